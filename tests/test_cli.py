"""The command line, as a user runs it: real subprocesses where a command runs a training or the
process itself is the point; ``cli.main`` in this process where it only parses or renders."""

from __future__ import annotations

import argparse
import json
import shutil
import sys

import pytest

from gpudoctor.cli import build_parser
from tests.conftest import ROOT, cli, run_cli
from tests.recording_builder import RecordingBuilder
from tests.test_rules import stall_run


@pytest.mark.parametrize("cmd", [[], ["run"], ["attach"], ["replay"], ["sweep"], ["report"], ["diff"], ["check"]])
def test_every_command_has_help(cmd):
    proc = cli(*cmd, "--help")
    assert proc.returncode == 0
    assert "usage: gpudoctor" in proc.stdout


def test_every_subcommand_and_argument_says_what_it_is():
    """Walks the parser: each subcommand has a description for its --help, each argument a help."""
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    missing = [f"{name}: description" for name, p in sub.choices.items() if not p.description]
    missing += [f"{name}: {'/'.join(a.option_strings) or a.dest}" for name, p in sub.choices.items()
                for a in p._actions if not a.help or a.help == argparse.SUPPRESS]
    assert sub.choices and missing == []


def test_check_help_says_fraction_or_percentage():
    text = " ".join(cli("check", "--help").stdout.split())
    assert "--max-waste FRACTION" in text and "fraction of wall time (0.2)" in text and "(20%)" in text


def test_run_returns_the_commands_exit_code_and_still_reports(tmp_path):
    script = "import torch, sys; x = torch.ones(3); sys.exit(3)"
    proc = run_cli("run", "--out", str(tmp_path / "r"), "--", sys.executable, "-c", script)
    assert proc.returncode == 3
    report = json.loads((tmp_path / "r" / "report.json").read_text())
    assert report["run"]["exit_code"] == 3 and report["run"]["status"] == "crashed"
    assert (tmp_path / "r" / "report.html").exists() and (tmp_path / "r" / "report.md").exists()
    assert "gpudoctor: the command crashed with exit code 3; the report covers the " in proc.stderr
    assert "no GPU on this machine" in proc.stderr or "GPU busy" in proc.stderr


def test_a_command_killed_by_a_signal_is_said_so(tmp_path):
    script = "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"
    proc = run_cli("run", "--out", str(tmp_path / "r"), "--", sys.executable, "-c", script)
    assert proc.returncode == 137
    assert "the command crashed with exit code 137 (signal 9, SIGKILL)" in proc.stderr
    assert (tmp_path / "r" / "report.json").exists()


