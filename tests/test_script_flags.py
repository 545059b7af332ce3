"""Fixes in the script's own terms: its flags and the whole edited command line.

Recordings pin the mapping (same name, alias, a value that disagrees, configurator style,
redaction); real scripts under ``gpudoctor run`` show the hooks record what they parse.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import types
from pathlib import Path

import pytest

from gpudoctor.hooks import cli_hooks
from gpudoctor.recording.store import load_recording
from gpudoctor.render.base import config_code
from gpudoctor.render.markdown import MarkdownRenderer
from gpudoctor.report.build import build_report
from tests.conftest import ROOT, run_cli
from tests.recording_builder import T0, RecordingBuilder

SCRIPTS = Path(__file__).parent / "scripts"


def _opt(dest: str, flag: str, value: object, default: object = None) -> dict[str, object]:
    return {"dest": dest, "flags": [flag], "default": default, "value": value, "takes_value": True,
            "const": None}


def _saving_loop(tmp_path: Path, args: list[str], options: list[dict[str, object]],
                 style: str = "argparse") -> dict:
    """A loop saving every 5 steps (6 s each) whose script parsed ``args``."""
    b = RecordingBuilder(tmp_path, cores=8, duration_s=100.0)
    rows = b.process()
    rows[0]["argv"] = ["/usr/bin/python3", "train.py", *args]
    b.meta_extra["command"] = ["torchrun", "--nproc-per-node", "1", "train.py", *args]
    rows.append({"k": "cli", "t": T0 + 0.5, "style": style, "parser": "ArgumentParser", "from_argv": True,
                 "args": None, "options": options})
    b.training_loop(rows, start_s=2.0, steps=100, compute_s=0.08, wait_s=0.0005, fetch_s=0.0004,
                    save_every=5, save_s=0.6)
    b.host_rows(cpu_total_pct=20.0, cpu_proc_pct=100.0)
    return build_report(load_recording(b.write()))


def _finding(report: dict, rule: str) -> dict:
    return next(f for f in report["findings"] if f["rule"] == rule)


def test_save_interval_named_by_the_scripts_flag_with_the_whole_command(tmp_path):
    args = ["--save-every", "5", "--lr", "0.1", "--hf-token", "***"]
    report = _saving_loop(tmp_path, args, [_opt("save_every", "--save-every", 5, 100),
                                           _opt("lr", "--lr", 0.1, 0.001)])
    fix = _finding(report, "checkpoint_overhead")["fix"]
    new = fix["config"]["save_steps"]  # the library's names stay, for code and for 'try'
    assert fix["summary"].startswith(f"Run with `--save-every {new}` instead of 5.")
    expected = ["torchrun", "--nproc-per-node", "1", "train.py", "--save-every", str(new), "--lr", "0.1",
                "--hf-token", "***"]
    assert shlex.split(fix["snippet"]) == expected  # the launcher as typed, the value edited in place
    assert {"library": "your command line", "call": None, "config": {"--save-every": new}} in fix["also"]
    md = MarkdownRenderer().render(report)
    assert f"```bash\n{shlex.join(expected)}\n```" in md
    assert f"# your command line\n--save-every={new}" in md


def test_a_flag_holding_another_value_is_not_the_knob(tmp_path):
    """--save-every 50 while saves came every 5 steps: something else sets the interval."""
    report = _saving_loop(tmp_path, ["--save-every", "50"], [_opt("save_every", "--save-every", 50, 100)])
    fix = _finding(report, "checkpoint_overhead")["fix"]
    assert "--save-every" not in fix["summary"] and "command_line" not in _finding(
        report, "checkpoint_overhead")["data"]
    assert all(t["library"] != "your command line" for t in fix["also"])


def test_a_flag_not_given_is_appended_with_its_default_said(tmp_path):
    report = _saving_loop(tmp_path, ["--lr", "0.1"], [_opt("save_interval", "--save_interval", 5, 5),
                                                      _opt("lr", "--lr", 0.1, 0.001)])
    fix = _finding(report, "checkpoint_overhead")["fix"]
    new = fix["config"]["save_steps"]
    assert f"`--save_interval {new}` instead of its default (5)" in fix["summary"]
    assert shlex.split(fix["snippet"])[-4:] == ["--lr", "0.1", "--save_interval", str(new)]


def test_configurator_globals_get_key_equals_value(tmp_path):
    """nanoGPT's style: the edited line says --key=value, as its configurator reads it."""
    report = _saving_loop(tmp_path, ["config/small.py", "--save_every=5"],
                          [_opt("save_every", "--save_every", 5, 1000)], style="globals")
    fix = _finding(report, "checkpoint_overhead")["fix"]
    new = fix["config"]["save_steps"]
    assert f"`--save_every={new}` instead of 5" in fix["summary"]
    assert fix["snippet"].endswith(f"train.py config/small.py --save_every={new}")


