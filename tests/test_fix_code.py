"""Every fix a report prints pastes: each Python block of report.md and report.html parses,
each config table names the arguments of one call of one library, and a value appears once."""

from __future__ import annotations

import ast
import html
import re

import pytest

from gpudoctor.recording.store import load_recording
from gpudoctor.render.html import HtmlRenderer
from gpudoctor.render.markdown import MarkdownRenderer
from gpudoctor.report.build import build_report
from tests.recording_builder import T0, RecordingBuilder

TRAINER_ARGS = {"per_device_train_batch_size": 2, "gradient_accumulation_steps": 8, "tf32": None, "bf16": False,
                "torch_compile": False, "save_steps": 50, "save_only_model": False, "dataloader_num_workers": 0,
                "train_sampling_strategy": "random", "eval_steps": 10, "per_device_eval_batch_size": 8}


def _padded_batches(rows: list, lengths: list[int], seq_len: int, n: int) -> None:
    for i in range(n):
        rows.append({"k": "batch", "t": T0 + 3 + i * 0.1, "tokens": seq_len * len(lengths),
                     "pad": seq_len * len(lengths) - sum(lengths), "seq_len": seq_len, "lengths": lengths})


def scenarios(tmp_path):
    """Recordings that fire every rule with a fix: loop and Trainer flavours, GPU and CPU."""
    for trainer in (None, TRAINER_ARGS):
        for stall in ("tokenize", "stall", "io", "cpu"):
            b = RecordingBuilder(tmp_path / f"{stall}-{bool(trainer)}", cores=8 if stall != "cpu" else 2,
                                 duration_s=80.0)
            rows = b.process()
            b.training_loop(rows, start_s=5.0, steps=600, compute_s=0.05, wait_s=0.1, fetch_s=0.1,
                            save_every=100, save_s=2.0, trainer_args=trainer)
            if stall == "tokenize":
                rows.append({"k": "counter", "t": T0 + 90, "name": "tokenize", "calls": 600, "s": 50.0})
            rows.append({"k": "span", "c": "format", "t0": T0 + 0.2, "dt": 4.7, "name": "datasets.Dataset.map"})
            _padded_batches(rows, [40, 300, 90, 120], 512, 50)
            rows.append({"k": "torch_cfg", "t": T0 + 2.0, "cuda": True, "device": "cuda",
                         "device_name": "NVIDIA H100 80GB HBM3", "device_capability": [9, 0],
                         "matmul_precision": "highest", "allow_tf32": False, "param_dtype": "torch.float32",
                         "autocast": False})
            b.host_rows(cpu_total_pct={"cpu": 97.0}.get(stall, 20.0), cpu_proc_pct=100.0,
                        iowait_pct=40.0 if stall == "io" else 0.0)
            b.gpu_rows(util_pct=40.0, mem_used_mib=9000.0)
            yield build_report(load_recording(b.write()))


def _python_blocks(md: str, page: str) -> list[str]:
    blocks = re.findall(r"^(`{3,})python\n(.*?)\n\1$", md, flags=re.S | re.M)
    blocks = [code for _, code in blocks]
    blocks += [html.unescape(code) for code in re.findall(r"<pre[^>]*><code>(.*?)</code></pre>", page, re.S)]
    return blocks


def test_every_config_and_snippet_parses_as_python(tmp_path):
    rules_seen, parsed = set(), 0
    for report in scenarios(tmp_path):
        rules_seen |= {f["rule"] for f in report["findings"]}
        for code in _python_blocks(MarkdownRenderer().render(report), HtmlRenderer().render(report)):
            try:
                ast.parse(code)
            except SyntaxError as exc:
                pytest.fail(f"does not parse: {exc}\n{code}")
            parsed += 1
    must = {"tokenization_in_loop", "data_stall", "io_bound", "cpu_saturated", "padding_waste",
            "checkpoint_overhead", "startup_idle", "no_tf32", "no_mixed_precision", "small_batch"}
    assert must <= rules_seen, must - rules_seen
    assert parsed >= 40


def test_each_table_belongs_to_one_call_and_trainer_tables_hold_only_its_fields(tmp_path):
    for report in scenarios(tmp_path):
        for f in report["findings"]:
            fix = f["fix"]
            tables = [fix] + fix["also"]
            for t in tables:
                if "TrainingArguments" in (t.get("library") or ""):
                    assert set(t["config"]) <= set(TRAINER_ARGS) | {"group_by_length"}, (f["rule"], t)
                assert not any(isinstance(v, dict) for v in (t.get("config") or {}).values()), (f["rule"], t)
            calls = [t.get("call") for t in tables if t.get("config")]
            assert len(calls) == len(set(calls)), (f["rule"], calls)
