"""No secret reaches a recording (issue 12, finding 8): the gaps found, then a property test
that plants random secrets of every format in every string field the hooks record."""

from __future__ import annotations

import json
import string
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpudoctor.common.redact import (
    REDACTED,
    is_secret_name,
    redact_argv,
    redact_mapping,
    redact_value,
)

HF = "hf_" + "Ab3" * 12
GLPAT = "glpat-" + "x1Y2z3" * 4
PW = "Hunter2Pw9x"


def recorded(value: Any) -> str:
    """What a recording would hold: the JSON text."""
    return json.dumps(value)


@pytest.mark.parametrize(
    "text",
    [
        f"redis://:{PW}@cache:6379/0",
        f"https://user:{PW}@ss@host.example/x",
        f"postgres://admin:{PW}:x@db/main",
        f"https://{PW}@github.com/org/repo.git",
        f"user:{PW}@ss@host",
        f"https://acct.blob.core.windows.net/c/f.bin?sv=2022-11-02&se=2030-01-01&sp=r&sig={PW}%3D",
        f"https://b.s3.amazonaws.com/k?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential={PW}%2F20260101"
        f"&X-Amz-Security-Token={PW}tok&X-Amz-SignedHeaders=host&X-Amz-Signature={PW}sig",
        f"https://b.s3.amazonaws.com/k?AWSAccessKeyId=AKIA{PW}&Expires=1&Signature={PW}%2B",
        f"torch 2.13.0+{HF}",
        f"push with {GLPAT}",
        f'{{"hub_token": "{PW}", "lr": 3e-4}}',
        f"{{'api_key': '{PW}'}}",
        f'{{"credentials": {{"user": "u", "password": "{PW}"}}}}',
        f"export HF_TOKEN={PW}; python train.py",
        f"python train.py --hf-token {PW} --lr 1",
        f"Authorization: Bearer {PW}",
    ],
)
def test_each_gap_in_a_free_string_is_closed(text):
    out = redact_value(text)
    assert PW not in out and HF not in out and GLPAT not in out, out
    assert REDACTED in out


@pytest.mark.parametrize(
    "argv",
    [
        ["--tokenizer-auth-token", PW],
        ["--api-token-id", PW],
        ["--author-password", PW],
        ["--password", f"--{PW}"],
        ["--hf-token", f"-{PW}"],
        ["--wandb-key", PW],
        ["--openai-key", PW],
        ["--key", PW],
        ["--pass", PW],
        ["--pwd", PW],
        ["-p", PW],
        ["-p", f"{PW}/x"],
        ["-p=" + PW],
        ["--token", "--password", PW],
        ["--token", f"-Token{PW}"],  # a value that reads as a secret flag: the next flag is kept
        ["--config", json.dumps({"hub_token": PW, "max_tokens": 5})],
        [f"--config={json.dumps({'wandb': {'api_key': PW}})}"],
        [f"tokens_secret={PW}"],
        ["--resume", f"https://{PW}@host/ckpt"],
        ["--db", f"mysql://root:{PW}@localhost/x"],
    ],
)
def test_each_gap_in_a_command_line_is_closed(argv):
    out = redact_argv(["python", "train.py", *argv, "--lr", "3e-4"])
    assert PW not in recorded(out), out
    assert out[:2] == ["python", "train.py"] and out[-2:] == ["--lr", "3e-4"]
    assert len(out) == len(argv) + 4


def test_secret_names_with_an_exempt_word_in_them():
    for name in (
        "--tokenizer-auth-token",
        "--api-token-id",
        "--author-password",
        "tokens_secret",
        "wandb_key",
        "openai_key",
        "key",
        "pass",
        "pwd",
        "hubToken",
        "AWSAccessKeyId",
        "X-Amz-Signature",
        "sig",
        "api_tokens",
        "db_pass",
    ):
        assert is_secret_name(name), name
    assert redact_mapping({"tokens_secret": PW, "api_token_id": PW}) == {
        "tokens_secret": REDACTED,
        "api_token_id": REDACTED,
    }


