"""Shared helpers for the gpudoctor acceptance probes.

Probes are standalone training scripts (``python probes/<name>.py``) that each plant ONE
known waste and measure their own ground truth with ``time.perf_counter``. The only part
of gpudoctor they import is its synthetic corpus (:mod:`gpudoctor.replay.synthetic`,
standard library only), so the probes and the replay draw text one way; nothing of the
doctor's measuring is imported. This module is import-safe and cheap: it imports only the
standard library, psutil, torch and that module at module level; ``tokenizers`` / ``transformers`` are imported
lazily by the helpers that need them, so a probe pays for those imports only when it
actually uses them (that time is part of its startup, exactly like a user's script).

Contents
- ``add_common_args`` / ``truth_path``: the ``--truth PATH`` / ``GPUDOCTOR_PROBE_TRUTH`` plumbing.
- ``make_corpus`` (from :mod:`gpudoctor.replay.synthetic`): deterministic English-like text
  with long-tailed (lognormal) lengths.
- ``get_tokenizer`` / ``get_hf_tokenizer``: a small BPE trained with ``tokenizers`` (cached on
  disk, keyed by its parameters) and its ``transformers.PreTrainedTokenizerFast`` wrapper.
- ``TinyCausalLM``: a GPT-style causal LM in plain torch (HF-like ``forward(input_ids=...,
  attention_mask=..., labels=...)`` returning ``.loss``). Plain-loop probes use it rather than
  ``GPT2LMHeadModel`` because importing the transformers modeling stack costs ~3.5 s on a
  2-core box, which would make startup the dominant cost of every probe. ``build_gpt2`` is
  there for probes that want the real thing (hf_trainer).
- ``Truth``: accumulates timers and writes the ground-truth JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import hashlib
import json
import math
import os
import random
import stat
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass

import psutil
import torch
from torch import nn
from torch.nn import functional as F

from gpudoctor.replay.synthetic import make_corpus, train_bpe  # stdlib-only at import

PAD = "<pad>"
BOS = "<s>"
EOS = "</s>"
UNK = "<unk>"

# --------------------------------------------------------------------------- CLI / truth path


def add_common_args(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument(
        "--truth",
        default=None,
        help="write the ground-truth JSON here (default: $GPUDOCTOR_PROBE_TRUTH; skipped if neither)",
    )
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    p.add_argument("--device", default="cpu", help="where the model trains: cpu (default) or cuda "
                   "(bench/gpu_check.py); the probes that take it move their model and batches there")
    return p


def wait_for_attach(seconds: float) -> None:
    """Before the first step, wait up to ``seconds`` for ``gpudoctor attach`` to finish installing its
    hooks here (a test's way to attach during startup surely: on a busy machine the injection can
    land after the loop began, and a report's window then starts mid-run). The wait is startup, in
    the truth as in the report; 0 (the default) waits for nothing."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        hooks = sys.modules.get("gpudoctor.hooks")  # the payload runs whole on this thread, between two sleeps
        if hooks is not None and hooks.is_installed():
            return
        time.sleep(0.02)


def truth_path(args) -> str | None:
    return args.truth or os.environ.get("GPUDOCTOR_PROBE_TRUTH") or None


def setup(args) -> None:
    torch.set_num_threads(max(1, int(args.threads)))
    random.seed(args.seed)
    torch.manual_seed(args.seed)


def cache_dir() -> str:
    """``$GPUDOCTOR_PROBE_CACHE`` or ``<tmp>/gpudoctor-probes-cache-<uid>``, private to this user.

    A cached tokenizer is loaded as it is, so a folder another user made (pre-planted in
    /tmp) or can write is refused, never used. (Probes never import gpudoctor: this is
    ``gpudoctor.common.safefs.private_dir``'s check, written out.)
    """
    d = os.environ.get("GPUDOCTOR_PROBE_CACHE") or os.path.join(
        tempfile.gettempdir(), f"gpudoctor-probes-cache-{os.geteuid()}"
    )
    with contextlib.suppress(FileExistsError):
        os.makedirs(d, mode=0o700)
    st = os.lstat(d)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
        mode = stat.S_IMODE(st.st_mode)
        raise RuntimeError(
            f"probe cache {d} is a link or not a folder, or someone else's (uid {st.st_uid}), or writable "
            f"by others (mode {mode:o}); remove it or set GPUDOCTOR_PROBE_CACHE to a folder of your own"
        )
    return d


# --------------------------------------------------------------------------- synthetic corpus
# One corpus for the probes and the replay: gpudoctor.replay.synthetic (make_corpus, train_bpe).

# --------------------------------------------------------------------------- tokenizer


def get_tokenizer(vocab_size: int = 2000, seed: int = 0, n_docs: int = 3000):
    """A byte-level BPE (``tokenizers.Tokenizer``) trained on the synthetic corpus.

    Cached in ``cache_dir()`` keyed by its parameters; the first build takes < 2 s.
    """
    from tokenizers import Tokenizer

    key = hashlib.sha1(f"bpe-v1-{vocab_size}-{seed}-{n_docs}".encode()).hexdigest()[:12]
    path = os.path.join(cache_dir(), f"bpe-{vocab_size}-{key}.json")
    if os.path.exists(path):
        try:
            return Tokenizer.from_file(path)
        except Exception:  # a torn or stale file: rebuild it
            pass
    tok = train_bpe(make_corpus(n_docs, seed=seed + 1000), vocab_size, [PAD, BOS, EOS, UNK], unk_token=UNK)
    fd, tmp = tempfile.mkstemp(dir=cache_dir(), suffix=".tmp")
    os.close(fd)
    tok.save(tmp)
    os.replace(tmp, path)  # atomic: concurrent probes (DDP ranks) never see a torn file
    return tok


def get_hf_tokenizer(vocab_size: int = 2000, seed: int = 0):
    """The cached BPE wrapped as ``transformers.PreTrainedTokenizerFast`` (pad token set)."""
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(
        tokenizer_object=get_tokenizer(vocab_size, seed),
        pad_token=PAD,
        bos_token=BOS,
        eos_token=EOS,
        unk_token=UNK,
        padding_side="right",
    )
    return tok


def pad_id(tok) -> int:
    """Pad id of a ``tokenizers.Tokenizer`` or a HF tokenizer."""
    if hasattr(tok, "pad_token_id"):
        return int(tok.pad_token_id)
    return int(tok.token_to_id(PAD))


# --------------------------------------------------------------------------- batching


def packed_blocks(tok, texts: list[str], n_blocks: int, seq_len: int) -> torch.Tensor:
    """``texts`` tokenized once and packed end to end into ``n_blocks`` rows of ``seq_len`` ids (the
    stream repeated as needed): pre-tokenized causal-LM blocks, no padding."""
    stream = [t for e in tok.encode_batch(texts) for t in e.ids]
    need = n_blocks * seq_len
    stream = (stream * (need // max(1, len(stream)) + 1))[:need]
    return torch.tensor(stream, dtype=torch.long).view(n_blocks, seq_len)


def rank_loader(tok, args, world: int, rank: int, n_blocks: int, truth: Truth):
    """This rank's ``(sampler, loader)`` over ``n_blocks`` packed blocks of ``args.seq_len`` ids, the
    corpus tokenized once (timed as the truth's ``tokenize_s``): a ``DistributedSampler`` of
    ``args.batch_size`` per rank, no workers; the same blocks on every rank."""
    from torch.utils.data import DataLoader
    from torch.utils.data.distributed import DistributedSampler

    texts = make_corpus(400, seed=args.seed + 7, median_words=40)
    with truth.timed("tokenize_s"):
        blocks = packed_blocks(tok, texts, n_blocks, args.seq_len)
    sampler = DistributedSampler(blocks, num_replicas=world, rank=rank, shuffle=True, seed=args.seed)
    return sampler, DataLoader(blocks, batch_size=args.batch_size, sampler=sampler, num_workers=0)


def collate_ids(seqs: list[list[int]], pad: int, length: int | None = None) -> dict:
    """Right-pad token-id lists into an HF-style batch dict (labels: -100 on padding)."""
    T = length if length is not None else max(len(s) for s in seqs)
    ids = torch.full((len(seqs), T), pad, dtype=torch.long)
    mask = torch.zeros((len(seqs), T), dtype=torch.long)
    for i, s in enumerate(seqs):
        s = s[:T]
        ids[i, : len(s)] = torch.tensor(s, dtype=torch.long)
        mask[i, : len(s)] = 1
    labels = ids.masked_fill(mask == 0, -100)
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


class PadCounter:
    """Counts pad vs real tokens over training batches from their attention masks."""

    def __init__(self) -> None:
        self.real = 0
        self.total = 0
        self.batches = 0
        self.max_len = 0
        self.lengths: list[int] = []

    def add(self, attention_mask: torch.Tensor) -> None:
        lens = attention_mask.sum(dim=-1)
        self.batches += 1
        self.lengths.extend(int(x) for x in lens)
        self.real += int(lens.sum())
        self.total += int(attention_mask.numel())
        self.max_len = max(self.max_len, int(attention_mask.shape[-1]))

    def fields(self) -> dict:
        """Truth fields: pad_fraction, p50/p99 of real lengths, max_length (padded width)."""
        return {
            "pad_fraction": self.pad_fraction,
            "p50_length": percentile(self.lengths, 50),
            "p99_length": percentile(self.lengths, 99),
            "max_length": self.max_len or None,
            "batches_seen": self.batches,
        }

    @property
    def pad_fraction(self) -> float | None:
        return None if self.total == 0 else (self.total - self.real) / self.total


def percentile(xs, q: float) -> float | None:
    xs = sorted(xs)
    if not xs:
        return None
    k = (len(xs) - 1) * q / 100.0
    lo, hi = math.floor(k), math.ceil(k)
    return float(xs[lo] + (xs[hi] - xs[lo]) * (k - lo))


# --------------------------------------------------------------------------- model


@dataclass
class LMOutput:
    loss: torch.Tensor | None
    logits: torch.Tensor


class _Block(nn.Module):
    def __init__(self, d: int, n_head: int, mlp_mult: int) -> None:
        super().__init__()
        self.n_head = n_head
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, mlp_mult * d)
        self.out = nn.Linear(mlp_mult * d, d)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        B, T, D = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(D, dim=-1)
        q, k, v = (t.view(B, T, self.n_head, D // self.n_head).transpose(1, 2) for t in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        x = x + self.proj(a.transpose(1, 2).reshape(B, T, D))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class TinyCausalLM(nn.Module):
    """GPT-style causal LM with random weights, HF-like call signature."""

    def __init__(self, vocab_size: int, n_embd: int = 64, n_layer: int = 2, n_head: int = 2,
                 n_positions: int = 1024, mlp_mult: int = 4) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.wpe = nn.Embedding(n_positions, n_embd)
        self.blocks = nn.ModuleList(_Block(n_embd, n_head, mlp_mult) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(n_embd)
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # tied, like GPT-2
        self.apply(self._init)

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def forward(self, input_ids, attention_mask=None, labels=None, **_):
        B, T = input_ids.shape
        pos = torch.arange(T, device=input_ids.device)
        x = self.wte(input_ids) + self.wpe(pos)[None]
        mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()[None, None]
        if attention_mask is not None:
            mask = mask & attention_mask.bool()[:, None, None, :]
        for blk in self.blocks:
            x = blk(x, mask)
        logits = self.lm_head(self.ln_f(x))
        loss = None
        if labels is not None:
            loss = F.cross_entropy(
                logits[:, :-1].reshape(-1, logits.shape[-1]),
                labels[:, 1:].reshape(-1),
                ignore_index=-100,
            )
        return LMOutput(loss=loss, logits=logits)


def build_gpt2(vocab_size: int, n_embd: int = 64, n_layer: int = 2, n_head: int = 2,
               n_positions: int = 1024, pad_token_id: int = 0):
    """A tiny ``GPT2LMHeadModel`` from a config, random weights (imports transformers)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(vocab_size=vocab_size, n_embd=n_embd, n_layer=n_layer, n_head=n_head,
                     n_positions=n_positions, pad_token_id=pad_token_id,
                     bos_token_id=1, eos_token_id=2)
    return GPT2LMHeadModel(cfg)


def make_adamw(params, lr: float, truth: Truth | None = None) -> torch.optim.Optimizer:
    """``torch.optim.AdamW``; records its construction time as ``optimizer_init_s``.

    The first optimizer built in a process imports ``torch._dynamo`` lazily (~1.5 s on a
    2-core box): library import time that lands in startup although the script imports
    nothing itself.
    """
    t = time.perf_counter()
    opt = torch.optim.AdamW(params, lr=lr)
    if truth is not None:
        truth.fields["optimizer_init_s"] = time.perf_counter() - t
    return opt


# --------------------------------------------------------------------------- ground truth


def process_age_s() -> float:
    """Seconds since this process was created (the origin of wall_s and startup_s).

    On Linux this reads the start time in clock ticks from /proc/self/stat and compares it
    with CLOCK_BOOTTIME (10 ms resolution). ``psutil.Process().create_time()`` is used as
    the fallback only: it anchors the start time to /proc/stat's *integer* boot time, so on
    Linux it is typically 0.3-1 s too early, which would inflate wall_s and startup_s.
    """
    try:
        with open("/proc/self/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        start = int(fields[19]) / os.sysconf("SC_CLK_TCK")
        return time.clock_gettime(time.CLOCK_BOOTTIME) - start
    except (OSError, ValueError, IndexError, AttributeError):
        return time.time() - psutil.Process().create_time()


def psutil_create_time_error_s() -> float:
    """How much earlier psutil's create_time() puts the start than /proc does (info only)."""
    return (time.time() - psutil.Process().create_time()) - process_age_s()


class Truth:
    """Accumulates the probe's own timers and writes the ground-truth JSON.

    Timers (seconds): ``data_wait_s``, ``tokenize_s``, ``checkpoint_s``, ``format_s``,
    ``eval_s``, ``compute_s`` (forward + backward + optimizer step of the training loop);
    ``startup_s`` is set by ``mark_train_start()`` (process creation -> just before the first
    ``next()`` on the training DataLoader). ``wall_s`` is process creation -> ``write()``.
    """

    TIMERS = ("data_wait_s", "tokenize_s", "checkpoint_s", "format_s", "eval_s", "compute_s")

    def __init__(self, probe: str, planted: str, path: str | None) -> None:
        self.probe = probe
        self.planted = planted
        self.path = path
        self._origin = time.perf_counter() - process_age_s()  # process creation, perf clock
        self.timers: dict[str, float | None] = dict.fromkeys(self.TIMERS)
        self.startup_s: float | None = None
        self.step_times: list[float] = []
        self.step_starts: list[float] = []  # perf_counter at each training batch request (timed_batches)
        # time until the probe's module-level imports were done (a Truth is created first
        # thing in main); lazy imports later (torch._dynamo when the first optimizer is
        # built, ~1.5 s on a 2-core box) are not in it
        self.fields: dict = {"imports_s": process_age_s()}

    def now(self) -> float:
        """Seconds since process creation."""
        return time.perf_counter() - self._origin

    def mark_train_start(self) -> None:
        if self.startup_s is None:
            self.startup_s = self.now()

    def add(self, name: str, dt: float) -> None:
        self.timers[name] = (self.timers[name] or 0.0) + dt

    def enable(self, *names: str) -> None:
        """Mark timers as applicable (0.0 instead of null) even if never hit."""
        for n in names:
            if self.timers[n] is None:
                self.timers[n] = 0.0

    @contextlib.contextmanager
    def timed(self, name: str):
        t = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, time.perf_counter() - t)

    def write(self, also_at: str | None = None, **fields) -> dict:
        """The truth as a dict, written to its path (and to ``also_at``: rank 0's copy at the plain
        ``--truth`` path of a multi-rank probe, for ``bench/prescriptions.py``)."""
        self.fields.update(fields)
        wall = self.now()
        d = {
            "probe": self.probe,
            "planted": self.planted,
            "wall_s": wall,
            "startup_s": self.startup_s,
            **self.timers,
            "pad_fraction": None,
            "p99_length": None,
            "max_length": None,
            "steps": len(self.step_times),
            "step_time_s_p50": statistics.median(self.step_times) if self.step_times else None,
            "steady_steps_per_s": steady_rate(self.step_times, self.step_starts),
            "optimizer_init_s": None,
            "pid": os.getpid(),
            "psutil_create_time_error_s": psutil_create_time_error_s(),
        }
        d.update(self.fields)
        for k in ("startup", "data_wait", "tokenize", "checkpoint", "format", "eval", "compute"):
            v = d.get(k + "_s")
            d[k + "_share"] = None if v is None or wall <= 0 else v / wall
        for path in (self.path, also_at):
            if path:
                os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
                with open(path + ".tmp", "w") as f:
                    json.dump(d, f, indent=2, sort_keys=False)
                os.replace(path + ".tmp", path)
        # Interpreter teardown with torch._dynamo loaded takes ~1-1.5 s on a small box, time
        # that happens after the truth is written and that no probe means to plant. Freezing
        # the GC generations makes the final collection skip them (teardown ~0.2-0.4 s).
        gc.freeze()
        return d


def steady_rate(step_times: list[float], step_starts: list[float] | None = None) -> float | None:
    """Steps per second after the warm-up (the first fifth of the steps, at least 3): workers
    starting and the first batches are not the steady state a fix is judged on. From one batch
    request to the next where the loop recorded them (a save or eval between steps counts),
    else from the steps' own times."""
    if step_starts and len(step_starts) >= 8:
        skip = max(3, len(step_starts) // 5)
        span = step_starts[-1] - step_starts[skip]
        return (len(step_starts) - 1 - skip) / span if span > 0 else None
    skip = max(3, len(step_times) // 5)
    tail = step_times[skip:]
    return len(tail) / sum(tail) if tail and sum(tail) > 0 else None


def timed_batches(loader, truth, done, on_epoch=None):
    """Batches from passes over ``loader`` until ``done(steps so far)``, each wait added to the truth's data_wait_s.

    Yields ``(step, batch, t_step, t_data)``: the step's number (from 1), its batch, when it began
    waiting and when its batch came. ``on_epoch(i)`` runs before pass ``i`` (e.g.
    ``DistributedSampler.set_epoch``).
    """
    step = epoch = 0
    while not done(step):
        if on_epoch is not None:
            on_epoch(epoch)
        epoch += 1
        it = iter(loader)
        while not done(step):
            t_step = time.perf_counter()
            truth.step_starts.append(t_step)
            try:
                batch = next(it)
            except StopIteration:
                truth.add("data_wait_s", time.perf_counter() - t_step)
                break
            t_data = time.perf_counter()
            truth.add("data_wait_s", t_data - t_step)
            step += 1
            yield step, batch, t_step, t_data


def train_timed(model, loader, opt, truth, pads, done, on_step=None, device="cpu"):
    """The probes' shared training loop, timing its own data wait and compute.

    ``done(step)`` says when to stop (checked before each batch, across epochs);
    ``on_step(step, t_end)`` runs after each optimizer step. Returns the last loss. On ``cuda``
    each batch is copied there as a user's loop does (``.to(device)``, pageable memory); the host's
    step times then hold the GPU's pace once its queue is full (the copy waits for it).
    """
    loss = None
    for step, batch, t_step, t_data in timed_batches(loader, truth, done):
        pads.add(batch["attention_mask"])
        if device != "cpu":
            batch = {k: v.to(device) for k, v in batch.items()}
        loss = model(**batch).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        t_end = time.perf_counter()
        truth.add("compute_s", t_end - t_data)
        truth.step_times.append(t_end - t_step)
        if on_step is not None:
            on_step(step, t_end)
    return loss


def train_trainer_timed(trainer, truth, on_batches=None):
    """Run ``trainer.train()`` timing it the way the HF Trainer probes' truth needs.

    Wraps two methods of this Trainer: ``get_batch_samples`` (first call marks the training
    start; time inside is ``data_wait_s``; ``on_batches(batches)`` sees each fetch) and
    ``_save_checkpoint`` (time inside is ``checkpoint_s``, calls are ``checkpoints``).
    Sets ``truth.step_times`` from fetch to fetch; returns (train() result, seconds in train()).
    """
    fetch_starts = []
    orig_get, orig_save = trainer.get_batch_samples, trainer._save_checkpoint

    def get_batch_samples(*a, **kw):
        truth.mark_train_start()
        t = time.perf_counter()
        fetch_starts.append(t)
        out = orig_get(*a, **kw)
        truth.add("data_wait_s", time.perf_counter() - t)
        if on_batches is not None:
            on_batches(out[0])
        return out

    def save_checkpoint(*a, **kw):
        t = time.perf_counter()
        try:
            return orig_save(*a, **kw)
        finally:
            truth.add("checkpoint_s", time.perf_counter() - t)
            truth.fields["checkpoints"] = truth.fields.get("checkpoints", 0) + 1

    trainer.get_batch_samples = get_batch_samples
    trainer._save_checkpoint = save_checkpoint
    t = time.perf_counter()
    result = trainer.train()
    t_end = time.perf_counter()
    fetch_starts.append(t_end)
    truth.step_times = [b - a for a, b in zip(fetch_starts, fetch_starts[1:], strict=False)]
    truth.step_times = truth.step_times[: trainer.state.global_step]
    return result, t_end - t
