"""Sleeps a known time, then profiles ``N`` short trainings a second apart; prints each one's startup.

    python profiled_startup.py OUT PROBES_DIR [N]

Each training's true startup is measured on the process's own clock (probes' ``process_age_s``).
"""

import json
import sys
import time

sys.path.insert(0, sys.argv[2])  # probes/, for the ground-truth clock
from _common import process_age_s  # noqa: E402

import gpudoctor  # noqa: E402

seen = []
last_left = 0.0  # the process's age when the last training ended
time.sleep(1.0)
for i in range(int(sys.argv[3]) if len(sys.argv) > 3 else 1):
    if i:
        time.sleep(1.0)  # between two trainings: neither's startup
    with gpudoctor.profile(out=f"{sys.argv[1]}/run{i}", interval_s=0.05) as doc:
        entered = process_age_s()  # the process's age at profile()'s entry
        for _ in range(20):
            gpudoctor.step()
            time.sleep(0.01)
        left = process_age_s()  # the training's end, just before profile()'s
    seen.append({"entered_s": entered, "since_last_s": entered - last_left if i else None,
                 "startup": doc.report["startup"], "notes": doc.report["notes"]})
    last_left = left
print(json.dumps(seen))
