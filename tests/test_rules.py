"""Each rule on a recording of the situation it is about (see recording_builder)."""

from __future__ import annotations

import pytest

from gpudoctor.recording.store import load_recording
from gpudoctor.report.build import ReportOptions, build_report
from tests.recording_builder import T0, RecordingBuilder


def report_of(builder: RecordingBuilder, **options) -> dict:
    return build_report(load_recording(builder.write()), ReportOptions(**options))


def rules_of(report: dict, min_waste: float = 0.0) -> list[str]:
    return [f["rule"] for f in report["findings"] if f["severity"] != "info" and f["waste_fraction"] >= min_waste]


def stall_run(tmp_path, *, cores: int, cpu_total_pct: float, iowait_pct: float = 0.0) -> RecordingBuilder:
    b = RecordingBuilder(tmp_path, cores=cores, duration_s=100.0)
    rows = b.process()
    # 5 s startup, then 1000 steps of 40 ms waiting + 50 ms compute; a batch costs 40 ms to build.
    b.training_loop(rows, start_s=5.0, steps=1000, compute_s=0.05, wait_s=0.04, fetch_s=0.04)
    b.host_rows(cpu_total_pct=cpu_total_pct, cpu_proc_pct=100.0, iowait_pct=iowait_pct)
    b.gpu_rows(util_pct=50.0, mem_used_mib=60000.0)
    return b


def test_data_stall_recommends_workers_from_load_cost_and_free_cores(tmp_path):
    report = report_of(stall_run(tmp_path, cores=8, cpu_total_pct=20.0))
    f = report["findings"][0]
    assert f["rule"] == "data_stall"
    # ceil(1.25 * 40 ms / 50 ms) = 1 worker keeps up; 7 cores are free.
    assert f["data"]["recommended_workers"] == 1
    assert f["fix"]["config"]["num_workers"] == 1
    assert f["waste_fraction"] == pytest.approx(40 / 100, abs=0.02)
    # H100 from NVML name -> built-in price; waste $/h = price x GPUs x waste.
    assert report["run"]["price_per_gpu_hour_usd"] == 2.50
    assert f["waste_usd_per_hour"] == pytest.approx(2.50 * f["waste_fraction"], rel=1e-3)


def test_busy_cores_get_no_add_workers_advice(tmp_path):
    report = report_of(stall_run(tmp_path, cores=2, cpu_total_pct=97.0))
    rules = rules_of(report, 0.05)
    assert "cpu_saturated" in rules and "data_stall" not in rules
    f = next(f for f in report["findings"] if f["rule"] == "cpu_saturated")
    assert "num_workers" not in f["fix"]["config"]  # 0 ran: a fix never repeats the value that ran (#24)


def test_iowait_makes_it_io_bound_not_a_worker_problem(tmp_path):
    report = report_of(stall_run(tmp_path, cores=8, cpu_total_pct=30.0, iowait_pct=40.0))
    rules = rules_of(report, 0.05)
    assert rules[0] == "io_bound" and "data_stall" not in rules


def test_checkpoint_gap_is_not_called_a_loader_stall(tmp_path):
    b = RecordingBuilder(tmp_path, cores=8, duration_s=100.0)
    rows = b.process()
    # 800 steps of 80 ms, no wait; a 6 s save every 200 steps = 24 s of saving.
    b.training_loop(rows, start_s=2.0, steps=800, compute_s=0.08, wait_s=0.0005, fetch_s=0.0004,
                    save_every=200, save_s=6.0, trainer_args={"save_steps": 200, "save_only_model": False,
                                                              "dataloader_num_workers": 0})
    b.host_rows(cpu_total_pct=20.0, cpu_proc_pct=100.0)
    report = report_of(b)
    assert rules_of(report, 0.05) == ["checkpoint_overhead"]
    f = report["findings"][0]
    # 6 s per save vs 80 ms steps: 6 * 0.98 / (0.02 * 0.0805) = 3652 -> 5000, a round number.
    assert f["fix"]["config"]["save_steps"] == 5000
    assert f["fix"]["config"]["save_only_model"] is True
    assert report["breakdown"]["checkpoint"] == pytest.approx(24 / 100, abs=0.01)


