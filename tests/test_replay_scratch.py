"""A replay writes nowhere but its run folder and its private caches, and a YAML bomb or a
planted cache is refused in one line. Real worker processes, real files."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpudoctor.common.errors import UserError
from gpudoctor.replay.config import load_config_text
from tests.conftest import ROOT, run_cli
from tests.test_bad_input import assert_one_line_error

TINY = """\
dataset: {kind: synthetic, count: 200, length: {mean: 40, max: 60, unit: tokens}}
tokenizer: {train_bpe: {vocab_size: 300, train_examples: 50}, tokenize_at: ahead}
max_length: 64
model:
  arch: gpt2
  config: {n_layer: 1, n_embd: 16, n_head: 2}
training: {per_device_train_batch_size: 2, gradient_accumulation_steps: 1, dataloader_num_workers: 0}
replay: {steps: 100000, seconds: 300, examples: 200, save_steps: 1}
"""


def _bomb(levels: int) -> str:
    lines = ["dataset: {kind: synthetic, count: 10}", "model:", "  config:", "    l0: &l0 [" + "x, " * 9 + "x]"]
    lines += [f"    l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 10) + "]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


def test_a_yaml_alias_bomb_is_refused_before_anything_expands_it():
    from gpudoctor.replay.yamlsrc import MAX_EXPANDED_NODES

    with pytest.raises(UserError, match=f"more than {MAX_EXPANDED_NODES:,} values through its aliases"):
        load_config_text(_bomb(9), "bomb.yaml")  # 10^9 values: before, hashing it ran for hours
    cfg = load_config_text(_bomb(3), "small.yaml")  # a few aliases are fine
    assert len(cfg.model.config["l2"]) == 10
    with pytest.raises(UserError, match="alias refers to the node that contains it"):
        load_config_text("dataset: &a {kind: synthetic, count: 1, x: [*a]}\n", "loop.yaml")


def test_a_fifo_or_huge_config_is_refused_not_waited_on(tmp_path):
    os.mkfifo(tmp_path / "fifo.yaml")
    proc = run_cli("replay", str(tmp_path / "fifo.yaml"), "--out", str(tmp_path / "a"), timeout=60)
    assert "cannot read config" in assert_one_line_error(proc, 2)
    big = tmp_path / "big.yaml"
    with open(big, "wb") as fh:
        fh.write(b"dataset: {kind: synthetic, count: 10}\n#")
        fh.truncate(2**20 + 1)
    proc = run_cli("replay", str(big), "--out", str(tmp_path / "b"), timeout=60)
    assert "over the 1 MiB cap" in assert_one_line_error(proc, 2)


def _leftovers() -> set[str]:
    return {p.name for p in Path("/tmp").glob("gpudoctor-replay-*")}


def test_a_killed_replay_leaves_its_checkpoints_only_in_its_run_folder_and_they_go_next_time(tmp_path):
    config = tmp_path / "tiny.yaml"
    config.write_text(TINY)
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "GPUDOCTOR_RUN_DIR": str(run), "TOKENIZERS_PARALLELISM": "false"}
    before = _leftovers()
    worker = subprocess.Popen([sys.executable, "-m", "gpudoctor.replay.worker", str(config), "--cache",
                               str(tmp_path / "cache"), "--no-measure"], env=env, start_new_session=True,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 240  # a deadline for a stuck worker, not a timing claim
        while not any(run.glob("scratch/*/checkpoint.pt")) and not any(
                Path("/tmp").glob("gpudoctor-replay-ckpt-*/checkpoint.pt")):
            assert worker.poll() is None, worker.stderr.read().decode() if worker.stderr else ""
            assert time.monotonic() < deadline, "the worker never saved a checkpoint"
            time.sleep(0.2)
    finally:
        os.killpg(worker.pid, signal.SIGKILL)  # no finally, no atexit: what a killed replay leaves
        worker.wait()
    assert _leftovers() == before  # before the fix: /tmp/gpudoctor-replay-ckpt-* stayed for good
    stale = list((run / "scratch").iterdir())
    assert [p.name.split("-")[:2] for p in stale] == [["ckpt", str(worker.pid)]]
    assert oct((run / "scratch").stat().st_mode & 0o777) == oct(0o700)

    from gpudoctor.replay.scratch import remove_all, scratch_dir

    os.environ["GPUDOCTOR_RUN_DIR"] = str(run)
    try:
        with scratch_dir("ckpt") as fresh:  # the next user of the folder clears a dead process's
            assert not stale[0].exists() and fresh.is_dir()
    finally:
        del os.environ["GPUDOCTOR_RUN_DIR"]
    assert not fresh.exists()
    remove_all(run)  # what 'gpudoctor replay' does once its worker ended, however it ended
    assert not (run / "scratch").exists()


def test_caches_another_user_made_are_refused(tmp_path, other_user, other_user_dir):
    from gpudoctor.replay.cache import private_root
    from gpudoctor.sweep.cache import TrialCache

    with pytest.raises(UserError, match=f"belongs to uid {other_user.uid}"):
        private_root(other_user_dir)
    with pytest.raises(UserError, match=f"belongs to uid {other_user.uid}"):
        TrialCache(other_user_dir).load("0" * 20)  # a planted trial.json is never trusted
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    with pytest.raises(UserError, match="writable by other users"):
        TrialCache(shared).load("0" * 20)
    assert TrialCache(tmp_path / "none").load("0" * 20) is None and not (tmp_path / "none").exists()
    assert oct(private_root(tmp_path / "mine").stat().st_mode & 0o777) == oct(0o700)


def test_the_probes_cache_cannot_be_planted_by_another_user(tmp_path, other_user):
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    env.pop("GPUDOCTOR_PROBE_CACHE", None)
    code = "import sys; sys.path.insert(0, 'probes'); import _common; print(_common.cache_dir())"
    planted = tmp_path / f"gpudoctor-probes-cache-{os.geteuid()}"
    planted.mkdir(mode=0o755)
    os.chown(planted, other_user.uid, other_user.gid)  # what another user could do in /tmp first
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT)
    assert proc.returncode != 0 and f"someone else's (uid {other_user.uid})" in proc.stderr
    planted.rmdir()
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(planted) and planted.stat().st_mode & 0o777 == 0o700
