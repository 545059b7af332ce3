"""Issue 34 (third audit), rows 2, 4, 7, 8 and 9: each test here failed on main before its fix.

* row 2: ``--backend ray`` refuses to start a local instance on a Ray that does not enforce token
  authentication (< 2.52), before Ray is imported or the environment touched;
* row 4: ``attach``'s ELF reader refuses a file whose headers claim more than it holds or a budget allows;
* row 7: no string of a report.json becomes live Markdown (or HTML): a fuzz over every string field;
* row 8: the readers' budgets count what records cost in memory, not only bytes on disk (events,
  samples, a report.json's values);
* row 9: the patient's strings reach the terminal through one sanitiser (the summary, errors,
  tracebacks, attach's live panel), and nothing of the doctor's prints around it.
"""

from __future__ import annotations

import copy
import io
import json
import os
import struct
import subprocess
import sys
import time
import tracemalloc
import types
import typing
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from typing_extensions import NotRequired, Required, is_typeddict

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


# -- row 7: no string of a report.json becomes live Markdown or HTML --------------------------------

EVIL = "evil.example"
PAYLOAD = ("<img src=https://evil.example/i> [l](https://evil.example/l) ![m](https://evil.example/m) "
           "\\[b\\](https://evil.example/b) <https://evil.example/a> '\\' \" `x` *y*\n\n"
           "</script><script src=https://evil.example/s></script> | --x")
URL_ATTRS = frozenset({"href", "src", "srcset", "action", "formaction", "data", "poster", "xlink:href"})


