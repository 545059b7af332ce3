"""Probe: a healthy, compute-bound control (planted: none).

Pre-tokenized in memory with the ``tokenizers`` BPE (no transformers import, quick
startup), length-bucketed batches with dynamic padding (pad_fraction < 0.1), DataLoader
serving ready index batches, no checkpoints, no tokenization in the loop.

Runs for ``--seconds S`` of training (default 6) or ``--steps N`` (whichever comes first
when both are given) and prints its steady-state throughput as the last stdout line,
``STEPS_PER_S=<float>``, measured over the steps after a warm-up of ``--warmup`` steps
(the overhead benchmark compares bare vs profiled runs with it). ``--threads``, ``--workers``
and ``--worker-ms`` make it keep every core busy (``bench/saturated_overhead.py``).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common as C  # noqa: E402
import torch  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

PROBE = "healthy"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=None,
                   help="training time budget in seconds (default 6 unless --steps is given)")
    p.add_argument("--steps", type=int, default=None, help="optimizer steps")
    p.add_argument("--warmup", type=int, default=5, help="steps excluded from STEPS_PER_S")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--examples", type=int, default=1000)
    p.add_argument("--max-length", type=int, default=256, help="truncation length (default 256)")
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--workers", type=int, default=0,
                   help="DataLoader workers (default 0); with --worker-ms they keep cores busy, as a real "
                        "input pipeline does (the saturated-host overhead bench uses it)")
    p.add_argument("--worker-ms", type=float, default=0.0,
                   help="CPU milliseconds each batch costs in the loader (decoding/augmenting stand-in)")
    p.add_argument("--until-file", default=None,
                   help="also stop when this file exists (tests end a long patient when they are done with it)")
    p.add_argument("--step-log", default=None,
                   help="append each step's wall-clock and main-thread CPU end times and the padded tokens so far "
                        "here, a line per step "
                        "(the attach benchmark computes throughput per time block from it)")
    p.add_argument("--toggle-hooks", action="store_true",
                   help="under 'gpudoctor run': SIGUSR1 removes the doctor's hooks from this process, SIGUSR2 puts "
                        "them back (bench/saturated_overhead.py --mode run measures run's cost within one process)")
    p.add_argument("--refork-on-toggle", action="store_true",
                   help="with --toggle-hooks and --workers: end the epoch at each switch, so new workers fork "
                        "with the main process's hooks or without them, as a run's workers do (no install in a worker)")
    args = C.add_common_args(p).parse_args(argv)
    refork = Refork() if args.refork_on_toggle else None
    if args.toggle_hooks:
        toggle_hooks_on_signals(refork)
    if args.seconds is None and args.steps is None:
        args.seconds = 6.0
    C.setup(args)
    truth = C.Truth(PROBE, "none", C.truth_path(args))
    truth.enable("data_wait_s", "tokenize_s", "checkpoint_s", "compute_s")

    tok = C.get_tokenizer(seed=args.seed)
    tok.enable_truncation(args.max_length)
    texts = C.make_corpus(args.examples, seed=args.seed + 5, median_words=50, sigma=0.5)
    with truth.timed("tokenize_s"):
        seqs = [e.ids for e in tok.encode_batch(texts)]
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))
    buckets = [order[i:i + args.batch_size] for i in range(0, len(order), args.batch_size)]
    pad = C.pad_id(tok)
    g = torch.Generator().manual_seed(args.seed)
    work_s = args.worker_ms / 1000.0

    def collate(idx):
        if work_s > 0:  # CPU work, not a sleep: it must occupy a core, as tokenizing or decoding does
            end = time.thread_time() + work_s
            while time.thread_time() < end:
                pass
        return C.collate_ids([seqs[i] for i in idx], pad)

    loader = DataLoader(buckets, batch_size=None, shuffle=True, num_workers=args.workers, generator=g,
                        collate_fn=collate, persistent_workers=args.workers > 0 and refork is None)
    if refork is not None:
        refork.loader, loader = loader, refork

    model = C.TinyCausalLM(tok.get_vocab_size())
    opt = C.make_adamw(model.parameters(), args.lr, truth)
    model.train()
    pads = C.PadCounter()

    truth.mark_train_start()
    t_begin = time.perf_counter()
    t_warm = None
    step = 0

    def done(n: int) -> bool:
        if args.steps is not None and n >= args.steps:
            return True
        if args.until_file is not None and os.path.exists(args.until_file):
            return True
        return args.seconds is not None and time.perf_counter() - t_begin >= args.seconds

    step_log = open(args.step_log, "w", buffering=1) if args.step_log else None  # noqa: SIM115 (lives for the run)

    cpu_warm = [0.0]  # the main thread's CPU at the warm-up's end: the hooks' cost shows in CPU per step

    def on_step(n: int, t_end: float) -> None:
        nonlocal t_warm, step
        step = n
        if step_log is not None:
            step_log.write(f"{time.time():.6f} {time.thread_time():.6f} {pads.total}\n")
        if n == args.warmup:
            t_warm = t_end
            cpu_warm[0] = time.thread_time()

    loss = C.train_timed(model, loader, opt, truth, pads, done=done, on_step=on_step)
    t_last = time.perf_counter()

    if t_warm is not None and step > args.warmup and t_last > t_warm:
        steps_per_s = (step - args.warmup) / (t_last - t_warm)
    else:  # too short for a warm-up: use every step
        steps_per_s = step / max(t_last - t_begin, 1e-9)
    if t_warm is not None and step > args.warmup:
        print(f"MAIN_CPU_MS_PER_STEP={1000 * (time.thread_time() - cpu_warm[0]) / (step - args.warmup):.4f}")
    print(f"STEPS_PER_S={steps_per_s:.4f}", flush=True)
    if step_log is not None:
        step_log.close()
    truth.write(**pads.fields(), steps_per_s=steps_per_s, final_loss=float(loss.detach()))


class Refork:
    """Passes over the loader that end at the batch after a hooks switch, so the next pass forks new workers."""

    def __init__(self) -> None:
        self.loader = None
        self.switched = False

    def __iter__(self):
        self.switched = False
        for batch in self.loader:
            yield batch
            if self.switched:
                return


def toggle_hooks_on_signals(refork: Refork | None = None) -> None:
    """SIGUSR1: ``gpudoctor.hooks.uninstall()``; SIGUSR2: ``install()`` again, as training underway.

    The real install and removal (the ones attach uses), so a bench can compare one process with
    and without run's in-process part. Set before the DataLoader forks: its workers inherit the
    handlers and toggle their own hooks (a worker's recording has no first step to mark); with
    ``refork`` the bench signals only the main process and each switch ends the epoch instead.
    """
    import signal

    def off():
        hooks = sys.modules.get("gpudoctor.hooks")
        if hooks is not None and hooks.is_installed():
            hooks.uninstall()

    def on():
        hooks = sys.modules.get("gpudoctor.hooks")
        run_dir = os.environ.get("GPUDOCTOR_RUN_DIR")
        if hooks is None or not run_dir or hooks.is_installed():
            return
        # run installs before the script has parsed its command line; the live-parser search is attach's
        # (a walk of every object, ~35 ms here), not run's steady state: left out of the reinstall
        cli_hooks = sys.modules["gpudoctor.hooks.cli_hooks"]
        search, cli_hooks.record_existing_parser = cli_hooks.record_existing_parser, lambda writer: None
        try:
            hooks.install(run_dir)
        finally:
            cli_hooks.record_existing_parser = search
        th = hooks.active_torch_hooks()
        if th is not None and torch.utils.data.get_worker_info() is None:
            th.mark_first_step()  # steady state, as attach's install marks a loop already running

    def handler(switch):
        def run(signum, frame):
            try:
                switch()
            except Exception as exc:  # the bench's switch must not end the training it measures
                print(f"healthy probe: --toggle-hooks failed: {exc!r}", file=sys.stderr)
            if refork is not None:
                refork.switched = True

        return run

    signal.signal(signal.SIGUSR1, handler(off))
    signal.signal(signal.SIGUSR2, handler(on))


if __name__ == "__main__":
    main()
