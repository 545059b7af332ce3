"""Which training processes ran together: one run folder may hold several trainings in a row.

A wrapper that trains twice under one ``gpudoctor run``, or a launcher restarting its
ranks, leaves training processes whose lives never overlapped. Measured over the whole
recording, the first one's 'other' time would be the second's training and the second's
'startup' the first's (issue 12, #7). So overlapping processes form one training, the
trainings split the recording's wall time at each one's first process start, and each
process is measured over its own training's window only.
"""

from __future__ import annotations

from gpudoctor.recording.records import Records

Lifetime = tuple[float, float]


def lifetime(records: Records, start: float, end: float) -> Lifetime:
    """(born, died) of one process: its start time (else first event) and exit (else last event)."""
    proc = records.proc
    created = proc.get("create_time") if proc is not None else None
    born = float(created) if created is not None else None
    died = records.exit_t
    extent = records.extent()
    if born is None:
        born = extent[0] if extent is not None else start
    if died is None:
        died = extent[1] if extent is not None else end
    return born, max(died, born)


# A process's start is read to a clock tick (common.proctime), but from psutil's create_time, up to a
# second early (boot-time skew), off Linux and in older recordings: a training started right after
# another ended must not read as running beside it.
START_SLACK_S = 1.0


def group(lives: dict[int, Lifetime]) -> list[list[int]]:
    """Pids in groups of overlapping lifetimes (by more than the start's error), by first start."""
    groups: list[list[int]] = []
    group_end = float("-inf")
    for pid in sorted(lives, key=lambda p: (lives[p][0], p)):
        born, died = lives[pid]
        if groups and born < group_end - START_SLACK_S:
            groups[-1].append(pid)
            group_end = max(group_end, died)
        else:
            groups.append([pid])
            group_end = died
    return groups


def windows(groups: list[list[int]], lives: dict[int, Lifetime], start: float, end: float) -> list[Lifetime]:
    """Each training's share of [start, end]: from its first process start to the next one's.

    One training gets the whole recording, as a run with a single training always did.
    """
    if not groups:
        return []
    bounds = [start]
    for pids in groups[1:]:
        born = min(lives[p][0] for p in pids)
        bounds.append(min(max(born, bounds[-1]), end))
    bounds.append(max(end, bounds[-1]))
    return list(zip(bounds, bounds[1:], strict=False))