class _LiveTags(HTMLParser):
    """The tags of an HTML text whose link, source or handler names the payload's host: markup the
    payload made live (an escaped payload is text, or an attribute's text like a ``<meta>`` content)."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.live: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if (name in URL_ATTRS or name.startswith("on")) and EVIL in (value or ""):
                self.live.append(f"<{tag} {name}={value}>")


def _live(html: str) -> list[str]:
    parser = _LiveTags()
    parser.feed(html)
    parser.close()
    return parser.live


def _full_report() -> dict[str, Any]:
    """report_sample.json with every optional section, per-rank rows, trackers and a script flag fix:
    each string field of the schema at least once."""
    from gpudoctor.replay.preflight import predict
    from tests.test_preflight import config as preflight_config
    from tests.test_preflight import measure as preflight_measure

    data = Path(__file__).parent / "data"
    r = json.loads((data / "report_sample.json").read_text())
    r["per_rank"] = json.loads((data / "report_nogpu.json").read_text())["per_rank"]
    r["preflight"] = predict(preflight_config(), preflight_measure())
    r["findings"][0]["fix"]["also"] = [{"library": "script", "call": "train.py", "config": {"--lr": "3e-4"}}]
    r["preflight"]["fixes"] = [{"rule": "data_stall", "config": {"num_workers": 4}, "summary": "workers", "saves_h": 1.0}]
    r["preflight"]["notes"] = ["a preflight note"]
    r["gpu_timeline"] = {
        "source": "cuda events", "steps_timed": 10, "gpu_step_s": 0.1, "busy_fraction": 0.5,
        "data_wait_gpu_idle_s": 1.0, "data_wait_host_s": 2.0, "syncs_per_step": 1.0, "sync_block_s_per_step": 0.0,
        "sync_idle_s_per_step": 0.0, "h2d_s_per_step": 0.0, "host_breakdown": r["breakdown"],
        "nvml_windows": [{"t_s": 1.0, "duration_s": 1.0, "steps": 10, "events_busy": 0.5, "nvml_busy": 0.5,
                          "tolerance": 0.1, "agree": True}],
        "nvml_verdict": "agree", "trusted": "events"}
    r["notes"] = ["a note"]
    r["attach"] = {"attached_at": "2026-01-01T00:00:00", "process_age_s": 60.0, "window_start_s": 0.0,
                   "loaded": ["hooks"], "window": "from the attach", "estimated": ["startup"], "notes": ["n"]}
    r["prediction_check"] = {"gpu": "NVIDIA H100", "known": True, "target": "h100-sxm", "mfu_assumed": 0.4,
                             "mfu_achieved": 0.05, "precision": "bf16",
                             "rows": [{"figure": "step time", "unit": "s", "predicted": 0.1, "measured": 0.12,
                                       "measured_over_predicted": 1.2}], "notes": ["a note"]}
    r["trial"] = {
        "rule": "data_stall", "fix": r["findings"][0]["fix"], "values": {"dataloader": {"num_workers": 2}},
        "unchanged": {"pin_memory": True}, "set_by_user": {"batch": "8"},
        "applied": [{"call": "DataLoader", "values": {"num_workers": 2, "mode": "fork"},
                     "was": {"num_workers": 0, "mode": "spawn"}, "skipped": {"x": "y"}}],
        "not_applied": [{"call": "Trainer", "key": "bf16", "reason": "no GPU"}], "complete": False,
        "predicted_speedup": 1.2, "predicted_speedup_range": None, "prediction_basis": "workers",
        "finding_predicted_speedup": 1.25, "achieved_speedup": 1.1, "baseline_steps_per_s": 8.0,
        "trial_steps_per_s": 8.8, "baseline": {"steps_per_s": 8.0, "steps": 20, "warmup_steps": 3, "window_s": 3.0},
        "trial": {"steps_per_s": 8.8, "steps": 22, "warmup_steps": 3, "window_s": 3.0}, "seconds": 3.0,
        "trial_run": {"folder": "trial", "status": "finished", "crash": None}, "unmeasured": None,
        "pairs": [{"baseline_steps_per_s": 8.0, "trial_steps_per_s": 8.8, "speedup": 1.1, "folder": "trial",
                   "unmeasured": None},
                  {"baseline_steps_per_s": None, "trial_steps_per_s": None, "speedup": None, "folder": "pairs/2",
                   "unmeasured": "too few steps"}],
        "notes": ["a trial note"]}
    node = {"node": "node0", "folder": "n0", "host": "h0", "ranks": [0], "status": "finished", "duration_s": 10.0,
            "clock_offset_s": 0.0, "alignment_residual_s": 0.01, "aligned_steps": 10,
            "breakdown": r["breakdown"], "data_wait_s": 1.0, "data_wait_s_max": 1.5, "checkpoint_s": 0.5,
            "step_time_s": {"p50": 0.1, "p90": 0.2}, "findings": ["data_stall"]}
    r["nodes"] = {"reference": "node0", "method": "step ends", "skew_corrected_s": 0.0,
                  "nodes": [node, {**node, "node": "node1", "folder": "n1", "host": "h1", "ranks": [1]}]}
    r["trackers"] = [{"kind": "mlflow", "status": "skipped", "target": "file:///x", "detail": "why"}]
    r["run"]["doctor_fault"] = {"raised": True, "frames": ["gpudoctor/hooks/torch_hooks.py:97 in save"]}
    return r


def _positions(value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[str, tuple[Any, ...]]]:
    """Every string (``"value"``) and every object (``"key"``: a new key may be added) inside ``value``."""
    if isinstance(value, str):
        yield "value", path
    elif isinstance(value, dict):
        yield "key", path
        for k, v in value.items():
            yield from _positions(v, (*path, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _positions(v, (*path, i))


def _unwrapped(hint: Any) -> set[Any]:
    """The types ``hint`` may hold: Annotated, NotRequired and unions taken apart."""
    args, origin = typing.get_args(hint), typing.get_origin(hint)
    if origin is typing.Annotated or origin in (NotRequired, Required):
        return _unwrapped(args[0])
    if origin in (typing.Union, types.UnionType):
        return set().union(*(_unwrapped(a) for a in args))
    return {hint}


def _texts(hint: Any) -> bool:
    """Is the field a string, or a list of strings?"""
    return any(m is str or (typing.get_origin(m) is list and typing.get_args(m) == (str,)) for m in _unwrapped(hint))


def _schema_fields(tp: Any, seen: dict[str, list[str]]) -> dict[str, list[str]]:
    """Each TypedDict the report schema reaches: its fields that hold text."""
    for member in _unwrapped(tp):
        inner = typing.get_args(member)
        if typing.get_origin(member) in (list, dict):
            _schema_fields(inner[-1], seen)
        elif is_typeddict(member) and member.__name__ not in seen:
            hints = typing.get_type_hints(member, include_extras=True)
            seen[member.__name__] = [name for name, hint in hints.items() if _texts(hint)]
            for hint in hints.values():
                _schema_fields(hint, seen)
    return seen


def _schema_strings(tp: Any, value: Any, reached: set[tuple[str, str]],
                    path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Each string field of the schema in ``value``, present or not (a fixture holding null or
    nothing there still gets the payload); ``reached`` collects (TypedDict, field) as it goes."""
    for member in _unwrapped(tp):
        if is_typeddict(member) and isinstance(value, dict):
            for name, hint in typing.get_type_hints(member, include_extras=True).items():
                if str in _unwrapped(hint):
                    yield (*path, name)
                if _texts(hint) and (str in _unwrapped(hint) or value.get(name)):
                    reached.add((member.__name__, name))
                if name in value:
                    yield from _schema_strings(hint, value[name], reached, (*path, name))
        elif typing.get_origin(member) is list and isinstance(value, list):
            for i, item in enumerate(value):
                yield from _schema_strings(typing.get_args(member)[0], item, reached, (*path, i))


