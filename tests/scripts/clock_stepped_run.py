"""``gpudoctor run`` with the wall clock stepped forward mid-run, in the doctor and the training alike.

    python clock_stepped_run.py STEP_S DELAY_S OUT

The step comes DELAY_S after this starts; the training is ``clock_stepped_loop.py`` (it steps its
own clock at the same monotonic moment), recorded into OUT.
"""

import os
import runpy
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import stepped_clock  # noqa: E402

step_s, delay_s, out = float(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
os.environ[stepped_clock.ENV] = f"{time.monotonic() + delay_s!r}:{step_s!r}"
stepped_clock.install()
sys.argv = ["gpudoctor", "run", "--no-timing", "--out", out, "--", sys.executable, str(HERE / "clock_stepped_loop.py")]
runpy.run_module("gpudoctor", run_name="__main__")
