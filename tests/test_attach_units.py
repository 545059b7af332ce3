"""The pieces of ``gpudoctor attach`` that need no live patient: classification, sampled events, windows, lock."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpudoctor.analysis.process import build_process_view
from gpudoctor.analysis.sampled import Code, sampled_events, sampled_records
from gpudoctor.attach import scratch, symbols
from gpudoctor.attach.classify import classify
from gpudoctor.attach.inject import gdb_commands, gdb_script
from gpudoctor.attach.lock import AttachLock, lock_path
from gpudoctor.attach.stacks import window_rows
from gpudoctor.attach.window import AttachRecord, TargetRecord
from gpudoctor.common.errors import UserError

TRAIN = ("<module>", "train.py")
NEXT = ("_BaseDataLoaderIter.__next__", "/site-packages/torch/utils/data/dataloader.py")
FETCH = ("_MapDatasetFetcher.fetch", "/site-packages/torch/utils/data/_utils/fetch.py")
TOKENIZE = ("PreTrainedTokenizerFast._batch_encode_plus", "/site-packages/transformers/tokenization_utils_fast.py")
FORWARD = ("Module._call_impl", "/site-packages/torch/nn/modules/module.py")
SAVE = ("save", "/site-packages/torch/serialization.py")
EVALUATE = ("Trainer.evaluate", "/site-packages/transformers/trainer.py")
MAP = ("Dataset.map", "/site-packages/datasets/arrow_dataset.py")
WORKER = ("_worker_loop", "/site-packages/torch/utils/data/_utils/worker.py")
NO_GRAD = ("_DecoratorContextManager.decorate_context", "/site-packages/torch/utils/_contextlib.py")
ESTIMATE_LOSS = ("main.<locals>.estimate_loss", "train.py")
BACKWARD = ("Tensor.backward", "/site-packages/torch/_tensor.py")


@pytest.mark.parametrize(("stack", "code"), [
    ([TRAIN, NEXT, FETCH], Code.DATA_WAIT),
    ([TRAIN, NEXT, FETCH, TOKENIZE], Code.DATA_WAIT_TOKENIZE),
    ([TRAIN, TOKENIZE], Code.TOKENIZE),
    ([TRAIN, FORWARD], Code.COMPUTE),
    ([TRAIN, SAVE], Code.CHECKPOINT),
    ([TRAIN, EVALUATE, NEXT], Code.EVAL),  # a DataLoader wait inside evaluation is evaluation
    ([TRAIN, MAP, TOKENIZE], Code.FORMAT),
    ([TRAIN], Code.OTHER),
    ([WORKER, FETCH], Code.WORKER_FETCH),
    ([WORKER], Code.WORKER_IDLE),
    # a hand-written loop's eval: the script's own eval-named function, no backward under it
    ([TRAIN, NO_GRAD, ESTIMATE_LOSS, FORWARD], Code.EVAL),
    ([TRAIN, ("run_validation", "train.py"), ("get_batch", "train.py")], Code.EVAL),
    ([TRAIN, ("evaluate_and_step", "train.py"), BACKWARD], Code.COMPUTE),
    ([TRAIN, ("interval_loss", "train.py"), FORWARD], Code.COMPUTE),
    ([TRAIN, ("Module.eval", "/site-packages/torch/nn/modules/module.py")], Code.OTHER),
])
def test_a_stack_sample_gets_the_category_the_hooks_would_give(stack, code):
    assert classify(stack) == code


def _row(t: float, codes: str, pid: int = 7, rate: float = 10.0) -> dict:
    return {"t": t, "t1": t + len(codes) / rate, "pid": pid, "ppid": 1, "rank": None, "role": "main",
            "rate_hz": rate, "codes": codes}


def test_sampled_events_give_a_breakdown_in_the_samples_proportions():
    codes = "OOOO" + "DDDTTCCCCC" * 6  # 4 samples of startup, then 60% compute, 30% data wait (10% tokenizing)
    records = sampled_records([_row(100.0, codes)], skip_pids=set())[7]
    view = build_process_view(7, records, 100.0, 100.0 + len(codes) / 10.0, [])
    assert view.proc["sampled"] is True
    assert view.first_step == pytest.approx(100.4)
    assert view.breakdown["startup"] == pytest.approx(4 / 64)
    assert view.breakdown["data_wait"] == pytest.approx(30 / 64, abs=0.02)
    assert view.breakdown["compute"] == pytest.approx(30 / 64, abs=0.02)
    assert view.tokenize_in_loop_s == pytest.approx(1.2)
    assert not view.step_times  # no step is made up


def test_a_launcher_caught_once_in_torch_code_is_not_a_training_loop():
    """torchrun's agent sampled 190 times, once inside torch: no first step, no wait for a batch
    (under load that one sample made it a second "rank 0" in an attached job's per-rank table)."""
    events = sampled_events([_row(0.0, "O" * 6 + "C" + "O" * 90), _row(20.0, "O" * 40 + "D" + "O" * 52)], set())[7]
    assert not [e for e in events if e["k"] == "first_step" or (e["k"] == "span" and e["c"] in ("loop", "data_wait"))]
    loop = sampled_events([_row(0.0, "OOOO" + "DDCCC" * 3)], set())[7]  # a short loop: 15 samples
    assert [e["k"] for e in loop].count("first_step") == 1


def test_sampled_events_never_replace_hooked_processes():
    assert sampled_events([_row(1.0, "CCDD")], skip_pids={7}) == {}


def test_a_gap_between_sampling_windows_ends_a_span():
    rows = [_row(0.0, "KK"), _row(10.0, "KK")]
    spans = [e for e in sampled_events(rows, set())[7] if e["k"] == "span"]
    assert [(s["t0"], round(s["dt"], 3)) for s in spans] == [(0.0, 0.2), (10.0, 0.2)]


def test_window_rows_keep_each_process_main_thread():
    frames = [{"name": "process 5:\"python t.py\"", "file": ""}, {"name": "thread (5): MainThread", "file": ""},
              {"name": NEXT[0], "file": NEXT[1]}, {"name": FORWARD[0], "file": FORWARD[1]},
              {"name": WORKER[0], "file": WORKER[1]}]
    profile = {"shared": {"frames": frames}, "profiles": [
        {"name": 'Process 5 Thread 5 "MainThread"', "samples": [[0, 1, 2], [0, 1, 3]]},
        {"name": 'Process 5 Thread 9 "pin_memory"', "samples": [[0, 1, 2]]},
        {"name": 'Process 6 Thread 6 "MainThread"', "samples": [[0, 4]]},
        {"name": 'Thread 5 "MainThread"', "samples": [[3]]},  # py-spy's naming without --subprocesses
    ]}
    rows = window_rows(profile, 10.0, 14.0, 20.0, root_pid=5)
    assert [(r["pid"], r["role"], r["codes"]) for r in rows] == [
        (5, "main", "DC"), (6, "worker", "w"), (5, "main", "C")]


def test_gdb_script_writes_the_source_then_queues_one_pending_call():
    script = gdb_script(0x1000, 0x2000, 0x3000, b"print(1)\n")
    assert "0x1000)(0, 4096, 3, 34, -1, 0)" in script
    assert "(int(*)(void*, void*))0x2000)((void*)0x3000, $gd_page)" in script
    words = [int(line.rsplit("= ", 1)[1]) for line in script.splitlines() if line.startswith("set *(long*)")]
    data = b"".join(w.to_bytes(8, "little", signed=True) for w in words)
    assert data.rstrip(b"\0") == b"print(1)\n" and data.endswith(b"\0")
    assert script.rstrip().endswith('printf "GPUDOCTOR pending %d\\n", $gd_rc')


def test_gdb_puts_the_stopped_thread_back_even_when_its_calls_fail():
    """gdb's calls leave orig_rax at -1; put back after the script (which a failing call ends), the
    sleep or poll the thread was stopped in goes on (issue #39)."""
    argv = gdb_commands(7, Path("/s"), machine="x86_64")
    assert argv == ["-p", "7", "-ex", "set $gd_orig_rax = $orig_rax", "-x", "/s", "-ex", "set $orig_rax = $gd_orig_rax",
                    "-ex", "detach", "-ex", "quit"]
    assert gdb_commands(7, Path("/s"), machine="aarch64") == ["-p", "7", "-x", "/s", "-ex", "detach", "-ex", "quit"]


def test_symbols_of_this_interpreter_resolve_to_its_own_code():
    image = symbols.python_image(os.getpid())
    assert image is not None
    import ctypes

    want = ctypes.cast(ctypes.pythonapi.Py_AddPendingCall, ctypes.c_void_p).value
    assert image.address("Py_AddPendingCall") == want
    assert symbols.python_version(os.getpid(), image) == sys.version_info[:2]
    assert symbols.libc_image(os.getpid()).address("mmap") is not None


def test_a_non_python_process_has_no_python_image():
    proc = subprocess.Popen(["sleep", "5"])
    try:
        time.sleep(0.1)
        assert symbols.python_image(proc.pid) is None
    finally:
        proc.kill()
        proc.wait()


def test_window_starts_at_the_hooks_when_training_was_underway(tmp_path: Path):
    rec = AttachRecord(attach_time=100.0, root_start_time=40.0)
    rec.targets[1] = TargetRecord(pid=1, rank=None, create_time=40.0, installed_at=101.0, underway=True)
    assert rec.window_start(tmp_path) == 101.0
    assert "while it was training" in " ".join(rec.notes(101.0))


def test_window_starts_at_process_start_when_attached_before_the_first_step(tmp_path: Path):
    rec = AttachRecord(attach_time=100.0, root_start_time=97.0)
    rec.targets[1] = TargetRecord(pid=1, rank=None, create_time=97.0, installed_at=100.5, underway=False)
    assert rec.window_start(tmp_path) == 97.0
    assert "before its first training step" in " ".join(rec.notes(97.0))


def test_without_hooks_the_notes_say_which_figures_are_unavailable(tmp_path: Path):
    rec = AttachRecord(attach_time=100.0, stack_samples=400, sample_rate_hz=20.0)
    rec.targets[1] = TargetRecord(pid=1, rank=None, create_time=99.5, error="gdb is not installed")
    note = rec.notes(100.0)[0]
    assert "gdb is not installed" in note and "400 stack samples" in note and "padding" in note


def test_the_live_view_says_what_holds_the_hooks_back():
    rec = AttachRecord(attach_time=100.0)
    rec.targets[7] = TargetRecord(pid=7, rank=0, create_time=99.0)
    assert rec.source() == "loading the in-process hooks…"
    rec.targets[7].waiting_for = "its main thread is in torch.distributed's init_process_group()"
    assert rec.source().endswith("pid 7: its main thread is in torch.distributed's init_process_group()")


def test_a_second_doctor_is_refused_and_a_stale_lock_taken_over():
    pid = 2**22 + 12345  # no such process: only the lock file matters here
    with AttachLock(pid), pytest.raises(UserError, match="already attached"):
        AttachLock(pid).acquire()
    dead = subprocess.Popen(["sleep", "60"])
    token = scratch.process_token(dead.pid)
    dead.kill()
    dead.wait()
    assert token is not None and not scratch.token_alive(token)
    lock_path(pid).write_text(token)
    with AttachLock(pid) as lock:
        assert lock_path(pid).read_text() == scratch.process_token(os.getpid())
    assert not lock.path.exists()


def test_permission_denied_says_what_to_change(monkeypatch):
    from gpudoctor.attach import inject

    monkeypatch.setattr(inject, "_ptrace_scope", lambda: 1)
    hint = inject.permission_hint(4242, "ptrace: Operation not permitted")
    assert "same user" in hint and "CAP_SYS_PTRACE" in hint
    assert "/proc/sys/kernel/yama/ptrace_scope is 1" in hint


def test_an_unreadable_process_is_a_user_error_not_a_traceback(monkeypatch):
    from gpudoctor.attach import targets

    def denied(path: str) -> str:
        raise PermissionError(13, "Permission denied", path)

    monkeypatch.setattr(targets.os, "readlink", denied)
    with pytest.raises(UserError, match="not permitted to inspect pid"):
        targets.is_python(4242)


def test_importing_torch_is_not_a_training_step():
    importing = [("<module>", "torchrun"), ("_find_and_load", "<frozen importlib._bootstrap>"),
                 ("<module>", "/site-packages/torch/autograd/__init__.py")]
    assert classify(importing) == Code.OTHER


@pytest.mark.parametrize(("argv", "launcher"), [
    (["/venv/bin/torchrun", "--nproc-per-node", "2", "train.py"], True),
    (["/venv/bin/python", "/venv/bin/accelerate", "launch", "train.py"], True),
    (["python", "-m", "torch.distributed.run", "train.py"], True),
    (["python", "accelerate_experiment.py"], False),
    (["python", "train.py", "--note", "torchrun"], False),
])
def test_launchers_are_told_from_training_scripts(argv, launcher):
    from gpudoctor.attach.targets import launcher_cmdline

    assert launcher_cmdline(argv) is launcher


def test_a_process_marked_hooked_ends_its_py_spy_window_at_once_and_is_not_sampled_again(tmp_path: Path) -> None:
    """Once hooked, a process's stacks are read by nothing: the window under way stops for it
    (it would otherwise sample a busy patient for the rest of a long window) and no later
    window includes it. Its samples so far are kept."""
    from gpudoctor.attach.stacks import StackSampler, pyspy_path
    from gpudoctor.recording.store import JsonlAppender

    if pyspy_path() is None:
        pytest.skip("py-spy is not installed")
    patient = subprocess.Popen([sys.executable, "-c", "import time\nwhile True: sum(range(1000)); time.sleep(0.005)"])
    sampler = StackSampler(patient.pid, JsonlAppender(tmp_path / "stacks.jsonl"), window_s=600.0)
    try:
        sampler.start()
        for _ in range(600):  # the window's py-spy for the patient is running
            proc = sampler._procs.get(patient.pid)
            if proc is not None and proc.returncode is None:
                break
            time.sleep(0.1)
        assert proc is not None
        time.sleep(1.0)  # a few samples taken
        sampler.mark_hooked(patient.pid)
        proc.wait(timeout=120)  # the 600 s window ended on SIGINT, long before its end
        assert patient.pid not in sampler._python_tree()
    finally:
        sampler.stop()
        patient.kill()
        patient.wait()
    assert sampler.samples > 0  # what py-spy had when it was stopped was written


@pytest.mark.skipif(shutil.which("gdb") is None or sys.platform != "linux", reason="injects with gdb on Linux")
def test_a_patient_stopped_in_time_sleep_sleeps_on_after_an_injection(tmp_path: Path) -> None:
    """Whether gdb's calls work here or fail (some containers refuse its register writes), the
    patient's ``time.sleep`` goes on: no ``OSError: [Errno 514]`` out of a syscall gdb interrupted."""
    from gpudoctor.attach.inject import InjectError, inject, write_bootstrap

    patient = subprocess.Popen([sys.executable, "-c", "import time\nfor _ in range(60): time.sleep(0.05)\n"
                                "print('slept')"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(0.5)  # in its sleeps
    bootstrap = write_bootstrap(tmp_path / "control", tmp_path / "run")
    with contextlib.suppress(InjectError):
        inject(patient.pid, bootstrap)
    out, err = patient.communicate(timeout=60)
    assert patient.returncode == 0 and out.strip() == "slept", err[-2000:]


ENDING = """
import json, os, sys
import psutil
from gpudoctor.attach.session import AttachOptions, AttachSession
session = AttachSession(AttachOptions(pid=os.getpid(), out=sys.argv[1] + "/run", doctor_priority={"cpu": "nice 10"}),
                        psutil.Process())
session._ending.set()  # the window is over: the detach's status poll sees the install
session._idle()
print(json.dumps({"policy": os.sched_getscheduler(0), "idle": session.stacks.idle,
                  "meta": session.recorder.meta.get("doctor_priority")}))
"""


def test_an_install_seen_after_the_window_never_lowers_the_doctor_again(tmp_path: Path):
    """A Ctrl-C a moment after the install: the detach's own status poll saw it after the doctor
    went back to normal, lowered it again, and beside two busy programs the report took minutes."""
    done = subprocess.run([sys.executable, "-c", ENDING, str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    got = json.loads(done.stdout)
    assert got == {"policy": os.SCHED_OTHER, "idle": False, "meta": None}