def _planted(report: dict[str, Any], where: str, path: tuple[Any, ...]) -> dict[str, Any]:
    out = copy.deepcopy(report)
    holder: Any = out
    for part in path[:-1] if where == "value" else path:
        holder = holder[part]
    if where == "value":
        holder[path[-1]] = PAYLOAD
    else:
        holder[PAYLOAD] = PAYLOAD
    return out


def _live_markdown(md: str) -> list[str]:
    """What CommonMark (GitHub's base) makes of ``md``: the tags that carry the payload's host."""
    from markdown_it import MarkdownIt

    return _live(MarkdownIt("commonmark").render(md))


def test_no_string_of_a_report_becomes_live_markdown_or_html():
    """Every string position of a schema-valid report (and a key added to every object) holds a
    payload of raw HTML, links, images, escaped brackets and quotes; the Markdown of ``report`` and
    ``diff`` rendered by CommonMark, and the HTML, hold no tag that names the payload's host."""
    pytest.importorskip("markdown_it")
    from gpudoctor.core.schema import SECTIONS, Report
    from gpudoctor.render.diff_page import render_diff_html, render_diff_markdown
    from gpudoctor.render.html import HtmlRenderer
    from gpudoctor.render.markdown import MarkdownRenderer
    from gpudoctor.report.check import problem
    from gpudoctor.report.diff import diff_reports

    report = _full_report()
    assert problem(report) is None and all(s.key in report for s in SECTIONS)
    assert not _live_markdown(MarkdownRenderer().render(report))
    reached: set[tuple[str, str]] = set()
    schema_paths = [("value", p) for p in _schema_strings(Report, report, reached)]
    every = {(td, f) for td, fields in _schema_fields(Report, {}).items() for f in fields}
    assert sorted(every - reached) == []  # the report holds every text field of the schema
    positions = list(dict.fromkeys([*_positions(report), *schema_paths]))
    live, tried = [], 0
    for where, path in positions:
        planted = _planted(report, where, path)
        if problem(planted) is not None:  # a Literal, a date the schema checks: not a string position
            continue
        tried += 1
        md = MarkdownRenderer().render(planted)
        diff_md = render_diff_markdown(diff_reports(report, planted))
        live += [(where, path, tag) for text in (md, diff_md) for tag in _live_markdown(text)]
    assert tried >= 200, tried
    assert not live, sorted({(w, p) for w, p, _ in live}, key=str)
    for key in report:  # the HTML pages (slower): every position of one top-level key at once
        planted = copy.deepcopy(report)
        for where, path in _positions(report[key], (key,)):
            planted = _planted(planted, where, path) if problem(_planted(planted, where, path)) is None else planted
        html = HtmlRenderer().render(planted) + render_diff_html(diff_reports(report, planted))
        assert not _live(html), (key, _live(html)[:3])


