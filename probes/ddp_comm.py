"""Probe: the communication two-rank DistributedDataParallel adds on CPU (gloo), planted or not.

Run with ``torchrun --nproc-per-node 2 probes/ddp_comm.py [--accum N] [--no-sync] [--find-unused]``.
Each rank trains a tiny causal LM wrapped in ``DistributedDataParallel`` over pre-tokenized packed
blocks (a ``DistributedSampler``), ``--accum`` micro-batches per optimizer step.

Planted:
* ``--accum 4`` without ``--no-sync``: DDP all-reduces the gradients on every micro-step
  (``sync_every_microstep``); ``--no-sync`` is its fix (``model.no_sync()`` on all but the last).
* ``--find-unused``: ``find_unused_parameters=True`` while every parameter gets a gradient
  (``unused_parameter_search``); leaving it out is the fix.
* neither: a healthy DDP (``none``).

Ground truth per rank, ``<truth>.rank<R>.json`` (rank 0's also at ``<truth>`` itself, for
``bench/prescriptions.py``). Before the loop each rank times ``--calib`` backward passes of one
batch under ``no_sync()`` (in eval mode: no all-reduce, not a training step): its local backward,
``local_backward_s``; ``sync_cost_s`` is, over the loop's backward passes that all-reduced, their
time beyond that local backward: all the gradient sync cost them (the wait, and backward slowed
while the all-reduce overlapped it). ``communication_s`` is the wait alone: in each such pass, from
the moment its last parameter's gradient was accumulated (a ``post_accumulate_grad`` hook on every
parameter: backward's own work is over) until ``backward()`` returned, the all-reduce done.
``allreduces`` counts those passes, ``micro_steps`` all of them.
With ``--log-loss`` each step also all-reduces its loss (a direct ``torch.distributed`` call, timed
into ``communication_s``). ``compute_s`` is forward + backward + optimizer less ``communication_s``;
``forward_s`` is the loop's forward passes (the unused-parameter search runs inside them).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common as C  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

PROBE = "ddp_comm"


def planted(args: argparse.Namespace) -> str:
    if args.find_unused:
        return "unused_parameter_search"
    return "sync_every_microstep" if args.accum > 1 and not args.no_sync else "none"


def local_backward_s(ddp: DDP, x: torch.Tensor, n: int) -> float:
    """Median seconds of a backward pass without the all-reduce (eval mode: no training step)."""
    ddp.eval()
    times = []
    with ddp.no_sync():
        for _ in range(n + 1):
            loss = ddp(input_ids=x, labels=x).loss
            t = time.perf_counter()
            loss.backward()
            times.append(time.perf_counter() - t)
    ddp.zero_grad(set_to_none=True)
    ddp.train()
    return statistics.median(times[1:])  # the first warms the allocator up


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=30, help="optimizer steps per rank (default 30)")
    p.add_argument("--accum", type=int, default=1, help="micro-batches per optimizer step (default 1)")
    p.add_argument("--no-sync", action="store_true", help="all-reduce on the last micro-step only (the fix)")
    p.add_argument("--find-unused", action=argparse.BooleanOptionalAction, default=False,
                   help="DDP(find_unused_parameters=True); --no-find-unused is the fix")
    p.add_argument("--batch-size", type=int, default=2, help="per-rank micro-batch size")
    p.add_argument("--seq-len", type=int, default=32)
    p.add_argument("--n-embd", type=int, default=256)
    p.add_argument("--n-layer", type=int, default=4)
    p.add_argument("--calib", type=int, default=6, help="backward passes timed without all-reduce")
    p.add_argument("--bucket-cap-mb", type=float, default=None, help="DDP(bucket_cap_mb=...) (default: DDP's)")
    p.add_argument("--grad-as-view", action="store_true", help="DDP(gradient_as_bucket_view=True)")
    p.add_argument("--compress", choices=("none", "fp16", "bf16"), default="none",
                   help="register DDP's fp16 or bf16 compression hook")
    p.add_argument("--late-hook", action="store_true",
                   help="register a counting all-reduce hook after the first optimizer step (late_hook_calls)")
    p.add_argument("--log-loss", action="store_true",
                   help="all_reduce the loss after each optimizer step (a direct collective, as loggers do)")
    args = C.add_common_args(p).parse_args(argv)
    C.setup(args)

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    base = C.truth_path(args)
    truth = C.Truth(PROBE, planted(args), f"{base}.rank{rank}.json" if base else None)
    truth.enable("data_wait_s", "tokenize_s", "checkpoint_s", "compute_s")
    truth.fields.update(rank=rank, world_size=world, accum=args.accum, no_sync=args.no_sync,
                        find_unused=args.find_unused)

    tok = C.get_tokenizer(seed=args.seed)
    sampler, loader = C.rank_loader(tok, args, world, rank, world * args.batch_size * (args.steps * args.accum + 1), truth)

    torch.manual_seed(args.seed)  # identical initial weights on every rank
    model = C.TinyCausalLM(tok.get_vocab_size(), n_embd=args.n_embd, n_layer=args.n_layer, n_head=4)
    ddp = DDP(model, find_unused_parameters=args.find_unused, bucket_cap_mb=args.bucket_cap_mb,
              gradient_as_bucket_view=args.grad_as_view)
    if args.compress != "none":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        ddp.register_comm_hook(None, getattr(default_hooks, f"{args.compress}_compress_hook"))
    opt = C.make_adamw(ddp.parameters(), 3e-4, truth)
    local_s = local_backward_s(ddp, loader.dataset[: args.batch_size], args.calib)

    last_grad = [0.0]  # when the last parameter's gradient was accumulated in this backward

    def grad_ready(_: torch.Tensor) -> None:
        last_grad[0] = time.perf_counter()

    for param in model.parameters():
        param.register_post_accumulate_grad_hook(grad_ready)

    late_calls = [0]

    def counting_hook(state, bucket):  # DDP checks a hook's annotations: none here
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        late_calls[0] += 1
        return default_hooks.allreduce_hook(state, bucket)

    comm_s = sync_s = forward_s = 0.0
    allreduces = micro_steps = 0
    t_first = 0.0
    truth.mark_train_start()
    batches = C.timed_batches(loader, truth, lambda n: n >= args.steps * args.accum, on_epoch=sampler.set_epoch)
    for n, x, t_step, t_data in batches:
        last = n % args.accum == 0
        if n % args.accum == 1 or args.accum == 1:
            t_first = t_step
        sync = last or not args.no_sync
        with contextlib.nullcontext() if sync else ddp.no_sync():
            t_f = time.perf_counter()
            loss = ddp(input_ids=x, labels=x).loss / args.accum
            t_b = time.perf_counter()
            loss.backward()
            t_e = time.perf_counter()
        forward_s += t_b - t_f
        micro_steps += 1
        if sync:
            allreduces += 1
            sync_s += max(0.0, (t_e - t_b) - local_s)
            comm_s += max(0.0, t_e - last_grad[0])
        if last:
            opt.step()
            opt.zero_grad(set_to_none=True)
            if args.late_hook and n == args.accum:  # after the first step: the slot DDP offers a script then (the doctor holds none)
                ddp.register_comm_hook(None, counting_hook)
            if args.log_loss:
                t_l = time.perf_counter()
                dist.all_reduce(loss.detach().clone())  # blocks the host: communication
                comm_s += time.perf_counter() - t_l
        t_end = time.perf_counter()
        truth.add("compute_s", t_end - t_data)
        if last:
            truth.step_times.append(t_end - t_first)

    truth.timers["compute_s"] = max(0.0, (truth.timers["compute_s"] or 0.0) - comm_s)
    # DDP's reducer holds the process group: drop it first, so the group (and gloo's threads, which may
    # hold the Python comm hook's futures) is gone while the interpreter is whole; left to interpreter
    # exit, gloo's teardown aborts the process now and then ("terminate called without an active
    # exception", pytorch/pytorch#179291). No barrier: a final wait for the other rank is no step's.
    del ddp
    gc.collect()
    dist.destroy_process_group()
    fields = dict(communication_s=comm_s, sync_cost_s=sync_s, local_backward_s=local_s, allreduces=allreduces,
                  micro_steps=micro_steps, forward_s=forward_s, late_hook_calls=late_calls[0], final_loss=float(loss.detach()))
    truth.write(also_at=base if rank == 0 else None, **fields, communication_share=comm_s / truth.now())


if __name__ == "__main__":
    main()
