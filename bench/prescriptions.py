"""Is a prescription a promise? Predicted speedup vs what applying the top fix achieves.

For each probe with a planted waste: run it under ``gpudoctor run``, read the top finding, apply
its fix through the probe's own flag (the report's edited command line, ``data.command_line``;
or the probe's entry in ``fixes`` where the fix is not a flag value, e.g. pre-tokenizing), then
run the probe as it was and with the fix, interleaved (``--pairs`` rounds, the order alternating),
and compare steady-state steps/s (``steady_steps_per_s`` of the probe's truth: after the warm-up).
The simple fixes tried by hand (``by_hand``) run in the same rounds, so the prescribed fix is
compared with the best of them on the same machine at the same time.

A probe is one entry in :data:`PROBES`; add a row for a new one::

    Probe("my_probe", ("probes/my_probe.py", "--steps", "60"), planted="some_rule",
          by_hand=(("--knob", "4"),))

Run it quiet (nothing else on the machine) for figures worth quoting::

    python bench/prescriptions.py --pairs 3
    python bench/prescriptions.py --only latency_loader --pairs 5 --json out.json

Prints one table: planted, top finding, the fix, predicted vs achieved (median and spread over
the pairs), whether it is within +-20%, the best simple fix by hand and whether the prescription
is at least as good; and, for ``hog`` rows (one CPU-bound program beside the probe), whether the
planted cause stayed the top finding and no fix was a no-op.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TOLERANCE = 0.20


@dataclass(frozen=True)
class Probe:
    name: str
    argv: tuple[str, ...]  # the probe's script and its planted settings, relative to the repo root
    planted: str  # the rule it plants (the top finding expected)
    fixes: dict[str, tuple[str, ...]] = field(default_factory=dict)  # rule -> flags to add, where the fix is no flag value
    by_hand: tuple[tuple[str, ...], ...] = ()  # simple fixes tried by hand: flags to add
    hog: bool = False  # one CPU-bound program runs beside it (the busy-host case)
    label: str = ""
    # rule -> (the probe's flag, the finding's value for it): fixes the report words as a config
    # value, not as an edited command line (a padding length, a save interval)
    values: dict[str, tuple[str, Callable[[dict[str, Any]], Any]]] = field(default_factory=dict)

    @property
    def title(self) -> str:
        return self.label or self.name


PRETOKENIZE = {"tokenization_in_loop": ("--pretokenize",)}
WORKERS = tuple(("--num-workers", str(n)) for n in (1, 2, 4))
TORCHRUN_2 = ("-m", "torch.distributed.run", "--nproc-per-node", "2")  # a 2-rank job: rank 0 writes the truth

PROBES: list[Probe] = [
    Probe("latency_loader", ("probes/latency_loader.py", "--steps", "60"), "io_bound",
          by_hand=(*WORKERS, ("--num-workers", "8"))),
    Probe("latency_loader", ("probes/latency_loader.py", "--steps", "60"), "io_bound",
          by_hand=(*WORKERS, ("--num-workers", "8")), hog=True, label="latency_loader + hog"),
    Probe("threaded_tokenizer", ("probes/threaded_tokenizer.py", "--steps", "120"), "tokenization_in_loop",
          fixes=PRETOKENIZE, by_hand=(*WORKERS, ("--pretokenize",))),
    Probe("augment_cpu", ("probes/augment_cpu.py", "--steps", "60"), "data_stall", by_hand=WORKERS),
    Probe("tokenize_in_getitem", ("probes/tokenize_in_getitem.py", "--steps", "60"), "tokenization_in_loop",
          fixes=PRETOKENIZE, by_hand=(("--num-workers", "1"), ("--num-workers", "2"), ("--pretokenize",))),
    Probe("tokenize_in_getitem", ("probes/tokenize_in_getitem.py", "--steps", "60"), "tokenization_in_loop",
          fixes=PRETOKENIZE, by_hand=(("--num-workers", "1"), ("--pretokenize",)), hog=True,
          label="tokenize_in_getitem + hog"),
    Probe("heavy_checkpoints", ("probes/heavy_checkpoints.py", "--steps", "24"), "checkpoint_overhead",
          by_hand=(("--save-every", "8"),)),
    Probe("fixed_padding", ("probes/fixed_padding.py",), "padding_waste", by_hand=(("--max-length", "160"),)),
    Probe("narrow_padding", ("probes/narrow_padding.py", "--steps", "12"), "padding_waste",
          values={"padding_waste": ("--max-length", lambda f: f["data"]["new_max_length"])},
          by_hand=(("--max-length", "256"), ("--max-length", "320"))),
    Probe("fsync_checkpoints", ("probes/fsync_checkpoints.py", "--steps", "60"), "checkpoint_overhead",
          values={"checkpoint_overhead": ("--save-every", lambda f: f["fix"]["config"]["save_steps"])},
          by_hand=(("--save-every", "10"), ("--save-every", "30"))),
    Probe("ddp_comm", (*TORCHRUN_2, "probes/ddp_comm.py", "--accum", "4", "--steps", "12"), "sync_every_microstep",
          fixes={"sync_every_microstep": ("--no-sync",)}, label="ddp_comm accum 4"),
    Probe("ddp_comm", (*TORCHRUN_2, "probes/ddp_comm.py", "--find-unused", "--steps", "30", "--n-embd", "8",
                       "--n-layer", "64", "--batch-size", "1", "--seq-len", "4"), "unused_parameter_search",
          fixes={"unused_parameter_search": ("--no-find-unused",)}, label="ddp_comm find_unused"),
    Probe("fsdp_comm", (*TORCHRUN_2, "probes/fsdp_comm.py", "--steps", "40"), "fsdp_backward_allgather",
          fixes={"fsdp_backward_allgather": ("--no-reshard",)}, label="fsdp_comm reshard"),
    Probe("fsdp_comm", (*TORCHRUN_2, "probes/fsdp_comm.py", "--steps", "40"), "fsdp_backward_allgather",
          fixes={"fsdp_backward_allgather": ("--no-reshard",)}, hog=True, label="fsdp_comm reshard + hog"),
]


@contextlib.contextmanager
def cpu_hog(on: bool) -> Iterator[None]:
    """One CPU-bound program beside the probe (ended by its own pid)."""
    if not on:
        yield
        return
    proc = subprocess.Popen([sys.executable, "-I", "-c", "while True: pass"])
    try:
        time.sleep(0.5)
        yield
    finally:
        proc.kill()
        proc.wait()


def run_probe(argv: list[str], truth: Path) -> dict[str, Any] | None:
    """Run the probe bare; its truth JSON, or None if it failed."""
    truth.unlink(missing_ok=True)
    done = subprocess.run([sys.executable, *argv, "--truth", str(truth)], cwd=ROOT,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, check=False)
    if done.returncode != 0 or not truth.exists():
        print(f"  {' '.join(argv)} failed: {done.stderr.strip().splitlines()[-1:] }", file=sys.stderr)
        return None
    return json.loads(truth.read_text())


def diagnose(p: Probe, work: Path) -> dict[str, Any]:
    """Run under the doctor; the top finding, its fix as flags, and its predicted loop speedup."""
    out = work / f"doctor-{p.title.replace(' ', '_').replace('+', '')}"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    subprocess.run([sys.executable, "-m", "gpudoctor", "run", "--out", str(out), "--", sys.executable, *p.argv],
                   cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    report = json.loads((out / "report.json").read_text())
    found = [f for f in report["findings"] if f["severity"] != "info"]
    if not found:
        return {"top": None}
    top = found[0]
    data = top.get("data") or {}
    fix_argv: list[str] | None = None
    if top["rule"] in p.fixes:
        fix_argv = [*p.argv, *p.fixes[top["rule"]]]
    elif top["rule"] in p.values:
        flag, value_of = p.values[top["rule"]]
        fix_argv = [*p.argv, flag, str(value_of(top))]
    elif data.get("command_line"):
        words = shlex.split(data["command_line"])
        script = next((i for i, w in enumerate(words) if w.endswith(".py")), None)
        fix_argv = words[script:] if script is not None else None
    predicted = data.get("predicted_loop_speedup") or steady_prediction(out, top["rule"]) or top.get("predicted_speedup")
    noop = fix_argv is not None and list(fix_argv) == list(p.argv)
    base = list(p.argv)
    fix_words = (fix_argv[len(base):] if fix_argv[:len(base)] == base else fix_argv[-2:]) if fix_argv else None
    return {"top": top["rule"], "fix_argv": fix_argv, "fix_words": fix_words, "predicted": predicted, "noop": noop,
            "whole_run_speedup": top.get("predicted_speedup"), "summary": top["fix"]["summary"],
            "rules": [f["rule"] for f in found], "report": str(out / "report.json")}


def steady_prediction(out: Path, rule: str) -> float | None:
    """What ``gpudoctor try`` predicts for the finding's fix, in steady-state steps/s (the same
    function try uses; a finding's own ``predicted_speedup`` is of the whole run, startup included)."""
    sys.path.insert(0, str(ROOT))
    from gpudoctor.recording.store import load_recording
    from gpudoctor.report.build import diagnose
    from gpudoctor.rules import knobs

    dx = diagnose(load_recording(out))
    return knobs.predict(dx.analysis, dx.findings, rule).speedup


