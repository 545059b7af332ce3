"""docs/ci.md's GitHub Actions workflow, run here: its ``run:`` steps as written, in order.

A two-commit repository stands in for a pull request: its base trains the heavy_checkpoints
probe saving every step, its head saves every fourth. Each step runs the way the runner runs
it (``bash --noprofile --norc -eo pipefail``, ``${{ }}`` expressions filled in, the workflow's
env), with ``gh`` and ``pip`` replaced by stand-ins that record their arguments; the steps that
``uses:`` an action are GitHub's own (the checkout is the repository made here).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpudoctor.render.markdown import COMMENT_LIMIT
from tests.conftest import PROBES, ROOT

DOC = ROOT / "docs" / "ci.md"
TRAIN_CMD = "python train.py --steps 8"  # the doc's TRAIN_CMD, shortened for the suite
EXPR = re.compile(r"\$\{\{\s*(.*?)\s*\}\}")


def workflow() -> dict[str, Any]:
    blocks = re.findall(r"```yaml\n(.*?)```", DOC.read_text(), re.S)
    assert len(blocks) == 1, "docs/ci.md holds one workflow"
    return yaml.safe_load(blocks[0])


def _steps() -> list[dict[str, Any]]:
    """Every job's steps, in the order the jobs run (``profile``, then ``comment``, which needs it)."""
    jobs = workflow()["jobs"]
    assert list(jobs) == ["profile", "comment"] and jobs["comment"]["needs"] == "profile"
    return [step for job in jobs.values() for step in job["steps"]]


def test_the_workflow_is_a_pull_request_job_that_may_comment() -> None:
    wf = workflow()
    on = wf.get("on", wf.get(True))  # YAML 1.1 reads a bare `on` key as true
    assert "pull_request" in on
    assert wf["permissions"] == {}  # nothing by default: each job says what it needs
    steps = _steps()
    uses = [s["uses"] for s in steps if "uses" in s]
    assert all(re.fullmatch(r"actions/(checkout|setup-python|upload-artifact|download-artifact)@v\d+", u)
               for u in uses)
    checkout = next(s for s in steps if s.get("uses", "").startswith("actions/checkout"))
    assert checkout["with"]["fetch-depth"] == 0  # the base commit must be there
    names = [s.get("name") for s in steps]
    comment, check = names.index("Comment on the pull request"), names.index("Check wasted time")
    assert comment < check  # a failing check still leaves its comment
    assert next(s for s in steps if s.get("uses", "").startswith("actions/upload-artifact"))["if"] == "always()"
    assert all(set(s) <= {"name", "run", "uses", "with", "env", "if"} for s in steps)


def test_the_job_that_runs_the_pull_requests_code_holds_no_write_token() -> None:
    """Issue 26, finding 10: profile with a read-only token left nowhere on disk; post from a job that
    runs none of the pull request's code; and say the gate is no security boundary."""
    jobs = workflow()["jobs"]
    profile, comment = jobs["profile"], jobs["comment"]
    assert profile["permissions"] == {"contents": "read"}
    checkout = next(s for s in profile["steps"] if s.get("uses", "").startswith("actions/checkout"))
    assert checkout["with"]["persist-credentials"] is False
    runs = " ".join(s.get("run", "") for s in profile["steps"])
    assert "TRAIN_CMD" in runs and "github.token" not in yaml.safe_dump(profile) and "gh " not in runs
    assert comment["permissions"] == {"pull-requests": "write"}
    assert not any(s.get("uses", "").startswith("actions/checkout") for s in comment["steps"])
    comment_runs = " ".join(s.get("run", "") for s in comment["steps"])
    assert "TRAIN_CMD" not in comment_runs and "gpudoctor run" not in comment_runs and "train.py" not in comment_runs
    assert any(s.get("uses", "").startswith("actions/download-artifact") for s in comment["steps"])
    text = " ".join(DOC.read_text().split())
    assert "Not a security boundary" in text and "workflow_run" in text


def _stand_ins(folder: Path, log: Path) -> None:
    """``gh``/``pip`` that record their arguments; ``gpudoctor``/``python`` of this checkout."""
    record = (f"#!{sys.executable}\nimport json, pathlib, shutil, sys\n"
              f"log = pathlib.Path({str(log)!r})\n"
              "args = sys.argv[1:]\n"
              "entry = {'tool': pathlib.Path(sys.argv[0]).name, 'args': args}\n"
              "if '--body-file' in args:\n"
              "    entry['body'] = pathlib.Path(args[args.index('--body-file') + 1]).read_text()\n"
              "with log.open('a') as fh:\n"
              "    fh.write(json.dumps(entry) + '\\n')\n")
    tools = {"gh": record, "pip": record,
             "gpudoctor": f'#!/bin/sh\nexec "{sys.executable}" -m gpudoctor "$@"\n',
             "python": f'#!/bin/sh\nexec "{sys.executable}" "$@"\n'}
    folder.mkdir()
    for name, text in tools.items():
        path = folder / name
        path.write_text(text)
        path.chmod(path.stat().st_mode | stat.S_IXUSR)


