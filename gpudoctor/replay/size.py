"""How many parameters a replay's model has, from its config's sizes alone (no transformers, no memory).

A recorded run says how many parameters its model had (the ``model`` event's ``params``), but the
replay builds what the *config* describes; a recording that says ``params: 1000`` beside 256
layers x 32768 wide is not small. So the size that decides whether a model is replayed at its own
shape, and whether it can be built here at all, is computed from the sizes the model would be
built with (:func:`tiny_defaults` under ``model.config``), the same ones ``build.model_config`` uses.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# A tiny size per architecture family when model.config gives none (CPU replay).
_DECODER: dict[str, Any] = {
    "num_hidden_layers": 2,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
}
TINY: dict[str, dict[str, Any]] = {
    "gpt2": {"n_layer": 2, "n_embd": 64, "n_head": 2},
    "opt": {
        "num_hidden_layers": 2,
        "hidden_size": 64,
        "ffn_dim": 128,
        "num_attention_heads": 2,
        "word_embed_proj_dim": 64,
    },
    "gpt_neox": {
        "num_hidden_layers": 2,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_attention_heads": 2,
    },
    "bert": {
        "num_hidden_layers": 2,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_attention_heads": 2,
    },
    "roberta": {
        "num_hidden_layers": 2,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_attention_heads": 2,
    },
}


# Archs whose MLP is gated (gate, up and down projections: 3 matrices); the others have 2.
GATED = ("llama", "qwen2", "qwen3", "mistral", "gemma", "phi3")
LEARNED_POSITIONS = ("gpt2", "opt", "bert", "roberta")
REPLAY_VOCAB = 8000  # the replay's BPE learns at most this many tokens (derive.MAX_BPE_VOCAB)
# Training in fp32 with Adam keeps 4 numbers per parameter: the weight, its gradient, two moments.
TRAIN_BYTES_PER_PARAM = 16
_KEYS = {
    "layers": ("num_hidden_layers", "n_layer", "num_layers"),
    "hidden": ("hidden_size", "n_embd", "d_model"),
    "ffn": ("intermediate_size", "n_inner", "ffn_dim"),
    "heads": ("num_attention_heads", "n_head"),
    "kv_heads": ("num_key_value_heads",),
    "head_dim": ("head_dim",),
    "positions": ("n_positions", "max_position_embeddings"),
}


def tiny_defaults(arch: str, config: Mapping[str, Any]) -> dict[str, Any]:
    """The sizes the replay fills in under ``model.config`` for ``arch`` (CPU replay)."""
    defaults = dict(TINY.get(arch, _DECODER))
    if "num_attention_heads" in config:
        defaults.pop("num_key_value_heads", None)
    return defaults


def config_params(arch: str, config: Mapping[str, Any], vocab: int = REPLAY_VOCAB) -> int:
    """About how many parameters ``arch`` built with ``config`` (over the tiny defaults) has.

    Embeddings, and per layer the attention's four projections and the MLP's two or three
    matrices; norms and biases (a few per layer) are left out. Exact enough to tell a model
    that fits from one that does not: it is compared with limits, never reported.
    """
    sizes = {**tiny_defaults(arch, config), **config}
    layers = _size(sizes, "layers") or 1
    hidden = _size(sizes, "hidden") or 1
    ffn = _size(sizes, "ffn") or 4 * hidden
    heads = _size(sizes, "heads") or 1
    head_dim = _size(sizes, "head_dim") or max(1, hidden // heads)
    kv_heads = _size(sizes, "kv_heads") or heads
    q_width, kv_width = heads * head_dim, kv_heads * head_dim
    attention = hidden * q_width * 2 + hidden * kv_width * 2  # q and o; k and v
    mlp = (3 if arch in GATED else 2) * hidden * ffn
    positions = (_size(sizes, "positions") or 0) if arch in LEARNED_POSITIONS else 0
    return layers * (attention + mlp) + (vocab + positions) * hidden


def _size(sizes: Mapping[str, Any], what: str) -> int | None:
    for key in _KEYS[what]:
        value = sizes.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None