def measure(p: Probe, variants: dict[str, list[str]], pairs: int, work: Path) -> dict[str, list[float]]:
    """Steady steps/s of every variant, ``pairs`` rounds, the order rotating each round."""
    rates: dict[str, list[float]] = {k: [] for k in variants}
    names = list(variants)
    for i in range(pairs):
        order = names[i % len(names):] + names[:i % len(names)]
        if i % 2:
            order.reverse()
        for key in order:
            truth = run_probe(variants[key], work / "truth.json")
            if truth and truth.get("steady_steps_per_s"):
                rates[key].append(float(truth["steady_steps_per_s"]))
    return rates


def ratios(rates: dict[str, list[float]], key: str) -> list[float]:
    """Per-round speedup of ``key`` over the baseline (rounds where both ran)."""
    return [b / a for a, b in zip(rates["baseline"], rates[key], strict=False) if a > 0]


def bench(p: Probe, pairs: int, work: Path) -> dict[str, Any]:
    with cpu_hog(p.hog):
        dx = diagnose(p, work)
        row: dict[str, Any] = {"probe": p.title, "planted": p.planted, **dx}
        if dx["top"] is None or dx.get("fix_argv") is None:
            return row
        variants = {"baseline": list(p.argv), "fix": list(dx["fix_argv"])}
        for extra in p.by_hand:
            argv = [*p.argv, *extra]
            if argv != variants["fix"]:
                variants[" ".join(extra)] = argv
        rates = measure(p, variants, pairs, work)
    row["rates"] = rates
    achieved = ratios(rates, "fix")
    if achieved:
        row["achieved"] = statistics.median(achieved)
        row["spread"] = [min(achieved), max(achieved)]
        if dx["predicted"]:
            row["within"] = abs(row["achieved"] / dx["predicted"] - 1) <= TOLERANCE
    hand = {k: statistics.median(r) for k in variants if k not in ("baseline", "fix") and (r := ratios(rates, k))}
    if hand:
        best = max(hand, key=lambda k: hand[k])
        row["by_hand"] = {k: round(v, 2) for k, v in hand.items()}
        row["best_by_hand"] = [best, hand[best]]
        if achieved:
            row["fix_at_least_best"] = row["achieved"] >= hand[best] * (1 - TOLERANCE / 2)
    return row


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| probe | planted | top finding | fix applied | predicted | achieved (median, min–max) | ±20% | best by hand | fix ≥ best |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        fix = " ".join(r.get("fix_words") or r["fix_argv"][-2:]) if r.get("fix_argv") else "—"
        pred = f"{r['predicted']:.2f}×" if r.get("predicted") else "—"
        ach = (f"{r['achieved']:.2f}× ({r['spread'][0]:.2f}–{r['spread'][1]:.2f})" if "achieved" in r else "—")
        within = {True: "yes", False: "**no**"}.get(r.get("within"), "—")
        best = f"`{r['best_by_hand'][0]}` {r['best_by_hand'][1]:.2f}×" if r.get("best_by_hand") else "—"
        at_least = {True: "yes", False: "**no**"}.get(r.get("fix_at_least_best"), "—")
        top = r.get("top") or "none"
        if top != r["planted"]:
            top = f"**{top}**"
        if r.get("noop"):
            fix += " (**no-op**)"
        lines.append(f"| {r['probe']} | `{r['planted']}` | `{top}` | `{fix}` | {pred} | {ach} | {within} | {best} | {at_least} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=3, help="interleaved rounds per probe (default 3)")
    ap.add_argument("--only", action="append", help="a row's title: the probe's name, or its label (repeatable)")
    ap.add_argument("--json", type=Path, help="write every row here")
    ap.add_argument("--hand", type=int, default=None,
                    help="try only the first N simple fixes by hand per probe (a short setting on a busy machine)")
    args = ap.parse_args(argv)
    picked = [p for p in PROBES if not args.only or p.title in args.only]
    if args.hand is not None:
        picked = [dataclasses.replace(p, by_hand=p.by_hand[:args.hand]) for p in picked]
    rows = []
    with tempfile.TemporaryDirectory(prefix="gd-presc-") as tmp:
        for p in picked:
            print(f"{p.title} ...", file=sys.stderr, flush=True)
            rows.append(bench(p, args.pairs, Path(tmp)))
            print(table(rows[-1:]).splitlines()[-1], file=sys.stderr, flush=True)
    print(table(rows))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