def _git(repo: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.com"}
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True,
                          env=env).stdout.strip()


def _pull_request(repo: Path) -> str:
    """A repository whose head commit saves checkpoints every 4 steps instead of every step; the base sha."""
    repo.mkdir()
    shutil.copy(PROBES / "_common.py", repo / "_common.py")
    train = repo / "train.py"
    shutil.copy(PROBES / "heavy_checkpoints.py", train)
    _git(repo, "init", "-q")
    _git(repo, "add", ".")
    _git(repo, "commit", "-q", "-m", "base")
    base = _git(repo, "rev-parse", "HEAD")
    text = train.read_text()
    old = '"--save-every", type=int, default=1,'
    assert old in text
    train.write_text(text.replace(old, '"--save-every", type=int, default=4,'))
    _git(repo, "commit", "-q", "-am", "save less often")
    return base


def _run_step(step: dict[str, Any], env: dict[str, str], values: dict[str, str], cwd: Path,
              tmp: Path) -> subprocess.CompletedProcess[str]:
    def fill(text: str) -> str:
        return EXPR.sub(lambda m: values[m.group(1)], text)  # an expression not emulated here: KeyError

    script = tmp / "step.sh"
    script.write_text(fill(step["run"]))
    step_env = {**env, **{k: fill(str(v)) for k, v in (step.get("env") or {}).items()}}
    return subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", str(script)], cwd=cwd,
                          env=step_env, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_the_workflow_steps_profile_both_commits_comment_the_diff_and_gate(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    repo = ws / "repo"
    base = _pull_request(repo)
    log = tmp_path / "tools.jsonl"
    _stand_ins(tmp_path / "bin", log)
    wf = workflow()
    env = {**os.environ, **{k: str(v) for k, v in wf["env"].items()}, "TRAIN_CMD": TRAIN_CMD,
           "GITHUB_WORKSPACE": str(repo), "GITHUB_REPOSITORY": "octo/trainer",
           "PATH": f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}",
           "PYTHONPATH": str(ROOT) + (os.pathsep + os.environ["PYTHONPATH"] if os.environ.get("PYTHONPATH") else "")}
    env.pop("GPUDOCTOR_RUN_DIR", None)
    values = {"github.event.pull_request.base.sha": base, "github.event.pull_request.number": "7",
              "github.token": "stand-in-token"}
    results = {}
    for step in _steps():
        if "run" in step:
            results[step["name"]] = proc = _run_step(step, env, values, repo, tmp_path)
            if step["name"] != "Check wasted time":
                assert proc.returncode == 0, f"{step['name']}: {proc.stderr[-2000:]}"

    calls = [json.loads(line) for line in log.read_text().splitlines()]
    assert [c["tool"] for c in calls] == ["pip", "pip", "pip", "gh"]  # profile's two, comment's one
    gh = calls[-1]
    assert gh["args"][:2] == ["pr", "comment"] and gh["args"][2] == "7"
    assert {"--edit-last", "--create-if-none"} <= set(gh["args"]) and "octo/trainer" in gh["args"]
    body = gh["body"]
    assert body.startswith("### gpudoctor diff: ") and len(body) <= COMMENT_LIMIT
    assert "| checkpoint |" in body

    before = json.loads((repo / "gpudoctor" / "before" / "report.json").read_text())
    after = json.loads((repo / "gpudoctor" / "after" / "report.json").read_text())
    assert before["steps"]["count"] == after["steps"]["count"] == 8
    assert before["saves"]["checkpoints"] == 8 and after["saves"]["checkpoints"] == 2  # base vs head
    assert "checkpoint_overhead" in body  # the base's finding, and what became of it
    # the gate: exit 1 exactly when the pull request's run wastes more than MAX_WASTE
    wasted, allowed = after["cost"]["wasted_fraction"], float(wf["env"]["MAX_WASTE"])
    assert results["Check wasted time"].returncode == (1 if wasted > allowed else 0)
    # and had the pull request been the base (saving every step), a strict gate fails the check
    shutil.rmtree(repo / "gpudoctor" / "after")
    shutil.copytree(repo / "gpudoctor" / "before", repo / "gpudoctor" / "after")
    gate = next(s for s in _steps() if s.get("name") == "Check wasted time")
    strict = _run_step(gate, {**env, "MAX_WASTE": "0"}, values, repo, tmp_path)
    assert before["cost"]["wasted_fraction"] > 0
    assert strict.returncode == 1 and "FAIL" in strict.stderr