def test_configurator_source_read_as_nanogpt_does(tmp_path):
    """Literal globals before exec(configurator.py); a config file, then --key=value, override."""
    cfg = tmp_path / "small.py"
    cfg.write_text("eval_interval = 5\nbatch_size = 16\n")
    event = cli_hooks.globals_event([str(SCRIPTS / "nanogpt_exec_loop.py"), str(cfg), "--eval_iters=20",
                                     "--wandb_api_key=hunter2"])
    assert event is not None and event["style"] == "globals"
    opts = {o["dest"]: o for o in event["options"]}
    assert set(opts) == {"eval_interval", "eval_iters", "batch_size", "learning_rate", "wandb_api_key",
                         "max_iters"}  # not config_keys, config or iter_num: after the exec, or not literal
    assert (opts["eval_iters"]["default"], opts["eval_iters"]["value"]) == (200, 20)
    assert (opts["eval_interval"]["value"], opts["batch_size"]["value"]) == (5, 16)
    assert opts["wandb_api_key"]["value"] == "***" and opts["wandb_api_key"]["default"] == "***"
    assert cli_hooks.globals_event([str(SCRIPTS / "tiny_loop.py")]) is None  # an argparse script


def test_parser_event_keeps_names_defaults_values_and_hides_secrets():
    p = argparse.ArgumentParser()
    p.add_argument("--num-workers", type=int, default=0)
    p.add_argument("--api-key", default="default-secret")
    p.add_argument("--resume", action="store_true")
    p.add_argument("--db", default="postgres://user:pw@host/db")
    ns = p.parse_args(["--num-workers", "2", "--api-key", "sk-live", "--resume"])
    event = cli_hooks.parser_event(p, ns, ["--num-workers", "2"])
    opts = {o["dest"]: o for o in event["options"]}
    assert "help" not in opts and event["from_argv"] is False and event["args"] == ["--num-workers", "2"]
    assert opts["num_workers"] == {"dest": "num_workers", "flags": ["--num-workers"], "default": 0, "value": 2,
                                   "takes_value": True, "const": None}
    assert opts["api_key"]["value"] == opts["api_key"]["default"] == "***"
    assert opts["resume"]["takes_value"] is False and opts["resume"]["const"] is True
    assert "pw" not in json.dumps(opts["db"])


def test_parser_event_keeps_an_options_choices_so_a_fix_sets_only_one_of_them():
    p = argparse.ArgumentParser()
    p.add_argument("--pad", choices=["max_length", "longest"], default="max_length")
    p.add_argument("--bits", type=int, choices=[4, 8, 16], default=16)
    p.add_argument("--token-kind", choices=["a", "b"], default="a")  # a secret's name: its words unsaid
    p.add_argument("--mode", choices=range(1000), type=int, default=3)  # not a short list: unsaid
    opts = {o["dest"]: o for o in cli_hooks.parser_event(p, p.parse_args([]), [])["options"]}
    assert opts["pad"]["choices"] == ["max_length", "longest"] and opts["bits"]["choices"] == [4, 8, 16]
    assert "choices" not in opts["token_kind"] and "choices" not in opts["mode"]


def test_attach_reads_a_parser_kept_in_main(tmp_path, monkeypatch):
    """After the parse, attach finds a module-level parser and its Namespace in __main__."""
    from gpudoctor.hooks.writer import EventWriter

    p = argparse.ArgumentParser()
    p.add_argument("--save_steps", type=int, default=500)
    main = types.ModuleType("__main__")
    main.parser, main.args = p, p.parse_args(["--save_steps", "5"])
    monkeypatch.setitem(sys.modules, "__main__", main)
    w = EventWriter(tmp_path)
    cli_hooks.record_existing_parser(w)
    w.close(exiting=False)
    events = [json.loads(line) for f in (tmp_path / "events").glob("*.jsonl") for line in f.read_text().splitlines()]
    [cli] = [e for e in events if e["k"] == "cli"]
    assert cli["options"][0]["value"] == 5


