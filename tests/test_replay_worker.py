"""The replay worker really trains what a sample config describes, within its bounds,
and writes the measurements preflight needs. Real subprocesses, real DataLoaders, CPU."""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpudoctor.replay.config import load_config, load_config_text
from gpudoctor.replay.preflight import predict

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")

ROOT = Path(__file__).parent.parent
SAMPLES = ROOT / "sample_configs"
# name -> (replay.examples, max steps, max seconds, extra training settings for the test)
SCALED: dict[str, tuple[int, int, float, dict[str, Any]]] = {
    "seed002_padding_2048": (200, 1, 10.0, {"gradient_accumulation_steps": 2}),
    "seed003_rtx4090_batch1": (25, 40, 3.0, {}),
    "healthy": (300, 2, 6.0, {"gradient_accumulation_steps": 1}),
    "seed000_format_at_startup": (300, 2, 6.0, {"gradient_accumulation_steps": 1}),
    "seed001_h100_38h": (200, 2, 6.0, {"gradient_accumulation_steps": 1}),
    "seed004_tokenize_on_the_fly": (40, 1, 8.0, {"gradient_accumulation_steps": 1}),
    "seed004_pretokenized_packed": (40, 1, 8.0, {"gradient_accumulation_steps": 1}),
    "slow_loading": (200, 2, 6.0, {"gradient_accumulation_steps": 1}),
}
# Two run as subprocesses, as ``gpudoctor run`` starts them; the others inside pytest, one after another while
# those run: each subprocess spends about 5 s of its 6 s of CPU importing torch, transformers and datasets.
SUBPROCESS = ("seed002_padding_2048", "slow_loading")


def scaled_config(name: str, folder: Path) -> Path:
    """The sample config with fewer examples, so the test stays in seconds."""
    examples, _, _, training = SCALED[name]
    data = yaml.safe_load((SAMPLES / f"{name}.yaml").read_text())
    data["replay"].update(examples=examples, measure_seconds=1.0)
    data["training"].update(training)
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def worker_args(name: str, folder: Path) -> list[str]:
    _, steps, seconds, _ = SCALED[name]
    return [
        str(scaled_config(name, folder)),
        "--max-steps",
        str(steps),
        "--max-seconds",
        str(seconds),
        "--cache",
        str(folder / "cache"),
    ]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """The workers of :data:`SUBPROCESS` as subprocesses (as ``gpudoctor run`` starts them, with
    ``GPUDOCTOR_RUN_DIR`` set), the others in this process with ``--measure-out``."""
    from gpudoctor.replay import worker

    base = tmp_path_factory.mktemp("replay")
    procs = {
        name: subprocess.Popen(
            [sys.executable, "-m", "gpudoctor.replay.worker", *worker_args(name, base)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "GPUDOCTOR_RUN_DIR": str(base / f"run-{name}")},
        )
        for name in SUBPROCESS
    }
    outputs = {}
    for name in SCALED:
        if name not in SUBPROCESS:
            printed = io.StringIO()
            with contextlib.redirect_stdout(printed):
                assert worker.main([*worker_args(name, base), "--measure-out", str(base / f"run-{name}")]) == 0, name
            outputs[name] = printed.getvalue()
    for name, proc in procs.items():
        out, err = proc.communicate(timeout=240)
        assert proc.returncode == 0, f"{name} failed:\n{err[-3000:]}"
        outputs[name] = out
    return {
        name: {
            "stdout": outputs[name],
            "config": base / f"{name}.yaml",
            "measure": json.loads((base / f"run-{name}" / "replay_measure.json").read_text()),
        }
        for name in SCALED
    }


@pytest.mark.parametrize("name", list(SCALED))
def test_worker_trains_within_its_bounds(runs: dict[str, dict[str, Any]], name: str) -> None:
    _, steps, seconds, _ = SCALED[name]
    training = runs[name]["measure"]["training"]
    assert 1 <= training["steps"] <= steps
    # It stops at a bound, not before and not at another: no wall-clock ceiling (a busy machine's step is slow)
    assert training["stopped_by"] in ("steps", "seconds")
    if training["stopped_by"] == "steps":
        assert training["steps"] == steps
    else:
        assert training["seconds"] >= seconds
    assert math.isfinite(training["loss_last"]) and training["loss_last"] > 0
    assert "replay:" in runs[name]["stdout"]


@pytest.mark.parametrize("name", list(SCALED))
def test_measurements_are_sane(runs: dict[str, dict[str, Any]], name: str) -> None:
    m = runs[name]["measure"]
    assert m["schema"] == "gpudoctor.replay_measure/1"
    assert m["pipeline"]["samples_per_s"] > 0 and m["pipeline"]["samples_timed"] > 0
    assert 0 < m["pipeline"]["loader_s_per_sample"] < 1
    assert 0 < m["replayed_model"]["params"] < 5_000_000
    tokens = m["tokens"]
    assert 0 < tokens["nonpad_mean"] <= tokens["padded_mean"] <= tokens["max_length"]
    assert 0 <= tokens["pad_fraction"] < 1 and len(tokens["raw_lengths_sample"]) > 0


def test_padding_to_max_length_and_startup_work_are_measured(
    runs: dict[str, dict[str, Any]],
) -> None:
    m = runs["seed002_padding_2048"]["measure"]
    tokens = m["tokens"]
    assert tokens["padded_mean"] == 2048 and tokens["raw_max"] <= 1481 + 16
    assert tokens["pad_fraction"] > 0.5  # ~700-token examples padded to 2048
    start = m["startup_work"]
    assert (
        start["format_s"] > 0 and start["tokenize_s"] > 0 and start["format_examples_per_s"] > 100
    )
    assert m["training"]["loop"] == "trainer"
    ckpt = m["checkpoint"]
    assert ckpt["count"] >= 1 and ckpt["bytes"] > 0 and ckpt["bytes_per_param"] > 4


