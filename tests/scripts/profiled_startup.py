"""A script that sleeps a known time before ``gpudoctor.profile()``: its startup, on the process's own clock."""

import json
import sys
import time

sys.path.insert(0, sys.argv[2])  # probes/, for the ground-truth clock
from _common import process_age_s  # noqa: E402

import gpudoctor  # noqa: E402

time.sleep(1.0)
with gpudoctor.profile(out=sys.argv[1], interval_s=0.05) as doc:
    entered = process_age_s()  # the startup profile() should count: process start -> here
    for _ in range(20):
        gpudoctor.step()
        time.sleep(0.01)
print(json.dumps({"entered_s": entered, "startup": doc.report["startup"]}))