NOT_SECRET_ARGV = [
    "--max-tokens",
    "512",
    "--pad-token-id",
    "0",
    "--eos-token",
    "</s>",
    "--tokenizer-name",
    "gpt2",
    "--author",
    "Ada Lovelace",
    "--max-new-tokens",
    "64",
    "-p",
    "8080",
    "--port",
    "29500",
    "-p",
    "/data/ckpt",
    "--keep-tokens",
    "3",
    "--sort-key",
    "length",
    "--token-budget",
    "4096",
    "--dataset",
    "https://huggingface.co/datasets/x?split=train",
]
NOT_SECRET_MAPPING = {
    "max_tokens": 512,
    "pad_token_id": 0,
    "eos_token": "</s>",
    "bos_token_id": 1,
    "tokenizer_name": "gpt2",
    "author": "Ada Lovelace",
    "max_new_tokens": 64,
    "token_type_ids": [0, 0],
    "metric_key_prefix": "eval",
    "include_tokens_per_second": True,
    "special_tokens_map": {"pad_token": "<pad>"},
    "hub_model_id": "org/model",
    "run_name": "lr3e-4-bs32",
}


def test_non_secrets_survive():
    assert redact_argv(NOT_SECRET_ARGV) == NOT_SECRET_ARGV
    assert redact_mapping(NOT_SECRET_MAPPING) == NOT_SECRET_MAPPING


def test_a_token_in_a_library_version_never_reaches_the_recording():
    from gpudoctor.hooks.torch_hooks import torch_cfg_event
    from gpudoctor.hooks.writer import _proc_event

    real = torch.__version__
    torch.__version__ = f"2.13.0+{HF}"  # a local build can name itself anything
    try:
        events = [_proc_event(), torch_cfg_event(torch, torch.nn.Linear(2, 2))]
    finally:
        torch.__version__ = real
    assert HF not in recorded(events)
    assert all(e["libs"]["torch"] == f"2.13.0+{REDACTED}" for e in events)


# -- property: random secrets of every format, planted in every recorded string field -------

ALNUM = string.ascii_letters + string.digits
PUNCT = "!$%&*+,-.:;<=>@^_|~"


def _word(alphabet: str, n: int) -> st.SearchStrategy[str]:
    return st.text(alphabet, min_size=n, max_size=n + 12)


TOKENS = st.one_of(
    _word(ALNUM, 34).map(lambda s: "hf_" + s),
    _word(ALNUM + "-_", 24).map(lambda s: "sk-proj-" + s),
    _word(ALNUM, 36).map(lambda s: "ghp_" + s),
    _word(ALNUM + "_", 60).map(lambda s: "github_pat_" + s),
    _word(ALNUM + "-_", 20).map(lambda s: "glpat-" + s),
    _word(ALNUM + "-", 24).map(lambda s: "xoxb-" + s),
    _word(string.ascii_uppercase + string.digits, 16)
    .filter(lambda s: len(s) == 16)
    .map(lambda s: "AKIA" + s),
    st.tuples(_word(ALNUM, 12), _word(ALNUM, 12), _word(ALNUM, 12)).map(
        lambda p: "eyJ" + ".eyJ".join(p[:2]) + "." + p[2]
    ),
)
# A password: letters first (so it is never taken for a port or a path), any punctuation after.
PASSWORDS = st.tuples(
    st.sampled_from(["", "-", "--"]), _word(string.ascii_letters, 3), _word(ALNUM + PUNCT, 6)
).map("".join)
URL_PASSWORDS = st.tuples(
    _word(string.ascii_letters, 3), _word(ALNUM + "-._~!$&'()*+,;=:@", 6)
).map("".join)
SECRET_NAMES = st.sampled_from(
    [
        "token",
        "hf-token",
        "hf_token",
        "HF_TOKEN",
        "api-key",
        "api_key",
        "apiKey",
        "password",
        "passwd",
        "pwd",
        "pass",
        "key",
        "secret",
        "client_secret",
        "wandb-key",
        "openai-key",
        "tokenizer-auth-token",
        "api-token-id",
        "author-password",
        "tokens_secret",
        "hub_token",
        "access_token",
        "private_key",
        "credentials",
        "passphrase",
        "auth",
        "AWS_SECRET_ACCESS_KEY",
        "sas_token",
        "db_pass",
    ]
)


