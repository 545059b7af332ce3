"""In-process hooks: measure, from inside the training process, what only it knows.

``install(run_dir)`` is called by the injected ``sitecustomize`` (``gpudoctor
run``), by ``attach`` through a debugger, and by the Python API. It patches
libraries as they are imported (or at once if they already are) and writes
events to ``<run_dir>/events/<pid>.jsonl``. ``uninstall()`` undoes every patch
so the process runs on unharmed after a detach. Every hook body is guarded
(:mod:`gpudoctor.hooks.guard`): a failure of ours never reaches the training.
Stdlib-only at import time.
"""

from __future__ import annotations

import os
from pathlib import Path

from gpudoctor.hooks import apply, cli_hooks, crash, guard, hf_hooks, imports, patch, trackers
from gpudoctor.hooks.comm_hooks import CommHooks
from gpudoctor.hooks.eval_regions import EvalRegions
from gpudoctor.hooks.torch_hooks import TorchHooks
from gpudoctor.hooks.writer import EventWriter

_writer: EventWriter | None = None
_torch_hooks: TorchHooks | None = None
_eval_regions: EvalRegions | None = None


# Libraries whose import is a visible part of startup, timed as startup's "imports" part.
HEAVY_IMPORTS = ("torch", "transformers", "datasets", "accelerate", "lightning", "pytorch_lightning",
                 "tokenizers", "numpy", "pandas")


def is_installed() -> bool:
    return _writer is not None


def writer() -> EventWriter | None:
    return _writer


def install(run_dir: str | os.PathLike[str]) -> EventWriter:
    """Install all hooks once per process; later calls return the same writer."""
    global _writer, _torch_hooks, _eval_regions
    if _writer is not None:
        return _writer
    w = _writer = EventWriter(Path(run_dir))
    guard.arm(w)
    patch.reset_depths()
    th = _torch_hooks = TorchHooks(w)
    imports.time_imports(HEAVY_IMPORTS, lambda name, t0, dt: w.emit(
        {"k": "span", "c": "imports", "t0": t0, "dt": dt, "name": f"import {name}"}))
    imports.when_imported("argparse", lambda m: cli_hooks.install_argparse(w, m))
    cli_hooks.record_existing_parser(w)  # attach: the script parsed its command line before
    cli_hooks.record_script_globals(w)
    imports.when_imported("torch", th.install_save)
    imports.when_imported("torch.utils.data.dataloader", th.install_dataloader)
    imports.when_imported("torch.utils.data._utils.fetch", th.install_fetch)
    imports.when_imported("torch.optim.optimizer", th.install_optimizer)
    imports.when_imported("torch.nn.modules.module", th.install_module)
    comm = th.comm = CommHooks(w)  # DDP's all-reduce and direct torch.distributed calls, per step
    CommHooks.current = comm  # a timer DDP kept from an earlier attach reports to this one
    comm.gpu_marks = lambda: th.gpu  # on CUDA, DDP's exposed all-reduce on the GPU clock
    imports.when_imported("torch.nn.parallel.distributed", comm.install_ddp)
    imports.when_imported("torch.distributed", comm.install_direct)
    imports.when_imported("torch.distributed.fsdp._fully_shard._fsdp_param_group", comm.install_fsdp_group)
    imports.when_imported("torch.distributed.fsdp._fully_shard._fsdp_state", comm.install_fsdp_state)
    regions = _eval_regions = EvalRegions(w, th)
    imports.when_imported("torch", regions.install)
    imports.when_imported("transformers.tokenization_utils_base", lambda m: hf_hooks.install_tokenizers(w, th, m))
    imports.when_imported("transformers.modeling_utils", lambda m: hf_hooks.install_modeling(w, m))
    imports.when_imported("transformers.trainer", lambda m: hf_hooks.install_trainer(w, m))
    imports.when_imported("datasets", lambda m: hf_hooks.install_datasets(w, m))
    imports.when_imported("safetensors.torch", lambda m: hf_hooks.install_safetensors(w, m))
    imports.when_imported("accelerate", lambda m: hf_hooks.install_accelerate(w, m))
    imports.when_imported("lightning.pytorch", _install_lightning)
    imports.when_imported("pytorch_lightning", _install_lightning)
    trackers.install(w)  # which MLflow / W&B / TensorBoard run the figures go to
    crash.install(w)  # the exception that ends the training, as its last event
    apply.install(w)  # ``gpudoctor try``: a fix's values, when GPUDOCTOR_APPLY names them
    return w


def _install_lightning(mod: object) -> None:
    from gpudoctor.hooks import lightning_hooks
    from gpudoctor.hooks.lightning_callback import install_into_trainer_class  # imports Lightning

    install_into_trainer_class(mod, writer)  # type: ignore[arg-type]
    if _writer is not None:
        lightning_hooks.install(_writer, mod)  # type: ignore[arg-type]


def uninstall() -> None:
    """Remove every patch and hook, flush what was recorded."""
    global _writer, _torch_hooks, _eval_regions
    imports.clear()
    if _eval_regions is not None:
        _eval_regions.close()
    patch.restore_all()
    if _torch_hooks is not None:
        _torch_hooks.remove_handles()
        if _torch_hooks.comm is not None:
            _torch_hooks.comm.close()
    if _writer is not None:
        _writer.close(exiting=False)
        _writer.enabled = False
    guard.disarm()
    _writer = None
    _torch_hooks = None
    _eval_regions = None


def active_torch_hooks() -> TorchHooks | None:
    return _torch_hooks
