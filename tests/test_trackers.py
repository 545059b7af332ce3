"""Experiment trackers: the doctor's figures land in the training's own MLflow / TensorBoard / W&B run.

Real runs: an HF Trainer with ``report_to=["mlflow", "tensorboard", "wandb"]`` under ``gpudoctor
run`` (the doctor adds to the runs after the training exits: MLflow's file store, a new
TensorBoard events file, a resumed offline W&B run), and a hand-written loop with its own
SummaryWriter, ``mlflow.start_run`` on a sqlite store and a live offline ``wandb.run`` inside
``gpudoctor.profile()`` (added from inside the training). Each is read back with the tracker's
own reader (MlflowClient, TensorBoard's EventAccumulator, the W&B offline run file) and compared
with the run's report.json. W&B runs offline only (``WANDB_MODE=offline``): nothing leaves the machine.
"""

from __future__ import annotations

import json
import os
import socket
import struct
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from gpudoctor.cli import build_parser
from gpudoctor.pipeline import finish
from gpudoctor.report.build import ReportOptions
from gpudoctor.trackers import add_to_trackers, folders
from gpudoctor.trackers.figures import Figures
from gpudoctor.trackers.found import tracker_runs
from gpudoctor.trackers.mlflow_sink import local_store
from tests.conftest import ROOT, run_cli

pytestmark = pytest.mark.slow  # real trainings for most of a minute: scheduled first (conftest.py)

pytest.importorskip("mlflow")
pytest.importorskip("tensorboard")
pytest.importorskip("wandb")

DATA = Path(__file__).parent / "data"
ENV = {"WANDB_MODE": "offline", "WANDB_SILENT": "true", "MLFLOW_DISABLE_TELEMETRY": "true",
       "WANDB_ERROR_REPORTING": "false", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}

TRAINER = """
import os, sys, torch
sys.path.insert(0, {probes!r})
from _common import build_gpt2
from transformers import Trainer, TrainingArguments

torch.set_num_threads(1)
class Rows(torch.utils.data.Dataset):
    def __len__(self): return 64
    def __getitem__(self, i):
        ids = torch.randint(3, 100, (32,))
        return {{"input_ids": ids, "attention_mask": torch.ones(32, dtype=torch.long), "labels": ids}}

args = TrainingArguments(output_dir="out", per_device_train_batch_size=8, max_steps=8, save_strategy="no",
                         use_cpu=True, report_to=["mlflow", "tensorboard", "wandb"], logging_steps=2,
                         run_name="tracked", disable_tqdm=True)
Trainer(model=build_gpt2(vocab_size=100), args=args, train_dataset=Rows()).train()
"""

LOOP = """
import sys, torch, mlflow, wandb
sys.path.insert(0, {root!r})
import gpudoctor
from torch.utils.tensorboard import SummaryWriter

torch.set_num_threads(1)
mlflow.set_tracking_uri("sqlite:///" + {db!r})
model = torch.nn.Linear(16, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
data = torch.utils.data.TensorDataset(torch.randn(128, 16), torch.randn(128, 1))
with gpudoctor.profile(out="run", interval_s=0.05) as doc:
    run = wandb.init(project="loop", dir=".")
    writer = SummaryWriter("tb")
    with mlflow.start_run() as ml:
        for step, (x, y) in enumerate(torch.utils.data.DataLoader(data, batch_size=8)):
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad(); loss.backward(); opt.step()
            writer.add_scalar("loss", loss.item(), step)
            mlflow.log_metric("loss", loss.item(), step=step)
    writer.close()
print("RUNS", ml.info.run_id, run.id)
run.finish()
"""


# -- reading back -------------------------------------------------------------------------


def mlflow_run(uri: str, run_id: str) -> tuple[dict[str, float], list[str]]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    metrics = client.get_run(run_id).data.metrics
    return metrics, [a.path for a in client.list_artifacts(run_id, "gpudoctor")]


