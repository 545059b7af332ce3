"""``gpudoctor replay RUN_FOLDER`` and ``--training-args/--model-config``: the replay config derived
from what users already have, checked against what was recorded or written by real HF objects."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from gpudoctor.cli import main as cli_main
from gpudoctor.recording.store import load_recording
from gpudoctor.replay import derive, facts
from gpudoctor.replay.config import load_config, load_config_text
from tests.conftest import run_cli

pytestmark = pytest.mark.slow  # real trainings for most of a minute: scheduled first (conftest.py)


def recorded(folder: Path) -> dict:
    """What the hooks wrote into the probe's run folder: batches, TrainingArguments, the model."""
    rec = load_recording(folder)
    records = list(rec.events.values())
    return {
        "batches": [e for r in records for e in r.batches if e.get("lengths")],
        "args": next(r.trainer["args"] for r in records if r.trainer is not None),
        "model": next(r.model for r in records if r.model is not None),
    }


@pytest.fixture(scope="module")
def replayed(probe_run, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A real HF Trainer run recorded by gpudoctor run (shared with test_probes), replayed from its folder."""
    run = probe_run("hf_trainer")
    assert run.returncode == 0, run.stderr[-2000:]
    out = tmp_path_factory.mktemp("from-run") / "replay"
    proc = run_cli("replay", str(run.folder), "--target", "h100", "--out", str(out), "--max-steps", "8",
                   "--max-seconds", "300")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return run.folder, out


def test_the_config_derived_from_a_recorded_trainer_run_is_what_was_recorded(replayed):
    folder, out = replayed
    seen = recorded(folder)
    cfg = load_config(out / "replay.yaml")  # written for the user, and valid as it is
    args, model = seen["args"], seen["model"]
    widths = {b["seq_len"] for b in seen["batches"]}
    lengths = [x for b in seen["batches"] for x in b["lengths"]]
    assert widths == {cfg.max_length} and cfg.padding == "max_length"  # the probe pads every row to 512
    assert (cfg.dataset.length.min, cfg.dataset.length.max) == (min(lengths), max(lengths))
    assert cfg.dataset.length.mean == pytest.approx(statistics.fmean(lengths), abs=0.05)
    assert cfg.tokenizer.tokenize_at == "startup"  # datasets.map before the first step, nothing after
    assert cfg.loop == "trainer"
    for key in ("per_device_train_batch_size", "gradient_accumulation_steps", "dataloader_num_workers",
                "save_steps", "max_steps", "learning_rate", "seed", "optim"):
        assert getattr(cfg.training, key) == args[key], key
    assert cfg.model.arch == model["config"]["model_type"] == "gpt2"
    assert (cfg.model.n_layers, cfg.model.hidden_size) == (model["config"]["n_layer"], model["config"]["n_embd"])
    assert cfg.model.params_b == pytest.approx(model["params"] / 1e9, rel=1e-3)
    text = (out / "replay.yaml").read_text()
    assert "max_length: 512  # the recorded batches" in text
    assert "per_device_train_batch_size: 2  # the recorded TrainingArguments" in text


def test_the_replay_of_a_recorded_run_says_where_each_value_came_from(replayed):
    folder, out = replayed
    report = json.loads((out / "report.json").read_text())
    notes = report["preflight"]["notes"]
    for source in ("the recorded batches", "the recorded TrainingArguments", "the recorded model config",
                   "the recorded tokenizer calls"):
        assert any(n.startswith(f"replay config, from {source}: ") for n in notes), source
    assert report["run"]["command"][:3] == ["gpudoctor", "replay", str(folder)]
    # The small local run replays what the rented one would compute: the same padded width.
    assert report["padding"]["max_length"] == 512
    assert "replay config, from the recorded batches" in (out / "report.md").read_text()


def test_the_config_from_a_checkpoints_json_files_matches_the_real_objects(tmp_path: Path):
    transformers = pytest.importorskip("transformers")
    targs = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, gradient_accumulation_steps=3,
        dataloader_num_workers=2, save_steps=250, max_steps=900, learning_rate=2e-4, report_to=[])
    (tmp_path / "training_args.json").write_text(targs.to_json_string())
    config = transformers.AutoConfig.for_model("llama", num_hidden_layers=2, hidden_size=64, intermediate_size=128,
                                               num_attention_heads=4, num_key_value_heads=2, vocab_size=1200)
    config.save_pretrained(str(tmp_path))  # config.json, as beside the weights
    found = facts.add_files(facts.RunFacts(), tmp_path / "training_args.json", tmp_path / "config.json")
    derived = derive.derive(found, target="h100")
    cfg = load_config_text(derived.yaml_text("gpudoctor replay replay.yaml"), "replay.yaml")
    assert cfg.loop == "trainer" and cfg.hardware.target == "h100"
    for key in ("per_device_train_batch_size", "gradient_accumulation_steps", "dataloader_num_workers",
                "save_steps", "max_steps", "learning_rate"):
        assert getattr(cfg.training, key) == getattr(targs, key), key
    assert cfg.full_run.max_steps == 900 and cfg.dataset.count == 900 * 4 * 3
    assert cfg.model.arch == "llama" and (cfg.model.n_layers, cfg.model.hidden_size) == (2, 64)
    assert cfg.model.config["num_key_value_heads"] == 2 and cfg.tokenizer.train_bpe.vocab_size == 1200
    with_meta = transformers.AutoModelForCausalLM.from_config(config)
    assert cfg.model.params_b == pytest.approx(sum(p.numel() for p in with_meta.parameters()) / 1e9, rel=1e-3)
    # What a checkpoint does not hold is a default, and replay.yaml says so beside it.
    assert derived.sources["padding"][0] == derive.DEFAULT and derived.sources["training.max_steps"][0] == (
        "--training-args training_args.json")


def test_a_pickled_training_args_bin_is_refused_with_what_to_pass(tmp_path: Path, capsys):
    binary = tmp_path / "training_args.bin"
    binary.write_bytes(b"\x80\x04not loaded")
    assert cli_main(["replay", "--training-args", str(binary)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "never loads" in err and "to_json_string()" in err
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"lr": 1}))
    assert cli_main(["replay", "--training-args", str(other)]) == 2
    assert "TrainingArguments.to_json_string()" in capsys.readouterr().err
    assert cli_main(["replay"]) == 2
    assert "run folder" in capsys.readouterr().err
