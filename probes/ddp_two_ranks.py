"""Probe: two-rank DistributedDataParallel on CPU (gloo), optionally with a straggler rank.

Run with ``torchrun --nproc-per-node 2 probes/ddp_two_ranks.py [--slow-rank R]``.
Each rank trains a tiny causal LM wrapped in ``DistributedDataParallel`` over pre-tokenized
packed blocks served by a ``DistributedSampler``. With ``--slow-rank R``, rank R's
``Dataset.__getitem__`` sleeps ``--sleep-ms`` per item: rank R stalls on data and every
other rank waits for it in the gradient all-reduce (planted: straggler_rank). Without it
the run is healthy (planted: none).

Each rank writes its own truth to ``<truth>.rank<R>.json`` (truth = ``--truth`` or
``$GPUDOCTOR_PROBE_TRUTH``). Extra fields: ``rank``, ``world_size``, ``slow_rank``,
``sleep_s`` (time this rank slept in ``__getitem__``, inside ``data_wait_s``),
``backward_s`` (backward incl. DDP's gradient all-reduce: on a fast rank it contains the
wait for the straggler), ``compute_s`` (forward + backward + optimizer).
Also runs without torchrun as a single process (world size 1).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common as C  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402
from torch.utils.data import DataLoader, Dataset  # noqa: E402
from torch.utils.data.distributed import DistributedSampler  # noqa: E402

PROBE = "ddp_two_ranks"


class BlockDataset(Dataset):
    def __init__(self, blocks, sleep_s, truth):
        self.blocks = blocks
        self.sleep_s = sleep_s
        self.truth = truth

    def __len__(self):
        return self.blocks.shape[0]

    def __getitem__(self, i):
        if self.sleep_s > 0:
            t = time.perf_counter()
            time.sleep(self.sleep_s)  # the straggler: slow storage / slow preprocessing
            self.truth.fields["sleep_s"] += time.perf_counter() - t
        return self.blocks[i]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=60, help="optimizer steps per rank (default 60)")
    p.add_argument("--slow-rank", type=int, default=None, help="rank whose __getitem__ sleeps")
    p.add_argument("--sleep-ms", type=float, default=10.0,
                   help="sleep per item on the slow rank (default 10 ms)")
    p.add_argument("--batch-size", type=int, default=4, help="per-rank batch size")
    p.add_argument("--seq-len", type=int, default=64)
    args = C.add_common_args(p).parse_args(argv)
    C.setup(args)

    distributed = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    if distributed:
        dist.init_process_group("gloo")
        rank, world = dist.get_rank(), dist.get_world_size()
    else:
        rank, world = 0, 1
    base = C.truth_path(args)
    planted = "straggler_rank" if args.slow_rank is not None else "none"
    truth = C.Truth(PROBE, planted, f"{base}.rank{rank}.json" if base else None)
    truth.enable("data_wait_s", "tokenize_s", "checkpoint_s", "compute_s")
    truth.fields.update(rank=rank, world_size=world, slow_rank=args.slow_rank, sleep_s=0.0,
                        backward_s=0.0)

    tok = C.get_tokenizer(seed=args.seed)
    n_blocks = world * args.batch_size * (args.steps + 1)
    texts = C.make_corpus(400, seed=args.seed + 7, median_words=40)
    with truth.timed("tokenize_s"):
        blocks = C.packed_blocks(tok, texts, n_blocks, args.seq_len)
    sleep_s = args.sleep_ms / 1000.0 if args.slow_rank == rank else 0.0
    ds = BlockDataset(blocks, sleep_s, truth)
    sampler = DistributedSampler(ds, num_replicas=world, rank=rank, shuffle=True,
                                 seed=args.seed) if distributed else None
    loader = DataLoader(ds, batch_size=args.batch_size, sampler=sampler,
                        shuffle=sampler is None, num_workers=0)

    torch.manual_seed(args.seed)  # identical initial weights on every rank
    model = C.TinyCausalLM(tok.get_vocab_size())
    ddp = DDP(model) if distributed else model
    opt = C.make_adamw(ddp.parameters(), 3e-4, truth)
    ddp.train()
    pads = C.PadCounter()

    truth.mark_train_start()
    set_epoch = sampler.set_epoch if sampler is not None else None
    for _, x, t_step, t_data in C.timed_batches(loader, truth, lambda n: n >= args.steps, on_epoch=set_epoch):
        mask = torch.ones_like(x)
        pads.add(mask)
        loss = ddp(input_ids=x, attention_mask=mask, labels=x).loss
        t_bwd = time.perf_counter()
        loss.backward()
        truth.fields["backward_s"] += time.perf_counter() - t_bwd
        opt.step()
        opt.zero_grad(set_to_none=True)
        t_end = time.perf_counter()
        truth.add("compute_s", t_end - t_data)
        truth.step_times.append(t_end - t_step)

    if distributed:
        dist.barrier()
        dist.destroy_process_group()
    truth.write(**pads.fields(), final_loss=float(loss.detach()))


if __name__ == "__main__":
    main()
