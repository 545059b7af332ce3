"""``gpudoctor replay`` end to end: real worker under the doctor, preflight on a target."""

from __future__ import annotations

import json

from tests.conftest import ROOT, run_cli


def test_healthy_config_gets_no_invented_waste_and_a_prediction(tmp_path):
    out = tmp_path / "run"
    proc = run_cli("replay", str(ROOT / "sample_configs" / "healthy.yaml"), "--out", str(out),
                   "--max-seconds", "4", "--target", "h100")
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    assert report["run"]["mode"] == "replay"
    assert [f["rule"] for f in report["findings"] if f["waste_fraction"] > 0.10] == []
    pre = report["preflight"]
    assert pre["before"]["wall_h"] > 0 and pre["speedup"] >= 1.0
    assert "Prediction for the full run" in (out / "report.html").read_text()
    assert "Prediction for the full run" in (out / "report.md").read_text()


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
