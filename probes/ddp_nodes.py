"""Probe: a data-parallel job over several torchrun "nodes" (gloo, CPU), one rank made slower.

Run one launch per node, each with its own ``--node-rank``::

    torchrun --nnodes 2 --node-rank 0 --nproc-per-node 1 --master-addr 127.0.0.1 \
        --master-port 29533 probes/ddp_nodes.py --slow-rank 1 --truth /tmp/job
    torchrun --nnodes 2 --node-rank 1 ... (the same)

Every rank trains the tiny causal LM of :mod:`ddp_two_ranks` under ``DistributedDataParallel``
on packed blocks from a ``DistributedSampler``. With ``--slow-rank R`` (a global rank), rank R's
``Dataset.__getitem__`` sleeps ``--sleep-ms`` per item: R waits for data and every other rank, on
every node, waits for it in the gradient all-reduce (planted: straggler_rank, on R's node).

Each rank writes its own truth to ``<truth>.rank<R>.json`` (the common fields, see
``probes/README.md``) plus ``rank``, ``local_rank``, ``node_rank`` (torchrun's ``GROUP_RANK``),
``world_size``, ``slow_rank``, ``sleep_s`` (inside ``data_wait_s``), ``data_waits`` (how many
timed waits), ``step_end_epoch_s`` (``time.time()`` at the end of each optimizer step: the
collective's step boundaries in this node's clock) and ``steps``.
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
from ddp_two_ranks import BlockDataset  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402
from torch.utils.data.distributed import DistributedSampler  # noqa: E402

PROBE = "ddp_nodes"


def _blocks(tok, args, world: int) -> torch.Tensor:
    n_blocks = world * args.batch_size * (args.steps + 1)
    texts = C.make_corpus(200, seed=args.seed + 7, median_words=40)
    return C.packed_blocks(tok, texts, n_blocks, args.seq_len)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=40, help="optimizer steps per rank (default 40)")
    p.add_argument("--slow-rank", type=int, default=None, help="global rank whose __getitem__ sleeps")
    p.add_argument("--sleep-ms", type=float, default=15.0, help="sleep per item on the slow rank (default 15 ms)")
    p.add_argument("--batch-size", type=int, default=4, help="per-rank batch size")
    p.add_argument("--seq-len", type=int, default=32)
    args = C.add_common_args(p).parse_args(argv)
    C.setup(args)

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    base = C.truth_path(args)
    planted = "straggler_rank" if args.slow_rank is not None else "none"
    truth = C.Truth(PROBE, planted, f"{base}.rank{rank}.json" if base else None)
    truth.enable("data_wait_s", "tokenize_s", "checkpoint_s", "compute_s")
    truth.fields.update(rank=rank, local_rank=int(os.environ.get("LOCAL_RANK", 0)),
                        node_rank=int(os.environ.get("GROUP_RANK", 0)), world_size=world,
                        slow_rank=args.slow_rank, sleep_s=0.0, data_waits=0, step_end_epoch_s=[])

    tok = C.get_tokenizer(seed=args.seed)
    with truth.timed("tokenize_s"):
        blocks = _blocks(tok, args, world)
    ds = BlockDataset(blocks, args.sleep_ms / 1000.0 if args.slow_rank == rank else 0.0, truth)
    sampler = DistributedSampler(ds, num_replicas=world, rank=rank, shuffle=True, seed=args.seed)
    loader = DataLoader(ds, batch_size=args.batch_size, sampler=sampler, num_workers=0)

    torch.manual_seed(args.seed)  # identical initial weights on every rank
    ddp = DDP(C.TinyCausalLM(tok.get_vocab_size()))
    opt = C.make_adamw(ddp.parameters(), 3e-4, truth)
    ddp.train()
    truth.mark_train_start()
    ends = truth.fields["step_end_epoch_s"]
    for _, x, t_step, t_data in C.timed_batches(loader, truth, lambda n: n >= args.steps,
                                                 on_epoch=sampler.set_epoch):
        truth.fields["data_waits"] += 1
        loss = ddp(input_ids=x, attention_mask=torch.ones_like(x), labels=x).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        ends.append(time.time())
        t_end = time.perf_counter()
        truth.add("compute_s", t_end - t_data)
        truth.step_times.append(t_end - t_step)

    dist.barrier()
    dist.destroy_process_group()
    truth.write(steps=len(ends), final_loss=float(loss.detach()))


if __name__ == "__main__":
    main()
