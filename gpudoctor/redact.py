"""Keep secrets out of recordings and reports.

Reports land in pull requests, so command lines, TrainingArguments and any
mapping we record pass through here first. Stdlib only: this runs inside the
patient's interpreter too.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

REDACTED = "***"

# Names that hold secrets: HF_TOKEN, WANDB_API_KEY, hub_token, --api-key, db_password...
_SECRET_NAME = re.compile(
    r"(token|secret|passw(or)?d|passwd|passphrase|api[-_]?key|access[-_]?key|private[-_]?key|credential|auth)",
    re.IGNORECASE,
)
# Names that match the above but hold counts, ids, special-token strings or people.
_NOT_SECRET_NAME = re.compile(
    r"(tokens\b|tokens[-_]|[-_]tokens|token[-_]?ids?\b|tokeniz|num[-_]?token|max[-_]?token"
    r"|(bos|eos|pad|unk|sep|cls|mask|special)[-_]token|token[-_](budget|limit|count|len|length|type)|author)"
)
# Values that look like secrets whatever they are called.
_SECRET_VALUE = re.compile(
    r"(hf_[A-Za-z0-9]{20,}|sk-[A-Za-z0-9_-]{20,}|ghp_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,}"
    r"|xox[abpr]-[A-Za-z0-9-]{10,}|AKIA[0-9A-Z]{16}|eyJ[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]+)"
)
# user:password@ in URLs
_URL_CREDENTIALS = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://)[^/@\s:]+:[^/@\s]+@")


def is_secret_name(name: str) -> bool:
    """True for keys such as ``HF_TOKEN``, ``hub_token``, ``--api-key``, ``db_password``.

    Token *counts*, ids and special tokens (``max_tokens``, ``num_tokens``,
    ``pad_token_id``, ``eos_token``), tokenizers and authors are not secrets.
    """
    lowered = name.lower().lstrip("-")
    if _NOT_SECRET_NAME.search(lowered):
        return False
    return bool(_SECRET_NAME.search(lowered))


def redact_value(text: str) -> str:
    """Mask secret-looking substrings inside a free-form string."""
    text = _URL_CREDENTIALS.sub(lambda m: f"{m.group('scheme')}{REDACTED}@", text)
    return _SECRET_VALUE.sub(REDACTED, text)


def redact_argv(argv: Sequence[str]) -> list[str]:
    """Redact ``--token X``, ``--api-key=X``, ``HF_TOKEN=X`` and secret-looking values."""
    out: list[str] = []
    hide_next = False
    for arg in argv:
        arg = str(arg)
        if hide_next and not arg.startswith("--"):  # "--use-auth-token --lr 3e-4": a flag, no value
            out.append(REDACTED)
            hide_next = False
            continue
        hide_next = False
        if arg.startswith("-") and "=" in arg:
            name, _, _value = arg.partition("=")
            out.append(f"{name}={REDACTED}" if is_secret_name(name) else redact_value(arg))
            continue
        if arg.startswith("-") and is_secret_name(arg):
            out.append(arg)
            hide_next = True
            continue
        if "=" in arg and not arg.startswith("-"):
            name, _, _value = arg.partition("=")
            if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.]*", name) and is_secret_name(name):
                out.append(f"{name}={REDACTED}")
                continue
        out.append(redact_value(arg))
    return out


def redact_mapping(data: Any) -> Any:
    """Recursively redact values under secret-named keys, and secret-looking strings."""
    if isinstance(data, Mapping):
        result: dict[str, Any] = {}
        for key, value in data.items():
            skey = str(key)
            if is_secret_name(skey) and value not in (None, "", False):
                result[skey] = REDACTED
            else:
                result[skey] = redact_mapping(value)
        return result
    if isinstance(data, (list, tuple)):
        return [redact_mapping(v) for v in data]
    if isinstance(data, str):
        return redact_value(data)
    return data
