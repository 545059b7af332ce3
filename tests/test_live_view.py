"""The live panel of ``run`` (issue #36 item 2): its figures from a real recording, the tail that reads
only new bytes, the off-switches (no terminal, --quiet, --json, CI) and the panel on a real terminal."""

from __future__ import annotations

import json
import os
import pty
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpudoctor.live.pace import PaceReader, steps_per_s
from gpudoctor.live.snapshot import last_data_time, take
from gpudoctor.live.view import LiveView
from gpudoctor.recording.store import load_recording
from gpudoctor.recording.tail import FileTail
from gpudoctor.render.live_panel import PanelFigures, panel_lines
from gpudoctor.render.progress import live_output
from gpudoctor.report.build import build_report
from tests.conftest import ROOT, gpudoctor_cmd, run_cli

pytestmark = pytest.mark.slow  # real trainings for most of a minute: scheduled first (conftest.py)

STALL = ROOT / "tests" / "scripts" / "stall_loop.py"
TINY = ROOT / "tests" / "scripts" / "tiny_loop.py"


@pytest.fixture(scope="module")
def stalled(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real run folder of a loop that waits on its data (its report is the truth to match)."""
    folder = tmp_path_factory.mktemp("live") / "run"
    done = run_cli("run", "--no-timing", "--out", str(folder), "--", sys.executable, str(STALL), "--steps", "150")
    assert done.returncode == 0, done.stderr
    return folder


def test_the_panel_says_the_reports_figures_of_a_real_recording(stalled: Path) -> None:
    """The report of the recording up to its last line (the panel's "so far"), and the final report:
    the same top finding; the final one also counts the exit after the last step."""
    final = json.loads((stalled / "report.json").read_text())
    rec = load_recording(stalled)
    rec.meta["end_time"] = last_data_time(rec.events, stalled)
    so_far = build_report(rec)
    view = LiveView(stalled, "gpudoctor run", sys.stderr)
    view.analyst.latest = take(stalled)  # type: ignore[union-attr]  # what the analysis thread takes
    f = view.figures()
    assert f.steps == final["steps"]["count"] == 150
    assert f.top_rule == so_far["findings"][0]["rule"] == final["findings"][0]["rule"]
    assert f.top_share == pytest.approx(so_far["findings"][0]["waste_fraction"], abs=0.001)
    assert f.breakdown is not None
    assert f.breakdown["data_wait"] == pytest.approx(so_far["breakdown"]["data_wait"], abs=0.001)
    assert f.gpus == 0  # no GPU here: said, not "GPU busy 0%"
    head, body = panel_lines(f)
    assert f"top finding: {f.top_rule} {100 * f.top_share:.0f}%" in head and "no GPU" in head
    assert f"data_wait {100 * f.breakdown['data_wait']:.0f}%" in body


def test_the_tail_reads_only_the_lines_added_and_holds_an_unfinished_one(tmp_path: Path) -> None:
    path = tmp_path / "1.jsonl"
    path.write_bytes(b'{"k":"step","t":1.0,"n":1}\n{"k":"step","t":2.0')
    tail = FileTail(path)
    assert [e["n"] for e in tail.read()] == [1]
    with path.open("ab") as fh:
        fh.write(b',"n":2}\n{"k":"step","t":3.0,"n":3}\n')
    assert [e["n"] for e in tail.read()] == [2, 3]
    assert tail.read() == [] and tail.offset == path.stat().st_size
    with path.open("ab") as fh:  # a line over the cap is skipped, never held
        fh.write(b'{"k":"x","v":"' + b"a" * (5 * 2**20) + b'"}\n{"k":"step","t":4.0,"n":4}\n')
    got = tail.read() + tail.read()
    assert [e["n"] for e in got if e.get("k") == "step"] == [4] and len(tail.partial) < 2**20


def test_steps_per_second_over_the_last_steps_and_falling_while_none_comes() -> None:
    times = [100 + 0.5 * i for i in range(40)]  # 2 steps/s, the last at 119.5
    assert steps_per_s(times, 119.5) == pytest.approx(2.0, rel=0.06)
    slow = [100.0, 110.0, 120.0]  # 10 s steps
    assert steps_per_s(slow, 121.0) == pytest.approx(0.1)
    assert steps_per_s(slow, 160.0) == pytest.approx(1 / 40)  # 40 s without a step
    assert steps_per_s([100.0], 101.0) is None


def test_pace_from_a_real_recording(stalled: Path) -> None:
    pace = PaceReader(stalled).read()
    assert pace.steps == 150 and pace.steps_per_s is not None and pace.gpus == 0


def test_a_figure_not_observed_is_said_so() -> None:
    head, body = panel_lines(PanelFigures("gpudoctor run", 3.0))
    assert "no training step yet" in head and "GPU busy unavailable yet" in head
    assert "top finding: after the first analysis" in head and "after the first analysis" in body


@pytest.mark.parametrize(("env", "quiet", "as_json"), [({}, True, False), ({}, False, True),
                                                         ({"CI": "true"}, False, False)])
def test_the_off_switches(monkeypatch: pytest.MonkeyPatch, env: dict[str, str], quiet: bool,
                          as_json: bool) -> None:
    class Tty:
        def isatty(self) -> bool:
            return True

    monkeypatch.delenv("CI", raising=False)
    monkeypatch.setenv("TERM", "xterm")
    assert live_output(Tty())  # type: ignore[arg-type]
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert not live_output(Tty(), quiet=quiet, as_json=as_json)  # type: ignore[arg-type]


def _pty_run(args: list[str], env: dict[str, str], limit_s: float = 120) -> tuple[int, bytes]:
    """``gpudoctor ARGS`` with stdout and stderr on a pseudo-terminal of 100x30; what it drew, raw."""
    master, slave = pty.openpty()
    os.set_inheritable(slave, True)
    import fcntl
    import struct
    import termios

    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 100, 0, 0))
    proc = subprocess.Popen(gpudoctor_cmd(*args), stdin=subprocess.DEVNULL, stdout=slave, stderr=slave,
                            env=env, cwd=ROOT)
    os.close(slave)
    out = b""
    deadline = time.time() + limit_s
    while time.time() < deadline:
        ready, _, _ = select.select([master], [], [], 0.5)
        if ready:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # the slave side closed: the command ended
                break
            if not chunk:
                break
            out += chunk
        elif proc.poll() is not None:
            break
    os.close(master)
    return proc.wait(timeout=30), out


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "GPUDOCTOR_RUN_DIR")}
    env.update(PYTHONPATH=str(ROOT), TERM="xterm", **extra)
    return env


def test_the_panel_appears_updates_and_leaves_the_trainings_lines_on_a_terminal(tmp_path: Path) -> None:
    code, out = _pty_run(["run", "--out", str(tmp_path / "run"), "--", sys.executable, str(TINY),
                          "--seconds", "7"], _env())
    text = out.decode(errors="replace")
    assert code == 0, text[-2000:]
    assert "\x1b[1;28r" in text and "\x1b[r" in text  # the bottom 2 rows reserved, then given back
    drawn = [int(n) for n in __import__("re").findall(r"gpudoctor run · (\d+) s · ", text)]
    assert len(set(drawn)) >= 3 and drawn == sorted(drawn)  # redrawn as the seconds pass
    assert "steps/s" in text and "no GPU" in text
    assert "step 1\r\n" in text and "step 101\r\n" in text  # the training's own lines, whole
    assert "report:" in text


@pytest.mark.parametrize("how", ["--quiet", "--json", "CI"])
def test_no_panel_when_switched_off_on_a_terminal(tmp_path: Path, how: str) -> None:
    flag = [how] if how.startswith("--") else []
    code, out = _pty_run(["run", *flag, "--out", str(tmp_path / "run"), "--", sys.executable, str(TINY),
                          "--seconds", "2"], _env(**({"CI": "true"} if how == "CI" else {})))
    text = out.decode(errors="replace")
    assert code == 0, text[-2000:]
    assert "step 1\r\n" in text
    assert "\x1b[1;" not in text and "gpudoctor run ·" not in text


def test_no_panel_without_a_terminal(tmp_path: Path) -> None:
    done = run_cli("run", "--out", str(tmp_path / "run"), "--", sys.executable, str(TINY), "--seconds", "2")
    assert done.returncode == 0
    assert "\x1b" not in done.stderr and "gpudoctor run ·" not in done.stderr
    assert done.stderr.lstrip().startswith("gpudoctor: ")  # the summary, as before
