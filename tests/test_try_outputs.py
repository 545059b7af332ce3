"""``try`` keeps the baseline's outputs: a path on the command line the baseline created or rewrote is
pointed into the trial's own folder, so the trial does not overwrite what the baseline left (a metrics
file a program reads after ``try``, a log, an output folder)."""

from __future__ import annotations

import os
from pathlib import Path

from gpudoctor.tryfix import outputs


def _command(tmp: Path) -> list[str]:
    return ["python", str(tmp / "train.py"), "--metrics", str(tmp / "metrics.json"), "--padding", "longest",
            f"--log={tmp / 'train.log'}", "--out-dir", str(tmp / "ckpts"), "--data", str(tmp / "data"),
            "--n", "3"]


def test_what_the_baseline_wrote_goes_to_the_trials_own_folder(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("pass\n")
    (tmp_path / "train.log").write_text("an old log\n")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "rows.txt").write_text("rows\n")
    command = _command(tmp_path)
    seen = outputs.before(command, tmp_path)
    # the baseline: creates the metrics and the checkpoint folder, rewrites the log, reads the data
    (tmp_path / "metrics.json").write_text('{"steps_per_s": 3.0}')
    (tmp_path / "ckpts").mkdir()
    (tmp_path / "train.log").write_text("an old log\nthe baseline's lines\n")
    folder = tmp_path / "doctor" / "trial" / "outputs"
    written = {o.text: o for o in outputs.written(seen, folder)}
    assert set(written) == {str(tmp_path / "metrics.json"), str(tmp_path / "train.log"), str(tmp_path / "ckpts")}
    metrics, log, ckpts = (written[str(tmp_path / n)] for n in ("metrics.json", "train.log", "ckpts"))
    assert (metrics.how, metrics.kind, ckpts.how, ckpts.kind, log.how) == (
        "created", "file", "created", "folder", "rewritten")
    # created: starts absent for the trial, as it did for the baseline; rewritten: the trial reads a copy
    assert metrics.trial is not None and not metrics.trial.exists()
    assert ckpts.trial is not None and not ckpts.trial.exists()
    assert log.trial is not None and log.trial.read_text() == "an old log\nthe baseline's lines\n"
    edited = outputs.redirect(command, list(written.values()))
    assert edited[:2] == command[:2] and "longest" in edited and edited[-1] == "3"
    assert edited[edited.index("--metrics") + 1] == str(metrics.trial)
    assert f"--log={log.trial}" in edited and str(tmp_path / "data") in edited
    assert edited[edited.index("--out-dir") + 1] == str(ckpts.trial) and folder.is_dir()
    # the trial writes its own; the baseline's stay as it left them
    Path(edited[edited.index("--metrics") + 1]).write_text('{"steps_per_s": 9.0}')
    assert (tmp_path / "metrics.json").read_text() == '{"steps_per_s": 3.0}'


def test_a_folder_that_was_there_and_a_file_over_the_budget_are_shared_and_said(tmp_path: Path,
                                                                              monkeypatch) -> None:
    (tmp_path / "train.py").write_text("pass\n")
    (tmp_path / "ckpts").mkdir()
    (tmp_path / "big.bin").write_bytes(b"0" * 10)
    command = ["python", "train.py", "--out-dir", str(tmp_path / "ckpts"), "--dump", str(tmp_path / "big.bin")]
    seen = outputs.before(command, tmp_path)
    (tmp_path / "ckpts" / "step-1.pt").write_bytes(b"x")
    (tmp_path / "big.bin").write_bytes(b"1" * 100)
    monkeypatch.setattr(outputs, "COPY_BUDGET_BYTES", 50)
    written = outputs.written(seen, tmp_path / "trial" / "outputs")
    assert [(o.kind, o.how, o.trial) for o in written] == [("folder", "rewritten", None), ("file", "rewritten", None)]
    assert outputs.redirect(command, written) == command


def test_a_file_the_baseline_had_not_written_when_it_stopped_is_the_trials_own_too(tmp_path: Path) -> None:
    """``try`` stops the baseline after its seconds; a script that writes its metrics at the end never
    wrote them. The trial, run to the same seconds, must not be the one whose file is found there."""
    command = ["python", "train.py", "--truth", str(tmp_path / "truth.json"), "--lr", "0.5", "--seed", "1",
               "--out", "runs/today", "--name", "baseline"]
    (tmp_path / "runs").mkdir()
    (tmp_path / "train.py").write_text("pass\n")
    seen = outputs.before(command, tmp_path)
    written = outputs.written(seen, tmp_path / "trial" / "outputs")  # the baseline wrote nothing
    assert [(o.text, o.kind, o.how) for o in written] == [(str(tmp_path / "truth.json"), "path", "unwritten"),
                                                         ("runs/today", "path", "unwritten")]
    edited = outputs.redirect(command, written)
    assert [edited[i] for i in (5, 7, 11)] == ["0.5", "1", "baseline"]  # words and numbers are not paths
    assert Path(edited[3]).parent == tmp_path / "trial" / "outputs" and not Path(edited[3]).exists()


def test_a_pattern_and_the_prefix_of_input_files_are_inputs_left_as_they_are(tmp_path: Path) -> None:
    """``--train-files 'data/*.jsonl'`` and Megatron's ``--data-path data/corpus_text_document`` (beside
    ``corpus_text_document.bin`` and ``.idx``) name no path that exists, and the trial must read them."""
    (tmp_path / "train.py").write_text("pass\n")
    (tmp_path / "data").mkdir()
    for name in ("corpus_text_document.bin", "corpus_text_document.idx", "a.jsonl"):
        (tmp_path / "data" / name).write_text("x")
    command = ["python", "train.py", "--train-files", "data/*.jsonl", "--data-path", "data/corpus_text_document",
               "--save", "data/ckpt.pt"]
    written = outputs.written(outputs.before(command, tmp_path), tmp_path / "trial" / "outputs")
    assert [(o.text, o.how) for o in written] == [("data/ckpt.pt", "unwritten")]
    edited = outputs.redirect(command, written)
    assert edited[:6] == command[:6] and edited[7] != command[7]


def test_links_and_untouched_paths_are_never_redirected(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("pass\n")
    target = tmp_path / "elsewhere.txt"
    target.write_text("not ours to move")
    os.symlink(target, tmp_path / "link.txt")
    command = ["python", "train.py", "--metrics", str(tmp_path / "link.txt"), "--data", str(tmp_path)]
    seen = outputs.before(command, tmp_path)
    target.write_text("rewritten through the link")
    (tmp_path / "new-file-not-named").write_text("x")  # the folder changed; it was there before
    written = outputs.written(seen, tmp_path / "trial" / "outputs")
    assert all(o.trial is None for o in written)
    assert outputs.redirect(command, written) == command
