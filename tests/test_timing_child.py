"""The timing children's environment: a heap kept as a training's is, so passes do not fault afresh."""

from __future__ import annotations

import subprocess
import sys

from gpudoctor.launch import timing_child

# A pass's tensors: three of 20 MiB made and freed together, ten times; the minor faults of the last nine.
FAULTS = """
import resource
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
def one_pass():
    tensors = [bytearray(20 << 20) for _ in range(3)]
    del tensors
one_pass()  # the first: every process maps it
f0 = faults()
for _ in range(9):
    one_pass()
print(faults() - f0)
"""


def _faults(env: dict[str, str]) -> int:
    out = subprocess.run([sys.executable, "-c", FAULTS], env=env, capture_output=True, text=True, check=True)
    return int(out.stdout.strip())


def test_the_child_keeps_freed_pages_where_a_fresh_process_maps_them_again() -> None:
    bare = {k: v for k, v in timing_child.child_env().items() if k not in timing_child.WARM_HEAP}
    pages = 9 * 3 * (20 << 20) // 4096
    assert _faults(bare) > pages // 3  # glibc gives the freed top of its heap back each pass: mapped afresh
    assert _faults(timing_child.child_env()) < pages // 20  # kept: the next one reuses its pages


def test_the_environments_own_heap_settings_are_left_as_they_are() -> None:
    env = timing_child.child_env({"MALLOC_TRIM_THRESHOLD_": "131072", "GPUDOCTOR_RUN_DIR": "/x"})
    assert env["MALLOC_TRIM_THRESHOLD_"] == "131072"
    assert env["GPUDOCTOR_HOOKS"] == "0" and "GPUDOCTOR_RUN_DIR" not in env
    tuned = timing_child.child_env({"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=131072"})
    assert not set(timing_child.WARM_HEAP) & set(tuned)
