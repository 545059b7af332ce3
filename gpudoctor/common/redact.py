"""Keep secrets out of recordings and reports.

Reports land in pull requests, so command lines, TrainingArguments, library
versions and any mapping we record pass through here first. Three nets, each
catching what the others miss:

* names: a value under a secret-looking name (``--hf-token X``, ``hub_token``,
  ``"api_key": ...`` in JSON, ``?sig=`` in a URL) is hidden, whatever it looks like;
* shapes: credentials in URLs (``scheme://user:pass@``, ``https://TOKEN@``);
* formats: known token formats (``hf_``, ``sk-``, ``ghp_``, ``glpat-``...) wherever they are.

Names are read word by word (``--tokenizer-auth-token`` is ``tokenizer``,
``auth``, ``token``), so a count, id or special token (``max_tokens``,
``pad_token_id``, ``eos_token``), a tokenizer or an author is kept, while a name
that also holds a secret word is not. Stdlib only: this runs inside the
patient's interpreter too.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

REDACTED = "***"

# A secret wherever these appear inside a word: hubtoken, dbpassword, oauth, apikey...
_SECRET_PART = re.compile(
    r"secret|passw(?:or)?d|passphrase|credential|apikey|accesskey|privatekey"
    r"|auth(?!or(?!i[sz]))|token(?!i[sz])|cookie|bearer|signature"
)
# Whole words that are secrets on their own.
_SECRET_WORDS = frozenset({"pwd", "creds", "cred", "sig", "key", "keys", "apikey", "pass"})
# Special tokens: ``eos_token``, ``pad_token_id`` are vocabulary, not credentials.
_SPECIAL = frozenset({
    "bos", "eos", "pad", "unk", "sep", "cls", "mask", "special", "start", "end", "image", "video",
    "audio", "stop", "placeholder", "added"
})
_TOKEN_NEXT_OK = frozenset({
    "type", "types", "budget", "limit", "limits", "count", "counts", "len", "length", "lengths",
    "level", "embedding", "embeddings", "dim", "size", "classification"
})
_COUNTING = frozenset({"max", "min", "num", "n", "total", "per"})
# Words that make a plural ``tokens`` credentials (``api_tokens``) rather than a count.
_CREDENTIAL_CONTEXT = frozenset({
    "api", "auth", "access", "hf", "hub", "oauth", "refresh", "session", "github", "gh", "gitlab",
    "slack", "bot", "private", "wandb", "openai", "client", "login", "user", "id", "bearer"
})
# ``sort_key``, ``metric_key_prefix``: keys of data, not of doors.
_HARMLESS_KEY = frozenset({
    "sort", "cache", "group", "metric", "monitor", "primary", "foreign", "column", "text", "label",
    "labels", "input", "output", "image", "audio", "dataset", "data", "feature", "features",
    "lookup", "dict", "batch", "sample", "join", "partition", "shard", "hash", "map", "index",
    "row", "split", "field", "prompt", "answer", "question", "target", "source", "context",
    "response", "chosen", "rejected", "message", "messages", "content", "rng", "random"
})
# A flag that reads as a switch: what follows it may be the next flag, not its value.
_SWITCH_FIRST = frozenset({
    "use", "no", "enable", "disable", "with", "without", "allow", "require", "skip", "ignore"
})

_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")
_WORD_SPLIT = re.compile(r"[^a-z0-9]+")

# Values that look like secrets whatever they are called.
_SECRET_VALUE = re.compile(
    r"(hf_[A-Za-z0-9]{20,}|sk-[A-Za-z0-9_-]{20,}|gh[pousr]_[A-Za-z0-9]{20,}"
    r"|github_pat_[A-Za-z0-9_]{20,}"
    r"|gl(?:pat|dt|rt|ptt|cbt|ft|soat|imt|agent)-[A-Za-z0-9_-]{20,}"
    r"|xox[abprs]-[A-Za-z0-9-]{10,}|(?:AKIA|ASIA)[0-9A-Z]{16}"
    r"|eyJ[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]+)"
)
# scheme://userinfo@host: the userinfo runs to the authority's last '@' (a raw '@' in a
# password happens). Any userinfo is hidden: ``https://TOKEN@host`` has no ':'.
_URL_USERINFO = re.compile(r'(?P<scheme>\b[a-zA-Z][a-zA-Z0-9+.-]*://)[^/?#\s"]*@')
# user:password@host without a scheme (``--db user:p@ss@host``); the user may be empty.
_BARE_CREDENTIALS = re.compile(r'(?<![\w/:@.%+-])[\w.%+-]*:[^\s/?#"]*@(?=[\w\[])')
# name=value, name: value, "name": "value", --name value inside a longer string.
_PAIR = re.compile(
    r"""(?<![\w.-])(?P<q>["']?)(?P<name>-{0,2}[A-Za-z_][\w.-]*)(?P=q)
        (?P<sep>\s*[:=]\s*|(?<=[\w-])\s+(?=\S))
        (?P<value>"(?:\\.|[^"\\])*"|'(?:\\.|[^'\\])*'|\[[^\[\]]*\]|\{[^{}]*\}
                  |(?:Bearer|Basic|Token)\s+[^\s,;&'"]+|[^\s,;&#'"}\]]+)""",
    re.VERBOSE,
)
_FLAG = re.compile(r"-{1,2}[A-Za-z][\w.-]*(?:=.*)?")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*")
# What ``-p`` carries when it is no password: a port (or port mapping) or a path.
_PORT_OR_PATH = re.compile(r"\d{1,5}(?::\d{1,5})?|(?:/|\./|\.\./|~/).*")
_MAX_DEPTH = 32


def _words(name: str) -> list[str]:
    return [w for w in _WORD_SPLIT.split(_CAMEL.sub("_", name).lower()) if w]


def is_secret_name(name: str) -> bool:
    """True for keys such as ``HF_TOKEN``, ``hub_token``, ``--api-key``, ``db_password``, ``key``.

    Token *counts*, ids and special tokens (``max_tokens``, ``num_tokens``,
    ``pad_token_id``, ``eos_token``), tokenizers and authors are not secrets;
    a name that holds one of those *and* a secret word (``--tokenizer-auth-token``,
    ``--author-password``, ``tokens_secret``) is.
    """
    words = _words(name)
    return any(_is_secret_word(words, i) for i in range(len(words)))


def _is_secret_word(words: list[str], i: int) -> bool:
    word = words[i]
    prev = words[i - 1] if i else ""
    nxt = words[i + 1] if i + 1 < len(words) else ""
    if word == "token":
        return not (prev in _SPECIAL or prev in _COUNTING or nxt in _TOKEN_NEXT_OK)
    if word == "tokens":
        return any(w in _CREDENTIAL_CONTEXT for w in words)
    if word in ("key", "keys"):
        return prev not in _HARMLESS_KEY
    if word == "pass":
        return i == len(words) - 1  # db_pass, --pass; not pass_at_k
    if word in _SECRET_WORDS:
        return True
    return bool(_SECRET_PART.search(word))


def _is_switch(flag: str) -> bool:
    words = _words(flag)
    return bool(words) and words[0] in _SWITCH_FIRST


def redact_value(text: str) -> str:
    """Mask secret-looking parts of a free-form string (a URL, JSON, a shell line, a version)."""
    if not isinstance(text, str):
        return text
    text = _redact_json(text)
    text = _URL_USERINFO.sub(lambda m: f"{m.group('scheme')}{REDACTED}@", text)
    text = _BARE_CREDENTIALS.sub(f"{REDACTED}@", text)
    text = _hide_pairs(text)
    return _SECRET_VALUE.sub(REDACTED, text)


def _hide_pairs(text: str) -> str:
    """Hide the value of each secret-named pair. A pair kept is read on from its value,
    which may be the next name (``python --hf-token X``: ``--hf-token`` is not a value)."""
    parts: list[str] = []
    pos = done = 0
    while (m := _PAIR.search(text, pos)) is not None:
        name, value = m.group("name"), m.group("value")
        spaced = not m.group("sep").strip()
        switch_then_flag = _is_switch(name) and _FLAG.fullmatch(value)
        if not is_secret_name(name) or (spaced and (not name.startswith("-") or switch_then_flag)):
            pos = m.start("value")  # prose ("token expired"), a switch then a flag, or no secret
            continue
        quote = value[0] if value[:1] in ("'", '"') and value[-1:] == value[:1] else ""
        parts += [text[done:m.start("value")], quote, REDACTED, quote]
        pos = done = m.end()
    parts.append(text[done:])
    return "".join(parts)


def _redact_json(text: str) -> str:
    """A JSON object or array (``--config '{...}'``) is redacted as data, then written back."""
    stripped = text.strip()
    if stripped[:1] not in ("{", "["):
        return text
    try:
        data = json.loads(stripped)
    except ValueError:
        return text
    redacted = redact_mapping(data)
    return text if redacted == data else json.dumps(redacted)


def redact_argv(argv: Sequence[str]) -> list[str]:
    """Redact ``--token X``, ``--api-key=X``, ``HF_TOKEN=X``, ``-p X`` and secret-looking values.

    The value after a secret flag is hidden whatever it looks like (``--password
    --x`` has the value ``--x``), unless the flag reads as a switch
    (``--use-auth-token``) and what follows is a flag. When what is hidden was
    itself a secret flag (``--token --password X``), the next one is hidden too,
    unless it is a flag: then what was hidden was a value that reads like a flag
    (``--token -AAAToken0 --max-tokens 512``), or a flag given no value.
    ``-p`` hides its value unless that is a port or a path (``-p 8080``, ``-p /data``).
    """
    out: list[str] = []
    hide_next = ""  # the secret flag whose value may come next
    chained = False  # hide_next was itself hidden as the value of a secret flag
    for raw in argv:
        arg = str(raw)
        if hide_next:
            flag, hide_next = hide_next, ""
            if _hides(flag, arg) and not (chained and _FLAG.fullmatch(arg)):
                out.append(REDACTED)
                chained = bool(_FLAG.fullmatch(arg)) and _is_secret_flag(arg.partition("=")[0], None)
                hide_next = arg if chained else ""
                continue
            chained = False
        if arg.startswith("-") and "=" in arg:
            name, _, value = arg.partition("=")
            hidden = REDACTED if _is_secret_flag(name, value) else redact_value(value)
            out.append(f"{redact_value(name)}={hidden}")
            continue
        if arg.startswith("-") and _is_secret_flag(arg, None):
            out.append(arg)
            hide_next = arg
            continue
        if "=" in arg and not arg.startswith("-"):
            name, _, _value = arg.partition("=")
            if _ENV_NAME.fullmatch(name) and is_secret_name(name):
                out.append(f"{name}={REDACTED}")
                continue
        out.append(redact_value(arg))
    return out


def _is_secret_flag(flag: str, value: str | None) -> bool:
    if flag == "-p":  # -p PASSWORD (mysql, redis-cli -a alike) unless a port or a path
        return value is None or not _PORT_OR_PATH.fullmatch(value)
    return flag.startswith("-") and is_secret_name(flag)


def _hides(flag: str, arg: str) -> bool:
    """Whether ``arg``, just after the secret ``flag``, is its value."""
    if flag == "-p":
        return not _PORT_OR_PATH.fullmatch(arg)
    return not (_is_switch(flag) and _FLAG.fullmatch(arg))  # "--use-auth-token --lr"


def redact_mapping(data: Any, _depth: int = 0) -> Any:
    """Recursively redact values under secret-named keys, and secret-looking strings.

    Never raises: an object that is not plain data is recorded as its redacted text.
    """
    if _depth > _MAX_DEPTH:
        return REDACTED
    if data is None or isinstance(data, (bool, int, float)):
        return data
    if isinstance(data, str):
        return redact_value(data)
    if isinstance(data, Mapping):
        result: dict[str, Any] = {}
        for key, value in data.items():
            skey = redact_value(str(key))
            if is_secret_name(skey) and not _empty(value):
                result[skey] = REDACTED
            else:
                result[skey] = redact_mapping(value, _depth + 1)
        return result
    if isinstance(data, (list, tuple, set, frozenset)):
        return [redact_mapping(v, _depth + 1) for v in data]
    try:
        text = str(data)
    except Exception:
        return f"<unprintable {type(data).__name__}>"
    return redact_value(text)


def _empty(value: Any) -> bool:
    """None, False and "" hide nothing (``push_to_hub_token: None`` is kept as is)."""
    return value is None or value is False or (isinstance(value, str) and value == "")