def tensorboard_scalars(log_dir: Path) -> tuple[dict[str, float], dict[str, str]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    scalars = {tag: acc.Scalars(tag)[-1].value for tag in acc.Tags()["scalars"]}
    texts = {tag: acc.Tensors(tag)[-1].tensor_proto.string_val[0].decode() for tag in acc.Tags()["tensors"]}
    return scalars, texts


def wandb_records(wandb_dir: Path, run_id: str) -> list[Any]:
    """Every record of the offline run files of ``run_id`` (W&B's LevelDB-style log: a 7-byte
    ``:W&B`` header, then 32 KiB blocks of records, each a 7-byte header and a protobuf chunk)."""
    from wandb.proto import wandb_internal_pb2 as pb

    out = []
    for path in sorted(wandb_dir.glob(f"offline-run-*-{run_id}/run-{run_id}.wandb")):
        data = path.read_bytes()
        assert data[:4] == b":W&B"
        pos, chunks = 7, b""
        while pos + 7 <= len(data):
            if 32768 - pos % 32768 < 7:  # a block's tail too short for a header is padding
                pos += 32768 - pos % 32768
                continue
            _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
            chunks += data[pos + 7:pos + 7 + length]
            pos += 7 + length
            if kind in (1, 4):  # FULL or LAST: a whole record
                record = pb.Record()
                record.ParseFromString(chunks)
                out.append(record)
                chunks = b""
    return out


def wandb_summary(records: list[Any]) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    for r in records:
        if r.WhichOneof("record_type") == "summary":
            for item in r.summary.update:
                summary[item.key or "/".join(item.nested_key)] = json.loads(item.value_json)
    return summary


def assert_figures(got: dict[str, float], report: dict[str, Any]) -> None:
    """The tracker holds the report's own figures (float32 in TensorBoard)."""
    expected = Figures.of(report).metrics
    assert expected["gpudoctor/wasted_fraction"] == report["cost"]["wasted_fraction"]
    for name, value in expected.items():
        assert got[name] == pytest.approx(value, rel=1e-6, abs=1e-6), name
    assert sum(v for k, v in got.items() if k.startswith("gpudoctor/breakdown/")) == pytest.approx(1, abs=0.02)


# -- gpudoctor run: HF Trainer report_to=[mlflow, tensorboard, wandb] ------------------------


@pytest.fixture(scope="module")
def trainer_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any], str]:
    work = tmp_path_factory.mktemp("trainer")
    script = work / "train.py"
    script.write_text(TRAINER.format(probes=str(ROOT / "probes")))
    env = dict(ENV, MLFLOW_TRACKING_URI=f"file:{work / 'mlruns'}", MLFLOW_ALLOW_FILE_STORE="true", WANDB_DIR=str(work),
               TENSORBOARD_LOGGING_DIR=str(work / "tb"))
    proc = run_cli("run", "--out", str(work / "run"), "--", sys.executable, str(script), env=env, cwd=work)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return work, json.loads((work / "run" / "report.json").read_text()), proc.stderr


