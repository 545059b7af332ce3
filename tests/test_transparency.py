"""The doctor never changes the training (issue #39): real small loops, bare and under the doctor.

Each script in tests/scripts/transparency_*.py runs many cases in one interpreter and writes one
line per case: the sha256 of its final weights (and of the copies, saves and checkpoints it made,
and of what the user sees of the model: repr, state_dict keys, names). Each script runs bare, under
``gpudoctor run`` as users run it, and the plain loops also with the hooks going in and out
mid-loop (``gpudoctor.profile()``, what ``attach`` does to a running loop); every case must end
bit-identical, and none may fail bare. Seeded, deterministic, a few steps each; three interpreter
start-ups per script, shared by all its cases.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT, run_cli

SCRIPTS = ROOT / "tests" / "scripts"
LOOPS = ("plain", "save_whole_each_epoch", "ema", "pickle_optimizer", "checkpointing", "checkpointing_reentrant",
         "custom_function", "amp_grad_scaler", "compile", "script_export")
FRAMEWORKS = ("hf_trainer", "lightning", "accelerate")
DDP = ("ddp_plain", "ddp_join_effective_world", "ddp_join_initial_world", "ddp_no_sync", "ddp_user_hook",
       "ddp_user_hook_join", "ddp_static_graph")
Results = dict[str, dict[str, Any]]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("GPUDOCTOR_RUN_DIR", None)
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def _read(path: Path) -> Results:
    return {r["case"]: r for r in map(json.loads, path.read_text().splitlines()) if r}


def _both(tmp: Path, command: Callable[[Path], list[str]], read: Callable[[Path], Results]) -> tuple[Results, Results]:
    """The command bare and under ``gpudoctor run``; each writes its results to the path it is given."""
    bare = subprocess.run(command(tmp / "bare"), capture_output=True, text=True, timeout=600, env=_env(), cwd=tmp)
    assert bare.returncode == 0, bare.stderr[-3000:]
    doctored = run_cli("run", "--out", str(tmp / "run"), "--", *command(tmp / "doctored"), timeout=600, cwd=tmp)
    assert doctored.returncode == 0, doctored.stderr[-3000:]
    return read(tmp / "bare"), read(tmp / "doctored")


@pytest.fixture(scope="module")
def loops(tmp_path_factory: pytest.TempPathFactory) -> tuple[Results, Results, Results]:
    tmp = tmp_path_factory.mktemp("transparency-loops")
    bare, doctored = _both(tmp, lambda out: [sys.executable, str(SCRIPTS / "transparency_loops.py"), str(out)], _read)
    attached = subprocess.run([sys.executable, str(SCRIPTS / "transparency_loops.py"), str(tmp / "attached"),
                               "--profile", str(tmp / "profiles")], capture_output=True, text=True, timeout=600,
                              env=_env(), cwd=tmp)
    assert attached.returncode == 0, attached.stderr[-3000:]
    return bare, doctored, _read(tmp / "attached")


@pytest.fixture(scope="module")
def frameworks(tmp_path_factory: pytest.TempPathFactory) -> tuple[Results, Results]:
    tmp = tmp_path_factory.mktemp("transparency-frameworks")
    return _both(tmp, lambda out: [sys.executable, str(SCRIPTS / "transparency_frameworks.py"), str(out)], _read)


@pytest.fixture(scope="module")
def ddp(tmp_path_factory: pytest.TempPathFactory) -> tuple[Results, Results]:
    tmp = tmp_path_factory.mktemp("transparency-ddp")
    torchrun = shutil.which("torchrun") or str(Path(sys.executable).parent / "torchrun")

    def read(out: Path) -> Results:
        ranks = [_read(Path(f"{out}.rank{r}")) for r in (0, 1)]
        return {case: {"sha256": [rank[case]["sha256"] for rank in ranks]} for case in ranks[0]}

    return _both(tmp, lambda out: [torchrun, "--nproc-per-node", "2", str(SCRIPTS / "transparency_ddp.py"),
                                   str(out)], read)


@pytest.mark.parametrize("case", LOOPS)
def test_a_plain_loop_ends_bit_identical_under_run_and_attach(loops: tuple[Results, Results, Results],
                                                              case: str) -> None:
    bare, doctored, attached = loops
    assert "error" not in bare[case], bare[case]
    assert doctored[case] == bare[case]
    assert attached[case] == bare[case]


@pytest.mark.parametrize("case", FRAMEWORKS)
def test_a_framework_loop_ends_bit_identical_under_run(frameworks: tuple[Results, Results], case: str) -> None:
    bare, doctored = frameworks
    assert "error" not in bare[case], bare[case]
    assert doctored[case] == bare[case]


@pytest.mark.parametrize("case", DDP)
def test_ddp_ends_bit_identical_under_run_on_every_rank(ddp: tuple[Results, Results], case: str) -> None:
    bare, doctored = ddp
    assert doctored[case] == bare[case]