def fp32_h100_run(tmp_path) -> RecordingBuilder:
    """An H100 at 40% busy training in FP32 without TF32, batch 2 x accumulation 8, 9 of 80 GB used."""
    b = RecordingBuilder(tmp_path, cores=16, duration_s=100.0)
    rows = b.process()
    b.training_loop(rows, start_s=2.0, steps=900, compute_s=0.1, wait_s=0.001, fetch_s=0.001,
                    trainer_args={"per_device_train_batch_size": 2, "gradient_accumulation_steps": 8,
                                  "tf32": None, "bf16": False, "torch_compile": False})
    rows.append({"k": "torch_cfg", "t": 1_700_000_002.0, "cuda": True, "device": "cuda",
                 "device_name": "NVIDIA H100 80GB HBM3", "device_capability": [9, 0],
                 "matmul_precision": "highest", "allow_tf32": False, "cudnn_allow_tf32": True,
                 "param_dtype": "torch.float32", "autocast": False})
    b.host_rows(cpu_total_pct=10.0, cpu_proc_pct=100.0)
    b.gpu_rows(util_pct=40.0, mem_used_mib=9000.0)
    return b


def test_gpu_rules_fire_on_fp32_h100_with_small_batches(tmp_path):
    report = report_of(fp32_h100_run(tmp_path))
    rules = rules_of(report)
    assert {"no_tf32", "no_mixed_precision", "small_batch", "low_gpu_utilization"} <= set(rules)
    by = {f["rule"]: f for f in report["findings"]}
    assert by["no_tf32"]["fix"]["config"] == {"tf32": True}
    assert by["no_mixed_precision"]["fix"]["config"] == {"bf16": True}
    # 9 of 80 GB used: 4x the batch, accumulation 8 -> 2 keeps the global batch.
    assert by["small_batch"]["fix"]["config"] == {"per_device_train_batch_size": 8, "gradient_accumulation_steps": 2}
    assert report["shares"]["gpu_busy"] == pytest.approx(0.40)


def test_gpu_scenario_verdict_is_bounded_by_the_compute_it_claims(tmp_path):
    """Four GPU fixes all claim compute (90% of wall): idle time (no GPU work, 0.9 - busy 0.4 -
    explained 0.029 = 47% of wall) goes once, and TF32 and bf16 compound on the busy rest
    (1 - 0.5 * 0.5 = 75% of it). The total is that, not the 95% (20x) a plain sum gave."""
    report = report_of(fp32_h100_run(tmp_path))
    by = {f["rule"]: f for f in report["findings"]}
    compute, wasted = report["breakdown"]["compute"], report["cost"]["wasted_fraction"]
    idle = by["low_gpu_utilization"]["waste_fraction"]
    assert idle == pytest.approx(0.9 - 0.4 - report["breakdown"]["startup"] - report["breakdown"]["data_wait"],
                                 abs=2e-3)
    assert wasted == pytest.approx(idle + 0.75 * (compute - idle), abs=2e-3)
    assert wasted <= compute
    # Each finding alone is its own claim; the tf32 and bf16 alone each give half the busy part.
    assert by["no_tf32"]["waste_fraction"] == pytest.approx(0.5 * (compute - idle), abs=2e-3)
    assert "about 4.8x faster" in report["verdict"]


def test_gpu_rules_silent_without_gpu(tmp_path):
    b = RecordingBuilder(tmp_path, cores=8, duration_s=50.0)
    rows = b.process()
    b.training_loop(rows, start_s=1.0, steps=480, compute_s=0.1, wait_s=0.0005, fetch_s=0.0004)
    rows.append({"k": "torch_cfg", "t": 1_700_000_001.0, "cuda": False, "device": "cpu",
                 "matmul_precision": "highest", "allow_tf32": False, "param_dtype": "torch.float32",
                 "autocast": False})
    b.host_rows(cpu_total_pct=60.0, cpu_proc_pct=100.0)
    report = report_of(b)
    assert rules_of(report, 0.05) == []
    assert report["verdict"].startswith("Healthy")
    assert report["shares"]["gpu_busy"] is None and report["cost"]["usd_per_hour"] is None


