"""``gpudoctor attach PID``: diagnose a training process that was not started under the doctor.

Two sources feed one run folder, so ``attach`` ends in the same analysis and
report as ``run``:

* outside, always: py-spy stack samples of the process tree (:mod:`.stacks`,
  classified by :mod:`.classify`) plus the psutil and NVML samplers;
* inside, when it can: the in-process hooks, loaded into the live interpreter
  (:mod:`.inject` puts :mod:`.payload` in with gdb, or ``sys.remote_exec`` on
  3.14+) and removed again on detach.

:mod:`.session` runs the two side by side. This package is imported inside the
patient (for :mod:`.payload`), so this file imports nothing.
"""
