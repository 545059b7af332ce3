"""A hook must never kill the training (issue 12, finding 6).

Real training loops, real DataLoaders, the real hooks: batches of every layout,
dtype and shape, hostile objects, failing user code. With the hooks in, the
training sees the same batches and the same exceptions as without them; a
failure of our own bookkeeping is swallowed, recorded once and said once.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import sys
import tempfile
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader, Dataset

from gpudoctor import hooks
from tests.conftest import ROOT, hooks_in, run_cli

SCRIPT = ROOT / "tests" / "scripts" / "odd_batches_loop.py"


# -- hostile objects -----------------------------------------------------------------------------


class RaisingGetattr:
    """Every missing attribute raises something other than AttributeError."""

    def __getattr__(self, name: str) -> Any:
        raise RuntimeError(f"no {name} for you")

    def __call__(self, item: Any) -> Any:  # usable as a collate_fn
        return item


class RaisingClass:
    """``isinstance`` itself raises on this object (it reads ``__class__``)."""

    @property  # type: ignore[misc]
    def __class__(self) -> type:
        raise RuntimeError("no class")


class RaisingMapping(Mapping):
    """A batch that is a Mapping but cannot be read."""

    def __getitem__(self, key: str) -> Any:
        raise KeyError(key)

    def get(self, key: str, default: Any = None) -> Any:
        raise ValueError("unreadable batch")

    def __iter__(self) -> Iterator[str]:
        return iter(())

    def __len__(self) -> int:
        return 0


@dataclasses.dataclass
class Record:
    input_ids: Any
    attention_mask: Any


class Items(Dataset):
    def __init__(self, items: list[Any]) -> None:
        self.items = items

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> Any:
        return self.items[i]


def identity(item: Any) -> Any:
    return item


# -- fuzzed batches ------------------------------------------------------------------------------

_DTYPE_NAMES = (
    "bool",
    "uint8",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint16",
    "uint32",
    "uint64",
    "float16",
    "bfloat16",
    "float32",
    "float64",
    "complex64",
    "complex128",
    "float8_e4m3fn",
    "float8_e5m2",
)
DTYPES = [getattr(torch, n) for n in _DTYPE_NAMES if hasattr(torch, n)]
LAYOUTS = (
    "strided",
    "transposed",
    "sparse_coo",
    "sparse_csr",
    "sparse_csc",
    "sparse_bsr",
    "mkldnn",
    "nested",
    "jagged",
    "meta",
    "quantized",
    "scalar",
    "1d",
    "3d",
)


def make_tensor(layout: str, dtype: torch.dtype, rows: int, cols: int) -> Any:
    """A tensor of ``layout`` and ``dtype``; None where torch cannot build that pair."""
    try:
        base = (torch.arange(rows * cols) % 3).reshape(rows, cols).to(dtype)
        if layout == "strided":
            return base
        if layout == "transposed":
            return base.t()
        if layout == "sparse_coo":
            return base.to_sparse()
        if layout == "sparse_csr":
            return base.to_sparse_csr()
        if layout == "sparse_csc":
            return base.to_sparse_csc()
        if layout == "sparse_bsr":
            return base.to_sparse_bsr((1, 1))
        if layout == "mkldnn":
            return base.float().to_mkldnn()
        if layout == "nested":
            return torch.nested.nested_tensor([base[0], base[0][: max(cols - 1, 0)]])
        if layout == "jagged":
            return torch.nested.nested_tensor(
                [base[0], base[0][: max(cols - 1, 0)]], layout=torch.jagged
            )
        if layout == "meta":
            return base.to("meta")
        if layout == "quantized":
            return torch.quantize_per_tensor(base.float(), 0.1, 0, torch.qint8)
        if layout == "scalar":
            return base.sum()
        if layout == "1d":
            return base.flatten()
        return base.unsqueeze(0)
    except Exception:  # e.g. no mkldnn for this dtype, no nested tensor of empty rows
        return None


tensors = st.builds(
    make_tensor,
    st.sampled_from(LAYOUTS),
    st.sampled_from(DTYPES),
    st.integers(0, 3),
    st.integers(0, 5),
)
leaves = st.one_of(
    tensors,
    st.none(),
    st.integers(-3, 3),
    st.text(max_size=5),
    st.builds(RaisingGetattr),
    st.builds(RaisingClass),
)
keys = st.sampled_from(["attention_mask", "input_ids", "labels", "pixel_values"])
batches = st.one_of(
    st.dictionaries(keys, leaves, max_size=3),
    st.tuples(leaves, leaves),
    st.lists(leaves, max_size=3),
    st.builds(Record, leaves, leaves),
    st.builds(RaisingMapping),
    leaves,
)


def train(items: list[Any], collate: Any) -> tuple[list[Any], str | None]:
    """A real small training loop over ``items``: the batches it saw, and how it ended."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.ones(2, 4)
    seen: list[Any] = []
    try:
        for batch in DataLoader(Items(items), batch_size=None, collate_fn=collate):
            seen.append(batch)
            model(x).sum().backward()
            opt.step()
            opt.zero_grad()
    except Exception as exc:
        return seen, f"{type(exc).__name__}: {exc}"
    return seen, None


