"""Overhead of ``gpudoctor run`` on the healthy probe's step throughput.

Alternates bare and profiled runs (so drift in machine load hits both alike)
and prints the ratio of median steady-state steps/s. Target: at most 1% cost.

    python bench/run_overhead.py --pairs 5 --seconds 20
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROBE = ROOT / "probes" / "healthy.py"


def steps_per_s(cmd: list[str]) -> float:
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=ROOT)
    match = re.findall(r"STEPS_PER_S=([0-9.eE+-]+)", out.stdout + out.stderr)
    if not match:
        raise SystemExit(f"no STEPS_PER_S in output of {cmd}:\n{out.stdout[-500:]}\n{out.stderr[-500:]}")
    return float(match[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=20.0)
    args = ap.parse_args()
    probe = [sys.executable, str(PROBE), "--seconds", str(args.seconds)]
    bare, doc = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.pairs):
            order = ("bare", "doc") if i % 2 == 0 else ("doc", "bare")
            for kind in order:
                if kind == "bare":
                    bare.append(steps_per_s(probe))
                else:
                    out = Path(tmp) / f"run{i}"
                    doc.append(steps_per_s([sys.executable, "-m", "gpudoctor", "run", "--out", str(out), "--", *probe]))
            print(f"pair {i + 1}: bare {bare[-1]:.2f} steps/s, under gpudoctor run {doc[-1]:.2f} steps/s", flush=True)
    ratio = statistics.median(doc) / statistics.median(bare)
    spread = (max(bare) - min(bare)) / statistics.median(bare)
    print(f"bare median {statistics.median(bare):.3f} steps/s (spread {100 * spread:.1f}%), "
          f"profiled median {statistics.median(doc):.3f} steps/s")
    print(f"RATIO profiled/bare = {ratio:.4f}  (overhead {100 * (1 - ratio):+.2f}%)")


if __name__ == "__main__":
    main()
