"""Peak memory of reading an events file of huge ``batch`` lines (issue 26, finding 5).

    python bench/batch_lengths_memory.py [LINES] [LENGTHS_PER_LINE]

Writes LINES ``batch`` lines of LENGTHS_PER_LINE row lengths each into a temporary events file,
reads it with :func:`gpudoctor.recording.read.read_events` in a fresh interpreter (the one on
PYTHONPATH), and prints the file's size and the reader's peak RSS. The audit's file: 50 lines of
1.9 M lengths (190 MB) took 2.25 GB before the reader bounded each line's lengths.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

READ = """
import resource, sys
from pathlib import Path
from gpudoctor.recording.read import read_events
got = read_events(Path(sys.argv[1]))
kept = sum(len(e.get("lengths") or []) for e in got.records.batches)
print(kept, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024)
"""


def main() -> None:
    lines = int(sys.argv[1]) if len(sys.argv) > 1 else 50
    per = int(sys.argv[2]) if len(sys.argv) > 2 else 400_000
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "events" / "1.jsonl"
        path.parent.mkdir()
        with open(path, "w") as fh:
            for i in range(lines):
                lengths = [300 + (i * 7 + j) % 700 for j in range(per)]  # past the small-int cache, as real ones
                fh.write(json.dumps({"k": "batch", "t": 1.7e9 + i, "tokens": per * 1024, "pad": per * 1024 - sum(lengths),
                                     "seq_len": 1024, "lengths": lengths}) + "\n")
        out = subprocess.run([sys.executable, "-c", READ, str(path)], check=True, capture_output=True, text=True,
                             cwd=tmp)  # gpudoctor from PYTHONPATH, not from the current folder
        kept, rss_mib = out.stdout.split()
        print(f"{lines} lines x {per:,} lengths: file {path.stat().st_size / 2**20:.0f} MiB, "
              f"lengths kept {int(kept):,}, peak RSS {rss_mib} MiB")


if __name__ == "__main__":
    main()
