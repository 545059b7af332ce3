"""``gpudoctor try [--fix RULE] [--seconds S] -- CMD``: prove a fix before anyone edits code.

Profiles CMD for S seconds of training as ``run`` does (the baseline), picks the fix
(``--fix`` or the top finding the hooks can apply), runs CMD again for S seconds of training
with the fix's values set by the same hooks that watch the Trainer, the DataLoader and the
tokenizer (:mod:`gpudoctor.hooks.apply`), and writes the baseline's report with a ``trial``
section: predicted vs achieved steady-state steps/s. A fix that needs a code change is said,
not tried. Both runs are the user's own command, with its side effects, except that the
trial writes its own copies of the outputs the command line names (:mod:`gpudoctor.tryfix.outputs`).
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpudoctor.commands import flags
from gpudoctor.common.errors import UserError
from gpudoctor.common.termtext import say
from gpudoctor.tryfix import confirm

if TYPE_CHECKING:
    from gpudoctor.core.schema import Pair, Report, Trial
    from gpudoctor.launch.launcher import Launched, RunSpec, View
    from gpudoctor.live.view import Limited
    from gpudoctor.tryfix.limit import TrainingLimit
    from gpudoctor.tryfix.outputs import Output, Seen
    from gpudoctor.tryfix.plan import Plan
    from gpudoctor.tryfix.steady import Rate

    Rates = tuple[Rate, Rate]  # the baseline's and the trial's steady rates over one window

HELP = "measure a finding's fix on the command itself, before editing code"
DESCRIPTION = ("Profile CMD for S seconds of training (the baseline), then run CMD again for S seconds of "
               "training with the top finding's fix (or --fix RULE) applied by the hooks: TrainingArguments "
               "fields, DataLoader workers/pin memory/prefetch, tokenizer max_length/padding, save interval, "
               "DistributedDataParallel/fully_shard/FSDP arguments, DDP's no_sync on accumulation. A "
               "fix that needs a code change is said, not tried. The report compares predicted and achieved "
               "steady-state steps/s. Both runs are your command itself, with its side effects; a file or folder "
               "on its command line that the baseline wrote is kept as the baseline left it: the trial writes its "
               "own under OUT/trial/outputs/.")

STARTUP_CAP_MIN_S = 120.0  # a trial that never reaches a step is stopped after this (or 3x baseline's)
APPLY_FILE = "apply.json"
TRIAL_DIR = "trial"
OUTPUTS_DIR = "outputs"  # under TRIAL_DIR: the trial's own copies of what the baseline wrote
PAIRS_DIR = "pairs"  # --pairs N: pair k's runs in pairs/<k>/baseline and pairs/<k>/trial
MAX_PAIRS = 9


def add_arguments(p: argparse.ArgumentParser) -> None:
    flags.add_common(p)
    p.add_argument("--fix", default=None, metavar="RULE", help="the finding whose fix to try (default: the top "
                   "finding the hooks can apply)")
    p.add_argument("--seconds", type=flags.positive, default=60.0, metavar="S",
                   help="seconds of training per run, counted from the first step (default 60)")
    p.add_argument("--pairs", type=flags.count, default=None, metavar="N",
                   help="measure N before/after pairs, back to back, and report the median of their speedups "
                        f"(at most {MAX_PAIRS}): on a machine whose speed moves between runs (a shared or virtual "
                        f"one) one pair lands wherever it was. Default: 1, and {confirm.PAIRS - 1} more when its "
                        f"speedup is more than {round(100 * confirm.AGREE)}%% from the prediction (--pairs 1: never more)")
    p.add_argument("--set", action="append", default=None, metavar="KEY=VALUE",
                   help="try this value instead of (or besides) the fix's own, e.g. --set num_workers=2")
    p.add_argument("--interval", type=flags.interval, default=0.1, help="sampling period in seconds (default 0.1)")
    flags.add_history(p)
    flags.add_quiet(p)
    flags.add_command(p)


def main(args: argparse.Namespace) -> int:
    # the analysis, the launcher and the fix planner load only when a trial runs (the CLI starts fast)
    from gpudoctor.common import safefs
    from gpudoctor.launch.launcher import RunSpec, run
    from gpudoctor.launch.recorder import default_out
    from gpudoctor.rules import knobs
    from gpudoctor.tryfix import outputs, steady
    from gpudoctor.tryfix import plan as planning
    from gpudoctor.tryfix import section as trial_section
    from gpudoctor.tryfix.limit import TrainingLimit

    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise UserError("no command to try; usage: gpudoctor try [--fix RULE] [--seconds S] -- python train.py")
    if args.pairs is not None and args.pairs > MAX_PAIRS:
        raise UserError(f"--pairs {args.pairs} is more than {MAX_PAIRS}; each pair runs the command twice: use at most "
                        f"{MAX_PAIRS}")
    sets = planning.parse_sets(args.set)
    planning.check_sets(sets)  # before the baseline: a refusal costs nothing
    seconds = float(args.seconds)
    out = args.out or default_out("try")

    seen = outputs.before(command)  # what the command line names, before the baseline writes any of it
    say(f"gpudoctor try: baseline: profiling {seconds:g} s of training", file=sys.stderr)
    base_limit = TrainingLimit(Path(out) / "events", seconds, math.inf)  # its startup is what it is
    spec = RunSpec(command, out, args.interval, args.price_per_gpu_hour, args.gpus, mode="try")
    baseline = run(replace(spec, limit=base_limit, view=_progress(args, "try: baseline", base_limit)))
    code, folder = baseline.code, baseline.folder
    if baseline.diagnosis is None:
        return code or 1
    report, a, findings = baseline.diagnosis.report, baseline.diagnosis.analysis, baseline.diagnosis.findings
    if report["run"].get("status") == "interrupted" and not base_limit.stopped:
        say("gpudoctor try: interrupted during the baseline; no trial run", file=sys.stderr)
        return code
    plan = planning.make_plan(report, a, args.fix, sets)
    if plan is None:
        say("gpudoctor try: the baseline has no finding: nothing to try", file=sys.stderr)
        flags.record_history(args, report, folder)
        return 0
    if not plan.applicable:
        section = trial_section.build(plan, prediction=None, baseline=steady.steady_rate(a, None), trial=None,
                                      applied=None,
                                      seconds=seconds, trial_run=None, notes=_plan_notes(plan))
        _finish(report, section, folder, args.json)
        flags.record_history(args, report, folder)
        return 0

    safefs.replace_file(folder / APPLY_FILE, json.dumps(plan.spec(), indent=2))
    startup = report["steps"].get("first_step_at_s") or 0.0
    limit = TrainingLimit(folder / TRIAL_DIR / "events", seconds, max(STARTUP_CAP_MIN_S, 3 * startup))
    edited = plan.command(command)
    written = outputs.written(seen, folder / TRIAL_DIR / OUTPUTS_DIR)
    trial_command = outputs.redirect(edited or command, written)
    values = "; ".join(f"{p.call}({', '.join(f'{k}={v!r}' for k, v in p.apply.items())})"
                       for p in plan.parts if p.apply and p.target != planning.COMMAND_LINE)
    if trial_command != command:
        values = "; ".join(x for x in (shlex.join(trial_command), values) if x)
    say(f"gpudoctor try: trial: {plan.rule} with {values}, {seconds:g} s of training", file=sys.stderr)
    trial, a_trial = _doctored(args, spec, trial_command, folder / TRIAL_DIR, folder / APPLY_FILE, limit,
                               f"try: trial of {plan.rule}")
    trial_code, trial_report = trial.code, trial.report
    notes = _plan_notes(plan) + _output_notes(written)
    if limit.note:
        notes.append(limit.note)
    crash = _crash(trial_code, limit.stopped, a_trial)
    length, rates, unmeasured = _window(a, a_trial, crash)
    prediction = knobs.predict(a, findings, plan.rule, plan.workers)
    first = trial_section.pair(rates, TRIAL_DIR, unmeasured)
    wanted, why = confirm.pairs_wanted(args.pairs, prediction, first["speedup"])
    pairs = None
    if wanted > 1 and crash is None:
        if why:
            notes.append(why)
        more, said = _more_pairs(args, spec, command, edited, seen, folder, limit.startup_cap_s, wanted)
        pairs = [first, *more]
        notes += said
    section = trial_section.build(
        plan,
        prediction=prediction,
        baseline=rates[0] if rates else None,
        trial=rates[1] if rates else None,
        applied=trial_section.applied_events(a_trial.rec.events),
        seconds=seconds,
        trial_run={"folder": TRIAL_DIR, "exit_code": trial_code, "stopped": limit.stopped,
                   "command_edited": edited is not None, "outputs": [_output(o) for o in written],
                   "status": trial_report["run"].get("status") if trial_report else None, "window_s": length,
                   "crash": crash},
        notes=notes,
        unmeasured=unmeasured,
        pairs=pairs,
    )
    _finish(report, section, folder, args.json)
    flags.record_history(args, report, folder)
    return (trial_code or 1) if crash is not None else 0


def _progress(args: argparse.Namespace, label: str, limit: Limited) -> Callable[[Path], View] | None:
    """The progress line at the bottom of a terminal (gpudoctor/live/view.py), or None (no terminal, --quiet, ...)."""
    from gpudoctor.live.view import try_progress
    from gpudoctor.render.progress import live_output

    if not live_output(sys.stderr, quiet=args.quiet, as_json=args.json):
        return None
    return lambda folder: try_progress(label, limit, sys.stderr)


def _crash(code: int, stopped: bool, a_trial: Any) -> dict[str, Any] | None:
    """The trial's crash: its exit code, steps and last words (its ``uncaught`` event); None when it
    finished, or was stopped by ``try`` itself and raised nothing of its own first (a crash that
    was still shutting down its workers when the seconds ran out is a crash all the same)."""
    last = next((e for records in a_trial.rec.events.values() for e in reversed(records.uncaught)), None)
    if last is None and (code == 0 or stopped):
        return None
    p = a_trial.primary
    lines = []
    if last is not None:
        error, message = str(last.get("error")), str(last.get("message") or "")
        first = message if message.startswith(error) else f"{error}: {message}".rstrip(": ")
        lines = [first, *(last.get("frames") or [])]
    return {"exit_code": code, "steps": len(p.step_times) if p is not None else 0, "last_lines": lines,
            "stopped_while_exiting": stopped}


MIN_COMPARE_STEPS = 10  # steady steps each run needs in the common window for a comparison


def _window(a: Any, a_trial: Any, crash: dict[str, Any] | None) -> tuple[float | None, Rates | None, str | None]:
    """The common length of training both runs are measured over and their steady rates over it;
    or why they cannot be compared (no rates)."""
    from gpudoctor.tryfix import steady

    if crash is not None:
        return None, None, f"the trial crashed (exit code {crash['exit_code']}) after {crash['steps']} steps"
    lengths = [steady.training_s(a), steady.training_s(a_trial)]
    if lengths[0] is None or lengths[1] is None:
        return None, None, "a run reached no training step"
    length = min(lengths[0], lengths[1])
    rates = (steady.steady_rate(a, length), steady.steady_rate(a_trial, length))
    short = min(r.steps for r in rates)
    if short < MIN_COMPARE_STEPS:
        slow = 1 if rates[1].steps <= rates[0].steps else 0
        enough = steady.seconds_for(rates[slow], length, MIN_COMPARE_STEPS)
        return length, None, (f"{('the baseline', 'the trial')[slow]} ran {short} steady steps in the common "
                              f"{length:.1f} s of training, fewer than the {MIN_COMPARE_STEPS} a comparison needs; "
                              f"raise --seconds (at its pace, about --seconds {enough:g})")
    return length, rates, None


def _more_pairs(args: argparse.Namespace, spec: RunSpec, command: list[str], edited: list[str] | None,
                seen: list[Seen], folder: Path, startup_cap_s: float, wanted: int) -> tuple[list[Pair], list[str]]:
    """Pairs 2 to ``wanted``: the command as it ran and with the fix, each for ``--seconds`` of
    training, the even pairs trial first (a machine that drifts one way over the pairs moves the
    odd pairs' ratios one way and the even pairs' the other, and the median sits between), recorded
    (their steps are what is measured) but not timed after (nothing is predicted from them), each
    writing its own copies of the outputs the command line names. A run that crashes ends the
    pairs; the ones measured stand."""
    from gpudoctor.tryfix import outputs
    from gpudoctor.tryfix import section as trial_section
    from gpudoctor.tryfix.limit import TrainingLimit

    seconds = float(args.seconds)
    pairs: list[Pair] = []
    notes: list[str] = []
    for k in range(2, wanted + 1):
        runs: dict[str, Any] = {}
        for side in confirm.order(k):
            out = folder / PAIRS_DIR / str(k) / side
            written = outputs.written(seen, out / OUTPUTS_DIR)
            cmd = outputs.redirect(((edited or command) if side == "trial" else command), written)
            limit = TrainingLimit(out / "events", seconds, startup_cap_s)
            say(f"gpudoctor try: pair {k} of {wanted}: {side}, {seconds:g} s of training", file=sys.stderr)
            done, a = _doctored(args, spec, cmd, out, folder / APPLY_FILE if side == "trial" else None, limit,
                                f"try: pair {k}, {side}")
            crash = _crash(done.code, limit.stopped, a)
            if crash is not None:
                notes.append(f"Pair {k}'s {side} crashed (exit code {crash['exit_code']}; its recording is in "
                             f"{PAIRS_DIR}/{k}/{side}/): the pairs stopped there.")
                break
            runs[side] = a
        if len(runs) < 2:
            break
        _, rates, unmeasured = _window(runs["baseline"], runs["trial"], None)
        pairs.append(trial_section.pair(rates, f"{PAIRS_DIR}/{k}", unmeasured))
    notes.append(f"{len(pairs) + 1} before/after pairs ran back to back, each run {seconds:g} s of training (pair 1 is "
                 f"this report's run and {TRIAL_DIR}/, pair k is in {PAIRS_DIR}/k/, the even pairs' trial run "
                 "first): the achieved speedup is the median of the measured pairs' own speedups, the steps/s each "
                 "side's median.")
    return pairs, notes


def _doctored(args: argparse.Namespace, spec: RunSpec, command: list[str], out: Path, apply: Path | None,
              limit: TrainingLimit, label: str) -> tuple[Launched, Any]:
    """One more recorded run of the command (the trial, or a repeat pair's side) for ``--seconds``
    of training, not timed after (it is measured, not predicted), with the fix's values where
    ``apply`` names them; and its analysis, read from its recording where its report failed (said
    on stderr)."""
    from gpudoctor.analysis import analyze
    from gpudoctor.hooks.apply import ENV
    from gpudoctor.launch.launcher import TRIAL_UNTIMED, run
    from gpudoctor.recording.store import load_recording

    done = run(replace(spec, command=command, out=out, extra_env={ENV: str(apply.resolve())} if apply else None,
                       limit=limit, summary=False, untimed=TRIAL_UNTIMED, view=_progress(args, label, limit)))
    return done, done.diagnosis.analysis if done.diagnosis is not None else analyze(load_recording(done.folder))


def _plan_notes(plan: Plan) -> list[str]:
    notes: list[str] = []
    if plan.applicable and not plan.complete:
        notes.append("Only part of the fix can be set without editing code (see not_applied): "
                     "the trial measures that part.")
    for part in plan.parts:
        if part.thinned:
            t = part.thinned
            notes.append(
                f"The loop's save interval is its own code, so the trial thinned its torch.save calls: it kept "
                f"the first checkpoint save and every {part.apply.get('keep_every')}th after it and skipped the "
                "others, each skipped save's path holding a hard link to the last checkpoint written (so the "
                "loop's fsync, rename or rotation of it still works), running as "
                f"saving every {t['trial_every']} steps would (the run saved every {t['ran_every']})"
                + (f"; the finding's value is save_steps={t['save_steps']}" if t["trial_every"] != t["save_steps"]
                   else "") + ".")
    workers_set = any(k in plan.user_set for k in ("num_workers", "dataloader_num_workers"))
    if plan.user_set and not workers_set:
        notes.append("Values set with --set: the prediction is the finding's, for its own values.")
    return notes


def _output(o: Output) -> dict[str, Any]:
    return {"argument": o.text, "kind": o.kind, "baseline": o.how,
            "trial": str(o.trial.relative_to(o.trial.parents[2])) if o.trial is not None else None}


def _output_notes(written: list[Output]) -> list[str]:
    """What the trial wrote where, in a sentence per kind: its own copies, and what it shared."""
    own = [o.text for o in written if o.trial is not None]
    shared = [o.text for o in written if o.trial is None]
    notes = []
    if own:
        notes.append(f"The outputs named on the command line ({', '.join(own)}) hold what the baseline left "
                     f"there (nothing, where it was stopped before writing them): the trial wrote its own under "
                     f"{TRIAL_DIR}/{OUTPUTS_DIR}/.")
    if shared:
        notes.append(f"The trial wrote into {', '.join(shared)} as the baseline did (a folder that was there "
                     "before the run, or a file too large to copy), so what is there now is partly the trial's.")
    return notes


def _finish(report: Report, section: Trial, folder: Path, as_json: bool) -> None:
    from gpudoctor.render import write_all
    from gpudoctor.tryfix import section as trial_section

    report["trial"] = section
    write_all(report, folder)
    if as_json:
        say(json.dumps(report, indent=2), file=sys.stdout)
    say(trial_section.headline(section), file=sys.stderr)
    say(f"  report: {folder / 'report.html'}", file=sys.stderr)
