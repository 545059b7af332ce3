"""The Python API for exact numbers: profile()/step(), the HF TrainerCallback, Lightning.

These run the doctor inside the test process on real small loops, then check
that every patch is gone afterwards (the same path ``attach`` uses to detach).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

import gpudoctor
from gpudoctor import hooks
from tests.conftest import PROBES, ROOT, cli_env

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "probes"))


class PaddedTexts(Dataset):
    """Rows of 16 real tokens padded to 64: a 75% pad fraction by construction."""

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        mask = torch.zeros(64, dtype=torch.long)
        mask[:16] = 1
        return {"input_ids": torch.randint(1, 100, (64,)) * mask, "attention_mask": mask}


def assert_unpatched() -> None:
    from torch.utils.data.dataloader import _BaseDataLoaderIter

    assert not hooks.is_installed()
    assert not hasattr(_BaseDataLoaderIter.__next__, "__gpudoctor_original__")
    assert not hasattr(torch.save, "__gpudoctor_original__")


def test_profile_context_manager_measures_a_plain_loop(tmp_path):
    model = torch.nn.Sequential(torch.nn.Embedding(100, 16), torch.nn.Flatten(), torch.nn.Linear(64 * 16, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with gpudoctor.profile(out=tmp_path / "run", interval_s=0.05) as doc:
        for epoch in range(2):
            for batch in DataLoader(PaddedTexts(), batch_size=8):
                loss = model(batch["input_ids"]).sum()
                loss.backward()
                opt.step()
                opt.zero_grad()
            with doc.checkpoint():  # ~16 MB
                torch.save({"model": model.state_dict(), "big": torch.zeros(4_000_000)}, tmp_path / f"ckpt{epoch}.pt")
    report = doc.report
    assert report["steps"]["count"] == 16
    assert report["padding"]["pad_fraction"] == pytest.approx(0.75)
    assert report["padding"]["batches_seen"] == 16
    # Both saves, counted and timed. The wall starts at the process's own start (its imports are
    # startup): in a long pytest session that is minutes before this test, so the saves' share of
    # it can round to 0.0000 in the report; the unrounded share from the recording cannot.
    saves = report["saves"]
    assert saves["checkpoints"] + saves["final"] == 2 and saves["checkpoint_s"] + saves["final_s"] > 0
    from gpudoctor.analysis import analyze
    from gpudoctor.recording.store import load_recording

    assert analyze(load_recording(tmp_path / "run")).breakdown()["checkpoint"] > 0
    assert abs(sum(report["breakdown"].values()) - 1) <= 0.01
    assert (tmp_path / "run" / "report.html").exists()
    assert_unpatched()


def test_explicit_step_marks_loops_without_torch_optim(tmp_path):
    with gpudoctor.profile(out=tmp_path / "run", interval_s=0.05) as doc:
        for _ in DataLoader(PaddedTexts(), batch_size=16):
            gpudoctor.step()
    assert doc.report["steps"]["count"] == 4
    assert_unpatched()


def _tiny_trainer(tmp_path: Path, callbacks: list) -> object:
    from _common import build_gpt2, get_hf_tokenizer
    from datasets import Dataset as HFDataset
    from transformers import Trainer, TrainingArguments

    tok = get_hf_tokenizer()
    texts = [f"sample number {i} " * (1 + i % 5) for i in range(64)]
    ds = HFDataset.from_dict({"text": texts}).map(
        lambda b: tok(b["text"], padding="max_length", truncation=True, max_length=64), batched=True,
        remove_columns=["text"])
    ds = ds.map(lambda b: {"labels": b["input_ids"]}, batched=True)
    model = build_gpt2(vocab_size=len(tok))
    args = TrainingArguments(output_dir=str(tmp_path / "out"), per_device_train_batch_size=8, max_steps=6,
                             save_steps=3, use_cpu=True, report_to=[], logging_steps=100, disable_tqdm=True)
    return Trainer(model=model, args=args, train_dataset=ds, callbacks=callbacks)


def test_hf_trainer_callback_runs_the_doctor_in_process(tmp_path):
    cb = gpudoctor.GpuDoctorCallback(out=str(tmp_path / "run"))
    trainer = _tiny_trainer(tmp_path, [cb])
    trainer.train()
    report = cb.report
    assert report is not None
    assert report["steps"]["count"] == 6
    # Trainer._save_checkpoint at steps 3 and 6, counted and timed; their share of a wall that starts at
    # this (pytest) process's start can round to 0.0 in the report (it did, 13 minutes into a suite),
    # the unrounded share from the recording cannot
    assert report["saves"]["checkpoints"] == 2 and report["saves"]["checkpoint_s"] > 0
    from gpudoctor.analysis import analyze
    from gpudoctor.recording.store import load_recording

    assert analyze(load_recording(tmp_path / "run")).breakdown()["checkpoint"] > 0
    assert report["padding"]["pad_fraction"] > 0.3
    assert report["cost"]["projected_run_hours"] is not None  # max_steps known from the Trainer
    assert_unpatched()


def test_lightning_callback_records_fit_and_validation(tmp_path):
    lightning = pytest.importorskip("lightning")

    class Module(lightning.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(8, 1)

        def training_step(self, batch, _):
            return self.layer(batch[0]).pow(2).mean()

        def validation_step(self, batch, _):
            return self.layer(batch[0]).mean()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    data = torch.utils.data.TensorDataset(torch.randn(64, 8))
    cb = gpudoctor.GpuDoctorLightningCallback(out=str(tmp_path / "run"))
    trainer = lightning.Trainer(max_steps=8, callbacks=[cb], accelerator="cpu", logger=False,
                                enable_checkpointing=False, enable_progress_bar=False,
                                enable_model_summary=False, val_check_interval=4, num_sanity_val_steps=0)
    trainer.fit(Module(), DataLoader(data, batch_size=8), DataLoader(data, batch_size=32))
    report = cb.report
    assert report["steps"]["count"] == 8
    assert report["timeline"]["spans"]["eval"]  # tiny validations can round to 0.0000 of wall
    assert_unpatched()


def _profiled(tmp_path: Path, trainings: int, repl: bool = False) -> list[dict]:
    """tests/scripts/profiled_startup.py's trainings, as a script or typed into a Python REPL."""
    script = ROOT / "tests" / "scripts" / "profiled_startup.py"
    args = [str(tmp_path / "runs"), str(PROBES), str(trainings)]
    if repl:  # the REPL sets sys.ps1 as a notebook kernel sets up IPython: time before is the user's
        typed = f"import sys; sys.argv = {[str(script), *args]!r}; exec(open({str(script)!r}).read())\n"
        done = subprocess.run([sys.executable, "-q", "-i"], input=typed, capture_output=True, text=True,
                              timeout=120, env=cli_env())
    else:
        done = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, timeout=120,
                              env=cli_env())
    assert done.returncode == 0, done.stderr[-2000:]
    line = next(ln for ln in reversed(done.stdout.splitlines()) if ln.startswith("["))
    return list(json.loads(line))


def test_profile_counts_startup_from_the_processs_own_start(tmp_path):
    """psutil's create_time reads up to a second early (common.proctime); profile() counted that second
    as startup that never happened (0.95 s on the VM this was found on). A second training in the same
    process counts its startup from the first one's end, not again from the process's start."""
    first, second = _profiled(tmp_path, 2)
    assert first["entered_s"] > 1.0  # the sleep at least
    assert first["startup"]["total_s"] == pytest.approx(first["entered_s"], abs=0.1)
    assert not any("startup" in n for n in first["notes"])
    assert second["since_last_s"] > 1.0  # the sleep between, and the first's report
    assert second["startup"]["total_s"] == pytest.approx(second["since_last_s"], abs=0.1)
    assert any("profiled before" in n for n in second["notes"])


def test_profile_in_a_repl_counts_no_time_before_the_training_as_startup(tmp_path):
    """A notebook kernel may have lived for hours of cells before ``trainer.train()``; counted from the
    process's start, that was all startup. In a REPL (as in a notebook) the recording starts at profile()."""
    (only,) = _profiled(tmp_path, 1, repl=True)
    assert only["entered_s"] > 1.0
    assert only["startup"]["total_s"] < 0.2
    assert any("interactive session" in n for n in only["notes"])