# -- row 8: the readers' budgets count memory, not only bytes --------------------------------------

def _lines(path: Path, line: str, count: int, then: str = "") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        for _ in range(count // 10_000):
            fh.write((line + "\n") * 10_000)
        fh.write(then)
    return path


def _peak(fn: Any) -> tuple[Any, int]:
    tracemalloc.start()
    try:
        got = fn()
        return got, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_lines_of_kinds_nothing_reads_are_dropped_and_counted_not_kept(tmp_path):
    from gpudoctor.recording.read import read_events

    step = '{"k":"step","t":1700000001.0,"dt":0.1,"n":1}\n'
    path = _lines(tmp_path / "events" / "1.jsonl", '{"k":"zz"}', 400_000, then=step)  # 4.4 MB
    got, peak = _peak(lambda: read_events(path))
    assert got.kept_lines == 1 and got.loop.steps == [1700000001.0] and got.bad == 0
    assert got.notes == ["events/1.jsonl: 400,000 lines of kinds this version of gpudoctor does not read "
                         "skipped ('zz'; a newer writer's, or not gpudoctor's)"]
    assert peak < 40 * 2**20, peak  # before: each kept whole, ~100 MB for these 4.4 MB


def test_check_on_a_folder_of_unknown_kinds_stays_small(tmp_path):
    """The finding as reported: ``gpudoctor check`` on a run folder with 22 MB of lines of a kind
    nothing reads (before: ~0.5 GB resident; 100 MB took 2.5 GB)."""
    from tests.conftest import ROOT
    from tests.recording_builder import RecordingBuilder

    b = RecordingBuilder(tmp_path / "run", cores=8, duration_s=60.0)
    rows = b.process()
    b.training_loop(rows, start_s=2.0, steps=100, compute_s=0.1, wait_s=0.1, fetch_s=0.1)
    b.host_rows(cpu_total_pct=20.0, cpu_proc_pct=100.0)
    folder = b.write()
    _lines(folder / "events" / "999.jsonl", '{"k":"zz"}', 2_000_000)
    # VmHWM: the peak of the command's own memory (ru_maxrss would count the forked test runner's)
    script = ("import re, sys; from gpudoctor.cli import main; code = main(sys.argv[1:]); "
              "print(re.search(r'VmHWM:\\s+(\\d+)', open('/proc/self/status').read())[1]); sys.exit(code)")
    proc = subprocess.run([sys.executable, "-c", script, "check", str(folder), "--max-waste", "1"],
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert int(proc.stdout.split()[-1]) < 200 * 1024, proc.stdout  # kB


def test_what_a_folder_keeps_is_charged_at_its_memory_against_a_budget(tmp_path, monkeypatch):
    from gpudoctor.recording import read

    monkeypatch.setattr(read, "MAX_FOLDER_KEPT_BYTES", 8 * 2**20, raising=False)  # new in #34
    line = '{"k":"first_step","t":1700000001.0}'  # a kind that is read, kept as a dict: ~250 bytes each
    first = _lines(tmp_path / "events" / "1.jsonl", line, 200_000)
    second = _lines(tmp_path / "events" / "2.jsonl", line, 10_000)
    budget = read.Budget()
    got, peak = _peak(lambda: read.read_events(first, budget=budget))
    kept = got.kept_bytes  # each line charged at its kept_bytes as parsed
    assert 8 * 2**20 <= kept < 8 * 2**20 + 3 * 2**20 * 25 // 10  # cut after the block that crossed it
    assert got.kept_lines < 50_000 and peak < 40 * 2**20, (got.kept_lines, peak)
    assert got.notes == ["events/1.jsonl: read only up to 8.0 MiB of memory for what it keeps (the memory "
                         "budget); the rest of it was skipped, and this report covers what was read"]
    later = read.read_events(second, budget=budget)  # the folder's budget is spent: nothing more kept
    assert later.kept_lines == 0 and later.notes == [
        "events/2.jsonl: read only up to what the folder's files before it kept in memory (the memory "
        "budget); the rest of it was skipped, and this report covers what was read"]


def test_a_sample_file_of_tiny_rows_is_read_within_a_memory_budget(tmp_path, monkeypatch):
    from gpudoctor.recording import read
    from gpudoctor.recording.validate import clean_host_row

    monkeypatch.setattr(read, "MAX_SAMPLE_KEPT_BYTES", 4 * 2**20, raising=False)  # new in #34
    path = _lines(tmp_path / "samples" / "host.jsonl", '{"t":1700000001.0}', 800_000)  # 15 MB: read whole
    notes: list[str] = []
    (rows, bad), peak = _peak(lambda: read.read_samples(path, clean_host_row, notes=notes))
    assert sum(map(read.kept_bytes, rows)) <= 4 * 2**20 and bad == 0
    assert any("memory budget" in n for n in notes), notes
    assert peak < 40 * 2**20, peak


# -- row 9: the patient's strings reach the terminal through one sanitiser -------------------------

TITLE, CLIPBOARD = "\x1b]0;pwned\x07", "\x1b]52;c;Y3VybCBldmlsLnNo\x07"  # set the title; write the clipboard


def test_the_summary_printed_after_a_run_holds_no_escape_from_a_script_flag(tmp_path, capsys):
    """The real printer of ``run``/``attach``: a flag of the patient's script named with OSC
    sequences is quoted by the fix summary; what reaches the terminal is its printable text."""
    from gpudoctor.recording.store import load_recording
    from gpudoctor.render.terminal import print_summary
    from gpudoctor.report.build import build_report
    from tests.recording_builder import T0, RecordingBuilder

    flag = f"--save-every{TITLE}{CLIPBOARD}"
    b = RecordingBuilder(tmp_path / "run", cores=8, duration_s=100.0)
    rows = b.process()
    rows[0]["argv"] = ["/usr/bin/python3", "train.py", flag, "5"]
    b.meta_extra["command"] = ["python3", "train.py", flag, "5"]
    rows.append({"k": "cli", "t": T0 + 0.5, "style": "argparse", "parser": "ArgumentParser", "from_argv": True,
                 "args": None, "options": [{"dest": "save_every", "flags": [flag], "default": 100, "value": 5,
                                            "takes_value": True, "const": None}]})
    b.training_loop(rows, start_s=2.0, steps=100, compute_s=0.08, wait_s=0.0005, fetch_s=0.0004,
                    save_every=5, save_s=0.6)
    b.host_rows(cpu_total_pct=20.0, cpu_proc_pct=100.0)
    report = build_report(load_recording(b.write()))
    assert any(TITLE in f["fix"]["summary"] for f in report["findings"])  # the run's string is there
    print_summary(report, tmp_path / "run", as_json=False)
    err = capsys.readouterr().err
    assert not any(c in err for c in "\x1b\x07\x9b\x9d"), repr(err)
    assert "`--save-every 500`" in err  # the flag still named, its sequences gone whole


def test_an_error_quoting_a_hostile_path_reaches_the_terminal_as_text(tmp_path, capsys):
    """The CLI's one door for errors: a path (here the command line's; under attach, one the
    patient chose) quoted by a refusal."""
    from gpudoctor.cli import main

    assert main(["report", str(tmp_path / f"run{TITLE}{CLIPBOARD}\x9b2J")]) != 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("gpudoctor: ") and "run" in err, repr(err)
    assert not any(c in err for c in "\x1b\x07\x9b\x9d"), repr(err)


def test_the_one_sanitiser_keeps_lines_and_indents_and_drops_escapes_and_workflow_commands(capsys):
    from gpudoctor.common.termtext import say, terminal_text

    text = f"gpudoctor: verdict{TITLE}\n  [high] rule: fix {CLIPBOARD}\x1b[2J\r\n  ::add-mask::x\n\x9d8;;http://e\x9clink"
    assert terminal_text(text) == "gpudoctor: verdict\n  [high] rule: fix \n  add-mask::x\nlink"
    say(text)
    say("plain", file=sys.stdout)
    out = capsys.readouterr()
    assert out.err == terminal_text(text) + "\n" and out.out == "plain\n"


def test_the_live_panel_of_attach_shows_a_note_as_text_not_markup_or_escapes():
    from rich.console import Console

    from gpudoctor.attach.live import LiveState, LiveView

    state = LiveState(pid=1, source="in-process hooks", duration_s=None,
                      notes=[f"live figures unavailable: [link=https://evil.example]x[/link]{TITLE}"])
    console = Console(record=True, force_terminal=True, width=200)
    console.print(LiveView(Path("."), state, stream=io.StringIO())._render())
    shown = console.export_text(styles=True, clear=False)
    assert "[link=https://evil.example]x[" in console.export_text()  # shown as text (the column cuts it)
    assert "\x1b]8;" not in shown and "pwned" not in shown  # no hyperlink made, no title set


def test_the_doctor_prints_through_the_sanitiser_only():
    """No ``print`` of the doctor's own bypasses :func:`~gpudoctor.common.termtext.say` (the hooks,
    inside the patient's process, print to the patient's own stderr and stay stdlib-light)."""
    import ast

    package = Path(__file__).resolve().parent.parent / "gpudoctor"
    patient_side = ("hooks", "_inject")
    # a child whose stdout is a pipe the doctor parses (one JSON line), never a terminal
    protocol = (Path("launch/length_cost_worker.py"), Path("launch/warm_compute_worker.py"))
    found = []
    for path in package.rglob("*.py"):
        rel = path.relative_to(package)
        if rel.parts[0] in patient_side or rel == Path("common/termtext.py") or rel in protocol:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and (
                (isinstance(node.func, ast.Name) and node.func.id == "print")
                or (isinstance(node.func, ast.Attribute) and node.func.attr == "write"
                    and isinstance(node.func.value, ast.Attribute) and node.func.value.attr in ("stdout", "stderr"))
            ):
                found.append(f"{rel}:{node.lineno}")
    assert found == []


def test_a_traceback_that_escapes_the_cli_is_printed_through_the_sanitiser(tmp_path):
    """``--debug``, or a fault nobody foresaw: the exception's text may quote the patient's strings."""
    script = "import sys; from gpudoctor.cli import main; sys.exit(main(['report', '--debug', sys.argv[1]]))"
    proc = subprocess.run([sys.executable, "-c", script, str(tmp_path / f"x{TITLE}{CLIPBOARD}")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and "Traceback" in proc.stderr and "no such file" in proc.stderr, proc.stderr
    assert not any(c in proc.stderr for c in "\x1b\x07\x9b\x9d"), repr(proc.stderr)


def test_a_report_json_of_tiny_values_is_refused_before_it_is_parsed(tmp_path):
    """8 MiB is under the byte cap, but 2.8 M empty lists parsed would take ~200 MB."""
    from gpudoctor.core.schema import SCHEMA
    from gpudoctor.report.load import read_report

    data = Path(__file__).parent / "data" / "report_sample.json"
    path = tmp_path / "report.json"
    path.write_text(data.read_text().rstrip().removesuffix("}") + ', "x": [' + "[]," * 2_800_000 + "[]]}")
    assert json.loads(data.read_text())["schema"] == SCHEMA
    tracemalloc.start()
    try:
        with pytest.raises(UserError, match="JSON values") as err:
            read_report(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert "\n" not in str(err.value) and peak < 40 * 2**20, peak  # the file's bytes, not 200 MB of lists
