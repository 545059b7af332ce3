"""Time a step's compute back to back as well as after a batch build, when the loop never ran it so.

A loop that builds every batch on the training process (``num_workers=0``) runs its compute right
after each build, slower than the same compute back to back (the build's code and data push the
step's out of the caches; on a VM a core that idled wakes slowly: measured here up to 3-4x on a CNN
step, and it drifts). Caching the items or pre-tokenizing leaves the compute back to back, so
what such a fix gives is the loop at its warm compute, which the recording holds no step of. After
the training exited, a child (:mod:`gpudoctor.launch.warm_compute_worker`) times a stand-in step of
the recorded compute's length on the training's threads, back to back and after a gap as long as
the recorded build (Python work for a build that computes on the training process, sleep for one
that waits or for the wait on workers, with as many busy processes beside it as the cores the
workers kept busy: their CPU is what a cache takes away too), and, where workers would take over a
build made on the training process, back to back beside a process burning the build's CPU each
step (what the compute becomes beside them), in up to three forked draws within twice
:data:`BUDGET_S` (:mod:`gpudoctor.launch.draws`: one process is one draw), kept as their median;
the figures go to ``warm_compute.json`` (:mod:`gpudoctor.recording.warm_compute`) and the data
rules scale the compute by their ratio, saying so. A CUDA run is not timed (its compute is the
device's; the host's caches bend only its launches), and anything that fails leaves the compute
as measured, said as such.
"""

from __future__ import annotations

import contextlib
import statistics
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gpudoctor.analysis import Analysis
from gpudoctor.common import batchlengths
from gpudoctor.core.thresholds import WASTE_SHARE
from gpudoctor.launch import conv_net, length_cost, timing_child
from gpudoctor.recording import warm_compute
from gpudoctor.rules.data import DataWait, data_wait

BUDGET_S = 10.0  # each draw's rounds a sixth of it (three time about the rounds one of all of it did); all, twice it
MAX_GAP_S = 1.0  # a longer build is timed as one this long: caches are cold well before
MIN_GAP_SHARE = 0.5  # a build shorter than half the compute leaves no cold compute to speak of
MIN_WORKER_CPU_SHARE = 0.05  # a worker's CPU under this share of the compute takes nothing worth timing from it
LINEAR = "two linear layers of the training's weight count, sized to its compute"


def job(a: Analysis) -> dict[str, Any] | None:
    """What to time for this recording, or None where no fix would run the compute back to back."""
    p = a.primary
    if p is None or a.rec.warm_compute is not None:
        return None
    cfg: Mapping[str, Any] = p.torch_cfg or {}
    if str(cfg.get("device") or "cpu") == "cuda":
        return None
    d = data_wait(a)
    if d is None or d.build is None or not d.n_batches:
        return None
    compute = d.compute_s_per_batch
    # Builds on the training process: the compute follows the build's own work. With workers the
    # training process sleeps on their queue until a batch comes: the compute follows that wait.
    in_process = not d.build.in_workers and not d.num_workers
    gap = d.build.wall_s if in_process else d.wait_s / d.n_batches
    threads = cfg.get("threads")
    beside = _busy_workers(d, threads if isinstance(threads, int) else None)  # a short wait leaves the compute warm, not alone on its cores
    # Workers would take over a build made on the training process: its CPU then runs beside the compute.
    worker_cpu = d.build.build_cpu_s if in_process and d.build.build_cpu_s >= MIN_WORKER_CPU_SHARE * (compute or 0.0) else 0.0
    if (not compute or compute <= 0 or (gap < MIN_GAP_SHARE * compute and not beside and not worker_cpu)
            or d.wait_s < WASTE_SHARE * d.wall_s):
        return None
    params = p.model.get("params") if p.model is not None else None
    job: dict[str, Any] = {"compute_s": compute, "gap_s": min(MAX_GAP_S, gap), "beside": beside,
                           "gap": "cpu" if in_process and d.build.kind != "wait" else "wait",
                           "params": params if isinstance(params, int) and params > 0 else None,
                           "threads": threads, "budget_s": BUDGET_S, "device": "cpu",
                           "autocast": cfg.get("autocast_dtype") if cfg.get("autocast") else None,
                           "worker_cpu_s": worker_cpu or None}
    recorded: Mapping[str, Any] = p.model or {}
    built = length_cost.architecture(dict(recorded))
    shapes = Counter((batchlengths.rows(b), int(b.get("seq_len") or 0)) for b in p.batches)
    rows, width = shapes.most_common(1)[0][0] if shapes else (None, 0)
    if built is not None and rows and width > 0:  # the training's own kinds of kernels, at its shapes
        if built["stand_in"]:
            built["config"]["n_positions"] = max(width, 8)
        job |= {**built, "rows": rows, "width": width}
    elif built is None and isinstance(walk := recorded.get("shape"), Mapping):
        net = conv_net.chain(walk, job["params"])  # a CNN: its own layers at its batch's shape
        if net is not None:
            name = recorded.get("class")
            job |= {"layers": net.layers, "input": net.input, "convs": [net.convs, net.recorded_convs],
                    "shown": name if isinstance(name, str) and name.isidentifier() else "the model"}
    return job


