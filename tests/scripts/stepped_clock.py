"""The machine's wall clock stepped forward at one moment, in every process that calls :func:`install`.

``GPUDOCTOR_TEST_CLOCK_STEP=AT:S``: from ``time.monotonic() >= AT`` on (the monotonic clock is the
machine's, shared by its processes), ``time.time()`` reads S seconds later, as after an NTP step or
a resumed virtual machine.
"""

import os
import time

ENV = "GPUDOCTOR_TEST_CLOCK_STEP"


def install() -> None:
    at, step = (float(x) for x in os.environ[ENV].split(":"))
    real = time.time
    time.time = lambda: real() + (step if time.monotonic() >= at else 0.0)