@st.composite
def planted(draw: st.DrawFn) -> tuple[list[str], dict[str, Any], dict[str, str], list[str]]:
    """(argv, settings mapping, library versions, the secrets planted in them)."""
    secrets: list[str] = []
    argv = ["python", "train.py"]
    mapping: dict[str, Any] = {}
    versions: dict[str, str] = {}
    for _ in range(draw(st.integers(1, 6))):
        token = draw(TOKENS)
        password = draw(PASSWORDS)
        url_password = draw(URL_PASSWORDS)
        name = draw(SECRET_NAMES)
        flag = "--" + name.lower().replace("_", "-")
        where = draw(
            st.sampled_from(
                [
                    "flag",
                    "flag=",
                    "env=",
                    "short-p",
                    "mapping",
                    "nested",
                    "version",
                    "url",
                    "url-empty-user",
                    "url-token-user",
                    "query-sig",
                    "s3",
                    "json-arg",
                    "token-anywhere",
                    "token-in-mapping",
                ]
            )
        )
        if where == "flag":
            argv += [flag, password]
            secrets.append(password)
        elif where == "flag=":
            argv.append(f"{flag}={password}")
            secrets.append(password)
        elif where == "env=":
            argv.append(f"{name.upper().replace('-', '_')}={password}")
            secrets.append(password)
        elif where == "short-p":
            argv += ["-p", password.lstrip("-")]
            secrets.append(password.lstrip("-"))
        elif where == "mapping":
            mapping[name] = password
            secrets.append(password)
        elif where == "nested":
            mapping.setdefault("nested", {})[name] = [password]
            secrets.append(password)
        elif where == "version":
            versions[draw(st.sampled_from(["torch", "transformers", "datasets"]))] = (
                f"2.1.0+{token}"
            )
            secrets.append(token)
        elif where == "url":
            argv += ["--resume", f"https://user:{url_password}@host.example/ckpt.pt"]
            secrets.append(url_password)
        elif where == "url-empty-user":
            mapping["cache_url"] = f"redis://:{url_password}@cache:6379/0"
            secrets.append(url_password)
        elif where == "url-token-user":
            argv.append(f"https://{token}@github.com/org/repo.git")
            secrets.append(token)
        elif where == "query-sig":
            argv += [
                "--data",
                f"https://a.blob.core.windows.net/c/x.bin?sv=2022&sp=r&sig={url_password}",
            ]
            secrets.append(url_password)
        elif where == "s3":
            mapping["data_url"] = (
                f"https://b.s3.amazonaws.com/k?X-Amz-Credential=AKIA{url_password}"
                f"&X-Amz-Signature={password}sig&X-Amz-Expires=60"
            )
            secrets += [url_password, password]
        elif where == "json-arg":
            argv += ["--config", json.dumps({name: password, "max_tokens": 512})]
            secrets.append(password)
        elif where == "token-anywhere":
            argv += ["--note", f"push with {token} please"]
            secrets.append(token)
        else:
            mapping["run_name"] = f"run-{token}"
            secrets.append(token)
    return argv, mapping, versions, secrets


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(planted())
def test_no_planted_secret_survives_and_non_secrets_do(case):
    argv, mapping, versions, secrets = case
    out_argv = redact_argv([*argv, *NOT_SECRET_ARGV])
    out_mapping = redact_mapping({**mapping, **NOT_SECRET_MAPPING})
    out_versions = redact_mapping(versions)
    text = recorded([out_argv, out_mapping, out_versions])
    for secret in secrets:
        assert secret not in text and json.dumps(secret)[1:-1] not in text, secret
    assert len(out_argv) == len(argv) + len(NOT_SECRET_ARGV)
    assert out_argv[len(argv) :] == NOT_SECRET_ARGV
    assert {k: out_mapping[k] for k in NOT_SECRET_MAPPING} == NOT_SECRET_MAPPING
