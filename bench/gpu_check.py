"""Every GPU claim gpudoctor makes, checked on a real GPU in one command (issue #37).

Each figure the doctor prints on CUDA (NVML's samples, the CUDA-event timeline, MFU, two
prescriptions, what its marks and ``attach`` cost, and a whole step captured as a CUDA graph)
was built on a fake device clock and a fake NVML binding. A GPU may be at hand for minutes, on a
bare machine with no package registry; this script is the check prepared for that moment:

    python3 bench/gpu_check.py                  # on the GPU machine, from the checkout's root

It installs what the machine lacks from the wheels in ``.whl/`` (pydantic, pydantic-core,
annotated-types, typing-inspection, orjson, py-spy: what gpudoctor needs beyond PyTorch's usual
stack; ``bench/gpu_wheels.sh`` downloads them again for another Python or version), then
gpudoctor itself from this checkout, and runs the checks in order within ``--budget-s`` (480 s:
a check that would start after it is skipped and says so). It prints one row per check
(measured, the truth or what is expected, pass/fail) and writes them all, with each check's raw
figures, to ``$OUT/gpu_check.json`` when ``$OUT`` is set (``--json PATH`` otherwise).

Without a GPU it takes its dry path: every row "no GPU: skipped", exit 0 (CI runs it, so the
script cannot rot: tests/test_gpu_check.py). Each check's judgement (a report and a truth in, a
row out) is also tested on CPU with reports from the fake device clock.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
WHEELS = ROOT / ".whl"
PY = sys.executable

# How close a figure must be to its truth. The GPU clock's step and its busy share come from the
# same CUDA events as the probe's truth, on the same stream: 10% / 5 points leaves room for the
# marks' own placement (the doctor's reference is the loader wait's end, the probe's the step end).
STEP_TOLERANCE = 0.10
BUSY_POINTS = 0.05
# A save's GPU seconds: the doctor's marks wrap torch.save itself, the probe's the same call.
SAVE_TOLERANCE = 0.20
# NVML read through gpudoctor and through nvidia-smi at the same moments: the same counters.
NVML_UTIL_POINTS = 10.0
NVML_MEM_SHARE = 0.02
NVML_POWER_SHARE = 0.10
NVML_PROC_MIB = 16.0
# MFU: FLOPs from the recorded shape vs the hand count, the step from the events vs the probe's.
FLOPS_TOLERANCE = 0.03
MFU_TOLERANCE = 0.10
# A prescription keeps its promise within this share (as bench/prescriptions.py).
PRESCRIPTION_TOLERANCE = 0.20
# The marks' cost per step, as a share of a 10 ms step; attach's cost on a busy GPU loop.
COST_BUDGET = 0.01
ATTACH_BUDGET = 0.05


@dataclass
class Row:
    """One check: what was measured beside its truth or expectation, and the verdict."""

    check: str
    measured: str = ""
    truth: str = ""
    result: str = "skipped"  # pass | fail | skipped | error
    note: str = ""
    figures: dict[str, Any] = field(default_factory=dict)


@dataclass
class Context:
    work: Path
    deadline: float
    log: list[str] = field(default_factory=list)
    patterns: list[str] | None = None

    def left_s(self) -> float:
        return self.deadline - time.monotonic()


# --------------------------------------------------------------------------- running things


def run(argv: list[str], ctx: Context, timeout_s: float, env: dict[str, str] | None = None
        ) -> subprocess.CompletedProcess[str]:
    """A child with a timeout bounded by the budget left; its last lines kept in the log."""
    limit = max(5.0, min(timeout_s, ctx.left_s()))
    t0 = time.monotonic()
    try:
        done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=limit, check=False)
    except subprocess.TimeoutExpired as exc:
        ctx.log.append(f"$ {shlex.join(argv)}\n  timed out after {limit:.0f} s")
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        return subprocess.CompletedProcess(argv, 124, out, f"timed out after {limit:.0f} s")
    tail = (done.stdout + done.stderr).strip().splitlines()[-6:]
    ctx.log.append(f"$ {shlex.join(argv)}  (rc {done.returncode}, {time.monotonic() - t0:.1f} s)\n  "
                   + "\n  ".join(tail))
    return done


def doctor_run(ctx: Context, name: str, probe: list[str], timeout_s: float = 90.0
               ) -> tuple[dict[str, Any] | None, dict[str, Any] | None, subprocess.CompletedProcess[str]]:
    """``gpudoctor run`` over a probe that writes its truth; (report, truth, the doctor's process)."""
    out = ctx.work / name
    truth = ctx.work / f"{name}.truth.json"
    done = run([PY, "-m", "gpudoctor", "run", "--out", str(out), "--", PY, *probe, "--truth", str(truth)],
               ctx, timeout_s)
    report = _load(out / "report.json")
    return report, _load(truth), done


def _load(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())  # type: ignore[no-any-return]
    except (OSError, ValueError):
        return None


def _rel(a: float, b: float) -> float:
    return abs(a - b) / abs(b) if b else float("inf")


def _ms(seconds: float | None) -> str:
    return "—" if seconds is None else f"{1000 * seconds:.1f} ms"


def _rules(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {f["rule"]: f for f in report.get("findings", []) if f.get("severity") != "info"}


def _unrun(row: Row, report: dict[str, Any] | None, rc: int) -> Row:
    """A doctored probe that left no report or no truth: an error, with what is missing and why."""
    row.result, row.note = "error", f"no {'report' if report is None else 'truth'} (exit code {rc})"
    return row


def _verdict(ok: bool) -> str:
    return "pass" if ok else "fail"


# --------------------------------------------------------------------------- 1. NVML

LOAD = """
import sys, time, torch
x = torch.randn(8192, 8192, device="cuda")
keep = torch.empty(int(float(sys.argv[2]) * 2**30) // 4, device="cuda")
torch.cuda.synchronize()
print("ready", flush=True)
end = time.time() + float(sys.argv[1])
while time.time() < end:
    for _ in range(20):
        x = (x @ x).clamp_(-1, 1)
    torch.cuda.synchronize()
"""


def nvidia_smi(pid: int) -> dict[str, float | None]:
    """``nvidia-smi``'s reading of GPU 0 and of ``pid`` now (None where it says N/A)."""
    gpu = subprocess.run(["nvidia-smi", "-i", "0", "--query-gpu=utilization.gpu,memory.used,power.draw",
                          "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=20, check=False)
    apps = subprocess.run(["nvidia-smi", "-i", "0", "--query-compute-apps=pid,used_memory",
                           "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=20, check=False)
    fields = [_num(v) for v in gpu.stdout.strip().split(",")] if gpu.returncode == 0 else []
    fields += [None] * (3 - len(fields))
    proc: float | None = None
    for line in apps.stdout.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2 and parts[0] == str(pid):
            proc = _num(parts[1])
    return {"util_pct": fields[0], "mem_used_mib": fields[1], "power_w": fields[2], "proc_mem_mib": proc}


def _num(text: str) -> float | None:
    try:
        return float(text.strip())
    except ValueError:
        return None


def check_nvml(ctx: Context) -> list[Row]:
    from gpudoctor.samplers.nvml import Nvml

    load = subprocess.Popen([PY, "-c", LOAD, "12", "2"], stdout=subprocess.PIPE, text=True)
    try:
        assert load.stdout is not None
        if load.stdout.readline().strip() != "ready":
            return [Row("nvml", result="error", note="the GPU load did not start")]
        nvml = Nvml()
        if not nvml.init():
            return [Row("nvml", result="fail", note="; ".join(nvml.problems()) or "NVML did not start")]
        pairs = sample_pairs(nvml, load.pid, nvidia_smi)
    finally:
        load.kill()
        load.wait()
    return judge_nvml(pairs)


def sample_pairs(nvml: Any, pid: int, smi: Callable[[int], dict[str, float | None]], n: int = 6,
                 pause_s: float = 0.8) -> list[tuple[dict[str, Any], dict[str, float | None]]]:
    """gpudoctor's GPU sampler row for GPU 0 (``pid``'s memory included) and ``smi``'s, ``n`` times."""
    from gpudoctor.samplers.nvml import GpuSampler

    sampler = GpuSampler(nvml, None, pids_provider=lambda: {pid})
    pairs = []
    try:
        for _ in range(n):
            time.sleep(pause_s)
            ours = sampler.sample()
            if ours:
                pairs.append((ours["gpus"][0], smi(pid)))
    finally:
        nvml.shutdown()
    return pairs


def judge_nvml(pairs: list[tuple[dict[str, Any], dict[str, float | None]]]) -> list[Row]:
    """gpudoctor's sampler row beside nvidia-smi's, read one after the other: util (points),
    memory (share), power (share), the load's own memory (MiB)."""
    rows = []
    for key, label, limit, unit in (("util_pct", "utilization", NVML_UTIL_POINTS, "points"),
                                    ("mem_used_mib", "memory used", NVML_MEM_SHARE, "share"),
                                    ("power_w", "power", NVML_POWER_SHARE, "share"),
                                    ("proc_mem_mib", "per-process memory", NVML_PROC_MIB, "MiB")):
        both = [(o.get(key), t.get(key)) for o, t in pairs]
        known = [(float(a), float(b)) for a, b in both if a is not None and b is not None]
        row = Row(f"nvml {label}")
        if not known:
            row.result = "fail" if any(b is not None for _, b in both) else "skipped"
            row.note = ("gpudoctor read nothing where nvidia-smi did" if row.result == "fail"
                        else "nvidia-smi reports none (N/A, or the load's pid is in another namespace)")
            rows.append(row)
            continue
        diffs = [abs(a - b) / b if unit == "share" and b else abs(a - b) for a, b in known]
        worst = statistics.median(diffs)
        row.measured = ", ".join(f"{a:g}" for a, _ in known)
        row.truth = "nvidia-smi: " + ", ".join(f"{b:g}" for _, b in known)
        row.result = _verdict(worst <= limit)
        row.note = f"median difference {worst:.3g} {unit} (limit {limit:g})"
        row.figures = {"pairs": known}
        rows.append(row)
    return rows


# --------------------------------------------------------------------------- 2. the GPU's own clock

PATTERN_STEPS = {"trap": 100, "sync": 100, "stall": 120, "save": 100}


def check_gpu_clock(ctx: Context) -> list[Row]:
    rows = []
    for pattern, steps in PATTERN_STEPS.items():
        if ctx.patterns and pattern not in ctx.patterns:
            rows.append(Row(f"gpu clock: {pattern}", note="not asked for (--pattern)"))
            continue
        report, truth, done = doctor_run(ctx, f"pattern-{pattern}",
                                         ["probes/gpu_patterns.py", "--pattern", pattern, "--steps", str(steps)])
        rows.append(judge_pattern(pattern, report, truth, done.returncode))
    return rows


def judge_pattern(pattern: str, report: dict[str, Any] | None, truth: dict[str, Any] | None, rc: int = 0) -> Row:
    """The report's GPU timeline and findings beside the probe's own CUDA events."""
    row = Row(f"gpu clock: {pattern}")
    if report is None or truth is None:
        return _unrun(row, report, rc)
    g = report.get("gpu_timeline") or {}
    if not g.get("steps_timed"):
        row.result, row.note = "fail", "no step timed on the GPU clock"
        return row
    rules = _rules(report)
    step, true_step = float(g["gpu_step_s"]), float(truth["gpu_step_ms_p50"]) / 1000
    busy, true_busy = float(g["busy_fraction"]), float(truth["gpu_busy_share_of_gpu_time"] or 0.0)
    checks = {"step": _rel(step, true_step) <= STEP_TOLERANCE}
    measured = [f"step {_ms(step)}", f"busy {busy:.0%}"]
    expected = [f"step {_ms(true_step)}", f"busy {true_busy:.0%}"]
    if pattern != "save":  # a save's idle is the save's, not the loop's busy share
        checks["busy"] = abs(busy - true_busy) <= BUSY_POINTS
    if pattern in ("trap", "stall"):
        _judge_stall(rules, truth, checks, measured, expected)
    elif pattern == "sync":
        idle = float(g.get("sync_idle_s_per_step") or 0.0)
        true_idle = float(truth.get("gpu_idle_after_sync_ms_p50") or 0.0) / 1000
        checks["host_sync"] = "host_sync" in rules
        # an upper bound by design (docs/gpu.md): at least the truth less a tenth, at most 1.5x + 5 ms
        checks["sync idle"] = 0.9 * true_idle <= idle <= 1.5 * true_idle + 0.005
        measured.append(f"idle after sync {_ms(idle)}")
        expected += [f"idle after sync {_ms(true_idle)}", "host_sync"]
    elif pattern == "save":
        ckpt = rules.get("checkpoint_overhead")
        per_save = float(((ckpt or {}).get("data") or {}).get("per_save_s") or 0.0)
        true_save = float(truth.get("gpu_save_ms_p50") or 0.0) / 1000
        checks["checkpoint_overhead"] = ckpt is not None
        checks["per save"] = ckpt is not None and _rel(per_save, true_save) <= SAVE_TOLERANCE
        measured.append(f"per save {_ms(per_save)}")
        expected += [f"per save {_ms(true_save)}", "checkpoint_overhead"]
    measured.append("findings: " + (", ".join(rules) or "none"))
    row.measured, row.truth = "; ".join(measured), "; ".join(expected)
    off = [k for k, ok in checks.items() if not ok]
    row.result = _verdict(not off)
    row.note = "off: " + ", ".join(off) if off else ""
    row.figures = {"gpu_timeline": {k: v for k, v in g.items() if k != "nvml_windows"},
                   "nvml_verdict": g.get("nvml_verdict"), "truth": truth, "rules": list(rules)}
    return row


def _judge_stall(rules: dict[str, dict[str, Any]], truth: dict[str, Any], checks: dict[str, bool],
                 measured: list[str], expected: list[str]) -> None:
    """``data_stall`` fires exactly when the probe's events saw the GPU idle in the loader waits for
    at least the rule's share of its time, and then promises no more than removing all of that idle
    would give: ``1 / (1 - idle share)``. (The trap is a trap only where the build is shorter than
    the GPU step; the truth says which it was on this GPU.)"""
    # the rule's own threshold, imported here: gpudoctor is importable only once install() ran
    from gpudoctor.core.thresholds import WASTE_SHARE as STALL_SHARE

    idle = float(truth.get("gpu_idle_in_wait_share_of_gpu_time") or 0.0)
    stall = rules.get("data_stall")
    ceiling = 1 / max(1e-6, 1 - idle)
    if idle < STALL_SHARE:
        checks["no data_stall"] = stall is None
        expected.append(f"GPU idle in waits {idle:.0%}: no data_stall")
        return
    checks["data_stall"] = stall is not None
    data = (stall or {}).get("data") or {}
    predicted = float(data.get("predicted_loop_speedup") or (stall or {}).get("predicted_speedup") or 0.0)
    checks["prediction within the idle"] = stall is not None and 1.0 < predicted <= ceiling * (1 + STEP_TOLERANCE / 2)
    measured.append(f"data_stall predicts {predicted:.2f}x" if stall else "no data_stall")
    expected.append(f"GPU idle in waits {idle:.0%}: data_stall, at most {ceiling:.2f}x")


# --------------------------------------------------------------------------- 3. MFU


def check_mfu(ctx: Context) -> list[Row]:
    rows = []
    for precision, steps in (("bf16", 40), ("fp32", 25)):
        report, truth, done = doctor_run(ctx, f"mfu-{precision}",
                                         ["probes/gpu_mfu.py", "--precision", precision, "--steps", str(steps)])
        rows.append(judge_mfu(precision, report, truth, done.returncode))
    return rows


def judge_mfu(precision: str, report: dict[str, Any] | None, truth: dict[str, Any] | None, rc: int = 0) -> Row:
    """The report's MFU and its inputs beside the hand count of FLOPs and the probe's step time."""
    row = Row(f"mfu {precision}")
    if report is None or truth is None:
        return _unrun(row, report, rc)
    mfu = report.get("mfu") or {}
    inputs = mfu.get("inputs") or {}
    if mfu.get("value") is None:
        row.result, row.note = "fail", f"MFU not measured: {mfu.get('reason')}"
        return row
    flops, hand = float(inputs["flops_per_step"]), float(truth["hand_flops_per_step"])
    step, true_step = float(inputs["gpu_step_s"]), float(truth["gpu_step_ms_p50"]) / 1000
    peak = float(inputs["peak_tflops"]) * 1e12
    hand_mfu = hand / true_step / peak
    value = float(mfu["value"])
    ok = {"flops": _rel(flops, hand) <= FLOPS_TOLERANCE, "step": _rel(step, true_step) <= STEP_TOLERANCE,
          "mfu": _rel(value, hand_mfu) <= MFU_TOLERANCE, "precision": inputs.get("precision") == precision}
    row.measured = f"MFU {value:.1%} ({flops:.3g} FLOP/step, step {_ms(step)}, {inputs.get('precision')})"
    row.truth = f"hand {hand_mfu:.1%} ({hand:.3g} FLOP/step, step {_ms(true_step)}, {precision})"
    row.result = _verdict(all(ok.values()))
    row.note = f"peak {peak / 1e12:g} TFLOP/s ({inputs.get('gpu')})" + (
        "; off: " + ", ".join(k for k, v in ok.items() if not v) if not all(ok.values()) else "")
    row.figures = {"mfu": mfu, "truth": truth}
    return row


# --------------------------------------------------------------------------- 4. prescriptions on CUDA


def prescription_probes() -> list[Any]:
    prescriptions = _bench_module("prescriptions")
    p = prescriptions.Probe
    return [
        p("narrow_padding", ("probes/narrow_padding.py", "--device", "cuda", "--steps", "60", "--n-embd", "256",
                             "--n-layer", "4", "--n-head", "4", "--batch-size", "16"), "padding_waste",
          values={"padding_waste": ("--max-length", lambda f: f["data"]["new_max_length"])},
          label="padding on cuda"),
        p("latency_loader", ("probes/latency_loader.py", "--device", "cuda", "--steps", "60"), "io_bound",
          label="workers on cuda"),
        # GPT-2 small's shape: after the cap its kernels still outlast its launches (the other side
        # of the padding rule's max: a narrow model's launches set the pace after the fix)
        p("narrow_padding", ("probes/narrow_padding.py", "--device", "cuda", "--steps", "30", "--n-embd", "768",
                             "--n-layer", "12", "--n-head", "12", "--batch-size", "16", "--examples", "600"),
          "padding_waste", values={"padding_waste": ("--max-length", lambda f: f["data"]["new_max_length"])},
          label="padding on cuda, wide"),
    ]


def check_prescriptions(ctx: Context) -> list[Row]:
    prescriptions = _bench_module("prescriptions")
    rows = []
    for probe in prescription_probes():
        if ctx.left_s() < 60:
            rows.append(Row(f"prescription: {probe.title}", note="out of time"))
            continue
        rows.append(judge_prescription(probe.title, probe.planted, prescriptions.bench(probe, 2, ctx.work)))
    return rows


def judge_prescription(title: str, planted: str, result: dict[str, Any]) -> Row:
    """bench/prescriptions.py's row: the top finding's fix applied, predicted vs achieved steady steps/s."""
    row = Row(f"prescription: {title}")
    predicted, achieved = result.get("predicted"), result.get("achieved")
    fix = " ".join(result.get("fix_words") or [])
    row.measured = (f"top {result.get('top')}, `{fix}`: achieved {achieved:.2f}x" if achieved
                    else f"top {result.get('top')}, nothing achieved")
    row.truth = f"planted {planted}; predicted {predicted:.2f}x" if predicted else f"planted {planted}; no prediction"
    ok = result.get("top") == planted and bool(predicted) and bool(achieved) and result.get("within") is True
    row.result = _verdict(ok)
    if achieved and result.get("spread"):
        row.note = f"2 pairs, spread {result['spread'][0]:.2f}-{result['spread'][1]:.2f}x; limit ±{PRESCRIPTION_TOLERANCE:.0%}"
    row.figures = {k: v for k, v in result.items() if k != "report"}
    return row


# --------------------------------------------------------------------------- 5. the cost


def check_cost(ctx: Context) -> list[Row]:
    done = run([PY, "bench/gpu_clock_cost.py", "--cuda", "--steps", "20000", "--repeats", "3"], ctx, 90)
    row = judge_clock_cost(done.stdout, done.returncode)
    return [row, check_attach(ctx)]


def judge_clock_cost(stdout: str, rc: int = 0) -> Row:
    """``bench/gpu_clock_cost.py --cuda``'s two lines: µs per step and its ratio to a 10 ms step."""
    row = Row("cost: GPU clock marks")
    ratio = next((float(line.split(":")[1].split()[0]) for line in stdout.splitlines()
                  if line.startswith("ratio to a")), None)
    per_step = next((line for line in stdout.splitlines() if line.startswith("per step")), "")
    if ratio is None:
        row.result, row.note = "error", f"no figure printed (exit code {rc})"
        return row
    row.measured = per_step.replace("per step ", "")
    row.truth = f"under {COST_BUDGET:.0%} of a 10 ms step"
    row.result = _verdict(ratio < COST_BUDGET)
    row.note = f"ratio {ratio:.5f}"
    row.figures = {"ratio": ratio, "stdout": stdout}
    return row


PATIENT = """
import sys, time, torch
log = open(sys.argv[1], "w", buffering=1)
x = torch.randn(4096, 4096, device="cuda")
w = torch.randn(4096, 4096, device="cuda", requires_grad=True)
opt = torch.optim.SGD([w], lr=1e-6)
end = time.time() + float(sys.argv[2])
while time.time() < end:
    loss = (x @ w).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    log.write(f"{time.time()}\\n")
"""


def check_attach(ctx: Context, bare_s: float = 8.0, attached_s: float = 10.0) -> Row:
    """A busy GPU loop: steps/s while ``gpudoctor attach`` is on it vs the bare stretches either side."""
    row = Row("cost: attach on a busy GPU loop")
    log = ctx.work / "patient.log"
    total = 2 * bare_s + attached_s + 12
    patient = subprocess.Popen([PY, "-c", PATIENT, str(log), str(total)])
    try:
        _first_steps(log, patient, warm_s=3.0)  # CUDA's start-up and the clocks' ramp are not the bare rate
        time.sleep(bare_s)
        t_attach = time.time()
        done = run([PY, "-m", "gpudoctor", "attach", str(patient.pid), "--duration", str(attached_s),
                    "--out", str(ctx.work / "attach")], ctx, attached_s + 60)
        t_detach = time.time()
        patient.wait(timeout=max(5.0, total))
    except subprocess.TimeoutExpired:
        patient.kill()
        patient.wait()
    ends = [float(v) for v in log.read_text().split()] if log.exists() else []
    report = _load(ctx.work / "attach" / "report.json")
    return judge_attach(ends, t_attach, t_detach, bare_s, done.returncode, report, row)


def _first_steps(log: Path, patient: subprocess.Popen[bytes], warm_s: float, limit_s: float = 60.0) -> None:
    """Until the patient has logged steps for ``warm_s`` seconds (or exited, or ``limit_s``)."""
    end = time.time() + limit_s
    while time.time() < end and patient.poll() is None:
        ends = log.read_text().split() if log.exists() else []
        if ends and time.time() - float(ends[0]) >= warm_s:
            return
        time.sleep(0.2)


def judge_attach(ends: list[float], t_attach: float, t_detach: float, bare_s: float, rc: int,
                 report: dict[str, Any] | None, row: Row | None = None) -> Row:
    """Steps/s inside the attached stretch over the mean of the bare stretches either side."""
    row = row or Row("cost: attach on a busy GPU loop")

    def rate(lo: float, hi: float) -> float | None:
        n = sum(lo <= t < hi for t in ends)
        return n / (hi - lo) if hi > lo and n else None

    before, during, after = rate(t_attach - bare_s, t_attach), rate(t_attach, t_detach), rate(t_detach, t_detach + bare_s)
    if before is None or during is None or after is None:
        row.result, row.note = "error", f"too few steps logged (attach exit code {rc})"
        return row
    bare = (before + after) / 2
    cost = 1 - during / bare
    if abs(before - after) / bare > ATTACH_BUDGET:  # the bare rate moved: no cost can be read off it
        row.result = "error"
        row.note = f"the bare stretches disagree ({before:.1f} vs {after:.1f} steps/s)"
        row.figures = {"before": before, "during": during, "after": after}
        return row
    loaded = ((report or {}).get("attach") or {}).get("loaded") or []
    hooks = ("hooks not loaded: stack samples only" if any("not loaded" in line for line in loaded)
             else "hooks loaded" if loaded else "no report")
    row.measured = f"{during:.1f} steps/s attached ({hooks}); cost {cost:+.1%}"
    row.truth = f"{bare:.1f} steps/s bare (before {before:.1f}, after {after:.1f}); budget {ATTACH_BUDGET:.0%}"
    row.result = _verdict(rc == 0 and cost <= ATTACH_BUDGET)
    row.note = f"attach exit code {rc}; " + "; ".join(loaded)[:200]
    row.figures = {"before": before, "during": during, "after": after, "hooks": hooks}
    return row


# --------------------------------------------------------------------------- 6. CUDA graph capture


def check_graph(ctx: Context) -> list[Row]:
    bare_truth = ctx.work / "graph-bare.truth.json"
    bare = run([PY, "probes/cuda_graph_step.py", "--truth", str(bare_truth)], ctx, 60)
    report, truth, done = doctor_run(ctx, "graph", ["probes/cuda_graph_step.py"])
    return [judge_graph(_load(bare_truth), truth, done.returncode, bare.returncode, report)]


def judge_graph(bare: dict[str, Any] | None, doctored: dict[str, Any] | None, rc: int, bare_rc: int,
                report: dict[str, Any] | None) -> Row:
    """The captured step under the doctor: it runs to the end with the bare run's weights, bit for bit."""
    row = Row("cuda graph: whole step captured")
    if bare is None:
        row.result, row.note = "error", f"the bare run failed (exit code {bare_rc})"
        return row
    row.truth = f"bare: exit 0, weights {bare['weights_sha256'][:12]}"
    if doctored is None:
        row.result, row.measured = "fail", f"under the doctor: exit {rc}, no truth written"
        return row
    same = doctored["weights_sha256"] == bare["weights_sha256"]
    steps = ((report or {}).get("gpu_timeline") or {}).get("steps_timed")
    differ = f"differ: sum {doctored['weights_sum']:.6g} vs {bare['weights_sum']:.6g}"
    row.measured = (f"under the doctor: exit {rc}, weights {doctored['weights_sha256'][:12]}"
                    f" ({'bit-equal' if same else differ})")
    row.result = _verdict(rc == 0 and same)
    row.note = f"GPU steps timed: {steps if steps is not None else 'none'}"
    return row


# --------------------------------------------------------------------------- the command

CHECKS: list[tuple[str, Callable[[Context], list[Row]], list[str]]] = [
    ("nvml", check_nvml, ["nvml utilization", "nvml memory used", "nvml power", "nvml per-process memory"]),
    ("gpu_clock", check_gpu_clock, [f"gpu clock: {p}" for p in PATTERN_STEPS]),
    ("mfu", check_mfu, ["mfu bf16", "mfu fp32"]),
    ("graph", check_graph, ["cuda graph: whole step captured"]),
    ("cost", check_cost, ["cost: GPU clock marks", "cost: attach on a busy GPU loop"]),
    ("prescriptions", check_prescriptions, ["prescription: padding on cuda", "prescription: workers on cuda",
                                            "prescription: padding on cuda, wide"]),
]


def _bench_module(name: str) -> Any:
    bench = str(ROOT / "bench")
    if bench not in sys.path:
        sys.path.insert(0, bench)
    return importlib.import_module(name)


def has_gpu() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def install(log: list[str]) -> str | None:
    """gpudoctor importable here and in its children: the carried wheels installed into this
    interpreter (``pip --no-index``: the GPU machine reaches no registry) and this checkout first on
    ``sys.path`` and ``PYTHONPATH``; None, or why not."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    # the probes import gpudoctor's synthetic corpus (probes/_common.py), bare runs included
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = str(ROOT) + (os.pathsep + old if old else "")
    try:
        import pydantic  # noqa: F401

        import gpudoctor  # noqa: F401

        return None
    except ImportError:
        pass
    wheels = sorted(str(w) for w in WHEELS.glob("*.whl"))
    if not wheels:
        return f"no wheels in {WHEELS} (bench/gpu_wheels.sh downloads them)"
    argv = [PY, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile", *wheels]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    log.append(f"$ pip install --no-index --no-deps {' '.join(Path(w).name for w in wheels)}  (rc {done.returncode})")
    if done.returncode != 0:
        return f"pip failed: {(done.stderr.strip().splitlines() or ['?'])[-1]}"
    importlib.invalidate_caches()
    try:
        import pydantic  # noqa: F401, F811

        import gpudoctor  # noqa: F401, F811
    except ImportError as exc:
        return f"still not importable: {exc}"
    return None


def table(rows: list[Row]) -> str:
    lines = ["| check | measured | truth or expected | result | note |", "|---|---|---|---|---|"]
    lines += [f"| {r.check} | {r.measured or '—'} | {r.truth or '—'} | {r.result} | {r.note or ''} |" for r in rows]
    return "\n".join(lines)


def environment() -> dict[str, Any]:
    env: dict[str, Any] = {"python": sys.version.split()[0], "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    with contextlib.suppress(ImportError):
        import torch

        env["torch"] = torch.__version__
        if torch.cuda.is_available():
            env["gpu"] = torch.cuda.get_device_name()
            env["cuda"] = torch.version.cuda
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        smi = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10, check=False)
        env["driver"] = smi.stdout.strip() or None
    return env


def checks_to_run(only: list[str] | None) -> list[tuple[str, Callable[[Context], list[Row]], list[str]]]:
    """All checks in their order, or those named by ``--only`` in the order named (a rerun in a short
    lease puts first what has not run yet)."""
    by_name = {c[0]: c for c in CHECKS}
    return [by_name[n] for n in dict.fromkeys(only)] if only else list(CHECKS)


def dry_rows(picked: list[tuple[str, Callable[[Context], list[Row]], list[str]]], why: str) -> list[Row]:
    return [Row(name, result="skipped", note=why) for _, _, names in picked for name in names]


@contextlib.contextmanager
def workdir(keep: Path | None) -> Iterator[Path]:
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
        yield keep
        return
    with tempfile.TemporaryDirectory(prefix="gd-gpu-check-") as tmp:
        yield Path(tmp)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget-s", type=float, default=480.0, help="start no check after this many seconds (480)")
    ap.add_argument("--only", action="append", choices=[c[0] for c in CHECKS], help="run these checks only, in this order")
    ap.add_argument("--pattern", action="append", choices=list(PATTERN_STEPS), help="gpu_clock: these patterns only")
    ap.add_argument("--json", type=Path, default=None, help="write the rows here (default $OUT/gpu_check.json)")
    ap.add_argument("--work", type=Path, default=None, help="keep the runs' folders here (default: a temporary one)")
    ap.add_argument("--dry", action="store_true", help="the dry path even with a GPU (what CI runs)")
    args = ap.parse_args(argv)
    t0 = time.monotonic()
    picked = checks_to_run(args.only)
    log: list[str] = []
    rows: list[Row]
    if args.dry or not has_gpu():
        rows = dry_rows(picked, "no GPU: skipped" if not args.dry else "--dry: skipped")
    elif (why := install(log)) is not None:
        rows = dry_rows(picked, f"gpudoctor could not be installed: {why}")
        rows[0].result = "error"
    else:
        rows = []
        with workdir(args.work) as work:
            ctx = Context(work, t0 + args.budget_s, log=log, patterns=args.pattern)
            for name, check, names in picked:
                if ctx.left_s() <= 0:
                    rows += [Row(n, note="skipped: out of time (--budget-s)") for n in names]
                    continue
                c0 = time.monotonic()
                print(f"gpu_check: {name} ...", file=sys.stderr, flush=True)
                try:
                    got = check(ctx)
                except Exception as exc:  # one check's fault must not lose the others' rows
                    got = [Row(names[0], result="error", note=f"{type(exc).__name__}: {exc}")]
                for r in got:
                    r.figures["seconds"] = round(time.monotonic() - c0, 1)
                rows += got
                print(table(got).split("\n", 2)[2], file=sys.stderr, flush=True)
    print(table(rows))
    failed = [r for r in rows if r.result in ("fail", "error")]
    print(f"\n{len(rows) - len(failed)} of {len(rows)} rows pass or are skipped; {time.monotonic() - t0:.0f} s")
    out = args.json or (Path(os.environ["OUT"]) / "gpu_check.json" if os.environ.get("OUT") else None)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"environment": environment(), "rows": [asdict(r) for r in rows],
                                   "log": log}, indent=1, default=str))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
