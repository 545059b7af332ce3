"""Sum the per-test lines of GPUDOCTOR_TEST_CPU_LOG by file, the costliest first (issue #35).

    GPUDOCTOR_TEST_CPU_LOG=/tmp/cpu.jsonl python -m pytest -q
    python -m tests.cpu_by_file /tmp/cpu.jsonl
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path


def main(path: str, top: int = 25) -> None:
    wall: dict[str, float] = defaultdict(float)
    cpu: dict[str, float] = defaultdict(float)
    tests: dict[str, int] = defaultdict(int)
    slowest: list[tuple[float, float, str]] = []
    for line in Path(path).read_text().splitlines():
        row = json.loads(line)
        name = row["test"].split("::")[0]
        wall[name] += row["wall_s"]
        cpu[name] += row["cpu_s"]
        tests[name] += 1
        slowest.append((row["wall_s"], row["cpu_s"], row["test"]))
    print(f"{sum(tests.values())} tests: {sum(wall.values()) / 60:.1f} min of wall, {sum(cpu.values()) / 60:.1f} "
          "min of CPU (the test process and the children it reaped)")
    print(f"{'file':<44} {'tests':>5} {'wall s':>8} {'cpu s':>8}")
    for name in sorted(cpu, key=lambda n: -cpu[n])[:top]:
        print(f"{name:<44} {tests[name]:>5} {wall[name]:>8.1f} {cpu[name]:>8.1f}")
    print("\nslowest tests (wall s, cpu s):")
    for w, c, test in sorted(slowest, reverse=True)[:top]:
        print(f"{w:8.1f} {c:8.1f}  {test}")


if __name__ == "__main__":
    main(sys.argv[1])
