"""``gpudoctor export PATH --format parquet|csv -o DIR``: the notebook's tables as files."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

import gpudoctor
from gpudoctor.tables import COLUMNS, TABLES
from tests.conftest import ROOT, cli


@pytest.fixture(scope="module")
def probe(probe_run):
    return probe_run("heavy_checkpoints")


def test_parquet_export_reads_back_as_the_loaded_tables(probe, tmp_path: Path) -> None:
    out = tmp_path / "exports" / "run-a"
    proc = cli("export", str(probe.folder), "--format", "parquet", "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in out.iterdir()) == sorted(f"{t}.parquet" for t in TABLES)
    assert all((out / f"{t}.parquet").stat().st_mode & 0o077 == 0 for t in TABLES)  # private, like reports
    run = gpudoctor.load(probe.folder)
    for name in TABLES:
        pd.testing.assert_frame_equal(pd.read_parquet(out / f"{name}.parquet"), getattr(run, name))
    # many runs queried together: every row says which run it is
    steps = pd.concat([pd.read_parquet(p) for p in (tmp_path / "exports").glob("*/steps.parquet")])
    assert steps.groupby("run").size().to_dict() == {probe.folder.name: probe.truth["steps"]}


def test_csv_export_of_a_report_json_alone_writes_headers_and_says_why(probe, tmp_path: Path) -> None:
    proc = cli("export", str(probe.folder / "report.json"), "--format", "csv", "-o", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    for name in TABLES:
        assert (tmp_path / f"{name}.csv").read_text().strip() == ",".join(COLUMNS[name])
    assert "holds a report.json only" in proc.stderr


def test_export_replaces_a_planted_link_instead_of_writing_through_it(probe, tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    out = tmp_path / "out"
    out.mkdir()
    (out / "steps.csv").symlink_to(victim)
    proc = cli("export", str(probe.folder), "--format", "csv", "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    assert victim.read_text() == "keep me" and not (out / "steps.csv").is_symlink()
    assert len(pd.read_csv(out / "steps.csv")) == probe.truth["steps"]


def test_bad_input_is_one_line_and_a_nonzero_exit(tmp_path: Path) -> None:
    proc = cli("export", str(tmp_path / "missing"), "-o", str(tmp_path / "o"))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "no such file or folder" in proc.stderr
    proc = cli("export", str(tmp_path), "--format", "xlsx", "-o", str(tmp_path / "o"))
    assert proc.returncode == 2 and "invalid choice: 'xlsx'" in proc.stderr


def test_without_pandas_the_tables_say_how_to_install_it(probe, tmp_path: Path) -> None:
    code = ("import sys; sys.modules['pandas'] = None\n"  # as if pandas were not installed
            "from gpudoctor.cli import main\n"
            f"sys.exit(main(['export', {str(probe.folder)!r}, '-o', {str(tmp_path)!r}]))")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip() == ("gpudoctor: the tables need pandas, which is not installed; "
                                   "pip install 'gpudoctor[pandas]'")
