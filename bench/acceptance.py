"""Every probe under ``gpudoctor run``: top finding and measured share vs the probe's own truth.

    python bench/acceptance.py
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.conftest import run_probe, within  # noqa: E402
from tests.test_probes import PLANTED  # noqa: E402


def main() -> None:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for probe in [*sorted(PLANTED), "healthy"]:
            run = run_probe(Path(tmp), probe)
            top = run.report["findings"][0]
            if probe == "healthy":
                worst = max((f["waste_fraction"] for f in run.report["findings"]), default=0.0)
                rows.append((probe, "none", top["rule"], "max waste", worst, None, worst <= 0.10))
                continue
            rule, (section, key), truth_key = PLANTED[probe]
            measured, truth = run.report[section][key], run.truth[truth_key]
            ok = top["rule"] == rule and within(measured, truth)
            rows.append((probe, rule, top["rule"], f"{section}.{key}", measured, truth, ok))
    print(f"{'probe':22} {'planted':22} {'top finding':22} {'figure':24} {'measured':>9} {'truth':>9}  ok")
    for probe, rule, top, fig, m, t, ok in rows:
        ts = f"{t:9.3f}" if t is not None else f"{'-':>9}"
        print(f"{probe:22} {rule:22} {top:22} {fig:24} {m:9.3f} {ts}  {'yes' if ok else 'NO'}")


if __name__ == "__main__":
    main()
