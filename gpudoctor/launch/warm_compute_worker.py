"""Child process: time a stand-in training step back to back and right after a build-like gap.

Run by :mod:`gpudoctor.launch.warm_compute` after the training exited, with the threads the
training had. The stand-in is the recorded ``transformers`` architecture (or a GPT-2 of the
recorded shape) at the recorded rows and width, random weights, forward, backward and an AdamW
step (built as :mod:`gpudoctor.launch.length_cost_worker` builds it, with its checks); for a
convolutional model, its recorded layers at its recorded image batch (:mod:`gpudoctor.launch.conv_net`);
where neither is known, two linear layers holding about as many weights as the training's
model, the batch grown until one step takes as long as the recorded compute. Nothing of the
user's code or files is run or read. Rounds interleave the two conditions, so a load that drifts
bends both alike: ``gap`` seconds of Python work (or of sleep, for a build that waits), one step
(cold), then steps back to back, the last of which is warm. Where the job names a worker's CPU
per batch (a build on the training process that workers would take over), steps back to back
beside a process burning that CPU from each step's start (``worker_s``). Each draw
(:mod:`gpudoctor.launch.draws`: a forked process, up to three, each timing for a sixth of the budget)
does all of it; prints one JSON line ``{"draws": [{"warm_s", "cold_s", "rows", "width"[,
"worker_s"]}...]}`` (each draw's medians), or ``{"error": "..."}``."""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from gpudoctor.launch import conv_net, draws, length_cost_worker
from gpudoctor.processes.pids import DIES_WITH_PARENT

MIN_ROUNDS = 5
MAX_ROUNDS = 15
WARM_AFTER = 3  # the step this many after the cold one counts as back to back
MAX_WIDTH = 2048
MAX_ROWS = 1 << 20
MAX_WORKER_CPU_S = 2.0  # a worker's burn per step, at most (a longer build keeps a core busy all along anyway)


def main(argv: list[str] | None = None) -> int:
    job = json.loads((argv if argv is not None else sys.argv[1:])[0])
    budget = float(job["budget_s"])
    try:
        _import(job)
    except Exception as exc:  # a torch that will not start: the doctor says so, nothing else
        print(json.dumps({"error": f"{type(exc).__name__}: {str(exc)[:200]}"}))
        return 1
    # A draw's rounds take a sixth of ``budget_s`` and its steps beside a worker half that (at least
    # MIN_ROUNDS each): three draws time about as many rounds as one draw of the whole budget did.
    # The batch's sizing keeps half the whole budget; the draws stop at twice it.
    got, error = draws.in_forks(lambda seconds: _time(job, seconds), budget / (2 * draws.DRAWS), 2 * budget)
    if not got:  # out of memory, a config that does not build
        print(json.dumps({"error": error or "no draw timed"}))
        return 1
    print(json.dumps({"draws": got}))
    return 0


def _import(job: dict[str, Any]) -> None:
    """torch (and the job's ``transformers`` class, as the padding timing imports it) once, before the draws fork."""
    import torch  # noqa: F401

    if job.get("model"):
        length_cost_worker.import_for(job)


def _time(job: dict[str, Any], seconds: float) -> dict[str, Any]:
    step, x, rows, width = _recorded(job) if job.get("model") else _convs(job) if job.get("layers") else _linear(job)
    gap, deadline = float(job["gap_s"]), time.monotonic() + seconds
    for _ in range(3):
        step(x)
    wait = job.get("gap") == "wait"
    cold: list[float] = []
    warm: list[float] = []
    with _Busy(int(job.get("beside") or 0)) as busy:
        while len(cold) < MAX_ROUNDS and (len(cold) < MIN_ROUNDS or time.monotonic() < deadline):
            busy.go()
            if wait:
                time.sleep(gap)
            else:
                end = time.perf_counter() + gap
                while time.perf_counter() < end:
                    sum(range(1000))
            cold.append(step(x))
            busy.pause()
            for _ in range(WARM_AFTER - 1):
                step(x)
            warm.append(step(x))
    out = {"warm_s": statistics.median(warm), "cold_s": statistics.median(cold), "rows": rows, "width": width}
    worker_cpu = float(job.get("worker_cpu_s") or 0.0)
    if worker_cpu > 0:
        out["worker_s"] = _beside_a_worker(step, x, min(worker_cpu, MAX_WORKER_CPU_S),
                                           time.monotonic() + seconds / 2)
    return out


def _beside_a_worker(step: Callable[[Any], float], x: Any, cpu_s: float, deadline: float) -> float:
    """Steps back to back, each beside a process that burns ``cpu_s`` of CPU from the step's start:
    what the compute takes once a background worker builds the batches (its CPU lands on the
    cores the compute's threads use; a thread pool waits at each op for the thread it lost)."""
    took: list[float] = []
    with _Burner(cpu_s) as burner:
        step(x)
        while len(took) < MAX_ROUNDS and (len(took) < MIN_ROUNDS or time.monotonic() < deadline):
            burner.go()
            took.append(step(x))
            burner.wait()
    return statistics.median(took)