def test_run_adds_the_report_to_the_trainers_mlflow_tensorboard_and_wandb_runs(trainer_run, monkeypatch):
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # as the training had it
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
    work, report, stderr = trainer_run
    by_kind = {e["kind"]: e for e in report["trackers"]}
    assert {k: e["status"] for k, e in by_kind.items()} == {"mlflow": "added", "tensorboard": "added",
                                                           "wandb": "added"}, report["trackers"]
    assert sum("figures added to" in n for n in report["notes"]) == 3
    assert stderr.count("gpudoctor: figures added to") == 3

    # MLflow: the Trainer's own run (its loss is there) now holds the figures, the table and report.html
    runs = [p for p in (work / "mlruns").glob("*/*") if (p / "meta.yaml").exists()]
    assert len(runs) == 1
    metrics, artifacts = mlflow_run(f"file:{work / 'mlruns'}", runs[0].name)
    assert "train_loss" in metrics or "loss" in metrics
    assert_figures(metrics, report)
    assert sorted(artifacts) == ["gpudoctor/findings.json", "gpudoctor/report.html"]
    html = runs[0] / "artifacts" / "gpudoctor" / "report.html"
    assert html.read_bytes().startswith((work / "run" / "report.html").read_bytes()[:200])
    table = json.loads((runs[0] / "artifacts" / "gpudoctor" / "findings.json").read_text())
    assert [row[0] for row in table["data"]] == [f["rule"] for f in report["findings"][:10]]

    # TensorBoard: the Trainer's log dir, read as TensorBoard reads it
    log_dirs = {Path(d) for d in (e.get("log_dir") for evs in _events(work / "run") for e in evs) if d}
    assert log_dirs == {(work / "tb").resolve()}
    scalars, texts = tensorboard_scalars(work / "tb")
    assert "train/loss" in scalars
    assert_figures(scalars, report)
    assert report["findings"][0]["rule"] in texts["gpudoctor/findings/text_summary"]

    # W&B: a resumed offline run beside the Trainer's, with the same id (wandb sync joins them)
    wandb_run = next(e for evs in _events(work / "run") for e in evs if e.get("kind") == "wandb")
    assert wandb_run["mode"] == "offline"
    folders_of_run = sorted((work / "wandb").glob(f"offline-run-*-{wandb_run['run_id']}"))
    assert len(folders_of_run) == 2
    summary = wandb_summary(wandb_records(work / "wandb", wandb_run["run_id"]))
    assert "train/loss" in summary
    assert_figures(summary, report)


def _events(folder: Path) -> list[list[dict[str, Any]]]:
    return [[json.loads(line) for line in p.read_text().splitlines() if '"tracker"' in line]
            for p in (folder / "events").glob("*.jsonl")]


def test_no_trackers_and_a_rerender_leave_the_runs_alone(trainer_run):
    work, report, _ = trainer_run
    assert build_parser().parse_args(["run", "--no-trackers", "--", "python", "x.py"]).no_trackers
    assert build_parser().parse_args(["attach", "1", "--no-trackers"]).no_trackers
    before = sorted((work / "tb").iterdir())
    again = finish(work / "run", ReportOptions(), trackers=False)
    assert "trackers" not in again
    assert sorted((work / "tb").iterdir()) == before


def test_the_doctor_opens_no_network_connection_when_adding(trainer_run, monkeypatch, tmp_path):
    """Adding again in this process with every internet connect refused: the local stores still take it."""
    work, report, _ = trainer_run
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
    real_connect = socket.socket.connect

    def connect(self: socket.socket, address: Any) -> Any:
        if self.family in (socket.AF_INET, socket.AF_INET6):
            raise AssertionError(f"network connection to {address}")
        return real_connect(self, address)

    monkeypatch.setattr(socket.socket, "connect", connect)
    events = {0: [e for evs in _events(work / "run") for e in evs if e["kind"] in ("mlflow", "tensorboard")]}
    again = dict(report)
    assert add_to_trackers(again, work / "run", events)
    assert [e["status"] for e in again["trackers"]] == ["added", "added"], again["trackers"]


# -- the in-process API: a hand-written loop inside gpudoctor.profile() ----------------------


