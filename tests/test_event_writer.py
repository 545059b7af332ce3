"""The event writer: across fork (DataLoader workers), across attach sessions, and asleep when idle."""

from __future__ import annotations

import gc
import json
import multiprocessing
import os
import time
import weakref
from pathlib import Path

import torch

from gpudoctor.hooks.writer import EventWriter


def _lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_forked_child_writes_only_its_own_events_to_its_own_file(tmp_path):
    writer = EventWriter(tmp_path)
    writer.emit({"k": "span", "c": "parent", "t0": 1.0, "dt": 0.1})  # buffered, not flushed: must not reach the child
    pid = os.fork()
    if pid == 0:  # the child: what a DataLoader worker does
        code = 1
        try:
            writer.emit({"k": "span", "c": "child", "t0": 2.0, "dt": 0.1})
            writer.close()
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    writer.close(exiting=False)
    child = _lines(tmp_path / "events" / f"{pid}.jsonl")
    parent = _lines(tmp_path / "events" / f"{os.getpid()}.jsonl")
    assert [e["c"] for e in child if e["k"] == "span"] == ["child"]
    assert [e["c"] for e in parent if e["k"] == "span"] == ["parent"]
    assert {e["pid"] for e in child if e["k"] == "proc"} == {pid}


def test_a_detached_writer_is_not_kept_alive_by_the_fork_handler(tmp_path):
    """attach installs a new writer each session: each detached one must be freed, not kept for every fork."""
    refs = []
    for session in range(3):
        writer = EventWriter(tmp_path / str(session))
        writer.emit({"k": "span", "c": "x", "t0": 1.0, "dt": 0.1})
        writer.close(exiting=False)
        writer._thread.join(timeout=10)
        assert not writer._thread.is_alive()
        refs.append(weakref.ref(writer))
        del writer
    gc.collect()
    assert [r() for r in refs] == [None, None, None]


def test_a_worker_that_only_counts_wakes_its_flush_thread_when_its_counters_are_due(tmp_path):
    """An old worker's counters are due every ~10 s: its flush thread must not wake every flush_s meanwhile."""
    writer = EventWriter(tmp_path, flush_s=0.02)
    writer._born -= 3600  # an hour old: counter lines every COUNTER_MAX_PERIOD_S
    flushes = []
    flush = writer.flush
    writer.flush = lambda final=False: (flushes.append(final), flush(final))[1]
    writer.count("fetch", 0.01)  # the first call: announced, written, and the period set
    for _ in range(100):  # ~50 flush periods of counting
        writer.count("fetch", 0.01)
        time.sleep(0.01)
    assert len(flushes) <= 5  # the first writes (announce, first counter line), not one per period (~50)
    writer.emit({"k": "span", "c": "late", "t0": 1.0, "dt": 0.1})  # an event still goes out within flush_s
    path = tmp_path / "events" / f"{os.getpid()}.jsonl"
    for _ in range(500):
        if '"c":"late"' in path.read_text():
            break
        time.sleep(0.01)
    assert '"c":"late"' in path.read_text()
    writer.close(exiting=False)
    counted = [e for e in _lines(path) if e["k"] == "counter"]
    assert sum(e["calls"] for e in counted) == 101  # nothing lost by sleeping


def _written(path, marker: str) -> bool:
    for _ in range(500):  # up to ~5 s on a busy machine; normally one flush_s
        if path.exists() and marker in path.read_text():
            return True
        time.sleep(0.01)
    return False


def test_events_after_the_first_steps_counter_cut_are_still_written(tmp_path):
    """The main process: tokenizer calls counted, the first step cuts them, then a step event per step."""
    writer = EventWriter(tmp_path, flush_s=0.02)
    path = tmp_path / "events" / f"{os.getpid()}.jsonl"
    writer.count("tokenize", 0.5)
    assert _written(path, '"k":"proc"')
    writer.cut_counters()  # lines appended by the main thread, no counter left to wait for
    for n in range(3):
        writer.emit({"k": "step", "t": 1.0 + n, "n": n + 1, "dt": 0.1})
    assert _written(path, '"n":3')
    writer.close(exiting=False)
    kinds = [e["k"] for e in _lines(path)]
    assert kinds.count("step") == 3 and kinds.count("counter") == 1


class _Counting(torch.utils.data.Dataset):
    """Each item counted and spanned by the writer in whichever process fetches it (a worker)."""

    def __init__(self, writer: EventWriter, n: int) -> None:
        self.writer, self.n = writer, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        self.writer.count("fetch", 0.001)
        self.writer.emit({"k": "span", "c": "item", "t0": time.time(), "dt": 0.0, "name": str(i)})
        return i


def test_a_dataloader_worker_writes_what_it_buffered_when_it_exits(tmp_path):
    """A worker ends in os._exit (multiprocessing), past atexit: what it had not yet written must
    still reach its file. flush_s is a minute: nothing is written before the workers exit."""
    writer = EventWriter(tmp_path, flush_s=60.0)
    n, epochs = 12, 2
    loader = torch.utils.data.DataLoader(_Counting(writer, n), batch_size=2, num_workers=2,
                                         persistent_workers=False)
    for _ in range(epochs):  # new workers each epoch, each exiting at its end
        assert sum(len(b) for b in loader) == n
    writer.close(exiting=False)
    rows = [e for path in (tmp_path / "events").glob("*.jsonl") if path.stem != str(os.getpid())
            for e in _lines(path)]
    assert len({e["pid"] for e in rows if e["k"] == "proc"}) == 2 * epochs
    assert sum(e["calls"] for e in rows if e["k"] == "counter" and e["name"] == "fetch") == n * epochs
    assert sum(1 for e in rows if e["k"] == "span" and e["c"] == "item") == n * epochs
    assert sum(1 for e in rows if e["k"] == "exit") == 2 * epochs


def _spawned_child(folder: str) -> None:
    writer = EventWriter(Path(folder), flush_s=60.0)
    writer.count("fetch", 0.001)
    writer.emit({"k": "span", "c": "item", "t0": time.time(), "dt": 0.0})


def test_a_spawned_child_writes_its_remainder_and_one_exit_line(tmp_path):
    """A spawned child runs both multiprocessing's exit and atexit: what it buffered is written once."""
    child = multiprocessing.get_context("spawn").Process(target=_spawned_child, args=(str(tmp_path),))
    child.start()
    child.join(timeout=120)
    assert child.exitcode == 0
    kinds = [e["k"] for e in _lines(tmp_path / "events" / f"{child.pid}.jsonl")]
    assert sorted(kinds) == ["counter", "exit", "proc", "span"]