def test_batch_one_replay_wraps_epochs_over_25_examples(runs: dict[str, dict[str, Any]]) -> None:
    m = runs["seed003_rtx4090_batch1"]["measure"]
    assert m["examples_replayed"] == 25
    assert m["training"]["micro_steps"] == m["training"]["steps"]  # no accumulation
    assert m["pipeline"]["stages"] == {"format_at": "getitem", "tokenize_at": "getitem"}


def test_healthy_config_measures_no_padding_and_gets_no_fixes(
    runs: dict[str, dict[str, Any]],
) -> None:
    m = runs["healthy"]["measure"]
    assert m["tokens"]["pad_fraction"] == 0
    prediction = predict(load_config(runs["healthy"]["config"]), m)
    assert prediction["fixes"] == [] and prediction["speedup"] == pytest.approx(1.0)
    assert prediction["after"]["data_stall_share"] < 0.02


def test_seed002_prediction_right_sizes_and_speeds_up(runs: dict[str, dict[str, Any]]) -> None:
    r = runs["seed002_padding_2048"]
    p = predict(load_config(r["config"]), r["measure"])
    padding = next(f for f in p["fixes"] if f["rule"] == "padding_waste")
    assert padding["config"]["max_length"] <= 1536
    assert p["speedup"] > 1.5


def test_bad_config_exits_2_with_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "dataset: {kind: synthetic, count: 5}\ntraining: {per_device_train_bach_size: 2}\n"
    )
    proc = subprocess.run(
        [sys.executable, "-m", "gpudoctor.replay.worker", str(bad)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert (
        proc.stderr.strip().count("\n") == 0
        and "did you mean per_device_train_batch_size" in proc.stderr
    )


def test_jsonl_data_tokenized_in_the_loop_builds_padded_batches(tmp_path: Path) -> None:
    """A JSONL file, formatting in collate and tokenizing in the loop: the plain-loop path."""
    from gpudoctor.replay import build, prepare

    rows = [
        {"question": f"what is {i} plus {i}", "answer": f"it is {2 * i} " * (1 + i % 5)}
        for i in range(40)
    ]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = load_config_text(
        "dataset: {kind: jsonl, path: train.jsonl}\n"
        "text: {template: 'Q: {question} A: {answer}', format_at: collate}\n"
        "tokenizer: {train_bpe: {vocab_size: 400}, tokenize_at: loop}\n"
        "max_length: 64\npadding: longest\ntraining: {per_device_train_batch_size: 4}\n",
        base_dir=str(tmp_path),
    )
    folder, meta = prepare.prepare(cfg, tmp_path / "cache")
    assert meta["examples"] == 40 and meta["rows_total"] == 40
    data, tokenizer = prepare.load_prepared(folder)
    pipe = build.build_pipeline(cfg, data, tokenizer)
    raw_batch = build.build_loader(cfg, pipe, pin_memory=False).__iter__().__next__()
    assert isinstance(raw_batch, list) and "text" in raw_batch[0]  # formatted, not yet tokenized
    batch = pipe.loop_work(raw_batch)
    assert batch["input_ids"].shape[0] == 4 and batch["input_ids"].shape[1] <= 64
    pads = batch["attention_mask"] == 0
    assert bool((batch["labels"][pads] == -100).all())
    model = build.build_model(cfg, tokenizer)
    assert model(**batch).loss.item() > 0


@pytest.mark.parametrize("kind", ["disk", "arrow"])
def test_saved_datasets_and_a_local_tokenizer_folder_load_offline(
    tmp_path: Path, kind: str
) -> None:
    """A save_to_disk folder or its .arrow file, with a tokenizer saved by save_pretrained."""
    import datasets

    from gpudoctor.replay import build, prepare

    datasets.Dataset.from_dict(
        {"text": [f"row {i} " + "word " * (i % 30) for i in range(60)]}
    ).save_to_disk(str(tmp_path / "ds"))
    first = load_config_text(
        "dataset: {kind: disk, path: ds}\ntokenizer: {train_bpe: {vocab_size: 300}}\n",
        base_dir=str(tmp_path),
    )
    folder, _ = prepare.prepare(first, tmp_path / "cache")
    path = "ds" if kind == "disk" else next(p.name for p in (tmp_path / "ds").glob("*.arrow"))
    if kind == "arrow":
        path = f"ds/{path}"
    cfg = load_config_text(
        f"dataset: {{kind: {kind}, path: {path}}}\ntokenizer: {{path: {folder / 'tokenizer'}, tokenize_at: collate}}\n"
        "max_length: 16\npadding: max_length\ntraining: {per_device_train_batch_size: 5}\nreplay: {examples: 20}\n",
        base_dir=str(tmp_path),
    )
    folder2, meta = prepare.prepare(cfg, tmp_path / "cache")
    assert meta["tokenizer_kind"] == "path" and meta["examples"] == 20 and meta["rows_total"] == 60
    data, tokenizer = prepare.load_prepared(folder2)
    pipe = build.build_pipeline(cfg, data, tokenizer)
    batch = pipe.collator([pipe.dataset[i] for i in range(5)])
    assert tuple(batch["input_ids"].shape) == (5, 16)
