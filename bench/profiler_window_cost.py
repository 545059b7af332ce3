"""What one torch.profiler window of the hooks costs a training loop, in seconds and as a share of its period.

The hooks open a short torch.profiler window (5 steps) once the run has trained a
minute, and on a GPU again every 10 minutes (``gpudoctor/hooks/profiler_windows.py``).
``saturated_overhead.py`` cannot see it: each profiled slot installs fresh hooks, whose
first window is a minute away. Here the healthy probe's model and batch train in one
process with the hooks installed; each window is opened by making it due, and the
steps it spans are timed against the median step outside windows. Printed: each
window's extra seconds, their mean, and that mean over the 10 minutes between windows
(the steady-state share on a GPU host; a CPU-only run pays for one window only).

    python bench/profiler_window_cost.py --windows 5 --threads 2

Measure on a quiet host: anything else running shows up as window cost.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "probes"))
sys.path.insert(0, str(ROOT))

import _common as C  # noqa: E402
import torch  # noqa: E402

import gpudoctor.hooks as hooks  # noqa: E402
from gpudoctor.hooks.profiler_windows import EVERY_S  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--windows", type=int, default=5, help="windows to time (default 5)")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    p.add_argument("--batch-size", type=int, default=8)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    tok = C.get_tokenizer(seed=0)
    tok.enable_truncation(256)
    seqs = [e.ids for e in tok.encode_batch(C.make_corpus(args.batch_size, seed=5, median_words=50, sigma=0.5))]
    batch = C.collate_ids(seqs, C.pad_id(tok))
    model = C.TinyCausalLM(tok.get_vocab_size())
    opt = C.make_adamw(model.parameters(), 3e-4)

    def step() -> None:
        model(**batch).loss.backward()
        opt.step()  # the optimizer hook steps the windows
        opt.zero_grad(set_to_none=True)

    with tempfile.TemporaryDirectory(prefix="gpudoctor-window-") as run_dir:
        hooks.install(run_dir)
        th = hooks.active_torch_hooks()
        assert th is not None
        th.mark_first_step()
        for _ in range(60):  # past the windows' minimum step count, warm
            step()
        times = []
        for _ in range(100):
            t = time.perf_counter()
            step()
            times.append(time.perf_counter() - t)
        typical = statistics.median(times)
        extra = []
        for n in range(args.windows):
            th.windows._last_p = time.perf_counter() - 10 * EVERY_S  # due at the next step
            th.windows._wait_s = EVERY_S
            t, k = time.perf_counter(), 0
            while k < 2 or th.windows.open:
                step()
                k += 1
            took = time.perf_counter() - t
            extra.append(took - k * typical)
            print(f"window {n + 1}: {k} steps in {took:.3f} s against {k * typical:.3f} s typical: "
                  f"+{extra[-1]:.3f} s", flush=True)
        hooks.uninstall()
    mean = statistics.fmean(extra)
    se = statistics.stdev(extra) / len(extra) ** 0.5 if len(extra) > 1 else float("nan")
    print(f"a window costs {mean:.3f} ± {se:.3f} s (typical step {typical * 1000:.1f} ms); "
          f"every {EVERY_S / 60:.0f} min (a GPU host) that is {100 * mean / EVERY_S:.3f}% of the run")
    print(f"WINDOW_EXTRA_S={mean:.3f}")
    print(f"WINDOW_SHARE_PCT={100 * mean / EVERY_S:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
