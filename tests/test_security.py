"""Reports land in pull requests: no secret in a run folder, no script through a report, no
port opened, nothing written outside the run folder, and the folder private to its user."""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
import time

import psutil
import pytest

from gpudoctor.common.redact import (
    REDACTED,
    is_secret_name,
    redact_argv,
    redact_mapping,
    redact_value,
)
from tests.conftest import ROOT, gpudoctor_cmd

HOSTILE = "<script>alert(1)</script>"
SECRETS = {
    "--hf-token": "hf_abcdefghijklmnopqrstuvwxyz123456",
    "--api-key": "sk-proj-abcdefghijklmnopqrstuvwxyz0123",
    "HF_TOKEN": "hf_envtokenABCDEFGHIJKLMNOPQRSTUV",
    "WANDB_API_KEY": "0123456789abcdef0123456789abcdef01234567",
    "MY_DB_PASSWORD": "correct-horse-battery-staple",
    "GPUDOCTOR_TEST_CANARY": "canary-env-value-not-a-secret-7731",  # any env value: never recorded
}
# Issue 12's redaction gaps, planted in the command line too (tests/test_redact.py has the rest).
ARGV_SECRETS = {
    "json": "json-hub-token-value-4417", "short-p": "mysqlPw-5521", "empty-user": "redisPw-9932",
    "dashes": "--dash-started-pw-1180", "glpat": "glpat-abcdefghij0123456789",
}


@pytest.fixture(scope="module")
def hostile_run(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """A real run of a script whose path and arguments carry markup, with secrets in argv and env.

    While it runs, the doctor's and the training's sockets and open files are watched.
    """
    tmp = tmp_path_factory.mktemp("hostile")
    script_dir = tmp / "<script>alert(1)<" / "script><img src=x onerror=alert(2)>"  # path holds HOSTILE
    script_dir.mkdir(parents=True)
    script = script_dir / "train<b>'\"&.py"
    shutil.copy(ROOT / "tests" / "scripts" / "tiny_loop.py", script)
    assert HOSTILE in str(script)
    folder = tmp / "run"
    cwd = tmp / "cwd"
    cwd.mkdir()
    env = {**os.environ, "PYTHONPATH": str(ROOT),
           **{k: v for k, v in SECRETS.items() if not k.startswith("--")}}
    cmd = gpudoctor_cmd("run", "--out", str(folder), "--", sys.executable, str(script), "--seconds", "2.5",
                        "--note", HOSTILE, "--hf-token", SECRETS["--hf-token"], f"--api-key={SECRETS['--api-key']}",
                        "--config", json.dumps({"hub_token": ARGV_SECRETS["json"]}), "-p", ARGV_SECRETS["short-p"],
                        "--cache", f"redis://:{ARGV_SECRETS['empty-user']}@localhost:6379",
                        "--password", ARGV_SECRETS["dashes"], "--note2", ARGV_SECRETS["glpat"])
    doctor = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env, cwd=cwd)
    sockets: list[str] = []
    written: set[str] = set()
    while doctor.poll() is None:
        try:
            procs = [psutil.Process(doctor.pid), *psutil.Process(doctor.pid).children(recursive=True)]
            for proc in procs:
                sockets += [f"{proc.pid}: {c}" for c in proc.net_connections(kind="inet")]
                written |= {f.path for f in proc.open_files() if f.mode != "r"}
        except psutil.NoSuchProcess:
            pass
        time.sleep(0.1)
    _, err = doctor.communicate()
    assert doctor.returncode == 0, err
    return {"folder": folder, "cwd": cwd, "sockets": sockets, "written": written, "stderr": err}


def _outside_code(markdown: str) -> str:
    """Markdown with fenced blocks and inline code spans removed (CommonMark shows those literally)."""
    text = re.sub(r"(?ms)^(`{3,}|~{3,}).*?^\1\s*$", "", markdown)
    return re.sub(r"(`+)(?!`).+?(?<!`)\1(?!`)", "", text)


def test_no_raw_markup_from_the_run_in_html_or_markdown(hostile_run):
    folder = hostile_run["folder"]
    html = (folder / "report.html").read_text()
    assert "<script>alert" not in html and "<img src=x" not in html and "train<b>" not in html
    assert "&lt;script&gt;alert(1)" in html  # shown, escaped: not dropped
    md = (folder / "report.md").read_text()
    assert "alert(1)" in md
    prose = _outside_code(md)
    assert "<script" not in prose and "<img" not in prose and "train<b>" not in prose