def test_profile_adds_to_the_live_runs_of_a_hand_written_loop(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
    db = str(tmp_path / "mlflow.db")
    (tmp_path / "loop.py").write_text(LOOP.format(root=str(ROOT), db=db))
    env = {**os.environ, **ENV, "PYTHONPATH": str(ROOT)}
    env.pop("GPUDOCTOR_RUN_DIR", None)
    proc = subprocess.run([sys.executable, "loop.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ml_id, wb_id = next(line for line in proc.stdout.splitlines() if line.startswith("RUNS")).split()[1:]
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    assert {e["kind"]: e["status"] for e in report["trackers"]} == {
        "mlflow": "added", "tensorboard": "added", "wandb": "added"}, report["trackers"]
    wandb_entry = next(e for e in report["trackers"] if e["kind"] == "wandb")
    assert "in the live run (offline)" in wandb_entry["detail"]

    metrics, artifacts = mlflow_run(f"sqlite:///{db}", ml_id)
    assert "loss" in metrics
    assert_figures(metrics, report)
    assert "gpudoctor/report.html" in artifacts
    scalars, _ = tensorboard_scalars(tmp_path / "tb")
    assert "loss" in scalars
    assert_figures(scalars, report)
    assert len(list((tmp_path / "wandb").glob(f"offline-run-*-{wb_id}"))) == 1  # the live run itself
    assert_figures(wandb_summary(wandb_records(tmp_path / "wandb", wb_id)), report)


# -- units: what is trusted, what is refused ---------------------------------------------


def test_tracker_events_are_checked_and_each_run_counted_once() -> None:
    good = {"k": "tracker", "t": 2.0, "kind": "mlflow", "run_id": "abc", "tracking_uri": "file:/x"}
    events = {1: [good, dict(good, t=3.0), {"k": "tracker", "kind": "comet", "run_id": "z"},
                  {"k": "tracker", "t": 1.0, "kind": "tensorboard", "log_dir": 7},
                  {"k": "tracker", "t": 1.0, "kind": "tensorboard", "log_dir": "/tb", "junk": {"a": 1}}]}
    runs = tracker_runs(events)
    assert [(r.kind, r.key) for r in runs] == [("tensorboard", "/tb"), ("mlflow", "abc")]
    assert "junk" not in runs[0].fields


def test_a_tracking_server_is_never_contacted() -> None:
    for uri in ("http://user:pw@mlflow.example:5000", "databricks", "https://x"):
        why = local_store(uri, "/tmp")
        assert isinstance(why, str) and "no network call" in why
    assert local_store("file:./mlruns", "/srv/job") == ("file:///srv/job/mlruns", "/srv/job/mlruns", None)
    assert local_store("sqlite:///m.db", "/srv/job")[2] == "/srv/job/m.db"  # type: ignore[index]


def test_folders_another_user_can_write_or_own_are_refused(tmp_path: Path) -> None:
    mine = tmp_path / "tb"
    mine.mkdir(mode=0o755)
    assert folders.problem(mine) is None
    mine.chmod(0o777)
    assert "writable by other users" in (folders.problem(mine) or "")
    mine.chmod(0o755)
    (mine / "sub").symlink_to("/etc")
    assert "not a folder" in (folders.problem(mine, ("sub",)) or "")
    if os.geteuid() == 0:
        os.chown(mine, 12345, 12345)
        assert "belongs to uid 12345" in (folders.problem(mine) or "")


def test_root_adds_nothing_to_a_folder_of_another_user(tmp_path: Path) -> None:
    """The figures are not written into a log dir the doctor's user does not own; the report says why."""
    if os.geteuid() != 0:
        pytest.skip("needs root to give the folder to another user")
    log_dir = tmp_path / "theirs"
    log_dir.mkdir(mode=0o755)
    os.chown(log_dir, 12345, 12345)
    report = json.loads((DATA / "report_sample.json").read_text())
    events = {9: [{"k": "tracker", "t": 1.0, "kind": "tensorboard", "log_dir": str(log_dir)}]}
    assert add_to_trackers(report, tmp_path, events)
    (entry,) = report["trackers"]
    assert entry["status"] == "skipped" and "belongs to uid 12345" in entry["detail"]
    assert list(log_dir.iterdir()) == []


def test_figures_leave_out_what_was_not_observed() -> None:
    report = json.loads((DATA / "report_nogpu.json").read_text())
    figures = Figures.of(report)
    assert report["cost"]["usd_per_hour"] is None
    assert "gpudoctor/usd_per_hour" not in figures.metrics
    assert figures.metrics["gpudoctor/wasted_fraction"] == report["cost"]["wasted_fraction"]
    assert len(figures.rows) == min(10, len(report["findings"]))
    assert textwrap.dedent(figures.markdown()).count("\n|") >= len(figures.rows)
