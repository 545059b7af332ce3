"""Loaders never crash: whatever a run folder or a report.json holds, the answer is a report
or one clear ``UserError``, never a traceback (hypothesis)."""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpudoctor.cli import main as cli_main
from gpudoctor.commands.load import load_report
from gpudoctor.common.errors import UserError
from gpudoctor.render import renderer_for
from tests.recording_builder import T0, RecordingBuilder

DATA = Path(__file__).parent / "data"
SETTINGS = settings(max_examples=int(os.environ.get("GPUDOCTOR_HYPOTHESIS_EXAMPLES", "60")), deadline=None, suppress_health_check=list(HealthCheck))

# Values a corrupt or foreign file could hold where a number, string or list is expected.
ODD = st.one_of(
    st.sampled_from([math.nan, math.inf, -math.inf, -1.0, -1, 0, 0.0, 1e300, -1e300, 10**30, 2**64,
                     True, False, None, "", "x", "1.5", [], {}, [1, 2], {"a": 1}, T0, T0 + 1e9, 1e11 + 1]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(),
    st.text(max_size=5),
)
KINDS = ["proc", "span", "step", "first_step", "batch", "loader", "counter", "torch_cfg", "trainer",
         "plan", "hf_plan", "profiler", "exit", "unknown_kind"]
TRAINER_ARGS = ["per_device_train_batch_size", "per_device_eval_batch_size", "gradient_accumulation_steps",
                "dataloader_num_workers", "save_steps", "eval_steps", "save_only_model", "max_steps",
                "dataloader_pin_memory", "dataloader_persistent_workers", "dataloader_prefetch_factor", "bf16",
                "tf32", "torch_compile", "eval_strategy"]
FIELDS = ["t", "t0", "dt", "c", "name", "n", "tokens", "pad", "seq_len", "lengths", "calls", "s", "rank",
          "is_worker", "ppid", "num_workers", "batch_size", "args", "max_steps", "cuda", "device_capability",
          "autocast", "param_dtype", "libs", "steps", "params", "device"]


def _valid_folder(root: Path) -> Path:
    """A small but complete recording: a training loop with waits, saves, padding and workers."""
    b = RecordingBuilder(root, cores=4, duration_s=20.0)
    rows = b.process(100, rank=0)
    b.training_loop(rows, start_s=2.0, steps=30, compute_s=0.3, wait_s=0.2, fetch_s=0.1, num_workers=2,
                    save_every=10, save_s=0.5, trainer_args={"per_device_train_batch_size": 8, "save_steps": 10,
                                                            "dataloader_num_workers": 2, "max_steps": 100})
    rows.append({"k": "batch", "t": T0 + 3, "tokens": 64, "pad": 20, "seq_len": 16, "lengths": [10, 12, 16, 6]})
    rows.append({"k": "torch_cfg", "t": T0 + 2, "cuda": True, "device": "cuda", "device_capability": [8, 0],
                 "param_dtype": "torch.float32", "autocast": False, "allow_tf32": False,
                 "matmul_precision": "highest", "device_name": "A100"})
    rows.append({"k": "counter", "t": T0 + 5, "name": "tokenize", "calls": 4, "s": 0.5})
    worker = b.process(101, is_worker=True, ppid=100)
    worker.append({"k": "counter", "t": T0 + 6, "name": "fetch", "calls": 10, "s": 1.0})
    b.host_rows(cpu_total_pct=50.0, cpu_proc_pct=120.0)
    b.gpu_rows(util_pct=40.0, mem_used_mib=9000.0, count=2)
    return b.write()


def _report_and_render(folder: Path) -> None:
    """What ``gpudoctor report FOLDER`` does: re-analyse (keeping a saved report's extra sections), render."""
    try:
        report = load_report(folder)
    except UserError:
        return
    for ext in ("json", "md", "html"):
        assert renderer_for(ext).render(report)


@st.composite
def odd_event(draw: st.DrawFn) -> dict[str, Any]:
    """An event of a known kind with some fields missing, extra, or of odd values."""
    event: dict[str, Any] = {"k": draw(st.sampled_from(KINDS))}
    for key in draw(st.lists(st.sampled_from(FIELDS), max_size=6)):
        event[key] = draw(ODD)
    if event["k"] == "trainer" and draw(st.booleans()):  # TrainingArguments the rules compute with
        event["args"] = draw(st.dictionaries(st.sampled_from(TRAINER_ARGS), ODD, max_size=4))
    return event


@st.composite
def mutated_valid_event(draw: st.DrawFn, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """A real event with one field replaced by an odd value or removed."""
    event = dict(draw(st.sampled_from(rows)))
    key = draw(st.sampled_from(sorted(event)))
    if draw(st.booleans()):
        event[key] = draw(ODD)
    else:
        del event[key]
    return event


def _line(obj: Any) -> str:
    return json.dumps(obj, allow_nan=True, default=str)


@SETTINGS
@given(data=st.data())
def test_any_bytes_in_any_recording_file_load_or_fail_cleanly(data):
    with tempfile.TemporaryDirectory() as tmp:
        folder = _valid_folder(Path(tmp) / "run")
        target = data.draw(st.sampled_from(["meta.json", "samples/host.jsonl", "samples/gpu.jsonl",
                                            "events/100.jsonl", "events/101.jsonl", "events/12x.jsonl",
                                            "report.json"]))
        blob = data.draw(st.one_of(
            st.binary(max_size=300),
            st.lists(st.one_of(st.binary(max_size=40), st.just(b"[" * 5000), st.just(b'{"k":"step","t":1e999}'),
                               st.just(b'{"t": 1' + b"0" * 5000 + b"}"), st.just(b"NaN")), max_size=5)
            .map(b"\n".join),
        ))
        path = folder / target
        keep = data.draw(st.booleans())  # append to what is there, or replace it
        path.write_bytes((path.read_bytes() if keep and path.exists() else b"") + blob)
        _report_and_render(folder)


@SETTINGS
@given(data=st.data())
def test_odd_values_in_events_and_samples_never_crash_the_analysis(data):
    with tempfile.TemporaryDirectory() as tmp:
        folder = _valid_folder(Path(tmp) / "run")
        events = [json.loads(x) for x in (folder / "events/100.jsonl").read_text().splitlines()]
        extra = data.draw(st.lists(st.one_of(odd_event(), mutated_valid_event(events)), min_size=1, max_size=8))
        with open(folder / "events/100.jsonl", "a") as fh:
            fh.write("".join(_line(e) + "\n" for e in extra))
        host = json.loads((folder / "samples/host.jsonl").read_text().splitlines()[0])
        gpu = json.loads((folder / "samples/gpu.jsonl").read_text().splitlines()[0])
        gpu["gpus"][0][data.draw(st.sampled_from(sorted(gpu["gpus"][0])))] = data.draw(ODD)
        for name, row in (("host", host), ("gpu", gpu)):
            if data.draw(st.booleans()):
                row[data.draw(st.sampled_from(sorted(row)))] = data.draw(ODD)
            with open(folder / f"samples/{name}.jsonl", "a") as fh:
                fh.write(_line(row) + "\n")
        _report_and_render(folder)


@SETTINGS
@given(data=st.data())
def test_odd_meta_values_never_crash_the_analysis(data):
    with tempfile.TemporaryDirectory() as tmp:
        folder = _valid_folder(Path(tmp) / "run")
        meta = json.loads((folder / "meta.json").read_text())
        for key in data.draw(st.lists(st.sampled_from(
                ["start_time", "end_time", "status", "exit_code", "host", "gpus", "nvml_problems", "command",
                 "price_per_gpu_hour", "gpus_option", "pid", "started_at", "mode"]), min_size=1, max_size=4)):
            meta[key] = data.draw(ODD)
        (folder / "meta.json").write_text(_line(meta))
        _report_and_render(folder)


@pytest.mark.parametrize("when", [-62135596801.0, -9e10])  # a second before year 1; 4 millennia before
def test_a_start_or_attach_no_calendar_holds_is_an_unknown_time(tmp_path: Path, when: float) -> None:
    """Hypothesis found ``year 0 is out of range`` in the report's start: a time within what the meta's
    check lets through (its bound is the magnitude) that no calendar holds is said unknown, never raised on."""
    folder = _valid_folder(tmp_path / "run")
    meta = json.loads((folder / "meta.json").read_text())
    meta.pop("started_at", None)
    meta.update(start_time=when, mode="attach", attach_time=when, attach={"targets": [], "inject": False})
    (folder / "meta.json").write_text(_line(meta))
    report = load_report(folder)
    assert report["run"]["started_at"] is None
    assert report["attach"]["attached_at"] is None
    assert any(n.startswith("Attached at an unknown time") for n in report["notes"]), report["notes"]
    for ext in ("json", "md", "html"):
        assert renderer_for(ext).render(report)


def _paths(obj: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix]
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj[:3]):
            out += _paths(v, (*prefix, i))
    return out


SAMPLE_REPORT = json.loads((DATA / "report_sample.json").read_text())
REPORT_PATHS = [p for p in _paths(SAMPLE_REPORT) if p]


@settings(max_examples=80, deadline=None, suppress_health_check=list(HealthCheck))
@given(paths=st.lists(st.sampled_from(REPORT_PATHS), min_size=1, max_size=3), value=ODD, delete=st.booleans(),
       command=st.sampled_from(["report-md", "report-html", "check", "diff"]))
def test_a_mutated_report_json_renders_or_fails_with_one_line(paths, value, delete, command, capsys):
    report = json.loads(json.dumps(SAMPLE_REPORT))
    for path in paths:
        parent: Any = report
        try:
            for key in path[:-1]:
                parent = parent[key]
            if delete and isinstance(parent, dict):
                parent.pop(path[-1], None)
            else:
                parent[path[-1]] = value
        except (KeyError, IndexError, TypeError):
            continue
    tmp = Path(tempfile.mkdtemp())
    try:
        src = tmp / "report.json"
        src.write_text(_line(report))
        args = {"report-md": ["report", str(src), "-o", str(tmp / "o.md")],
                "report-html": ["report", str(src), "-o", str(tmp / "o.html")],
                "check": ["check", str(src), "--max-waste", "0.5"],
                "diff": ["diff", str(DATA / "report_sample.json"), str(src), "-o", str(tmp / "d.md")]}[command]
        code = cli_main(args)  # anything but UserError would propagate and fail the test
        err = capsys.readouterr().err
        assert code in (0, 1, 2), err
        if code == 2:
            assert err.startswith("gpudoctor: ") and "Traceback" not in err
    finally:
        shutil.rmtree(tmp)
