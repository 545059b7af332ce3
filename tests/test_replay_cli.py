"""``gpudoctor replay`` end to end: real worker under the doctor, preflight on a target."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from gpudoctor.commands.load import load_report
from gpudoctor.render import write_all
from gpudoctor.replay.config import load_config
from gpudoctor.replay.here import ON_CPU_NOTE, compare
from gpudoctor.report.check import problem
from tests.conftest import ROOT, cli, run_cli

HEALTHY = ROOT / "sample_configs" / "healthy.yaml"


@pytest.fixture(scope="module")
def healthy_replay(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("replay") / "run"
    # Bounded by steps, not seconds: a busy machine must still give the comparison its steps.
    proc = run_cli("replay", str(HEALTHY), "--out", str(out), "--max-steps", "6", "--max-seconds", "300",
                   "--target", "h100")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def test_healthy_config_gets_no_invented_waste_and_a_prediction(healthy_replay: Path):
    out = healthy_replay
    report = json.loads((out / "report.json").read_text())
    assert report["run"]["mode"] == "replay" and problem(report) is None  # preflight's real shape
    assert [f["rule"] for f in report["findings"] if f["waste_fraction"] > 0.10] == []
    pre = report["preflight"]
    assert pre["before"]["wall_h"] > 0 and pre["speedup"] >= 1.0
    assert "Prediction for the full run" in (out / "report.html").read_text()
    assert "Prediction for the full run" in (out / "report.md").read_text()
    # On the CPU there is nothing to set beside the prediction, and the report says so.
    assert "prediction_check" not in report and ON_CPU_NOTE in pre["notes"]


def test_the_report_shows_the_users_command_the_price_source_and_no_gpu_here(healthy_replay: Path):
    report = json.loads((healthy_replay / "report.json").read_text())
    command = report["run"]["command"]
    assert command[:3] == ["gpudoctor", "replay", str(HEALTHY)] and "--target" in command
    assert not any("gpudoctor.replay.worker" in part for part in command)  # the internal worker is not shown
    assert report["cost"]["price_source"] == f"hardware.price_per_gpu_hour in {HEALTHY}"  # the YAML's, said so
    markdown = (healthy_replay / "report.md").read_text()
    assert "none here: the replay ran on the CPU; the target GPU is predicted" in markdown
    assert "1 GPU(s)" not in markdown and "none here: the replay ran on the CPU" in (
        healthy_replay / "report.html").read_text()


def on_a_gpu(folder: Path, gpu_name: str) -> tuple[dict, dict]:
    """The replay's real measurement and report, as a replay on ``gpu_name`` would have them.

    Only the hardware is stood in for (this machine has no GPU): the device the loop ran on,
    the GPU NVML named, and its utilization series: 20% before the first step, 80% after.
    """
    measure = json.loads((folder / "replay_measure.json").read_text())
    report = json.loads((folder / "report.json").read_text())
    measure["device"] = "cuda"
    report["run"]["gpus"] = [{"index": 0, "name": gpu_name, "memory_total_mib": 81559}]
    first = report["steps"]["first_step_at_s"]
    times = [first - 1.0, first - 0.5, first + 0.5, first + 1.0, first + 1.5]
    report["timeline"]["series"].update(gpu_t_s=times, gpu_busy_pct=[20.0, 20.0, 80.0, 80.0, 80.0])
    return measure, report


def test_replay_on_a_gpu_puts_the_prediction_for_it_beside_the_measurement(healthy_replay: Path):
    measure, report = on_a_gpu(healthy_replay, "NVIDIA H100 80GB HBM3")
    check = compare(load_config(HEALTHY), measure, report)
    assert check is not None and check["target"] == "h100-sxm" and check["precision"] == "bf16"
    rows = {r["figure"]: r for r in check["rows"]}
    # Predicted by hand, for the replayed model (not model.params_b) on this GPU: packing pads
    # to max_length 1024, batch 8 x accumulation 4, 4 workers on this machine's cores.
    n = measure["replayed_model"]["params"]
    layers, hidden = measure["replayed_model"]["n_layers"], measure["replayed_model"]["hidden_size"]
    flops = 1024 * (6 * n + 12 * layers * hidden * 1024)
    compute = 8 * flops / (989.4e12 * 0.4)
    pipe = measure["pipeline"]
    workers = min(4, measure["cpu_count"])
    micro = max(compute, 8 * pipe["loader_s_per_sample"] / workers) + 8 * pipe["loop_s_per_sample"]
    optimizer = n * 28 / (3350e9 * 0.7)
    step = 4 * micro + optimizer
    assert rows["step time"]["predicted"] == pytest.approx(step, rel=1e-9)
    assert rows["GPU busy while training"]["predicted"] == pytest.approx((4 * compute + optimizer) / step)
    assert rows["samples/s"]["predicted"] == pytest.approx(32 / step)
    # Measured: the report's own figures, over training only.
    p50 = report["steps"]["step_time_s"]["p50"]
    assert rows["step time"]["measured"] == p50
    assert rows["step time"]["measured_over_predicted"] == pytest.approx(p50 / step)
    assert rows["GPU busy while training"]["measured"] == pytest.approx(0.80)
    b = report["breakdown"]
    assert rows["data wait, share of training time"]["measured"] == pytest.approx(b["data_wait"] / (1 - b["startup"]))
    assert check["mfu_achieved"] == pytest.approx(32 * flops / (p50 * 989.4e12))
    # A tiny replayed model is nowhere near the assumed MFU, and the check says why.
    assert check["mfu_achieved"] < 0.2 and any("kernel launches" in note for note in check["notes"])


def test_the_check_renders_in_every_format_and_an_unknown_gpu_predicts_nothing(healthy_replay: Path,
                                                                               tmp_path: Path):
    measure, report = on_a_gpu(healthy_replay, "NVIDIA H100 80GB HBM3")
    report["prediction_check"] = compare(load_config(HEALTHY), measure, report)
    write_all(report, tmp_path)
    html, md = (tmp_path / "report.html").read_text(), (tmp_path / "report.md").read_text()
    for text in (html, md):
        assert "Prediction checked on this GPU" in text and "measured/predicted" in text
    measure, report = on_a_gpu(healthy_replay, "<b>Mystery GPU</b>")
    check = compare(load_config(HEALTHY), measure, report)
    assert check is not None and check["known"] is False and check["rows"] == []
    report["prediction_check"] = check
    write_all(report, tmp_path)
    html, md = (tmp_path / "report.html").read_text(), (tmp_path / "report.md").read_text()
    assert "&lt;b&gt;Mystery GPU&lt;/b&gt;" in html and "<b>Mystery GPU</b>" not in html
    assert "&lt;b&gt;Mystery GPU&lt;/b&gt;" in md and "<b>Mystery GPU</b>" not in md


def test_rerendering_a_gpu_replay_folder_keeps_its_prediction_check(healthy_replay: Path, tmp_path: Path):
    """``gpudoctor report FOLDER`` rebuilds the analysis from the recording and keeps what the
    replay added beside it: the preflight and, from a replay on a GPU, the prediction check."""
    folder = tmp_path / "replay"
    shutil.copytree(healthy_replay, folder)
    measure, report = on_a_gpu(folder, "NVIDIA H100 80GB HBM3")
    report["prediction_check"] = compare(load_config(HEALTHY), measure, report)
    assert problem(report) is None
    (folder / "report.json").write_text(json.dumps(report))
    proc = cli("report", str(folder))
    assert proc.returncode == 0, proc.stderr
    again = json.loads((folder / "report.json").read_text())
    assert again["prediction_check"] == report["prediction_check"]
    assert again["preflight"] == report["preflight"]
    assert "Prediction checked on this GPU" in (folder / "report.md").read_text()
    assert load_report(folder)["prediction_check"] == report["prediction_check"]


def test_misspelled_key_is_one_line_with_line_number(tmp_path):
    cfg = tmp_path / "bad.yaml"
    text = (ROOT / "sample_configs" / "healthy.yaml").read_text()
    cfg.write_text(text.replace("per_device_train_batch_size", "per_device_train_bach_size", 1))
    proc = run_cli("replay", str(cfg), "--out", str(tmp_path / "r"))
    assert proc.returncode != 0
    assert proc.stderr.count("\n") == 1 and "per_device_train_batch_size" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_unknown_target_lists_known_gpus(tmp_path):
    proc = run_cli("replay", str(ROOT / "sample_configs" / "healthy.yaml"), "--target", "tpu-v9",
                   "--out", str(tmp_path / "r"))
    assert proc.returncode != 0 and "h100" in proc.stderr.lower()
    assert not (tmp_path / "r" / "report.json").exists()