def test_price_options_override_table_and_scale_by_gpus(tmp_path):
    report = report_of(stall_run(tmp_path, cores=8, cpu_total_pct=20.0), price_per_gpu_hour=4.0, gpus=8)
    assert report["cost"]["usd_per_hour"] == 32.0
    f = report["findings"][0]
    assert f["waste_usd_per_hour"] == pytest.approx(32.0 * f["waste_fraction"], rel=1e-3)
    assert report["cost"]["wasted_usd_so_far"] == pytest.approx(
        report["cost"]["wasted_usd_per_hour"] * 100 / 3600, rel=1e-3)


def test_straggler_rank_names_the_slow_rank(tmp_path):
    b = RecordingBuilder(tmp_path, cores=8, duration_s=60.0)
    for rank, wait in ((0, 0.005), (1, 0.05)):
        rows = b.process(pid=200 + rank, rank=rank)
        b.training_loop(rows, start_s=2.0, steps=500, compute_s=0.1 - wait, wait_s=wait, fetch_s=wait)
    b.host_rows(cpu_total_pct=30.0, cpu_proc_pct=200.0)
    report = report_of(b)
    f = next(f for f in report["findings"] if f["rule"] == "straggler_rank")
    assert "Rank 1" in f["title"]
    assert [r["rank"] for r in report["per_rank"]] == [0, 1]


def test_no_inprocess_events_gives_null_breakdown_and_says_why(tmp_path):
    b = RecordingBuilder(tmp_path, cores=4, duration_s=10.0)
    b.host_rows(cpu_total_pct=30.0, cpu_proc_pct=100.0)
    report = report_of(b)
    assert all(v is None for v in report["breakdown"].values())
    assert "no_inprocess_data" in {f["rule"] for f in report["findings"]}


def test_outdated_libraries_are_named(tmp_path):
    b = RecordingBuilder(tmp_path, cores=8, duration_s=20.0)
    rows = b.process(libs={"torch": "2.0.1", "transformers": "4.41.2"})
    b.training_loop(rows, start_s=1.0, steps=180, compute_s=0.1, wait_s=0.001)
    report = report_of(b)
    f = next(f for f in report["findings"] if f["rule"] == "outdated_libraries")
    assert "torch 2.0.1" in f["evidence"] and "transformers" not in f["evidence"]


def test_loading_a_prepared_dataset_is_not_charged_as_startup_waste(tmp_path):
    """load_from_disk is the startup fix itself; datasets.map before the first step is the waste."""
    b = RecordingBuilder(tmp_path, cores=8, duration_s=100.0)
    rows = b.process()
    rows.append({"k": "span", "c": "data_load", "t0": 1_700_000_001.0, "dt": 10.0, "name": "datasets.load_from_disk"})
    b.training_loop(rows, start_s=25.0, steps=700, compute_s=0.1, wait_s=0.001, fetch_s=0.001)
    b.host_rows(cpu_total_pct=30.0, cpu_proc_pct=100.0)
    assert "startup_idle" not in rules_of(report_of(b))
    rows.append({"k": "span", "c": "format", "t0": 1_700_000_012.0, "dt": 8.0, "name": "datasets.Dataset.map"})
    f = next(f for f in report_of(b)["findings"] if f["rule"] == "startup_idle")
    assert f["data"]["format_s"] == 8.0 and f["data"]["data_load_s"] == 10.0


def test_checkpoint_fix_also_claims_the_slow_steps_after_each_save(tmp_path):
    """A save that slows the next step (page cache, fsync) costs more than its own seconds:
    fewer saves give that back too, and only what lies beyond a normal step's spread is sure."""
    b = RecordingBuilder(tmp_path, cores=8, duration_s=120.0)
    rows = b.process()
    b.training_loop(rows, start_s=2.0, steps=0, compute_s=0.08, wait_s=0.0)  # loader, first step
    t = 2.0
    for n in range(1, 1001):
        rows.append({"k": "span", "c": "data_wait", "t0": T0 + t, "dt": 0.0005, "name": "DataLoader.__next__"})
        t += 0.08 + 0.004 * (n % 5) + (0.3 if n % 100 == 1 and n > 1 else 0.0)  # 0.3 s slower after a save
        rows.append({"k": "step", "t": T0 + t, "n": n, "dt": 0.001})
        if n % 100 == 0:
            rows.append({"k": "span", "c": "checkpoint", "t0": T0 + t, "dt": 1.5, "name": "torch.save"})
            t += 1.5
    b.host_rows(cpu_total_pct=20.0, cpu_proc_pct=100.0)
    f = next(f for f in report_of(b)["findings"] if f["rule"] == "checkpoint_overhead")
    slow = next(c for c in f["claims"] if c["part"] == "after_save")
    assert 9 * 0.27 <= f["data"]["after_save_excess_s"] <= 9 * 0.31  # 9 saves with a step after them
    assert slow["bucket"] == "compute" and slow["fraction"] > 0.8  # save_steps 100 -> 1000+: most saves go
    assert f["predicted_speedup_range"] is not None