def _busy_workers(d: DataWait, threads: int | None) -> int:
    """Cores the loader's workers kept busy while the training computed on ``threads``: their
    build's CPU over the loop's time per batch, in whole processes; 0 where they and the compute's
    threads fit the machine's cores (they took none of the compute's), without workers, or for a
    build that waits. On 2 cores a worker decoding images took one of torch's two threads' cores,
    and the step ran 9x slower than back to back."""
    if d.build is None or not d.num_workers or d.build.kind == "wait" or not d.batch_s or not threads:
        return 0
    busy = min(d.num_workers, warm_compute.MAX_BESIDE, round(d.build.cpu_s / d.batch_s))
    return busy if threads + busy > d.cores else 0


def measure(a: Analysis, folder: Path) -> str | None:
    """Time what :func:`job` asks for, keep it in ``folder`` and on ``a.rec``; never raises.

    Returns a note when the timing was wanted and failed (the report says the compute stood), else None.
    """
    wanted = job(a)
    if wanted is None:
        return None
    failed = "timing the compute back to back failed ({}); a fix that removes the build is predicted at the compute as measured"
    try:
        doc = timing_child.run("gpudoctor.launch.warm_compute_worker", wanted, 2 * BUDGET_S)
    except timing_child.Failed as exc:
        return failed.format(exc)
    answered = doc.get("draws") if isinstance(doc, dict) else None
    timed = [d for d in (_figures(x) for x in (answered if isinstance(answered, list) else [])) if d]
    parsed = warm_compute.parse({"schema": warm_compute.SCHEMA, **_median(timed), "gap_s": wanted["gap_s"],
                                 "gap": wanted["gap"], "worker_cpu_s": wanted["worker_cpu_s"],
                                 "threads": wanted["threads"], "beside": wanted["beside"],
                                 "stand_in": _stand_in(wanted), "draws": len(timed)}) if timed else None
    if parsed is None:
        return failed.format(str(doc.get("error") if isinstance(doc, dict) else "no figures")[:200])
    with contextlib.suppress(OSError):  # the report still uses it; a later ``report`` uses the compute as measured
        warm_compute.write(folder, parsed)
    a.rec.warm_compute = parsed
    return None


def _figures(draw: object) -> dict[str, float]:
    """One draw's ``warm_s``, ``cold_s`` and ``worker_s`` (where timed); empty when it is not one."""
    if not isinstance(draw, dict):
        return {}
    out = {k: float(draw[k]) for k in ("warm_s", "cold_s", "worker_s") if warm_compute.positive(draw.get(k))}
    return out if "warm_s" in out and "cold_s" in out else {}


def _median(timed: list[dict[str, float]]) -> dict[str, float]:
    """The draws' figures as one: the median compute after a build, and back to back and beside a
    worker each at the median of the draws' own ratios to it (a draw that ran all slow moves the
    scale, not the ratios the prediction reads)."""
    cold = statistics.median(d["cold_s"] for d in timed)
    out = {"cold_s": cold, "warm_s": cold * statistics.median(d["warm_s"] / d["cold_s"] for d in timed)}
    if all("worker_s" in d for d in timed):
        out["worker_s"] = cold * statistics.median(d["worker_s"] / d["cold_s"] for d in timed)
    return out


def _stand_in(job: Mapping[str, Any]) -> str:
    """What was timed, in the evidence's words."""
    if job.get("layers"):
        n, c, h, w = job["input"]
        kept, recorded = job["convs"]
        some = f"{kept} of its {recorded}" if kept < recorded else f"its {kept}"
        return f"{job['shown']}'s layers ({some} convolutions), {n} images of {c}x{h}x{w}"
    if not job.get("model"):
        return LINEAR
    shape = f"{job['rows']} rows of {job['width']} tokens"
    return f"a GPT-2 of {job['shown']}'s shape, {shape}" if job.get("stand_in") else f"{job['model']}, {shape}"
