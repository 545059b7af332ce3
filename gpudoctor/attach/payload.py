"""The part of ``attach`` that runs inside the patient's interpreter.

Loaded by the bootstrap :mod:`gpudoctor.attach.inject` writes (through gdb or
``sys.remote_exec``), on the patient's main thread at a bytecode boundary.
Stdlib-only, like the hooks. It installs the hooks, catches up on what
happened before the attach (a loop already running, live DataLoaders, a Hugging
Face Trainer), and starts a watchdog thread that removes everything again when
the doctor asks (a ``detach`` file) or disappears (killed doctor): the patient
never keeps our patches after the doctor is gone, and detaching needs no second
debugger stop.

Status files (``<control>/<pid>.installed.json``, ``<pid>.detached.json``) tell
the doctor what happened.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import sys
import threading
import time
from typing import Any

from gpudoctor import hooks
from gpudoctor.attach.lock import pid_alive
from gpudoctor.hooks import torch_hooks
from gpudoctor.hooks.hf_hooks import trainer_event
from gpudoctor.hooks.writer import name_thread

WATCH_S = 1.0  # a wake of ours takes the patient's GIL: the detach may wait this long, the training not


class _State:
    def __init__(self) -> None:
        self.active = False
        self.control_dir = ""
        self.doctor_pid = 0
        self.path_added: str | None = None
        self.callbacks: list[tuple[Any, Any]] = []  # (trainer, callback) we added
        self.lock = threading.Lock()
        self.fork_hook = False


_state = _State()


def attach(run_dir: str, control_dir: str, doctor_pid: int, path_added: str | None = None) -> None:
    """Install the hooks once, catch up on live objects, start the watchdog, write the status."""
    t0 = time.perf_counter()  # the patient's main thread is ours until we return: the doctor reports how long
    if _state.active and _state.control_dir == control_dir:
        return  # this session's retry (its first try got in after all): installed, and said so, once
    _state.control_dir = control_dir
    if os.path.exists(os.path.join(control_dir, "detach")) or not pid_alive(doctor_pid):
        # Queued calls run late when the main thread was busy in C: the doctor may be done.
        write_status("skipped", {"t": time.time(), "reason": "the doctor had already detached"})
        if path_added in sys.path:
            sys.path.remove(path_added)
        return
    if hooks.is_installed():
        raise RuntimeError("gpudoctor hooks are already active in this process "
                           "(started under 'gpudoctor run' or the Python API)")
    if _importing(sys._getframe()):
        # Mid-import (e.g. torch still loading): a half-built module cannot be patched. Come back after.
        _when_out_of_imports(lambda: attach(run_dir, control_dir, doctor_pid, path_added), _fail, session_bound=True)
        return
    writer = hooks.install(run_dir)
    _state.doctor_pid, _state.path_added = doctor_pid, path_added
    _state.active = True
    try:
        live = _live_objects()
        underway = bool(live["iterators"] or live["optimizers"]) or _params_trained(live["modules"])
        # Not hooks.torch_hooks(): once the submodule of that name is imported it shadows the function.
        th = getattr(hooks, "_torch_hooks", None)
        if underway and th is not None and not th.first_step_seen:
            th.mark_first_step()
        _catch_up(writer, th, live)
        if not _state.fork_hook:
            os.register_at_fork(after_in_child=_after_fork_in_child)
            _state.fork_hook = True
        _start_watchdog()
    except BaseException:
        detach("failed while installing")  # never leave hooks behind that nobody will remove
        raise
    # The recording window may start here: after the catch-up first_step.
    write_status("installed", {"t": time.time(), "underway": underway, "trainers": len(live["trainers"]),
                               "loaders": len(live["loaders"]), "python": sys.version.split()[0],
                               "install_s": time.perf_counter() - t0})


def _importing(frame: Any) -> bool:
    """Is this stack inside an ``import`` statement?"""
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
    return False


_callbacks: list[Any] = []  # ctypes thunks must outlive their call: kept for the process's life


def _on_main_thread(fn: Any, on_error: Any) -> bool:
    """Queue ``fn`` to run on the main thread at its next bytecode boundary (``Py_AddPendingCall``,
    the door the debugger used). ``on_error(exc)`` gets what it raises: a pending call must never
    raise into the patient. False when CPython refused the call (its queue is full)."""
    import ctypes

    thunk = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)(_pending(fn, on_error))
    _callbacks.append(thunk)
    return bool(ctypes.pythonapi.Py_AddPendingCall(thunk, None) == 0)


def _pending(fn: Any, on_error: Any) -> Any:
    """What a pending call runs: ``fn``, unless it landed inside an import. There, whatever ``fn``
    imports would run importlib inside itself on the importing thread (on CPython 3.11 the
    training's own import dies of a KeyError: see ``inject._BODY``), so ``fn`` waits for the
    import to end (:func:`_when_out_of_imports`)."""

    def run(_: Any) -> int:
        try:
            if _importing(sys._getframe(1)):  # the frame below is the one the call interrupted
                _when_out_of_imports(fn, on_error)
            else:
                fn()
        except BaseException as exc:
            on_error(exc)
        return 0

    return run


def _when_out_of_imports(fn: Any, on_error: Any, session_bound: bool = False) -> None:
    """Queue ``fn`` on the main thread again once its stack holds no import (a helper thread
    watches it). A detach is queued whether or not the session goes on; an install put off
    (``session_bound``) is dropped once the doctor's folder is gone or asks for the detach."""

    def wait() -> None:
        main = threading.main_thread().ident or 0  # the main thread has started: it has an ident
        while _importing(sys._current_frames().get(main)):
            if session_bound and not _session_on():
                return
            time.sleep(0.05)
        if not _on_main_thread(fn, on_error):
            on_error(RuntimeError("Py_AddPendingCall refused the call (queue full)"))

    threading.Thread(target=wait, name="gpudoctor-attach-wait", daemon=True).start()


def _session_on() -> bool:
    return os.path.isdir(_state.control_dir) and not os.path.exists(os.path.join(_state.control_dir, "detach"))


def _fail(exc: BaseException) -> None:
    write_status("installed", {"ok": False, "t": time.time(), "error": f"{type(exc).__name__}: {exc}"})


def _live_objects() -> dict[str, list[Any]]:
    """One pass over the GC's objects: what training state exists already."""
    found: dict[str, list[Any]] = {"iterators": [], "loaders": [], "optimizers": [], "trainers": [], "tokenizers": [],
                                   "modules": []}
    kinds: list[tuple[str, type]] = []
    for module, attr, key in (
        ("torch.utils.data.dataloader", "_BaseDataLoaderIter", "iterators"),
        ("torch.utils.data.dataloader", "DataLoader", "loaders"),
        ("torch.optim.optimizer", "Optimizer", "optimizers"),
        ("transformers.trainer", "Trainer", "trainers"),
        ("transformers.tokenization_utils_base", "PreTrainedTokenizerBase", "tokenizers"),
        ("torch.nn.modules.module", "Module", "modules"),
    ):
        cls = getattr(sys.modules.get(module), attr, None)
        if isinstance(cls, type):
            kinds.append((key, cls))
    owner: dict[type, str] = {}
    for key, cls in kinds:
        for sub in _subclasses(cls):
            owner.setdefault(sub, key)
    # A set lookup on type(obj): ~3x faster than isinstance over a few 100k objects, and
    # isinstance reads __class__, which some proxies answer with a warning.
    for obj in gc.get_objects():
        kind = owner.get(type(obj))
        if kind is not None:
            found[kind].append(obj)
    found["optimizers"] = [o for o in found["optimizers"] if getattr(o, "state", None)]
    return found


# In-place changes a parameter's initialisation (and a state_dict load) makes: more means updates.
_INIT_VERSIONS = 4


def _params_trained(modules: list[Any]) -> bool:
    """A loop with no optimizer or DataLoader (plain SGD on tensors) is training when its
    parameters have gradients (backward ran) or were updated in place more than initialising
    them takes (``p -= lr * p.grad``, any optimizer step)."""
    for module in modules:
        for p in getattr(module, "_parameters", {}).values():
            if p is not None and p.requires_grad and (p.grad is not None or p._version > _INIT_VERSIONS):
                return True
    return False


def _subclasses(cls: type) -> set[type]:
    seen: set[type] = {cls}
    todo: list[type] = [cls]
    while todo:
        sub: type
        for sub in todo.pop().__subclasses__():
            if sub not in seen:
                seen.add(sub)
                todo.append(sub)
    return seen


def _catch_up(writer: Any, th: Any, live: dict[str, list[Any]]) -> None:
    """Events the hooks would have written had they been there from the start.

    Each live object is read on its own and skipped if reading it fails: the attach can land while
    the patient is inside an ``__init__`` (a tokenizer or DataLoader half built, its attributes not
    set yet: CI saw "TokenizersBackend has no attribute verbose"), and one such object must not
    keep the hooks out. The hooks see it once it is built and used."""
    now = time.time()
    iterated = {id(getattr(it, "_dataset", None)) for it in live["iterators"]}
    # The loader being iterated first: the analysis takes the earliest loader event as training's.
    for loader in sorted(live["loaders"], key=lambda ld: id(getattr(ld, "dataset", None)) not in iterated):
        if not getattr(loader, "_DataLoader__initialized", True):  # torch sets it last in __init__
            continue
        try:
            event = torch_hooks._loader_event(loader)
        except Exception:  # half built, or an odd subclass: not ours to fail on
            continue
        event["t"] = now if id(getattr(loader, "dataset", None)) in iterated else now + 1e-3
        writer.emit(event)
    if th is not None and th.pad_token_id is None:
        th.pad_token_id = next((pad for t in live["tokenizers"] if (pad := _pad_token_id(t)) is not None), None)
    for trainer in live["trainers"]:
        with contextlib.suppress(Exception):  # a Trainer half built is adopted by the hooks once it trains
            _adopt_trainer(writer, trainer, now)


def _pad_token_id(tokenizer: Any) -> int | None:
    """The tokenizer's pad id, or None where it has none or cannot say yet (half built)."""
    try:
        pad = tokenizer.pad_token_id
    except Exception:  # transformers' __getattr__ on an object whose __init__ has not run
        return None
    return pad if isinstance(pad, int) else None


def _adopt_trainer(writer: Any, trainer: Any, now: float) -> None:
    from gpudoctor.hooks.hf_callback import EventsCallback  # transformers: only with a live Trainer

    writer.emit(trainer_event(trainer))
    state = getattr(trainer, "state", None)
    writer.emit({"k": "plan", "t": now, "max_steps": getattr(state, "max_steps", None),
                 "num_train_epochs": getattr(trainer.args, "num_train_epochs", None),
                 "global_step": getattr(state, "global_step", None)})
    callback = EventsCallback(writer)
    trainer.add_callback(callback)
    _state.callbacks.append((trainer, callback))


def detach(reason: str) -> None:
    """Remove every hook and callback; safe from any thread, runs once."""
    with _state.lock:
        if not _state.active:
            return
        _state.active = False
    t0 = time.perf_counter()
    for trainer, callback in _state.callbacks:
        trainer.remove_callback(callback)
    _state.callbacks.clear()
    hooks.uninstall()
    if _state.path_added and _state.path_added in sys.path:
        sys.path.remove(_state.path_added)
    write_status("detached", {"t": time.time(), "reason": reason, "uninstall_s": time.perf_counter() - t0})


def _watch() -> None:
    name_thread(b"gd-attach-watch")  # its CPU and wakes can be told apart in /proc (bench/doctor_wakes.py)
    flag = os.path.join(_state.control_dir, "detach")
    while _state.active:
        time.sleep(WATCH_S)
        if os.path.exists(flag):
            reason = "requested"
        elif not pid_alive(_state.doctor_pid):
            reason = "doctor exited"
        else:
            continue
        # The detach runs on the main thread, like the install: an open torch.profiler window
        # belongs to the thread that started it, and stopped from any other thread its callbacks
        # stay behind (profiling on after the doctor left, warnings in the patient's stderr).
        # A main thread stuck in C runs it when it comes back; the doctor then sees no
        # confirmation and reports the detach as unconfirmed.
        if not _on_main_thread(lambda r=reason: detach(r), _report_detach_error):
            detach(reason)  # CPython's queue is full: remove the hooks from here rather than never
        return


def _report_detach_error(exc: BaseException) -> None:
    write_status("detached", {"t": time.time(), "reason": f"failed: {type(exc).__name__}: {exc}", "ok": False})


def _start_watchdog() -> None:
    threading.Thread(target=_watch, name="gpudoctor-attach-watch", daemon=True).start()


def _after_fork_in_child() -> None:
    """A forked DataLoader worker inherits the hooks: it must also drop them on detach."""
    _state.lock = threading.Lock()
    _state.callbacks = []
    if _state.active:
        _start_watchdog()


def write_status(kind: str, fields: dict[str, Any]) -> None:
    """``<control>/<pid>.<kind>.json``, written atomically so the doctor never reads half a file."""
    path = os.path.join(_state.control_dir, f"{os.getpid()}.{kind}.json")
    tmp = f"{path}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        json.dump({"ok": True, "pid": os.getpid(), **fields}, fh)
    os.replace(tmp, path)
