"""Child process: time a recorded ``transformers`` architecture, forward and backward, at given widths.

Run by :mod:`gpudoctor.launch.length_cost` after the training exited, on the device and with the
threads the training had. Random weights from the recorded config (sizes only): nothing is read
from a hub or from the user's files, and only a class that ``transformers`` itself exports and that
is a ``PreTrainedModel`` is built. Each draw (:mod:`gpudoctor.launch.draws`: a forked process,
up to three while the budget allows) times every width; prints one JSON line
``{"draws": [[[rows, width, seconds]...]...]}`` (in each draw the median of its passes at each
width; the narrower widths timed in rounds, as a loop padded per batch meets them), or
``{"error": "..."}``. On a GPU each point also carries the pass's kernels alone
(``[rows, width, seconds, kernel_seconds]``, :func:`_kernels_alone`): a narrow pass is bound by
its launches, and what the kernels take below them is what the training's own launches are
compared with (:func:`gpudoctor.rules.batches.gpu_cost_ratio`).
"""

from __future__ import annotations

import contextlib
import json
import statistics
import sys
import time
from typing import Any

from gpudoctor.launch import draws

MIN_REPS = 2
MIN_WIDTH_S = 0.3  # time each width for at least this long in all (and at least MIN_REPS passes)
LABELLED = ("LMHeadModel", "ForCausalLM", "ForMaskedLM", "ForPreTraining")


def main(argv: list[str] | None = None) -> int:
    job = json.loads((argv if argv is not None else sys.argv[1:])[0])
    budget = float(job["budget_s"])
    try:
        import_for(job)
    except Exception as exc:  # a torch that will not start: the doctor says so, nothing else
        print(json.dumps({"error": f"{type(exc).__name__}: {str(exc)[:200]}"}))
        return 1
    # each draw its budget (a slow pass needs all of it to reach the narrow widths), all of them too
    got, error = draws.in_forks(lambda seconds: _time({**job, "budget_s": seconds}), budget, budget)
    if not got:  # a config that does not build, out of memory
        print(json.dumps({"error": error or "no draw timed"}))
        return 1
    print(json.dumps({"draws": got}))
    return 0


def import_for(job: dict[str, Any]) -> None:
    """torch and the job's ``transformers`` class, once, before the draws fork (most of a draw's
    cost is these imports; no torch op runs here, so no thread pool is forked)."""
    import torch  # noqa: F401
    import transformers

    getattr(transformers, str(job["model"]), None)  # the lazy module behind the class


def build(job: dict[str, Any]) -> tuple[Any, Any, Any, Any]:
    """(model, config, device, autocast dtype) of a job's ``transformers`` class and sizes, on the
    job's device and threads, in train mode; refused when it is no model class or builds more
    parameters than the training had."""
    import torch
    import transformers

    cls = getattr(transformers, str(job["model"]), None)
    if not (isinstance(cls, type) and issubclass(cls, transformers.PreTrainedModel)):
        raise ValueError(f"{job['model']!r} is not a transformers model class")
    sizes = dict(job["config"])
    kind = str(sizes.pop("model_type"))
    config = transformers.AutoConfig.for_model(kind, **sizes)
    expected = job.get("params")
    if isinstance(expected, int) and expected > 0:  # sizes from a recording: never build more than ran
        with torch.device("meta"):
            counted = sum(p.numel() for p in cls(config).parameters())
        if counted > 2 * expected + 1_000_000:
            raise ValueError(f"the config builds {counted} parameters where the training had {expected}")
    if job.get("threads"):
        torch.set_num_threads(int(job["threads"]))
    torch.manual_seed(0)
    device = torch.device(str(job["device"]))
    model: Any = cls(config)
    model.to(device)
    model.train()
    dtype = getattr(torch, str(job["autocast"]).replace("torch.", ""), None) if job.get("autocast") else None
    return model, config, device, dtype


def loss_of(job: dict[str, Any], model: Any, ids: Any, dtype: Any, mask: bool = True) -> Any:
    """The stand-in's loss on ``ids`` (labels where the class takes them), under the job's autocast.
    ``mask=False`` passes no attention mask: the same kernels for rows with no padding, and no
    host check of the mask's values (a sync) inside the pass."""
    import torch

    attention = torch.ones_like(ids) if mask else None
    with torch.autocast(ids.device.type, dtype=dtype) if dtype is not None else contextlib.nullcontext():
        out = model(input_ids=ids, attention_mask=attention, labels=ids) if str(job["model"]).endswith(
            LABELLED) else model(input_ids=ids, attention_mask=attention)
        return out.loss if getattr(out, "loss", None) is not None else out[0].float().mean()


