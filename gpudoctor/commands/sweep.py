"""``gpudoctor sweep CONFIG.yaml --grid KEY=V1,V2 ...``: measure a grid of settings.

Each point is one replay trial in its own process (see :mod:`gpudoctor.sweep`);
the folder gets ``sweep.json``, ``sweep.md``, ``sweep.html`` and ``best.yaml``.
Exit 0 when at least one point trained steadily, 1 when none did.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from gpudoctor.common.redact import redact_argv
from gpudoctor.render.sweep_page import adaptive_text, headline
from gpudoctor.sweep.options import SweepOptions
from gpudoctor.sweep.session import emit_slurm, merge_sweeps, run_sweep


def main(args: Any) -> int:
    opts = SweepOptions.from_args(args)
    argv = ["gpudoctor", "sweep", *sys.argv[2:]] if sys.argv[1:2] == ["sweep"] else []
    opts.argv = redact_argv(argv)  # a --study-storage URL may hold a database password
    if opts.emit_slurm is not None:
        return _emit(opts)
    doc, folder = merge_sweeps(opts) if opts.merge else run_sweep(opts)
    if opts.as_json:
        print(json.dumps(doc, indent=2, default=str))
    out = sys.stderr
    print(f"\ngpudoctor: {headline(doc)}", file=out)
    change = doc.get("change") or {}
    if change.get("yaml_diff"):
        print(
            "  change:\n" + "\n".join("    " + line for line in change["yaml_diff"].splitlines()),
            file=out,
        )
    if change.get("lr_advice"):
        print(f"  {change['lr_advice']['text']}", file=out)
    if change.get("same_batch"):
        print(f"  or keep the batch: {change['same_batch']['text']}", file=out)
    if change.get("command"):
        print(f"  check it: {change['command']}", file=out)
    for note in doc.get("notes") or []:
        print(f"  note: {note}", file=out)
    adaptive = doc.get("adaptive")
    if adaptive:
        print(f"  {adaptive_text(adaptive)}", file=out)
    print(f"  report: {folder / 'sweep.html'}", file=out)
    return 0 if doc.get("best") else 1


def _emit(opts: SweepOptions) -> int:
    paths, count = emit_slurm(opts)
    folder = paths[0].parent
    print(
        f"gpudoctor: wrote a Slurm job array of {count} tasks (one per point) and its merge step:\n"
        + "\n".join(f"  {p}" for p in paths)
        + f"\n  submit: {folder / 'submit.sh'}  (result: {folder / 'merged' / 'sweep.html'})",
        file=sys.stderr,
    )
    return 0
