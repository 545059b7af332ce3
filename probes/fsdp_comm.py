"""Probe: the collectives FSDP adds on CPU (gloo), two ranks, parameters re-gathered in backward or not.

Run with ``torchrun --nproc-per-node 2 probes/fsdp_comm.py [--no-reshard] [--fsdp1]``. Each rank
trains a tiny causal LM sharded with FSDP2 (``fully_shard`` on every block, then on the root), or with
``--fsdp1`` the ``FullyShardedDataParallel`` wrapper (every block its own unit), over pre-tokenized
packed blocks (a ``DistributedSampler``).

Planted: FSDP's default ``reshard_after_forward=True`` frees each block's gathered parameters after
its forward and all-gathers them again in backward (``fsdp_backward_allgather``); ``--no-reshard``
(``reshard_after_forward=False``, ZeRO-2: the gathered parameters kept from forward to backward;
FSDP1's ``ShardingStrategy.SHARD_GRAD_OP``) is its fix, at the cost of that memory.

Ground truth per rank, ``<truth>.rank<R>.json`` (rank 0's also at ``<truth>`` itself, for
``bench/prescriptions.py``), timed by the probe itself around each collective FSDP issues (its own
wrapper of ``torch.distributed``'s all-gather and reduce-scatter functions, installed after the
doctor's, so outside it): ``communication_s`` is every collective's seconds (on CPU each blocks the
rank), ``gather_bwd_s`` / ``gathers_bwd`` the all-gathers inside backward, ``gathers`` all of them.
``compute_s`` is forward + backward + optimizer less ``communication_s``.
"""

from __future__ import annotations

import argparse
import functools
import gc
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common as C  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.distributed.fsdp import fully_shard  # noqa: E402

PROBE = "fsdp_comm"
TIMED = ("all_gather_single", "all_gather_into_tensor", "all_gather", "reduce_scatter_single",
         "reduce_scatter_tensor", "all_reduce")


class Collectives:
    """The probe's own clock on FSDP's collectives: seconds per kind, in backward or not."""

    def __init__(self) -> None:
        self.s = {"all": 0.0, "gather_bwd": 0.0}
        self.n = {"gathers": 0, "gathers_bwd": 0}
        self._depth = 0  # one collective implemented with another is timed once

    def install(self) -> None:
        for name in TIMED:
            fn = getattr(dist, name, None)
            if callable(fn):
                setattr(dist, name, self._timed(name, fn))

    def _timed(self, name: str, fn):
        gather = name.startswith("all_gather")

        @functools.wraps(fn)
        def timed(*args, **kwargs):
            if self._depth:
                return fn(*args, **kwargs)
            self._depth += 1
            t = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                dt = time.perf_counter() - t
                self._depth -= 1
                self.s["all"] += dt
                if gather:
                    self.n["gathers"] += 1
                    if torch._C._current_graph_task_id() != -1:  # inside backward
                        self.n["gathers_bwd"] += 1
                        self.s["gather_bwd"] += dt

        return timed


def shard(model: torch.nn.Module, args: argparse.Namespace) -> torch.nn.Module:
    """Every block its own unit, then the root: FSDP2's ``fully_shard``, or FSDP1's wrapper."""
    if not args.fsdp1:
        for block in model.blocks:
            fully_shard(block, reshard_after_forward=not args.no_reshard)
        return fully_shard(model, reshard_after_forward=not args.no_reshard)
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import ShardingStrategy

    strategy = ShardingStrategy.SHARD_GRAD_OP if args.no_reshard else ShardingStrategy.FULL_SHARD
    cpu = torch.device("cpu")
    for i, block in enumerate(model.blocks):
        model.blocks[i] = FSDP(block, sharding_strategy=strategy, device_id=cpu, use_orig_params=True)
    return FSDP(model, sharding_strategy=strategy, device_id=cpu, use_orig_params=True)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=30, help="optimizer steps per rank (default 30)")
    p.add_argument("--no-reshard", action="store_true",
                   help="fully_shard(..., reshard_after_forward=False): no all-gather in backward (the fix)")
    p.add_argument("--fsdp1", action="store_true", help="the FullyShardedDataParallel wrapper (FSDP1), not fully_shard")
    p.add_argument("--batch-size", type=int, default=2, help="per-rank batch size")
    p.add_argument("--seq-len", type=int, default=32)
    p.add_argument("--n-embd", type=int, default=256)
    p.add_argument("--n-layer", type=int, default=4)
    args = C.add_common_args(p).parse_args(argv)
    C.setup(args)

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    base = C.truth_path(args)
    truth = C.Truth(PROBE, "none" if args.no_reshard else "fsdp_backward_allgather",
                    f"{base}.rank{rank}.json" if base else None)
    truth.enable("data_wait_s", "tokenize_s", "checkpoint_s", "compute_s")
    truth.fields.update(rank=rank, world_size=world, reshard_after_forward=not args.no_reshard,
                        fsdp=1 if args.fsdp1 else 2)

    tok = C.get_tokenizer(seed=args.seed)
    sampler, loader = C.rank_loader(tok, args, world, rank, world * args.batch_size * (args.steps + 1), truth)

    torch.manual_seed(args.seed)  # identical initial weights on every rank
    model = C.TinyCausalLM(tok.get_vocab_size(), n_embd=args.n_embd, n_layer=args.n_layer, n_head=4)
    model = shard(model, args)
    opt = C.make_adamw(model.parameters(), 3e-4, truth)

    comms = Collectives()
    comms.install()
    truth.mark_train_start()
    batches = C.timed_batches(loader, truth, lambda n: n >= args.steps, on_epoch=sampler.set_epoch)
    for _, x, t_step, t_data in batches:
        loss = model(input_ids=x, labels=x).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        t_end = time.perf_counter()
        truth.add("compute_s", t_end - t_data)
        truth.step_times.append(t_end - t_step)

    truth.timers["compute_s"] = max(0.0, (truth.timers["compute_s"] or 0.0) - comms.s["all"])
    del model, opt  # FSDP holds the process group: gone before it, while the interpreter is whole (see ddp_comm)
    gc.collect()
    dist.destroy_process_group()
    truth.write(also_at=base if rank == 0 else None, communication_s=comms.s["all"],
                gather_bwd_s=comms.s["gather_bwd"], **comms.n, final_loss=float(loss.detach()),
                communication_share=comms.s["all"] / truth.now())


if __name__ == "__main__":
    main()
