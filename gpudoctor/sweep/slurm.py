"""``--emit-slurm DIR``: the sweep as a Slurm job array, without owning a scheduler.

Slurm already queues, places and retries jobs; the sweep only needs to say what one
array task runs. Task ``I`` of ``N`` (one per point) runs ``gpudoctor sweep ... --shard I/N``
into ``DIR/shards/I``, with the same trial cache, so a point measured before is not
measured again; ``merge.sbatch`` joins the shards that finished (``--merge``) into
``DIR/merged``. ``submit.sh`` submits both, the merge after the array (``afterany``:
a failed task leaves its point missing, named in the merged notes, not the whole sweep).
Every path in the scripts is absolute, so they run from anywhere. Every value in them is quoted
with :func:`shlex.quote` (a ``$(...)`` in DIR stays text), a value holding a control character
(a newline would start a new ``#SBATCH`` line or command) is refused in one line, and each task's
Python runs isolated (:mod:`gpudoctor.processes.childpy`): the job's folder is never on its path.
"""

from __future__ import annotations

import math
import shlex
import unicodedata
from pathlib import Path

from gpudoctor.common import safefs
from gpudoctor.common.errors import UserError
from gpudoctor.processes import childpy
from gpudoctor.sweep.axes import WORKERS
from gpudoctor.sweep.options import SweepOptions
from gpudoctor.sweep.plan import Plan

ARRAY = "sweep.sbatch"
MERGE = "merge.sbatch"
SUBMIT = "submit.sh"
MARGIN_MIN = 10  # minutes on top of the trials' own bound: imports, data preparation


def shard_args(opts: SweepOptions) -> list[str]:
    """The sweep's own options, as one array task repeats them (paths made absolute)."""
    assert opts.config is not None
    p = opts.protocol
    args = [str(opts.config.resolve())]
    for spec in opts.grid:
        args += ["--grid", spec]
    if opts.hold_global_batch:
        args.append("--hold-global-batch")
    args += ["--cache", str(opts.cache.resolve())]
    args += ["--warmup-s", f"{p.warmup_s:g}", "--window-s", f"{p.window_s:g}"]
    args += ["--windows", str(p.windows), "--noise", f"{opts.noise:g}"]
    args += ["--repeats", str(opts.repeats), "--trial-timeout", f"{opts.trial_timeout_s:g}"]
    if p.torch_threads is not None:
        args += ["--torch-threads", str(p.torch_threads)]
    for flag, value in (
        ("--target", opts.target),
        ("--price-per-gpu-hour", opts.price_per_gpu_hour),
        ("--gpus", opts.gpus),
    ):
        if value is not None:
            args += [flag, str(value)]
    return args


def write_scripts(opts: SweepOptions, plan: Plan, folder: Path, gpu: bool) -> list[Path]:
    """``sweep.sbatch``, ``merge.sbatch`` and ``submit.sh`` in ``folder``; their paths."""
    folder = folder.resolve()
    shard = shard_args(opts)
    python = childpy.isolated("gpudoctor", "sweep")
    for value in (str(folder), *shard, *python):
        _refuse_control(value)
    (folder / "logs").mkdir(parents=True, exist_ok=True)
    (folder / "shards").mkdir(exist_ok=True)
    n = len(plan.points)
    workers = max(int(p.params.get(WORKERS, plan.baseline.get(WORKERS, 0)) or 0) for p in plan.points)
    workers = max(workers, int(plan.fixed.get(WORKERS, 0) or 0))
    minutes = MARGIN_MIN + math.ceil(opts.trial_timeout_s * (1 + opts.repeats) / 60)
    q = shlex.quote
    sweep = " ".join(q(a) for a in python)
    shards = folder / "shards"
    array = _header(
        "gpudoctor-sweep",
        folder,
        [
            f"#SBATCH --array=0-{n - 1}",
            f"#SBATCH --cpus-per-task={workers + 1}",
            f"#SBATCH --time={minutes}",
            *(
                ["#SBATCH --gres=gpu:1"]
                if gpu
                else ["# no GPU seen here: add '#SBATCH --gres=gpu:1' to train each trial on one"]
            ),
        ],
        "%A_%a",
    ) + (
        f': "${{SLURM_ARRAY_TASK_ID:?run under sbatch --array (or set SLURM_ARRAY_TASK_ID)}}"\n'
        f"exec {sweep} {' '.join(q(a) for a in shard)} \\\n"
        f'    --shard "$SLURM_ARRAY_TASK_ID/{n}" --out {q(str(shards))}/"$SLURM_ARRAY_TASK_ID" '
        "--yes\n"
    )
    merge = _header("gpudoctor-sweep-merge", folder, ["#SBATCH --cpus-per-task=1", "#SBATCH --time=10"], "%j") + (
        "done=()\n"
        f"for i in $(seq 0 {n - 1}); do\n"
        f'    if [ -f {q(str(shards))}/"$i"/sweep.json ]; then done+=({q(str(shards))}/"$i"); fi\n'
        "done\n"
        'if [ "${#done[@]}" -eq 0 ]; then echo "gpudoctor: no shard finished; see '
        f'{q(str(folder / "logs"))}" >&2; exit 1; fi\n'
        f'exec {sweep} --merge "${{done[@]}}" --out {q(str(folder / "merged"))}\n'
    )
    submit = (
        "#!/bin/bash\n# Submit the array, then the merge once every array task has ended.\n"
        "set -euo pipefail\n"
        f"jid=$(sbatch --parsable {q(str(folder / ARRAY))})\n"
        f'sbatch --dependency=afterany:"${{jid%%;*}}" {q(str(folder / MERGE))}\n'
        f'echo "gpudoctor sweep: array job $jid ({n} tasks); merged result in "{q(str(folder / "merged"))}\n'
    )
    paths = []
    for name, text in ((ARRAY, array), (MERGE, merge), (SUBMIT, submit)):
        path = folder / name
        safefs.replace_file(path, text, mode=0o700)
        paths.append(path)
    return paths


def _header(name: str, folder: Path, lines: list[str], log: str) -> str:
    return "\n".join(
        [
            "#!/bin/bash",
            f"# gpudoctor sweep, written by --emit-slurm; submit both with {shlex.quote(str(folder / SUBMIT))}",
            f"#SBATCH --job-name={name}",
            "#SBATCH --ntasks=1",
            *lines,
            f"#SBATCH --output={shlex.quote(str(folder / 'logs') + f'/{log}.out')}",
            "set -euo pipefail",
            "",
        ]
    )


def _refuse_control(value: str) -> None:
    """A newline or other control character would end a ``#SBATCH`` line or a command: refused."""
    bad = next((c for c in value if unicodedata.category(c) in ("Cc", "Zl", "Zp")), None)
    if bad is not None:
        raise UserError(f"--emit-slurm: {value!r} holds the control character {bad!r}, which a batch script "
                        "cannot carry safely; rename it (or choose another folder)")