def test_flag_tables_render_as_a_shell_line():
    assert config_code({"--eval_iters": 10, "-j": 4}, "your command line") == (
        "bash", "# your command line\n--eval_iters=10 -j 4")


def test_exec_configurator_script_recorded_under_run(tmp_path):
    folder = tmp_path / "run"
    proc = run_cli("run", "--out", str(folder), "--", sys.executable,
                   str(SCRIPTS / "nanogpt_exec_loop.py"), "--eval_iters=20", cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    events = [json.loads(line) for f in (folder / "events").glob("*.jsonl") for line in f.read_text().splitlines()]
    [cli] = [e for e in events if e.get("k") == "cli"]
    values = {o["dest"]: o["value"] for o in cli["options"]}
    assert cli["style"] == "globals" and values["eval_iters"] == 20 and values["eval_interval"] == 10


@pytest.mark.slow
def test_real_argparse_scripts_get_their_own_flags(probe_run):
    """heavy_checkpoints takes --save-every, tokenize_in_getitem --num-workers."""
    run = probe_run("heavy_checkpoints")
    f = _finding(run.report, "checkpoint_overhead")
    new = f["fix"]["config"]["save_steps"]
    assert f"`--save-every {new}` instead of its default (1)" in f["fix"]["summary"]
    assert shlex.split(f["fix"]["snippet"])[-2:] == ["--save-every", str(new)]
    run = probe_run("tokenize_in_getitem")
    f = _finding(run.report, "tokenization_in_loop")
    # the fix's own knob is the script's switch for it; the interim workers, the alternative
    assert f["fix"]["summary"].startswith("Run with `--pretokenize` instead of its default (False)")
    assert f["data"]["command_line"].endswith("--pretokenize")
    workers = (f["data"].get("alternative") or {}).get("num_workers")
    if workers:  # none when other programs keep every spare core busy: then nothing changes
        assert f"or with `--num-workers {workers}` instead of its default (0)" in f["fix"]["summary"]
    else:
        assert "--num-workers" not in f["fix"]["summary"]


@pytest.mark.slow
def test_nanogpt_like_eval_fix_in_key_equals_value_form(probe_run):
    run = probe_run("nanogpt_like")
    f = _finding(run.report, "eval_overhead")
    new = f["fix"]["config"]["eval_interval"]
    assert f"`--eval_interval={new}` instead of its default ({run.truth['eval_interval']})" in f["fix"]["summary"]
    assert f"--eval_interval={new}" in f["fix"]["snippet"]


def _switch(dest: str) -> dict[str, object]:
    return {"dest": dest, "flags": [f"--{dest.replace('_', '-')}"], "default": False, "value": False,
            "takes_value": False, "const": True}


def _tokenizing_loop(tmp_path: Path, switch: str, *, tokenize_s: float = 0.02, cpu_total_pct: float = 40.0,
                     workers: int | None = None) -> dict:
    """A loop that waits 60 ms a batch, ``tokenize_s`` of it tokenizing, beside 20 ms of compute; its
    script takes an on/off ``--<switch>`` (and ``--num-workers N`` given, where ``workers`` says N)."""
    b = RecordingBuilder(tmp_path, cores=2, duration_s=60.0)
    rows = b.process()
    given = ["--num-workers", str(workers)] if workers is not None else []
    rows[0]["argv"] = ["/usr/bin/python3", "train.py", *given]
    b.meta_extra["command"] = ["python", "train.py", *given]
    options = [_switch(switch)] + ([{"dest": "num_workers", "flags": ["--num-workers"], "default": 0, "value": workers,
                                     "takes_value": True, "const": None}] if workers is not None else [])
    rows.append({"k": "cli", "t": T0 + 0.5, "style": "argparse", "parser": "ArgumentParser", "from_argv": True,
                 "args": None, "options": options})
    end = b.training_loop(rows, start_s=2.0, steps=600, compute_s=0.02, wait_s=0.06,
                          fetch_s=0.06 if workers is None else None, num_workers=workers or 0,
                          dataset_len=4096 if workers is not None else None)
    if workers is not None:  # a build of Python on the fetching thread: 60 ms of its CPU a batch
        b.fetch_counter(rows, t_s=end, calls=600, wall_s=0.06, cpu_s=0.06)
    b.tokenizer_counters(rows, start_s=2.0, end_s=end, total_s=tokenize_s * 600)
    b.host_rows(cpu_total_pct=cpu_total_pct, cpu_proc_pct=100.0)
    return build_report(load_recording(b.write()))


def test_a_caching_switch_promises_the_whole_build_a_pretokenizing_one_the_tokenizer(tmp_path):
    # --pretokenize: the tokenizer's 20 ms of the 80 ms batch go (80 -> 60 ms)
    tok = _finding(_tokenizing_loop(tmp_path / "pre", "pretokenize"), "tokenization_in_loop")
    assert tok["fix"]["summary"].startswith("Run with `--pretokenize` instead of its default (False).")
    assert "switch_kind" not in tok["data"]
    assert tok["predicted_speedup"] == pytest.approx(0.08 / 0.06, rel=0.03)
    # --precompute caches each whole item: the whole 60 ms wait goes (80 -> 20 ms), and it says so
    cached = _finding(_tokenizing_loop(tmp_path / "cache", "precompute"), "tokenization_in_loop")
    # the lead says its own figure, the finding's predicted_speedup: one knob, one value, one figure
    lead = f"Run with `--precompute` instead of its default (False) (about {cached['predicted_speedup']:.2f}x faster"
    assert cached["fix"]["summary"].startswith(lead)
    assert cached["data"]["switch_kind"] == "cache" and "caches each whole item" in cached["fix"]["summary"]
    assert cached["predicted_speedup"] == pytest.approx(0.08 / 0.02, rel=0.03)
    assert cached["data"]["command_argv"] == ["python", "train.py", "--precompute"]


def test_a_caching_switch_takes_the_workers_it_no_longer_needs_out_of_the_loop(tmp_path):
    """Cached items sent through a worker still pay its queue every batch (prove.py loop 83: 43-59
    steps/s cached through its 1 worker, 59-76 cached in the loop), and the promise is the compute
    back to back: the command sets both, the figure is the same as without workers to remove."""
    report = _tokenizing_loop(tmp_path, "precompute", workers=1, tokenize_s=0.005, cpu_total_pct=55.0)
    naming = [f for f in report["findings"] if "--precompute" in f["data"].get("command_argv", [])]
    assert naming, [f["rule"] for f in report["findings"]]
    for f in naming:
        assert f["data"]["command_argv"] == ["python", "train.py", "--num-workers", "0", "--precompute"]
        assert "`--precompute` instead of its default (False) and `--num-workers 0` instead of 1" in f["fix"]["summary"]
        assert "the loop reads each batch itself (--num-workers 0)" in f["fix"]["summary"]
        assert f["predicted_speedup"] == pytest.approx(0.08 / 0.02, rel=0.03)
    # a run without workers keeps its command to the one switch
    alone = _tokenizing_loop(tmp_path / "none", "precompute", workers=0, tokenize_s=0.005, cpu_total_pct=55.0)
    cached = [f for f in alone["findings"] if "--precompute" in f["data"].get("command_argv", [])]
    assert cached, [f["rule"] for f in alone["findings"]]
    for f in cached:
        assert f["data"]["command_argv"] == ["python", "train.py", "--num-workers", "0", "--precompute"]
        assert "the loop reads each batch itself" not in f["fix"]["summary"]


def test_a_switch_is_named_by_one_finding_with_one_figure_where_the_tokenizer_leads_on_busy_cores(tmp_path):
    """Every core busy and the tokenizer most of the build: ``cpu_saturated`` named the same
    ``--precompute`` for the rest of the build at 1.33x beside ``tokenization_in_loop``'s 4.00x. One
    knob, one finding: the tokenizer's, whose words say no core is free for workers."""
    report = _tokenizing_loop(tmp_path, "precompute", tokenize_s=0.04, cpu_total_pct=97.0)
    naming = [f for f in report["findings"] if "--precompute" in f["data"].get("command_argv", [])]
    assert [f["rule"] for f in naming] == ["tokenization_in_loop"]
    assert naming[0]["predicted_speedup"] == pytest.approx(0.08 / 0.02, rel=0.03)
    assert "no core is free for more DataLoader workers" in naming[0]["fix"]["summary"]
    # where the tokenizer is not most of it, the CPU finding names it, at the same figure
    rest = _tokenizing_loop(tmp_path / "rest", "precompute", cpu_total_pct=97.0)
    figures = {f["rule"]: f["predicted_speedup"] for f in rest["findings"]
               if "--precompute" in f["data"].get("command_argv", [])}
    assert set(figures) == {"tokenization_in_loop", "cpu_saturated"} and len(set(figures.values())) == 1
