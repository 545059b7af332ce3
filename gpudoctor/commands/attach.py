"""``gpudoctor attach PID``: profile a running training process, then write the same report as ``run``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gpudoctor.commands import flags
from gpudoctor.common.errors import UserError
from gpudoctor.common.termtext import say

HELP = "profile a running training process"
DESCRIPTION = ("Profile a running training process (its ranks and DataLoader workers) until it exits, "
               "--duration passes, or Ctrl-C; then write the report.")

NICE = 10  # before the hooks are in
PID_MAX = 2**22  # the kernel's highest pid_max


def pid(text: str) -> int:
    """A process id: a whole number from 1 to the kernel's highest pid_max."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 0 < value <= PID_MAX:
        raise argparse.ArgumentTypeError(f"{text!r} is not a process id (a whole number from 1 to {PID_MAX})")
    return value


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("pid", type=pid, help="the training process, its launcher (torchrun) or a wrapper around it")
    flags.add_common(p)
    p.add_argument("--duration", type=flags.positive, default=None, metavar="S",
                   help="detach after S seconds (default: when the process exits or on Ctrl-C)")
    p.add_argument("--interval", type=flags.interval, default=0.5,
                   help="host/GPU sampling period in seconds (default 0.5: the patient's CPU is not ours)")
    p.add_argument("--sample-rate", type=flags.bounded(0, 1000), default=20.0, metavar="HZ",
                   help="py-spy stack samples per second (default 20)")
    p.add_argument("--no-inject", action="store_true",
                   help="do not load the in-process hooks (no debugger); estimate from stack samples only")
    flags.add_quiet(p)
    flags.add_no_trackers(p)
    flags.add_history(p)


def main(args: argparse.Namespace) -> int:
    # ptrace, py-spy and the live view load only when attaching (the CLI starts fast)
    from gpudoctor.attach import scratch
    from gpudoctor.attach.live import LiveState, LiveView
    from gpudoctor.attach.lock import AttachLock
    from gpudoctor.attach.session import AttachOptions, open_session
    from gpudoctor.processes import priority

    # Until the hooks are in, the doctor's timing is the figure (the stop must be short, stack samples
    # must come on time): nice 10, as before. Once hooked, it takes only idle cycles (session.py).
    priority.start_normal_spawner()  # gdb is started from a thread kept normal
    doctor_priority = {**priority.nice_doctor(NICE), "py_spy": "nice 19, idle I/O (never SCHED_IDLE: its samples must stay spread over time)",
                       "gdb": "normal: SCHED_OTHER, nice 0 (it holds the patient stopped)"}
    if args.sample_rate <= 0:
        raise UserError("--sample-rate must be > 0 (stack samples are always taken; 20 is the default)")
    options = AttachOptions(
        pid=args.pid, out=args.out, duration_s=args.duration or None, interval_s=args.interval,
        price_per_gpu_hour=args.price_per_gpu_hour, gpus=args.gpus, inject=not args.no_inject,
        sample_rate_hz=args.sample_rate, doctor_priority=doctor_priority,
    )
    try:
        with AttachLock(args.pid):
            session = open_session(options)
            view = LiveView(session.folder.at, LiveState(args.pid, session.record.source(), options.duration_s),
                            quiet=args.quiet, as_json=args.json)
            view.start()
            try:
                record = session.run(view)
            finally:
                view.stop()
    finally:
        scratch.end_session()  # py-spy's output and gdb's commands; a killed doctor's: by the next attach
    observed_s = (record.end_time or record.attach_time) - record.attach_time
    # The session put the doctor back at normal priority when its window ended (session.py::_unidle):
    # the report must not wait behind a patient that keeps every core busy.
    return _report(session.folder.at, session.folder.root, args, observed_s)


def _report(folder: Path, shown: Path, args: argparse.Namespace, observed_s: float) -> int:
    """Write the report into ``folder`` (the run folder's descriptor), saying ``shown``; exit 1 when
    nothing about training could be measured."""
    from gpudoctor.pipeline import finish
    from gpudoctor.render.terminal import print_summary
    from gpudoctor.report.build import ReportOptions

    report = finish(folder, ReportOptions(price_per_gpu_hour=args.price_per_gpu_hour, gpus=args.gpus),
                    trackers=not args.no_trackers, shown=shown)
    print_summary(report, shown, args.json)
    flags.record_history(args, report, shown)
    if report["breakdown"].get("compute") is None:
        say(f"gpudoctor: no training activity seen in pid {args.pid} during {observed_s:.0f} s "
            "(no DataLoader batch, optimizer step or forward pass); the report has host figures only",
            file=sys.stderr)
        return 1
    return 0