@pytest.mark.parametrize(("map_cpu_pct", "num_proc"), [(100.0, 7), (30.0, None)])
def test_startup_proposes_num_proc_only_for_a_cpu_bound_map(tmp_path, map_cpu_pct, num_proc):
    """A map that kept a core busy splits over the idle cores; one that waited (I/O, a lock)
    would only wait in more processes. No GPU seen: the title speaks of training, not GPUs."""
    b = RecordingBuilder(tmp_path, cores=8, duration_s=100.0)
    rows = b.process()
    rows.append({"k": "span", "c": "format", "t0": T0 + 1.0, "dt": 30.0, "name": "datasets.Dataset.map"})
    b.training_loop(rows, start_s=32.0, steps=600, compute_s=0.1, wait_s=0.001, fetch_s=0.001)
    b.host_rows(cpu_total_pct=20.0, cpu_proc_pct=map_cpu_pct)
    f = next(f for f in report_of(b)["findings"] if f["rule"] == "startup_idle")
    assert f["title"] == "Training waits while the data is prepared"
    assert f["fix"]["config"].get("num_proc") == num_proc
    if num_proc is None:
        assert "not CPU-bound" in f["fix"]["summary"]


def test_a_hook_that_failed_is_said_in_the_report(tmp_path):
    b = RecordingBuilder(tmp_path, cores=8, duration_s=60.0)
    rows = b.process()
    b.training_loop(rows, start_s=1.0, steps=300, compute_s=0.1, wait_s=0.001, fetch_s=0.001)
    rows.append({"k": "hook_error", "t": T0 + 31.0, "where": "data wait", "vital": True,
                 "error": "RuntimeError", "message": "RuntimeError: boom"})
    rows.append({"k": "hook_error", "t": T0 + 2.0, "where": "padding count", "vital": False,
                 "error": "TypeError", "message": "TypeError: odd batch"})
    b.host_rows(cpu_total_pct=30.0, cpu_proc_pct=100.0)
    report = report_of(b)
    notes = " | ".join(report["notes"])
    assert "in-process recording stopped in pid 100 31.0 s after launch" in notes and "boom" in notes
    assert "the hook padding count (TypeError: odd batch) was switched off" in notes
    assert sum(f["rule"] == "partial_recording" for f in report["findings"]) == 2


@pytest.mark.parametrize(("states", "says"), [(["hit"], "read from the datasets cache"),
                                              (["none"], "never caches its map"),
                                              (["miss", "miss"], "the next launch with the same data")])
def test_startup_says_what_the_datasets_cache_does_for_the_next_launch(tmp_path, states, says):
    b = RecordingBuilder(tmp_path, cores=8, duration_s=100.0)
    rows = b.process()
    rows.append({"k": "span", "c": "imports", "t0": T0 + 0.1, "dt": 2.0, "name": "import torch"})
    rows.append({"k": "span", "c": "format", "t0": T0 + 3.0, "dt": 20.0, "name": "datasets.Dataset.map"})
    rows += [{"k": "map_cache", "t": T0 + 23.0, "state": s} for s in states]
    b.training_loop(rows, start_s=30.0, steps=600, compute_s=0.1, wait_s=0.001, fetch_s=0.001)
    b.host_rows(cpu_total_pct=20.0, cpu_proc_pct=100.0)
    report = report_of(b)
    f = next(f for f in report["findings"] if f["rule"] == "startup_idle")
    assert says in f["fix"]["summary"]
    parts = report["startup"]
    assert parts["imports_s"] == pytest.approx(2.0) and parts["format_s"] == pytest.approx(20.0)
    assert parts["other_s"] == pytest.approx(30.0 - 22.0, abs=0.05) and f["data"]["imports_s"] == pytest.approx(2.0)