class _Burner:
    """A process that burns ``cpu_s`` of its own CPU each time it is told (one byte on a pipe) and
    says when it is done: a DataLoader worker building a batch. It dies with this process
    (``PR_SET_PDEATHSIG``), and ends when its pipe closes."""

    def __init__(self, cpu_s: float) -> None:
        code = (DIES_WITH_PARENT + "import sys, time\n"
                f"while sys.stdin.buffer.read(1):\n    end = time.process_time() + {cpu_s!r}\n"
                "    while time.process_time() < end: pass\n    sys.stdout.buffer.write(b'.'); sys.stdout.flush()\n")
        self.proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL)

    def go(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(b".")
        self.proc.stdin.flush()

    def wait(self) -> None:
        """Until its burn is over: the next step starts beside a fresh one, as with a worker per batch."""
        assert self.proc.stdout is not None
        self.proc.stdout.read(1)

    def __enter__(self) -> _Burner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.proc.kill()
        self.proc.wait()


class _Busy:
    """``n`` processes that keep a core busy each, beside the cold step only (stopped with SIGSTOP
    during the warm ones): the loader's workers the training computed beside. The ``with`` kills
    them; if this process is killed first (the doctor's timeout), the kernel kills them too, stopped
    or not (``PR_SET_PDEATHSIG``), and a running one also ends when its parent is gone."""

    def __init__(self, n: int) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []
        spin = DIES_WITH_PARENT + f"import os\nwhile os.getppid() == {os.getpid()}: pass"
        for _ in range(max(0, n)):
            proc = subprocess.Popen([sys.executable, "-c", spin], stdin=subprocess.DEVNULL,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            self.procs.append(proc)
        if self.procs:
            time.sleep(0.2)  # into their loops: the first cold step is beside busy cores, not their start
            self.pause()

    def go(self) -> None:
        for proc in self.procs:
            proc.send_signal(signal.SIGCONT)

    def pause(self) -> None:
        for proc in self.procs:
            proc.send_signal(signal.SIGSTOP)

    def __enter__(self) -> _Busy:
        return self

    def __exit__(self, *exc: object) -> None:
        for proc in self.procs:
            proc.kill()
            proc.wait()


def _recorded(job: dict[str, Any]) -> tuple[Callable[[Any], float], Any, int, int]:
    """The recorded ``transformers`` architecture (or a GPT-2 of its shape), random weights, at the
    recorded rows and width, with an AdamW step: the training's own kinds of kernels."""
    import torch

    model, config, device, dtype = length_cost_worker.build(job)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    rows, width = int(job["rows"]), int(job["width"])
    ids = torch.randint(0, int(getattr(config, "vocab_size", 0) or 1000), (rows, width), device=device)

    def step(x: Any) -> float:
        t0 = time.perf_counter()
        length_cost_worker.loss_of(job, model, x, dtype).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return time.perf_counter() - t0

    return step, ids, rows, width


def _convs(job: dict[str, Any]) -> tuple[Callable[[Any], float], Any, int, int]:
    """A convolutional model's recorded layers (:mod:`gpudoctor.launch.conv_net`), random weights, at
    its recorded image batch, with an AdamW step: its convolutions' working set, not a matmul's."""
    torch = _seeded(job)
    net = conv_net.chain({"layers": job["layers"], "input": job["input"]}, job.get("params"))
    if net is None:  # the job is checked again here: it crossed a process boundary
        raise ValueError("the recorded layers do not make a model within the bounds")
    model, x = conv_net.build(net, torch)
    return _square_mean_step(torch, model), x, int(net.input[0]), int(net.input[2])


def _linear(job: dict[str, Any]) -> tuple[Callable[[Any], float], Any, int, int]:
    """Two linear layers of the training's weight count, the batch grown until a step back to back
    takes the recorded compute: where the architecture is not known."""
    torch = _seeded(job)
    width = int(min(MAX_WIDTH, max(16, (max(1, int(job.get("params") or 0)) / 2) ** 0.5)))
    model = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU(), torch.nn.Linear(width, width))
    step = _square_mean_step(torch, model)
    target, deadline = float(job["compute_s"]), time.monotonic() + float(job["budget_s"]) / 2
    rows = 64
    while True:
        x = torch.rand(rows, width)
        for _ in range(2):
            step(x)
        took = statistics.median(step(x) for _ in range(3))
        if took >= target or rows >= MAX_ROWS or time.monotonic() > deadline:
            return step, x, rows, width
        rows = min(MAX_ROWS, int(rows * min(8.0, max(1.25, target / max(took, 1e-6)))))


def _seeded(job: dict[str, Any]) -> Any:
    """torch on the training's threads, seeded: a stand-in built the same way in every draw."""
    import torch

    if job.get("threads"):
        torch.set_num_threads(int(job["threads"]))
    torch.manual_seed(0)
    return torch


def _square_mean_step(torch: Any, model: Any) -> Callable[[Any], float]:
    """A timed training step of a stand-in with no loss of its own: the output's mean square,
    backward, an AdamW step."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step(x: Any) -> float:
        t0 = time.perf_counter()
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return time.perf_counter() - t0

    return step


if __name__ == "__main__":
    sys.exit(main())
