"""The doctor never changes the training (issue #39): real small loops, bare and under the doctor.

Each script in tests/scripts/transparency_*.py runs many cases in one interpreter and writes one
line per case: the sha256 of its final weights (and of the copies, saves and checkpoints it made,
and of what the user sees of the model: repr, state_dict keys, names). Each script runs bare, under
``gpudoctor run`` as users run it, and the plain loops also with the hooks going in and out
mid-loop (``gpudoctor.profile()``, what ``attach`` does to a running loop); every case must end
bit-identical, and none may fail bare. A loop met mid-run by a real ``gpudoctor attach`` (gdb) that
saves and copies its model each epoch ends as it does bare. Seeded, deterministic, a few steps each; three interpreter
start-ups per script, shared by all its cases.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT, cli_env, gpudoctor_cmd, once_more_on_gloo_abort, run_cli
from tests.test_attach import wait_until

pytestmark = pytest.mark.slow  # real trainings for most of a minute: scheduled first (conftest.py)

SCRIPTS = ROOT / "tests" / "scripts"
LOOPS = ("plain", "save_whole_each_epoch", "ema", "pickle_optimizer", "checkpointing", "checkpointing_reentrant",
         "custom_function", "amp_grad_scaler", "compile", "script_export")
FRAMEWORKS = ("hf_trainer", "lightning", "accelerate")
DDP = ("ddp_plain", "ddp_join_effective_world", "ddp_join_initial_world", "ddp_no_sync", "ddp_user_hook",
       "ddp_user_hook_join", "ddp_static_graph")
Results = dict[str, dict[str, Any]]


def _read(path: Path) -> Results:
    return {r["case"]: r for r in map(json.loads, path.read_text().splitlines()) if r}


def _both(tmp: Path, command: Callable[[Path], list[str]], read: Callable[[Path], Results],
          together: bool = True) -> tuple[Results, Results]:
    """The command bare and under ``gpudoctor run``, at the same time (bit-identical results do not depend
    on what else the machine runs); each writes its results to the path it is given, and its scratch
    (the scripts' folders, torchrun's) under ``tmp``, not in /tmp."""
    from concurrent.futures import ThreadPoolExecutor

    scratch = {"TMPDIR": str(tmp)}

    if not together:  # two 2-rank gloo jobs at once: a rank of the bare one aborted ("terminate called") in CI
        bare = once_more_on_gloo_abort(lambda: subprocess.run(command(tmp / "bare"), capture_output=True, text=True,
                                                              timeout=600, env=cli_env(scratch), cwd=tmp))
        doctored = once_more_on_gloo_abort(lambda: run_cli("run", "--out", str(tmp / "run"), "--",
                                                           *command(tmp / "doctored"), timeout=600, cwd=tmp,
                                                           env=scratch),
                                           fresh=tmp / "run")
        assert bare.returncode == 0, bare.stderr[-3000:]
        assert doctored.returncode == 0, doctored.stderr[-3000:]
        assert "when there are global hooks" not in doctored.stderr
        return read(tmp / "bare"), read(tmp / "doctored")
    with ThreadPoolExecutor(2) as pool:
        under = pool.submit(run_cli, "run", "--out", str(tmp / "run"), "--", *command(tmp / "doctored"),
                            timeout=600, cwd=tmp, env=scratch)
        bare = subprocess.run(command(tmp / "bare"), capture_output=True, text=True, timeout=600, env=cli_env(scratch),
                              cwd=tmp)
        doctored = under.result()
    assert bare.returncode == 0, bare.stderr[-3000:]
    assert doctored.returncode == 0, doctored.stderr[-3000:]
    assert "when there are global hooks" not in doctored.stderr  # torch.compile's warning: ours don't count
    return read(tmp / "bare"), read(tmp / "doctored")


@pytest.fixture(scope="module")
def loops(tmp_path_factory: pytest.TempPathFactory) -> tuple[Results, Results, Results]:
    tmp = tmp_path_factory.mktemp("transparency-loops")
    bare, doctored = _both(tmp, lambda out: [sys.executable, str(SCRIPTS / "transparency_loops.py"), str(out)], _read)
    attached = subprocess.run([sys.executable, str(SCRIPTS / "transparency_loops.py"), str(tmp / "attached"),
                               "--profile", str(tmp / "profiles")], capture_output=True, text=True, timeout=600,
                              env=cli_env({"TMPDIR": str(tmp)}), cwd=tmp)
    assert attached.returncode == 0, attached.stderr[-3000:]
    return bare, doctored, _read(tmp / "attached")


@pytest.fixture(scope="module")
def frameworks(tmp_path_factory: pytest.TempPathFactory) -> tuple[Results, Results]:
    tmp = tmp_path_factory.mktemp("transparency-frameworks")
    return _both(tmp, lambda out: [sys.executable, str(SCRIPTS / "transparency_frameworks.py"), str(out)], _read)


@pytest.fixture(scope="module")
def ddp(tmp_path_factory: pytest.TempPathFactory) -> tuple[Results, Results]:
    tmp = tmp_path_factory.mktemp("transparency-ddp")
    torchrun = shutil.which("torchrun") or str(Path(sys.executable).parent / "torchrun")  # --standalone: a free port

    def read(out: Path) -> Results:
        ranks = [_read(Path(f"{out}.rank{r}")) for r in (0, 1)]
        return {case: {"sha256": [rank[case]["sha256"] for rank in ranks]} for case in ranks[0]}

    return _both(tmp, lambda out: [torchrun, "--standalone", "--nproc-per-node", "2", str(SCRIPTS / "transparency_ddp.py"),
                                   str(out)], read, together=False)


def _attach_loop(tmp: Path, attach: bool) -> str:
    """tests/scripts/transparency_attach.py, bare or with ``gpudoctor attach`` from its 5th step."""
    env = {k: v for k, v in cli_env({"TMPDIR": str(tmp)}).items() if not k.startswith("GPUDOCTOR_")}
    go, log, out = tmp / "go", tmp / "steps.log", tmp / "hash"
    if not attach:
        go.touch()
    loop = subprocess.Popen([sys.executable, str(SCRIPTS / "transparency_attach.py"), str(out), "--go", str(go),
                             "--step-log", str(log)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, cwd=tmp)
    doctor = None
    if attach:
        wait_until(lambda: log.exists() and log.read_text().count("\n") >= 5, "the loop at its 5th step")
        doctor = subprocess.Popen([*gpudoctor_cmd("attach", str(loop.pid), "--out", str(tmp / "run"))],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                                  env=dict(os.environ, PYTHONPATH=str(ROOT)))
        events = tmp / "run" / "events" / f"{loop.pid}.jsonl"
        with contextlib.suppress(AssertionError):  # not in after 30 s: gdb failed, said in meta.json
            wait_until(lambda: events.exists() and events.stat().st_size > 0, "the hooks are in", timeout_s=30)
        go.touch()
        if not events.exists():  # gdb could not inject here: the patient must still end well, then skip
            _, err = loop.communicate(timeout=300)
            doctor.communicate(timeout=120)
            assert loop.returncode == 0, err[-3000:]
            pytest.skip(f"gdb cannot inject on this machine: {_inject_error(tmp / 'run')}")
    _, err = loop.communicate(timeout=300)
    assert loop.returncode == 0, err[-3000:]
    if doctor is not None:
        _, derr = doctor.communicate(timeout=120)
        assert doctor.returncode == 0, derr[-3000:]
        events = (tmp / "run" / "events" / f"{loop.pid}.jsonl").read_text()
        assert '"k":"step"' in events  # the doctor was in while it trained
    return out.read_text()


def _inject_error(run: Path) -> str:
    try:
        targets = json.loads((run / "meta.json").read_text())["attach"]["targets"]
    except (OSError, ValueError, KeyError, TypeError):
        return ""
    return str(next((t["error"] for t in targets if t.get("error")), ""))


@pytest.mark.gdb_inject  # where gdb cannot call into a process the patient lives on (tests/test_attach_units.py)
def test_a_loop_attached_mid_run_that_saves_and_copies_its_model_ends_bit_identical(tmp_path: Path) -> None:
    (tmp_path / "bare").mkdir()
    (tmp_path / "attached").mkdir()
    assert _attach_loop(tmp_path / "attached", attach=True) == _attach_loop(tmp_path / "bare", attach=False)


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