def _time(job: dict[str, Any]) -> list[list[float]]:
    """The width that ran first (after a warm-up pass), then the narrower widths in rounds, one
    pass each a round and no warm-up between: a loop padded per batch changes width every step, and
    on a VM whose page faults are dear (each pass maps its large tensors afresh) a pass just after
    another width costs more than the fifth pass at one width (696 wide: 4.85 s against 2.62 s)."""
    import torch

    model, config, device, dtype = build(job)
    rows, deadline = int(job["rows"]), time.monotonic() + float(job["budget_s"])
    vocab = int(getattr(config, "vocab_size", 0) or 1000)
    widths = [int(w) for w in job["widths"]]
    times: dict[int, list[float]] = {w: [] for w in widths}
    launches: dict[int, list[float]] = {w: [] for w in widths}

    def timed(width: int) -> float:
        ids = torch.randint(0, vocab, (rows, width), device=device)
        t0 = time.perf_counter()
        loss_of(job, model, ids, dtype).backward()
        model.zero_grad(set_to_none=True)
        if device.type == "cuda":
            launches[width].append(time.perf_counter() - t0)
            torch.cuda.synchronize(device)  # our own process: the GPU's time is the point
        return time.perf_counter() - t0

    first, start = widths[0], time.monotonic()  # widest: the width that ran, known to fit
    warm = [timed(first)]
    while len(times[first]) < _reps(warm + times[first], job) or time.monotonic() - start < MIN_WIDTH_S:
        if time.monotonic() > deadline:
            break
        times[first].append(timed(first))
    rest = widths[1:]
    while rest and time.monotonic() < deadline:
        for width in rest:
            if time.monotonic() > deadline:
                break
            times[width].append(timed(width))
        rest = [w for w in rest if len(times[w]) < _reps(times[w], job) or sum(times[w]) < MIN_WIDTH_S]
    out = [[rows, w, statistics.median(times[w])] for w in widths if times[w]]
    if device.type == "cuda":
        with contextlib.suppress(Exception):  # the passes' own times stand without it
            launch_s = {w: statistics.median(launches[w]) for w in widths if launches[w]}
            kernels = _kernels_alone(job, model, dtype, vocab, launch_s)
            if all(int(point[1]) in kernels for point in out):
                for point in out:
                    point.append(kernels[int(point[1])])
    return out


KERNEL_REPS = 3
MAX_AHEAD_S = 2.0  # the GPU's head start at most; a pass the host launches slower is left out


def _kernels_alone(job: dict[str, Any], model: Any, dtype: Any, vocab: int,
                   launch_s: dict[int, float]) -> dict[int, float]:
    """Each width's pass with its kernels back to back on the GPU, in seconds: the pass is queued
    behind a GPU sleep longer than the host takes to launch it, so the GPU meets every kernel already
    queued, and two CUDA events time them. A pass bound by its launches times the launches, so
    this is how its kernels scale with width beneath them. A width whose host caught up with the
    sleep (a sync inside the pass) is left out: its figure would be launches again."""
    import torch

    device = next(model.parameters()).device
    event: Any = torch.cuda.Event
    start, end = event(enable_timing=True), event(enable_timing=True)
    torch.cuda.synchronize(device)
    start.record()
    torch.cuda._sleep(10_000_000)  # type: ignore[no-untyped-call]
    end.record()
    end.synchronize()
    cycles_per_s = 10_000_000 / max(1e-6, start.elapsed_time(end) / 1000.0)
    out: dict[int, float] = {}
    for width, host_s in launch_s.items():
        ids = torch.randint(0, vocab, (int(job["rows"]), width), device=device)
        ahead = min(MAX_AHEAD_S, 2.0 * host_s + 0.005)
        got = []
        for _ in range(KERNEL_REPS):
            torch.cuda.synchronize(device)
            torch.cuda._sleep(int(ahead * cycles_per_s))  # type: ignore[no-untyped-call]
            t0 = time.perf_counter()
            start.record()
            loss_of(job, model, ids, dtype, mask=False).backward()
            model.zero_grad(set_to_none=True)
            end.record()
            if time.perf_counter() - t0 > 0.8 * ahead:  # the host met the GPU: launches again
                break
            end.synchronize()
            got.append(start.elapsed_time(end) / 1000.0)
        if len(got) == KERNEL_REPS:
            out[width] = statistics.median(got)
    torch.cuda.synchronize(device)
    return out


def _reps(times: list[float], job: dict[str, Any]) -> int:
    """Passes to time at a width: MIN_REPS, or one when a pass takes over an eighth of the budget (a
    wide row on a CPU: 6.9 s each), so the budget reaches the narrower widths the fix goes to."""
    return 1 if times and times[-1] > float(job["budget_s"]) / 8 else MIN_REPS


if __name__ == "__main__":
    sys.exit(main())