def test_no_secret_anywhere_in_the_run_folder(hostile_run):
    folder = hostile_run["folder"]
    files = [p for p in folder.rglob("*") if p.is_file()]
    assert any(p.suffix == ".jsonl" for p in files)
    for path in files:
        data = path.read_bytes()
        for name, value in {**SECRETS, **ARGV_SECRETS}.items():
            assert value.encode() not in data, f"{name} leaked into {path.name}"
    command = json.loads((folder / "report.json").read_text())["run"]["command"]
    assert command[command.index("--hf-token") + 1] == REDACTED
    assert f"--api-key={REDACTED}" in command


def test_the_report_never_dumps_the_environment(hostile_run):
    text = (hostile_run["folder"] / "report.json").read_text() + (hostile_run["folder"] / "meta.json").read_text()
    for name in ("HF_TOKEN", "WANDB_API_KEY", "MY_DB_PASSWORD", "GPUDOCTOR_TEST_CANARY", "PATH="):
        assert name not in text


def test_the_run_folder_is_private_to_its_user(hostile_run):
    folder = hostile_run["folder"]
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    for sub in ("samples", "events"):
        assert stat.S_IMODE((folder / sub).stat().st_mode) == 0o700
    for path in folder.rglob("*"):
        if path.is_file():
            assert stat.S_IMODE(path.stat().st_mode) == 0o600, path


def test_no_network_port_and_no_writes_outside_the_run_folder(hostile_run):
    assert hostile_run["sockets"] == []
    folder = str(hostile_run["folder"].resolve())
    # The run history (docs/history.md) is the one write elsewhere, where the user put it (conftest's
    # GPUDOCTOR_HISTORY): sqlite's database and its journal files, caught open when the poll falls on it.
    history = os.environ["GPUDOCTOR_HISTORY"]
    outside = [p for p in hostile_run["written"] if not p.startswith(folder) and not p.startswith("/dev/")
               and p not in (history, f"{history}-wal", f"{history}-shm", f"{history}-journal")]
    assert outside == []
    assert any(p.startswith(folder + "/events/") for p in hostile_run["written"])  # the hooks' own file
    assert list(hostile_run["cwd"].iterdir()) == []  # nothing left in the working directory


# -- what is and is not a secret -------------------------------------------------------------

@pytest.mark.parametrize("name", ["HF_TOKEN", "hub_token", "--hf-token", "--api-key", "WANDB_API_KEY",
                                  "MY_DB_PASSWORD", "db_passwd", "AWS_SECRET_ACCESS_KEY", "client_secret",
                                  "private_key", "oauth_token", "credentials", "passphrase",
                                  "HUGGING_FACE_HUB_TOKEN", "key"])  # a bare --key holds one (issue 12)
def test_secret_names(name):
    assert is_secret_name(name)


@pytest.mark.parametrize("name", ["max_tokens", "pad_token_id", "num_tokens", "max_new_tokens", "--max-new-tokens",
                                  "tokenizer_name", "tokenize", "eos_token", "pad_token", "input_ids", "author",
                                  "token_budget", "tokens_per_batch", "learning_rate", "sort_key", "max_length"])
def test_not_secret_names(name):
    assert not is_secret_name(name)


def test_redact_argv_hides_values_not_structure():
    argv = ["python", "train.py", "--hf-token", "hf_abcdefghijklmnopqrstuvwxyz123456", "--api-key=sk-xyz",
            "--max-tokens", "512", "--pad_token_id=0", "HF_TOKEN=abc", "--use-auth-token", "--lr", "3e-4",
            "--resume", "https://user:pw@example.com/ckpt", "--note", HOSTILE]
    assert redact_argv(argv) == [
        "python", "train.py", "--hf-token", REDACTED, f"--api-key={REDACTED}", "--max-tokens", "512",
        "--pad_token_id=0", f"HF_TOKEN={REDACTED}", "--use-auth-token", "--lr", "3e-4",
        "--resume", f"https://{REDACTED}@example.com/ckpt", "--note", HOSTILE]


def test_secret_looking_values_are_masked_whatever_their_name():
    text = "push with hf_abcdefghijklmnopqrstuvwxyz123456 and ghp_abcdefghijklmnopqrstuvwxyz"
    assert redact_value(text) == f"push with {REDACTED} and {REDACTED}"
    assert redact_value("lr=3e-4, max_tokens=512") == "lr=3e-4, max_tokens=512"


def test_redact_mapping_keeps_counts_and_hides_tokens():
    args = {"hub_token": "hf_x", "push_to_hub_token": None, "max_tokens": 512, "pad_token_id": 0,
            "nested": {"wandb_api_key": "k", "run_name": "sk-abcdefghijklmnopqrstuvwxyz"}, "report_to": ["wandb"]}
    assert redact_mapping(args) == {
        "hub_token": REDACTED, "push_to_hub_token": None, "max_tokens": 512, "pad_token_id": 0,
        "nested": {"wandb_api_key": REDACTED, "run_name": REDACTED}, "report_to": ["wandb"]}
