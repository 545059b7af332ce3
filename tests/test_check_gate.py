"""The CI gate and the option parser, as CI runs them: a forged report.json or an odd option
value is one refused line, never a silent pass, a forged log line or a child left unwatched."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, cli, run_cli
from tests.test_bad_input import assert_one_line_error

SAMPLE = ROOT / "tests" / "data" / "report_sample.json"  # wasted_fraction 0.49 (tests/report_fixtures.py)


def _report(tmp_path: Path, **changes: object) -> Path:
    report = json.loads(SAMPLE.read_text())
    for dotted, value in changes.items():
        *parents, key = dotted.split("__")
        node = report
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node[part]
        node[key] = value
    path = tmp_path / "report.json"
    path.write_text(json.dumps(report))
    return path


@pytest.mark.parametrize(("limit", "code"), [("20%", 1), ("0.2", 1), ("60%", 0), ("0.6", 0), ("100%", 0)])
def test_max_waste_takes_a_fraction_or_a_percentage(tmp_path, limit, code):
    proc = cli("check", str(_report(tmp_path)), "--max-waste", limit)
    assert proc.returncode == code, proc.stderr


@pytest.mark.parametrize(("limit", "says"), [("20", "write 20% for a percentage"), ("nan", "not a finite"),
                                             ("inf", "not a finite"), ("-0.1", ">= 0"), ("120%", "at most 100%")])
def test_max_waste_refuses_what_would_always_pass(tmp_path, limit, says):
    line = assert_one_line_error(cli("check", str(_report(tmp_path)), "--max-waste", limit), 2)
    assert says in line and "--max-waste" in line


@pytest.mark.parametrize("wasted", [-3, 1.5, 1e308])
def test_a_forged_wasted_fraction_is_an_invalid_report_not_a_pass(tmp_path, wasted):
    path = _report(tmp_path, cost__wasted_fraction=wasted)
    line = assert_one_line_error(cli("check", str(path), "--max-waste", "0.1"), 2)
    assert "cost.wasted_fraction is not a fraction" in line


@pytest.mark.parametrize(("key", "value"), [("breakdown__compute", -0.5), ("breakdown__data_wait", 1e308),
                                            ("cost__usd_per_hour", -2.0), ("findings__0__waste_fraction", 7.0)])
def test_report_refuses_negative_and_absurd_figures(tmp_path, key, value):
    path = _report(tmp_path, **{key: value})
    line = assert_one_line_error(cli("report", str(path), "-o", str(tmp_path / "out.md")), 2)
    assert str(path) in line
    assert not (tmp_path / "out.md").exists()


HOSTILE = "data_stall\n::error file=ci.yml,line=1::forged\x1b[2J\x1b]8;;https://evil.example\x07link\x1b]8;;\x07"


def test_check_prints_rule_names_terminal_safe(tmp_path):
    path = _report(tmp_path, findings__0__rule=HOSTILE)
    proc = cli("check", str(path), "--max-waste", "0.1")
    assert proc.returncode == 1
    assert proc.stderr.count("\n") == 1, proc.stderr  # one line: nothing for CI to read as a command
    assert "\x1b" not in proc.stderr and "\x07" not in proc.stderr
    assert not any(line.lstrip().startswith("::") for line in proc.stderr.splitlines())
    assert "top: data_stall::error file=ci.yml,line=1::forgedlink" in proc.stderr


@pytest.mark.parametrize("interval", ["0", "1e-9", "nan", "-1"])
@pytest.mark.parametrize("command", ["run", "attach"])
def test_a_spinning_interval_is_refused_before_anything_starts(tmp_path, command, interval):
    marker = tmp_path / "started"
    target = (["--", sys.executable, "-c", f"open({str(marker)!r}, 'w')"] if command == "run" else ["1"])
    proc = run_cli(command, "--interval", interval, "--out", str(tmp_path / "out"), *target)
    assert "--interval" in assert_one_line_error(proc, 2)
    assert not marker.exists() and not (tmp_path / "out").exists()


@pytest.mark.parametrize("pid", ["-5", "0", "abc", "99999999999"])
def test_attach_to_a_bad_pid_is_one_line(tmp_path, pid):
    line = assert_one_line_error(run_cli("attach", "--out", str(tmp_path / "out"), pid), 2)
    assert "not a process id" in line


@pytest.mark.parametrize("changes", [{"cost__wasted_fraction": None},
                                     {"breakdown": dict.fromkeys(("startup", "data_wait", "compute", "checkpoint",
                                                                  "eval", "other"))}])
def test_a_report_that_measured_nothing_does_not_pass_the_gate(tmp_path, changes):
    line = assert_one_line_error(cli("check", str(_report(tmp_path, **changes)), "--max-waste", "0.99"), 2)
    assert "measured nothing inside the training" in line