def read_events(folder: Path) -> list[dict[str, Any]]:
    path = folder / "events" / f"{os.getpid()}.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


def hooked(fn: Any, *args: Any) -> tuple[Any, list[dict[str, Any]]]:
    """``fn(*args)`` with the hooks in (no profiler windows, pad id 0), and what they recorded."""
    with tempfile.TemporaryDirectory(prefix="gpudoctor-guard-") as name:
        folder = Path(name)
        with hooks_in(folder):
            hooks.active_torch_hooks().pad_token_id = 0
            result = fn(*args)
        return result, read_events(folder)


def same_run(bare: tuple[list[Any], str | None], with_hooks: tuple[list[Any], str | None]) -> None:
    assert with_hooks[1] == bare[1]
    assert len(with_hooks[0]) == len(bare[0])
    assert all(a is b for a, b in zip(with_hooks[0], bare[0], strict=True))


@settings(
    max_examples=int(os.environ.get("GPUDOCTOR_HYPOTHESIS_EXAMPLES", "60")),
    deadline=None,
    suppress_health_check=list(HealthCheck),
)
@given(items=st.lists(batches, min_size=1, max_size=4), hostile_collate=st.booleans())
def test_fuzzed_batches_train_the_same_with_the_hooks(items, hostile_collate):
    collate = RaisingGetattr() if hostile_collate else identity
    bare = train(items, collate)
    with_hooks, events = hooked(train, items, collate)
    same_run(bare, with_hooks)
    # Steps are vital: whatever the batches, every one is still counted.
    assert sum(e["k"] == "step" for e in events) == len(bare[0])


def test_a_failing_hook_is_said_once_and_the_rest_keep_recording(capfd):
    items = [RaisingMapping() for _ in range(5)]
    bare = train(items, identity)
    capfd.readouterr()
    with_hooks, events = hooked(train, items, identity)
    same_run(bare, with_hooks)
    errors = [e for e in events if e["k"] == "hook_error"]
    assert (
        len(errors) == 1
        and errors[0]["where"] == "padding count"
        and errors[0]["error"] == "ValueError"
    )
    assert sum(e["k"] == "step" for e in events) == 5
    assert (
        sum(e["k"] == "span" and e["c"] == "data_wait" for e in events) == 6
    )  # 5 batches + the end
    err = capfd.readouterr().err
    assert len([line for line in err.splitlines() if line.startswith("gpudoctor:")]) == 1, err
    assert "'padding count'" in err and "the training goes on" in err


class Boom(Exception):
    pass


class FailingAt(Dataset):
    """Raises its own exception at one index; counts every read."""

    def __init__(self, fail_at: int) -> None:
        self.fail_at = fail_at
        self.reads = 0

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        self.reads += 1
        if i == self.fail_at:
            raise Boom(f"row {i} is bad")
        mask = torch.ones(4, dtype=torch.long)
        return {"input_ids": mask, "attention_mask": mask}


def _iterate_failing() -> tuple[int, BaseException | None, int]:
    ds = FailingAt(fail_at=5)
    n = 0
    try:
        for _ in DataLoader(ds, batch_size=2):
            n += 1
    except Boom as exc:
        return n, exc, ds.reads
    return n, None, ds.reads


def _save_to(buffer: io.BytesIO, path: Path) -> tuple[bytes, str | None]:
    torch.save({"w": torch.arange(10)}, buffer)
    try:
        torch.save({"w": 1}, path)
    except Exception as exc:
        return buffer.getvalue(), f"{type(exc).__name__}: {exc}"
    return buffer.getvalue(), None


def test_the_users_own_exceptions_and_calls_pass_through_untouched(tmp_path):
    bare = _iterate_failing()
    (n, exc, reads), events = hooked(_iterate_failing)
    assert (n, reads) == (bare[0], bare[2])  # each dataset read happened exactly once
    assert type(exc) is Boom and str(exc) == str(bare[1])
    assert exc.__traceback__ is not None and "__getitem__" in str(_last_frame(exc))

    missing = tmp_path / "no" / "such" / "dir" / "x.pt"
    bare_save = _save_to(io.BytesIO(), missing)
    hooked_save, events2 = hooked(_save_to, io.BytesIO(), missing)
    assert hooked_save == bare_save  # saved once (same bytes), same error
    assert not [e for e in events + events2 if e["k"] == "hook_error"]