@pytest.mark.parametrize(("args", "fixed"), [
    (["run", "python", "train.py"], "gpudoctor run -- python train.py"),
    (["run", "--json", "python", "-c", "pass", "--out", "foo"], "gpudoctor run --json --out foo -- python -c pass"),
    (["try", "--seconds", "5", "python", "t.py", "--seconds=3"], "gpudoctor try --seconds 5 -- python t.py --seconds=3"),
])
def test_a_command_without_dashes_is_refused_with_the_corrected_line(tmp_path, args, fixed):
    """No guessing which words are the doctor's: the command goes after --, nothing runs, no folder."""
    proc = cli(*args, cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and fixed in proc.stderr
    assert "--out" not in args or "--out after the command would go to the command" in proc.stderr
    assert list(tmp_path.iterdir()) == []


def test_after_dashes_every_word_is_the_commands(tmp_path):
    script = "import sys; print(sys.argv[1:])"
    proc = run_cli("run", "--out", str(tmp_path / "r"), "--", sys.executable, "-c", script, "--out", "foo", "--")
    assert proc.returncode == 0 and "['--out', 'foo', '--']" in proc.stdout


def test_run_json_is_alone_on_stdout_when_the_training_prints(tmp_path):
    """``--json`` feeds other programs: the report alone on stdout, the command's prints on stderr."""
    script = "print('epoch 1 loss 2.3'); import sys; print('to stderr', file=sys.stderr)"
    proc = run_cli("run", "--json", "--out", str(tmp_path / "r"), "--", sys.executable, "-c", script)
    assert proc.returncode == 0
    report = json.loads(proc.stdout)  # nothing else on stdout
    assert report["run"]["status"] == "finished"
    assert "epoch 1 loss 2.3" in proc.stderr and "to stderr" in proc.stderr
    assert "own stdout then goes to stderr" in " ".join(cli("run", "--help").stdout.split())


def test_unknown_command_is_one_line_and_nonzero():
    proc = cli("frobnicate")
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and proc.stderr.startswith("gpudoctor: ")


def test_a_program_given_as_the_command_gets_the_run_line(tmp_path):
    """``gpudoctor python x.py`` (no ``run --``): the corrected line, nothing run, no folder."""
    proc = cli("python", "x.py", "--lr", "3e-4", cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert "'python' is not a gpudoctor command" in proc.stderr
    assert "gpudoctor run -- python x.py --lr 3e-4" in proc.stderr
    assert list(tmp_path.iterdir()) == []


def test_report_rerenders_a_saved_run_by_extension(tmp_path):
    folder = stall_run(tmp_path / "run", cores=8, cpu_total_pct=20.0).write()
    for ext in ("md", "html", "json"):
        out = tmp_path / f"out.{ext}"
        proc = cli("report", str(folder), "-o", str(out))
        assert proc.returncode == 0, proc.stderr
        assert "data_stall" in out.read_text()
    proc = cli("report", str(folder), "-o", str(tmp_path / "x.pdf"))
    assert proc.returncode == 2 and ".html" in proc.stderr


def test_check_gates_on_wasted_fraction(tmp_path):
    folder = stall_run(tmp_path / "run", cores=8, cpu_total_pct=20.0).write()
    cli("report", str(folder))
    assert cli("check", str(folder / "report.json"), "--max-waste", "0.1").returncode == 1
    assert cli("check", str(folder / "report.json"), "--max-waste", "0.9").returncode == 0


def test_diff_before_after(tmp_path):
    before = stall_run(tmp_path / "before", cores=8, cpu_total_pct=20.0).write()
    b = RecordingBuilder(tmp_path / "after", cores=8, duration_s=60.0)
    rows = b.process()
    b.training_loop(rows, start_s=5.0, steps=1000, compute_s=0.05, wait_s=0.001, fetch_s=0.04, num_workers=2)
    b.host_rows(cpu_total_pct=40.0, cpu_proc_pct=300.0)
    b.gpu_rows(util_pct=85.0, mem_used_mib=60000.0)
    after = b.write()
    out = tmp_path / "diff.md"
    proc = cli("diff", str(before), str(after), "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    text = out.read_text()
    assert "data_stall" in text and "resolved" in text.lower()


def test_help_is_fast_and_imports_nothing_heavy():
    code = ("import sys, gpudoctor.cli as c; c.build_parser(); "
            "print(sorted(m for m in ('torch', 'pandas', 'matplotlib', 'transformers') if m in sys.modules))")
    out = __import__("subprocess").run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.stdout.strip() == "[]"


HEAVY = ("torch", "pandas", "matplotlib", "transformers", "numpy", "pyarrow", "yaml", "jinja2", "psutil")


def test_every_commands_help_imports_none_of_the_work():
    """``gpudoctor --help`` and each command's ``--help`` build every command's flags, and load none of
    the libraries the commands' work needs: those load inside each command's main."""
    code = ("import contextlib, io, sys\n"
            "from gpudoctor.cli import COMMANDS, main\n"
            "for argv in [['--help'], *([name, '--help'] for name in COMMANDS)]:\n"
            "    with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
            "        main(argv)\n"
            f"print(len(COMMANDS), sorted(m for m in {HEAVY!r} if m in sys.modules))")
    out = __import__("subprocess").run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.stdout.strip() == "10 []", out.stderr


def test_module_entry_point_matches_console_script():
    if shutil.which("gpudoctor") is None:
        pytest.skip("console script not installed in this environment")
    proc = __import__("subprocess").run(["gpudoctor", "--version"], capture_output=True, text=True)
    assert proc.stdout.startswith("gpudoctor ")
