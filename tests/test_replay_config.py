"""The replay config: what loads, and the one-line errors users get when it does not."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpudoctor.common.errors import UserError
from gpudoctor.replay import gpus
from gpudoctor.replay.config import SECTION_TYPES, TrainingSection, load_config, load_config_text

SAMPLES = sorted((Path(__file__).parent.parent / "sample_configs").glob("*.yaml"))
MINIMAL = "dataset:\n  kind: synthetic\n  count: 10\n"


def error_of(text: str, source: str = "cfg.yaml") -> str:
    with pytest.raises(UserError) as info:
        load_config_text(text, source=source)
    message = str(info.value)
    assert "\n" not in message, "errors are one line"
    return message


@pytest.mark.parametrize("path", SAMPLES, ids=lambda p: p.stem)
def test_every_sample_config_loads_and_names_its_seed(path: Path) -> None:
    cfg = load_config(path)
    assert cfg.hardware.target and cfg.full_run.examples
    head = path.read_text().splitlines()[0]
    assert path.stem == "healthy" or "seeds/" in head, "first line names the source seed"


def test_sample_configs_cover_every_seed_case() -> None:
    names = {p.stem for p in SAMPLES}
    assert {
        "seed000_format_at_startup",
        "seed001_h100_38h",
        "seed002_padding_2048",
        "seed003_rtx4090_batch1",
        "seed004_tokenize_on_the_fly",
        "seed004_pretokenized_packed",
        "healthy",
    } <= names


def test_values_are_typed_and_lines_recorded() -> None:
    cfg = load_config_text(MINIMAL + "training:\n  learning_rate: 1e-4\n  bf16: true\n")
    assert cfg.training.learning_rate == pytest.approx(1e-4)  # YAML 1.1 reads 1e-4 as text
    assert cfg.training.bf16 is True
    assert cfg.line_of("training.learning_rate") == 5
    assert cfg.line_of("training.save_steps") == 4  # falls back to the section's line


def test_misspelled_key_names_key_line_and_suggestion() -> None:
    message = error_of(MINIMAL + "training:\n  per_device_train_bach_size: 2\n")
    assert message.startswith("cfg.yaml:5:")
    assert "training.per_device_train_bach_size" in message
    assert "did you mean per_device_train_batch_size?" in message


def test_key_in_the_wrong_section_says_where_it_belongs() -> None:
    message = error_of(MINIMAL + "dataloader_num_workers: 4\n")
    assert "cfg.yaml:4:" in message and "belongs under training:" in message


def test_bad_choice_suggests_the_close_one() -> None:
    message = error_of(MINIMAL + "padding: packed\n")
    assert "cfg.yaml:4: padding:" in message and "did you mean packing?" in message


def test_wrong_type_is_reported_with_its_key() -> None:
    message = error_of(MINIMAL + "training:\n  dataloader_num_workers: many\n")
    assert "cfg.yaml:5: training.dataloader_num_workers: must be a whole number" in message


def test_of_several_problems_the_earliest_in_the_file_is_reported() -> None:
    assert error_of(MINIMAL + "foo: 1\ntraining: {bf16: 3}\n").startswith("cfg.yaml:4: foo is not a known key")
    assert error_of(MINIMAL + "training: {bf16: 3}\nfoo: 1\n").startswith(
        "cfg.yaml:4: training.bf16: must be true or false, not 3"
    )


def test_missing_dataset_path_is_reported(tmp_path: Path) -> None:
    message = error_of("dataset:\n  kind: jsonl\n  path: data/train.jsonl\n")
    assert "cfg.yaml:3: dataset.path:" in message and "does not exist" in message


def test_relative_paths_resolve_from_the_config_folder(tmp_path: Path) -> None:
    (tmp_path / "train.jsonl").write_text('{"text": "hi"}\n')
    (tmp_path / "c.yaml").write_text("dataset: {kind: jsonl, path: train.jsonl}\n")
    assert load_config(tmp_path / "c.yaml").dataset.path == "train.jsonl"


@pytest.mark.parametrize(
    ("snippet", "key", "hint"),
    [
        ("model: {path: Qwen/Qwen2.5-14B-Instruct}", "model.path", "model: {arch: llama"),
        ("tokenizer: {path: meta-llama/Llama-3.1-8B}", "tokenizer.path", "train_bpe"),
        ("tokenizer: {path: gpt2}", "tokenizer.path", "train_bpe"),
    ],
)
def test_hub_ids_get_the_offline_alternative(snippet: str, key: str, hint: str) -> None:
    message = error_of(MINIMAL + snippet + "\n")
    assert f"{key}:" in message and "never downloads" in message and hint in message


def test_unknown_target_gpu_lists_the_known_ones() -> None:
    message = error_of(MINIMAL + "hardware: {target: h1000}\n")
    assert "cfg.yaml:4: hardware.target:" in message
    assert all(key in message for key in gpus.known_keys())


def test_a_gpu_the_table_lacks_can_be_described() -> None:
    cfg = load_config_text(
        MINIMAL + "hardware:\n  target: mi300x\n  gpu_spec: {bf16_tflops: 1307, fp32_tflops: 163,"
        " memory_gb: 192, bandwidth_gb_s: 5300}\n"
    )
    assert cfg.hardware.gpu_spec is not None and cfg.hardware.gpu_spec.bf16_tflops == 1307


def test_formatting_after_tokenizing_is_refused() -> None:
    text = (
        MINIMAL
        + "text: {template: '{q} {a}', format_at: loop}\ntokenizer: {tokenize_at: getitem}\n"
    )
    assert "text must be formatted before it is tokenized" in error_of(text)


def test_packing_needs_pretokenized_data() -> None:
    assert "packing" in error_of(MINIMAL + "padding: packing\n")


def test_prefetch_without_workers_is_refused_like_dataloader_does() -> None:
    message = error_of(MINIMAL + "training: {dataloader_prefetch_factor: 2}\n")
    assert "training.dataloader_prefetch_factor" in message and "num_workers > 0" in message


def test_duplicate_keys_are_refused() -> None:
    assert "appears twice (first on line 1)" in error_of(MINIMAL + "dataset: {}\n")


def test_yaml_syntax_errors_carry_a_line() -> None:
    assert error_of(MINIMAL + "training: [1,\n").startswith("cfg.yaml:")


def test_missing_file_is_a_user_error(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="config file not found"):
        load_config(tmp_path / "nope.yaml")


def test_training_keys_are_real_trainingarguments_fields() -> None:
    from transformers import TrainingArguments

    real = {f.name for f in dataclasses.fields(TrainingArguments)}
    assert {f.name for f in dataclasses.fields(TrainingSection)} <= real


@pytest.mark.parametrize("name", ["H100", "NVIDIA A100 80GB", "rtx 4090", "A10G", "l40s", "V100"])
def test_gpu_names_are_found_however_written(name: str) -> None:
    assert gpus.find(name) is not None


KEYS = sorted(
    {f.name for cls in SECTION_TYPES.values() for f in dataclasses.fields(cls)} | set(SECTION_TYPES)
)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-5, 10**6),
    st.floats(allow_nan=True),
    st.text(max_size=12),
    st.sampled_from(["synthetic", "jsonl", "ahead", "h100", "loop"]),
)
keys = st.one_of(st.sampled_from(KEYS), st.text(max_size=8), st.integers(0, 3))
trees = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(keys, inner, max_size=4)),
    max_leaves=12,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.one_of(
        st.text(max_size=200), trees.map(lambda t: yaml.safe_dump(t, default_flow_style=False))
    )
)
def test_loader_raises_nothing_but_user_error(text: str) -> None:
    try:
        load_config_text(text, source="fuzz.yaml")
    except UserError as exc:
        assert "\n" not in str(exc)