def _last_frame(exc: BaseException) -> str:
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb.tb_frame.f_code.co_name if tb is not None else ""


class Unprintable:
    def __str__(self) -> str:
        raise RuntimeError("cannot print me")

    __repr__ = __str__


def test_the_event_writer_survives_what_it_cannot_write(tmp_path, capfd):
    cyclic: list[Any] = []
    cyclic.append(cyclic)
    try:
        writer = hooks.install(tmp_path)
        writer.emit({"k": "note", "t": 1.0, "v": Unprintable()})
        writer.flush()
        writer.emit({"k": "note", "t": 2.0, "v": cyclic})
        writer.flush()  # its own failure: swallowed, said once
        writer.emit({"k": "note", "t": 3.0})
        writer.flush()
    finally:
        hooks.uninstall()
    events = read_events(tmp_path)
    assert [e["k"] for e in events if e["k"] in ("note", "hook_error")] == ["note", "hook_error"]
    assert events[-1]["k"] == "hook_error" and events[-1]["where"] == "event writer"
    assert capfd.readouterr().err.count("gpudoctor:") == 1


def test_a_detach_that_lands_inside_the_writers_own_lock_does_not_hang_the_thread(tmp_path):
    """A detach runs on the main thread at any bytecode (attach's pending call, a signal handler),
    so it may land while that thread holds the writer's lock in cut_counters (the first step)."""
    writer = hooks.install(tmp_path)
    writer.count("fetch", 0.25)
    done = threading.Event()

    def main_thread_at_its_first_step() -> None:
        with writer._lock:  # inside cut_counters ...
            hooks.uninstall()  # ... when the detach runs: its final flush takes the lock again
        done.set()

    t = threading.Thread(target=main_thread_at_its_first_step, daemon=True)
    t.start()
    t.join(timeout=10)
    assert done.is_set(), "the detach hung on the writer's lock"
    kinds = [e["k"] for e in read_events(tmp_path)]
    assert kinds.count("detach") == 1 and kinds.count("counter") == 1  # recorded to the end


def test_callbacks_survive_hostile_arguments(tmp_path):
    pytest.importorskip("transformers")
    lightning = pytest.importorskip("lightning")
    import gpudoctor

    try:
        writer = hooks.install(tmp_path)
        cb = gpudoctor.GpuDoctorCallback(_writer=writer)
        cb.on_train_begin(RaisingGetattr(), RaisingGetattr(), None)
        cb.on_step_end(RaisingGetattr(), RaisingGetattr(), None)
        cb.on_train_end(RaisingGetattr(), RaisingGetattr(), None)
        lcb = gpudoctor.GpuDoctorLightningCallback()
        lcb.on_fit_start(RaisingGetattr(), None)
        lcb.on_validation_start(RaisingGetattr(), None)
        lcb.on_validation_end(RaisingGetattr(), None)
        lcb.on_fit_end(RaisingGetattr(), None)
    finally:
        hooks.uninstall()
    assert lightning is not None
    wheres = {e["where"] for e in read_events(tmp_path) if e["k"] == "hook_error"}
    assert wheres == {"Trainer callback", "Lightning callback"}


def test_loader_event_never_raises_on_a_hostile_loader():
    from gpudoctor.hooks.torch_hooks import _loader_event

    event = _loader_event(DataLoader(Items([1]), batch_size=None, collate_fn=RaisingGetattr()))
    assert event["k"] == "loader" and event["collate_fn"] == "RaisingGetattr"


def test_odd_batches_and_the_users_own_profiler_do_not_kill_training(tmp_path):
    """End to end: exits 0 bare, so it must exit 0 under the doctor, its own profiler intact."""
    folder = tmp_path / "run"
    proc = run_cli(
        "run",
        "--out",
        str(folder),
        "--",
        sys.executable,
        str(SCRIPT),
        "--steps",
        "12",
        "--own-profiler",
        env={"GPUDOCTOR_PROFILE_WINDOW": "3:2"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((folder / "report.json").read_text())
    assert report["steps"]["count"] == 12
    assert "recorded nothing" not in proc.stderr


def test_the_event_writer_never_writes_through_a_planted_link(tmp_path, capsys):
    """attach hands events/ to the patient's user: a link planted there must not be followed."""
    from gpudoctor.hooks.writer import EventWriter

    victim = tmp_path / "victim"
    victim.write_text("keep")
    (tmp_path / "events").mkdir()
    (tmp_path / "events" / f"{os.getpid()}.jsonl").symlink_to(victim)
    writer = EventWriter(tmp_path)
    writer.emit({"k": "exit", "t": 1.7e9})
    writer.flush(final=True)
    writer.close(exiting=False)
    assert victim.read_text() == "keep"
    assert "stopped recording" in capsys.readouterr().err
