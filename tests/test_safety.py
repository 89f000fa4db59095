"""Nothing the user owns is destroyed: overlapping folders, an --output_dir that is not an earlier
export, and prepare_data.py sources that would be written over are refused with one `error:` line and
exit 2, before any work; every case is checked against a snapshot of the whole temp tree."""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import shutil
from pathlib import Path

import pytest

import prepare_data
import train_feedback
import train_vits
from tests.helpers import tiny_config, train_tiny
from tests.snapshot import assert_unchanged, snapshot
from vits_trainer.errors import UserError, run_cli
from vits_trainer.safety import (
    EXPORT_MARKER,
    UnsafeOverwrite,
    check_replaceable,
    foreign_entries,
    read_marker,
    resolved,
    write_marker,
)
from vits_trainer.training.config import check_output_dir, check_train_paths


def user_tree(root: Path) -> dict[str, Path]:
    """A user's folders with files in each: data (wavs + metadata), a checkpoint dir, a model folder, a
    folder holding only a model card (README.md)."""
    data = root / "data"
    (data / "wavs").mkdir(parents=True)
    (data / "wavs" / "a.wav").write_bytes(b"RIFF user recording")
    (data / "metadata.csv").write_text("a|hello|0\n", encoding="utf-8")
    (data / "cache").mkdir()
    (data / "cache" / "index.json").write_text("{}", encoding="utf-8")
    ckpt = root / "ckpt"
    (ckpt / "step_00000001").mkdir(parents=True)
    (ckpt / "metrics.jsonl").write_text('{"step": 1}\n', encoding="utf-8")
    mine = root / "mymodels"
    mine.mkdir()
    (mine / "notes.txt").write_text("my other models", encoding="utf-8")
    card = root / "mycard"  # e.g. a model folder being written by hand: its card first
    card.mkdir()
    (card / "README.md").write_text("---\nlicense: mit\n---\n# My voice\n", encoding="utf-8")
    return {"data": data, "ckpt": ckpt, "out": root / "out", "mine": mine, "card": card}


def refused(capsys, main, argv: list[str], expected: str = "") -> str:
    code = run_cli(main, argv)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2, err
    assert len(lines) == 1 and lines[0].startswith("error:") and "Traceback" not in err, lines
    assert expected in lines[0], lines[0]
    return lines[0]


def related(base: Path, how: str, scratch: Path) -> str:
    """A path that is `base` in disguise, or nested in it, or its parent."""
    if how == "same":
        return str(base)
    if how == "inside":
        return str(base / "sub")
    if how == "parent":
        return str(base.parent)
    if how == "dotdot":
        return os.path.relpath(base / "x" / "..")  # relative to the cwd, with a `..`
    if how == "symlink":
        link = scratch / f"link-to-{base.name}"
        if not link.is_symlink():
            link.symlink_to(base, target_is_directory=True)
        return str(link)
    if how == "symlink_inside":
        link = scratch / f"link-into-{base.name}"
        if not link.is_symlink():
            link.symlink_to(base, target_is_directory=True)
        return str(link / "sub")
    raise ValueError(how)


HOW = ("same", "inside", "parent", "dotdot", "symlink", "symlink_inside")


def train_cases(tree: dict[str, Path], scratch: Path):
    """(roles given, argv) for every overlap of the three folders train_vits.py takes."""
    data, ckpt, out = tree["data"], tree["ckpt"], tree["out"]
    for how in HOW:
        # --output_dir / --checkpoint_dir onto the data folder (inside it is fine, except its parts)
        target = data / "wavs" if how in ("inside", "symlink_inside") else data
        yield (
            f"out {how} data",
            dict(data_dir=data, checkpoint_dir=ckpt, output_dir=related(target, how, scratch)),
        )
        yield (
            f"ckpt {how} data",
            dict(data_dir=data, checkpoint_dir=related(target, how, scratch), output_dir=out),
        )
        # --output_dir and --checkpoint_dir never nest, either way
        yield (
            f"out {how} ckpt",
            dict(data_dir=data, checkpoint_dir=ckpt, output_dir=related(ckpt, how, scratch)),
        )
        yield (
            f"ckpt {how} out",
            dict(data_dir=data, checkpoint_dir=related(tree["mine"], how, scratch), output_dir=tree["mine"]),
        )


FLAGS = ("data_dir", "checkpoint_dir", "output_dir")
OVERLAP_VERBS = ("is the same folder as", "contains", "is inside", "overlaps")  # safety.refuse's


def test_every_overlap_of_train_folders_is_refused_and_nothing_changes(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    tree = user_tree(tmp_path)
    scratch = tmp_path / "links"
    scratch.mkdir()
    cases = list(train_cases(tree, scratch))
    assert len(cases) == 4 * len(HOW)
    before = snapshot(tmp_path)
    for name, roles in cases:
        argv = list(itertools.chain.from_iterable((f"--{k}", str(v)) for k, v in roles.items()))
        line = refused(capsys, train_vits.main, [*argv, "--model_name", "unused"])
        # refused for an overlap (a parent of two folders may be refused for the third), naming both
        # flags; not by a later check (the checkpoints' or the model's) that named two flags too
        assert any(f" {verb} --" in line for verb in OVERLAP_VERBS), (name, line)
        assert sum(f"--{flag} " in line for flag in FLAGS) >= 2, (name, line)
        assert_unchanged(tmp_path, before)


def test_defaults_layout_is_allowed():
    from vits_trainer.training.config import TrainConfig

    check_train_paths(TrainConfig(data_dir="/nonexistent/training"))  # checkpoints/ + final_model/ inside


def test_output_dir_with_user_files_is_refused_up_front(tmp_path, capsys, tone_corpus, tiny_model_dir):
    tree = user_tree(tmp_path)
    before = snapshot(tmp_path)
    argv = [
        "--data_dir",
        str(tone_corpus),
        "--model_name",
        str(tiny_model_dir),
        "--checkpoint_dir",
        str(tmp_path / "new_ckpt"),
    ]
    line = refused(capsys, train_vits.main, [*argv, "--output_dir", str(tree["mine"])], "notes.txt")
    assert "not a model exported by this tool" in line
    refused(capsys, train_vits.main, [*argv, "--output_dir", str(tree["mine"]), "--overwrite_output_dir"])
    # a folder holding only the user's model card: the export's own README.md never replaces it
    for flags in ([], ["--overwrite_output_dir"]):
        line = refused(
            capsys, train_vits.main, [*argv, "--output_dir", str(tree["card"]), *flags], "README.md"
        )
        assert "not a model exported by this tool" in line
    assert_unchanged(tmp_path, before)


def test_a_checkpoint_folder_holding_results_or_user_files_but_no_checkpoint_is_refused(
    tmp_path, capsys, tone_corpus, tiny_model_dir
):
    """Without a checkpoint to continue, a new run would write its files over what the folder holds: an
    earlier run's best_model/ and summary (its step_* folders deleted to save space: the first
    evaluation replaced that best model, and the two runs' metrics were mixed), or the user's own
    report.html and metrics.jsonl (overwritten and appended to without a word)."""
    from vits_trainer.training.session import check_fresh_folder

    earlier = tmp_path / "earlier"
    (earlier / "best_model").mkdir(parents=True)
    (earlier / "train_summary.json").write_text("{}")
    (earlier / "metrics.jsonl").write_text('{"event": "session", "step": 0}\n')
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "report.html").write_text("my page")
    (mine / "metrics.jsonl").write_text('{"mine": 1}\n')
    before = snapshot(tmp_path)
    argv = [
        "--data_dir",
        str(tone_corpus),
        "--model_name",
        str(tiny_model_dir),
        "--output_dir",
        str(tmp_path / "out"),
    ]
    line = refused(
        capsys, train_vits.main, [*argv, "--checkpoint_dir", str(earlier)], "no checkpoint to continue"
    )
    assert "best_model, train_summary.json, metrics.jsonl" in line
    line = refused(capsys, train_vits.main, [*argv, "--checkpoint_dir", str(mine)], "report.html")
    assert_unchanged(tmp_path, before)
    # a run killed before its first checkpoint left its own metrics, report, and a best_model/ when an
    # evaluation came first: the same command starts again there
    killed = tmp_path / "killed"
    (killed / "best_model").mkdir(parents=True)
    (killed / "metrics.jsonl").write_text('{"event": "session", "step": 0, "resumed_from": null}\n')
    (killed / "report.html").write_text("<!doctype html>")
    check_fresh_folder(killed)
    # ... but not one whose metrics show a resumed session: it had checkpoints, deleted since
    with (killed / "metrics.jsonl").open("a") as f:
        f.write('{"event": "session", "step": 40, "resumed_from": 40}\n')
    with pytest.raises(UserError, match="no checkpoint to continue from"):
        check_fresh_folder(killed)


def test_a_checkpoint_folder_holding_a_report_zip_alone_is_refused(tmp_path):
    """report.zip is the one file of a run to keep (the page with its samples): a new run in a folder
    holding it alone, an earlier run's or the user's, wrote over it without a word, where report.html
    alone is refused. A run killed before its first checkpoint left one too: that one starts again."""
    from vits_trainer.training.session import check_fresh_folder

    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "report.zip").write_bytes(b"PK\x05\x06" + bytes(18))
    with pytest.raises(UserError, match="holds report.zip but no checkpoint to continue from"):
        check_fresh_folder(kept)
    (kept / "metrics.jsonl").write_text('{"event": "session", "step": 0, "resumed_from": null}\n')
    check_fresh_folder(kept)


def test_export_replaces_only_a_readme_it_wrote(tmp_path, tiny_model_dir):
    """export_model's own check, as best_model's export during a run meets it: a user's README.md in
    a folder without the marker is refused and kept; the card of an earlier export is replaced."""
    from transformers import VitsTokenizer

    from vits_trainer.model.vits import export_model, load_vits_model

    model, tokenizer = load_vits_model(tiny_model_dir), VitsTokenizer.from_pretrained(tiny_model_dir)
    tree = user_tree(tmp_path)
    before = snapshot(tmp_path)

    def card(folder: Path) -> None:
        (folder / "README.md").write_text("---\nlicense: other\n---\n# exported\n", encoding="utf-8")

    with pytest.raises(UnsafeOverwrite, match="README.md"):
        export_model(model, tokenizer, tree["card"], extras=card, kind="best_model", run=tmp_path / "ckpt")
    assert_unchanged(tmp_path, before)
    out = tmp_path / "export"
    export_model(model, tokenizer, out, extras=card, kind="best_model", run=tmp_path / "ckpt")
    assert "README.md" in read_marker(out)["files"]
    # shareable: every file has the mode of a new file here (safetensors alone writes its weights 0600)
    mask = os.umask(0o022)
    os.umask(mask)
    assert {(p.name, p.stat().st_mode & 0o777) for p in out.iterdir()} == {
        (p.name, 0o666 & ~mask) for p in out.iterdir()
    }
    (out / "README.md").write_text("an older card of this export", encoding="utf-8")
    export_model(model, tokenizer, out, extras=card, kind="best_model", run=tmp_path / "ckpt")  # its own
    assert (out / "README.md").read_text(encoding="utf-8").endswith("# exported\n")
    # a crashed process with this same pid (a container's) left its aside copy: no longer in the way
    left = tmp_path / f".export.old-{os.getpid()}"
    (left / "sub").mkdir(parents=True)
    export_model(model, tokenizer, out, extras=card, kind="best_model", run=tmp_path / "ckpt")
    assert (out / "README.md").is_file() and not left.exists()


def fake_export(folder: Path, run: Path) -> None:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}", encoding="utf-8")
    (folder / "sub").mkdir()
    (folder / "sub" / "x.bin").write_bytes(b"1")
    write_marker(folder, "final_model", run)


def test_markers_decide_what_may_be_replaced(tmp_path):
    folder = tmp_path / "export"
    fake_export(folder, tmp_path / "ckpt")
    marker = read_marker(folder)
    assert marker["files"] == ["config.json", "sub/x.bin"] and marker["checkpoint_dir"] == str(
        resolved(tmp_path / "ckpt")
    )
    assert foreign_entries(folder) == []
    check_replaceable(folder)
    (folder / "sub" / "mine.txt").write_text("user", encoding="utf-8")
    with pytest.raises(UnsafeOverwrite, match="sub/mine.txt"):
        check_replaceable(folder)
    (folder / "sub" / "mine.txt").unlink()
    (folder / EXPORT_MARKER).write_text(json.dumps({"tool": "other", "files": []}), encoding="utf-8")
    with pytest.raises(UnsafeOverwrite, match="not a model exported by this tool"):
        check_replaceable(folder)
    check_replaceable(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    check_replaceable(tmp_path / "empty")


def test_an_earlier_export_needs_the_flag_unless_its_run_resumes(tmp_path):
    ckpt, out = tmp_path / "ckpt", tmp_path / "out"
    fake_export(out, ckpt)
    with pytest.raises(UserError, match="--overwrite_output_dir"):
        check_output_dir(out, ckpt, overwrite=False, resume="auto")  # its run has no checkpoint left
    (ckpt / "step_00000004").mkdir(parents=True)
    check_output_dir(out, ckpt, overwrite=False, resume="auto")  # the same run, resuming: its own export
    with pytest.raises(UserError, match="--overwrite_output_dir"):
        check_output_dir(out, ckpt, overwrite=False, resume="none")
    with pytest.raises(UserError, match="--overwrite_output_dir"):
        check_output_dir(out, tmp_path / "other_ckpt", overwrite=False, resume="auto")
    check_output_dir(out, tmp_path / "other_ckpt", overwrite=True, resume="auto")


# ---- prepare_data.py -------------------------------------------------------------------------------


def recordings(folder: Path) -> Path:
    """The user's recordings as audio + .txt pairs (real WAVs at 22.05 kHz)."""
    from vits_trainer.data.synthetic import make_corpus

    make_corpus(folder / "made", num_clips=6, sample_rate=22050, seed=1)
    wavs = folder / "wavs"
    (folder / "made" / "wavs").rename(wavs)
    for line in (folder / "made" / "metadata.csv").read_text(encoding="utf-8").splitlines():
        clip_id, text, _ = line.split("|")
        (wavs / f"{clip_id}.txt").write_text(text, encoding="utf-8")
    return folder


@pytest.mark.parametrize(
    "case",
    [
        "source is data_dir/wavs",
        "source inside data_dir/wavs",
        "source is data_dir",
        "source is metadata.csv",
        "symlinked data_dir",
        "source inside data_dir/cache",
        "a filelist elsewhere naming data_dir/wavs",
    ],
)
def test_prepare_never_writes_over_its_source(tmp_path, capsys, case):
    x = recordings(tmp_path / "X")
    (x / "metadata.csv").write_text(
        "\n".join(
            f"{p.stem}|{p.with_suffix('.txt').read_text(encoding='utf-8')}"
            for p in sorted((x / "wavs").glob("*.wav"))
        )
        + "\n",
        encoding="utf-8",
    )
    source, data_dir = {
        "source is data_dir/wavs": (x / "wavs", x),
        "source inside data_dir/wavs": (x / "wavs", x / "wavs" / ".."),
        "source is data_dir": (x, x),
        "source is metadata.csv": (x / "metadata.csv", x),
        "symlinked data_dir": (x / "wavs", tmp_path / "link"),
        "source inside data_dir/cache": (x / "cache" / "old", x),
        "a filelist elsewhere naming data_dir/wavs": (tmp_path / "filelist.txt", x),
    }[case]
    if case == "symlinked data_dir":
        (tmp_path / "link").symlink_to(x, target_is_directory=True)
    if case == "source inside data_dir/cache":  # recordings kept in the folder prepare_data.py rewrites
        shutil.copytree(x / "wavs", source)
    if case == "a filelist elsewhere naming data_dir/wavs":  # the folder is not a source, its files are
        lines = [
            f"{p}|{p.with_suffix('.txt').read_text(encoding='utf-8')}" for p in sorted(x.glob("wavs/*.wav"))
        ]
        source.write_text("\n".join(lines) + "\n", encoding="utf-8")
    before = snapshot(tmp_path)
    # the folder check (check_prepare_sources) and the per-file one (check_prepare_files) each refuse
    expected = {
        "source is data_dir": "is the same folder as --data_dir",
        "source inside data_dir/cache": "cache is written by prepare_data.py",
        "a filelist elsewhere naming data_dir/wavs": "where prepare_data.py writes; it would be overwritten",
    }.get(case, "is inside --data_dir")
    refused(
        capsys,
        prepare_data.main,
        ["--source", str(source), "--data_dir", str(data_dir), "--num_workers", "1"],
        expected,
    )
    assert_unchanged(tmp_path, before)


def test_prepare_replaces_only_the_wavs_it_wrote(tmp_path, capsys):
    src = recordings(tmp_path / "src") / "wavs"
    out = tmp_path / "out"
    args = ["--source", str(src), "--data_dir", str(out), "--num_workers", "1", "--no_progress"]
    assert run_cli(prepare_data.main, args) == 0
    assert run_cli(prepare_data.main, [*args, "--sample_rate", "22050"]) == 0  # its own WAVs: re-made
    capsys.readouterr()
    (out / "wavs" / "theirs.wav").write_bytes(b"RIFF a recording the tool did not make")
    before = snapshot(tmp_path)
    refused(capsys, prepare_data.main, [*args, "--clean"], "theirs.wav")
    assert_unchanged(tmp_path, before)
    first = sorted(p.stem for p in src.glob("*.wav"))[0]
    state = out / ".prepare_state.json"
    data = json.loads(state.read_text(encoding="utf-8"))
    del data["clips"][first]  # as if the WAV of that id had been put there by hand
    state.write_text(json.dumps(data), encoding="utf-8")
    before = snapshot(tmp_path)
    refused(capsys, prepare_data.main, args, f"{first}.wav")
    assert_unchanged(tmp_path, before)


# ---- train_feedback.py -----------------------------------------------------------------------------


def test_feedback_folders_that_overlap_are_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    tree = user_tree(tmp_path)
    fb = tmp_path / "feedback"
    (fb / "wavs").mkdir(parents=True)
    (fb / "metadata.csv").write_text("f|hi|0\n", encoding="utf-8")
    root = tmp_path / "fbmodels"
    (root / "v1" / "model").mkdir(parents=True)
    (root / "v1" / "model" / "config.json").write_text("{}", encoding="utf-8")  # v1 unfinished
    base = tmp_path / "base"
    base.mkdir()
    (base / "config.json").write_text("{}", encoding="utf-8")
    ok = dict(data_dir=tree["data"], feedback_dir=fb, output_dir=root, base_model=base)
    cases = {
        "root is data_dir": dict(ok, output_dir=tree["data"]),
        "root contains data_dir": dict(ok, output_dir=tmp_path),
        "root in data wavs": dict(ok, output_dir=tree["data"] / "wavs" / "fb"),
        "root is feedback_dir": dict(ok, output_dir=fb),
        "root symlinked to feedback_dir": dict(ok, output_dir=related(fb, "symlink", tmp_path)),
        "root inside feedback wavs": dict(ok, output_dir=fb / "wavs" / "out"),
        "root inside base": dict(ok, output_dir=base / "fb"),
        "base is an unfinished version": dict(ok, base_model=root / "v1" / "model"),
        "base is a version's checkpoints": dict(ok, base_model=root / "v1"),
        "base is root": dict(ok, base_model=root),
    }
    (root / "latest.json").write_text("my notes", encoding="utf-8")
    cases["a foreign latest.json"] = ok
    expected = {
        "root is data_dir": "is the same folder as --data_dir",
        "root contains data_dir": "contains --data_dir",
        "root in data wavs": "overlaps --data_dir",
        "root is feedback_dir": "is the same folder as --feedback_dir",
        "root symlinked to feedback_dir": "is the same folder as --feedback_dir",
        "root inside feedback wavs": "overlaps --feedback_dir",
        "root inside base": "is inside --base_model",
        "base is an unfinished version": "is inside --output_dir",
        "base is a version's checkpoints": "not a model folder (no config.json); this version's model is",
        "base is root": "not a model folder (no config.json); the current model of these feedback versions",
        "a foreign latest.json": "latest.json is not a pointer written by train_feedback.py",
    }
    before = snapshot(tmp_path)
    for name, roles in cases.items():
        argv = list(itertools.chain.from_iterable((f"--{k}", str(v)) for k, v in roles.items()))
        line = refused(capsys, train_feedback.main, argv)
        assert expected[name] in line, (name, line)  # refused for this case's reason, not a later check
        assert_unchanged(tmp_path, before)


# ---- real runs: export markers, --overwrite_output_dir, resume ------------------------------------


def test_real_runs_replace_only_their_own_exports(tmp_path, capsys, tone_corpus, tiny_model_dir):
    out = tmp_path / "final_model"
    first = tiny_config(
        tmp_path, tone_corpus, tiny_model_dir, max_steps=2, checkpoint_dir=str(tmp_path / "a")
    )
    check_train_paths(first)
    _, summary = train_tiny(
        tmp_path, tone_corpus, tiny_model_dir, max_steps=2, checkpoint_dir=str(tmp_path / "a")
    )
    assert summary["final_model"] == str(out)
    marker = read_marker(out)
    assert marker["kind"] == "final_model" and "train_summary.json" in marker["files"]
    assert "model.safetensors" in marker["files"] and foreign_entries(out) == []

    # the same run resumed: its own export is re-done without the flag
    resumed = dict(max_steps=4, checkpoint_dir=str(tmp_path / "a"))
    check_train_paths(tiny_config(tmp_path, tone_corpus, tiny_model_dir, **resumed))
    _, summary = train_tiny(tmp_path, tone_corpus, tiny_model_dir, **resumed)
    assert summary["resumed_from_step"] == 2 and summary["final_model"] == str(out)

    # another run: refused up front without --overwrite_output_dir (CLI), replaced with it
    other = [
        "--data_dir",
        str(tone_corpus),
        "--model_name",
        str(tiny_model_dir),
        "--checkpoint_dir",
        str(tmp_path / "b"),
        "--output_dir",
        str(out),
    ]
    before = snapshot(tmp_path)
    capsys.readouterr()  # the runs' progress bars
    refused(capsys, train_vits.main, other, "--overwrite_output_dir")
    assert_unchanged(tmp_path, before)
    second = dict(max_steps=1, checkpoint_dir=str(tmp_path / "b"), overwrite_output_dir=True)
    check_train_paths(tiny_config(tmp_path, tone_corpus, tiny_model_dir, **second))
    _, summary = train_tiny(tmp_path, tone_corpus, tiny_model_dir, **second)
    assert read_marker(out)["checkpoint_dir"] == str(resolved(tmp_path / "b"))

    # a file the user drops into the export is never deleted: the export is refused at the end
    (out / "my_notes.txt").write_text("keep me", encoding="utf-8")
    _, summary = train_tiny(tmp_path, tone_corpus, tiny_model_dir, **dict(second, max_steps=2))
    assert summary["final_model"] is None
    assert (out / "my_notes.txt").read_text(encoding="utf-8") == "keep me"
    assert "my_notes.txt" in capsys.readouterr().out


def other_runs_export(folder: Path, run: Path) -> None:
    """A folder as another run's export leaves it: a file and the marker naming that run."""
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(b"the other run's weights")
    write_marker(folder, "final_model", run, step=5)


def test_a_resume_checks_its_own_output_folder_not_the_default_one(tmp_path, monkeypatch):
    """`--resume auto --checkpoint_dir X` (the command a stopped run prints) takes --output_dir from the
    checkpoint: the default folder holding another run's model does not stop it before the checkpoint
    is read; the run's own folder is checked then (settings_known), and refused if another run's
    model is there."""
    from vits_trainer.errors import ArgumentParser
    from vits_trainer.training.config import TrainConfig, add_arguments, parse_config

    monkeypatch.chdir(tmp_path)
    (tmp_path / "training").mkdir()
    (tmp_path / "ck3" / "step_00000007").mkdir(parents=True)
    other_runs_export(tmp_path / "training" / "final_model", tmp_path / "training" / "checkpoints")
    parser = ArgumentParser()
    add_arguments(parser, TrainConfig)
    cfg = parse_config(parser, ["--resume", "auto", "--checkpoint_dir", "ck3"], TrainConfig)
    check_train_paths(cfg)  # before the checkpoint is read: not the default folder's business
    with pytest.raises(UserError, match="--overwrite_output_dir"):  # a new run there: refused up front
        check_train_paths(parse_config(parser, ["--checkpoint_dir", "ck4"], TrainConfig))
    restored = dataclasses.replace(cfg, output_dir="final3")  # what the checkpoint's settings say
    check_train_paths(restored, settings_known=True)  # empty: fine
    other_runs_export(tmp_path / "final3", tmp_path / "elsewhere")
    with pytest.raises(UserError, match="exported by an earlier run"):
        check_train_paths(restored, settings_known=True)


def test_an_export_that_appears_during_a_run_is_not_replaced(tmp_path, capsys, tone_corpus, tiny_model_dir):
    """Two runs given one --output_dir (other checkpoint folders) both start while it is empty; the one
    that ends second keeps the other's model there and says where its own weights are."""
    import time

    from vits_trainer.training.loop import Trainer
    from vits_trainer.training.session import build_session

    out = tmp_path / "shared"
    cfg = tiny_config(
        tmp_path, tone_corpus, tiny_model_dir, max_steps=1, val_fraction=0.0, output_dir=str(out)
    )
    check_train_paths(cfg)
    session = build_session(cfg, time.time())
    other_runs_export(out, tmp_path / "other_checkpoints")  # the other run ended first
    before = snapshot(out)
    summary = Trainer(session).train()
    assert summary["final_model"] is None
    assert_unchanged(out, before)
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("error:"))
    assert "now holds a model exported by the run of --checkpoint_dir" in line
    assert "the last good checkpoint is" in line and "step_00000001" in line


def test_failed_input_checks_leave_no_folder_behind(tmp_path, tiny_model_dir):
    import time

    from vits_trainer.training.session import build_session

    data = tmp_path / "data"
    (data / "wavs").mkdir(parents=True)
    import numpy as np
    import soundfile as sf

    for clip_id in ("a", "b"):  # readable audio, but text with no character of the model's vocabulary
        sf.write(data / "wavs" / f"{clip_id}.wav", np.zeros(16000, np.float32) + 0.1, 16000, subtype="PCM_16")
    (data / "metadata.csv").write_text("a|ЖЖЖ|0\nb|ЩЩЩ|0\n", encoding="utf-8")
    before = snapshot(tmp_path)
    cfg = tiny_config(tmp_path, data, tiny_model_dir)
    with pytest.raises(UserError, match="no usable training clips"):
        build_session(cfg, time.time())
    assert_unchanged(tmp_path, before)


def test_a_project_moved_or_copied_whole_keeps_its_own_exports(tmp_path):
    """The export marker names the checkpoint dir that wrote the folder, and where it is from the folder:
    a project moved (or copied) whole and resumed inside it redoes its own export without
    --overwrite_output_dir, as before the move; another run's export is still refused."""
    import shutil

    from vits_trainer.safety import check_own_export, write_marker

    project = tmp_path / "A"
    checkpoints, final = project / "training" / "checkpoints", project / "training" / "final_model"
    (checkpoints / "step_00000005").mkdir(parents=True)
    for folder in (final, checkpoints / "best_model"):
        folder.mkdir()
        (folder / "config.json").write_text("{}", encoding="utf-8")
        write_marker(folder, "final", checkpoints, 5)
    shutil.copytree(project, tmp_path / "copy")
    project.rename(tmp_path / "B")
    for moved in (tmp_path / "B", tmp_path / "copy"):
        checkpoints, final = moved / "training" / "checkpoints", moved / "training" / "final_model"
        check_output_dir(str(final), str(checkpoints), False, "auto")
        check_own_export(final, checkpoints, "--output_dir")
        check_own_export(checkpoints / "best_model", checkpoints, "best_model")
    # the copy's export is not the moved project's, and a fresh run does not replace it unasked
    moved, copy = tmp_path / "B" / "training" / "checkpoints", tmp_path / "copy" / "training" / "final_model"
    with pytest.raises(UserError, match="holds a model exported by an earlier run"):
        check_output_dir(str(copy), str(moved), False, "auto")
    with pytest.raises(UnsafeOverwrite, match="now holds a model exported by"):
        check_own_export(copy, moved, "--output_dir")
    with pytest.raises(UserError, match="holds a model exported by an earlier run"):
        check_output_dir(str(copy), str(copy.parent / "checkpoints"), False, "none")


def test_only_a_checkpoint_folder_makes_a_resume_of_the_runs_own_export(tmp_path):
    """What counts as a checkpoint is what a resume can find (list_checkpoints): a half-written
    `step_NNNNNNNN` (no manifest yet) does, as before; a `step_*` name of something else (`step_notes/`,
    a file) does not, so a fresh run there may not replace the run's earlier export unasked (the glob
    `step_*` took it for a checkpoint to continue)."""
    from vits_trainer.safety import write_marker
    from vits_trainer.training.config import TrainConfig

    checkpoints, final = tmp_path / "checkpoints", tmp_path / "final_model"
    final.mkdir()
    (final / "config.json").write_text("{}", encoding="utf-8")
    write_marker(final, "final", checkpoints, 5)
    (checkpoints / "step_notes").mkdir(parents=True)
    (checkpoints / "step_list.txt").write_text("mine", encoding="utf-8")
    (checkpoints / ".step_00000009.tmp-1").mkdir()  # a writer's temp folder
    cfg = TrainConfig(checkpoint_dir=str(checkpoints), output_dir=str(final))
    assert not cfg.may_restore()
    with pytest.raises(UserError, match="holds a model exported by an earlier run"):
        check_output_dir(str(final), str(checkpoints), False, "auto")
    (checkpoints / "step_00000005").mkdir()  # half-written: a resume finds it (and says it is damaged)
    assert cfg.may_restore()
    check_output_dir(str(final), str(checkpoints), False, "auto")


def test_a_failed_set_up_leaves_another_runs_folders_that_appeared_meanwhile(tmp_path):
    """Two runs started under one new folder (runs/exp1 and runs/exp2, runs/ not there yet): the first
    fails its input checks after the second locked its folder and saved a checkpoint there. Removing
    "what did not exist when the block began" took all of runs/, the other run's work and lock too."""
    from vits_trainer.errors import UserError
    from vits_trainer.runlock import LOCK_NAME
    from vits_trainer.safety import remove_created_on_error

    runs = tmp_path / "runs"
    with pytest.raises(UserError), remove_created_on_error([runs / "exp1" / "ckpt"]):
        (runs / "exp1" / "ckpt").mkdir(parents=True)  # this run's own folder
        other = runs / "exp2" / "ckpt"
        (other / "step_00000100").mkdir(parents=True)  # the other run, meanwhile
        (other / "step_00000100" / "manifest.json").write_text("{}")
        (other / LOCK_NAME).write_text("{}")
        raise UserError("bad input")
    assert (other / "step_00000100" / "manifest.json").is_file() and (other / LOCK_NAME).is_file()
    assert not (runs / "exp1").exists()  # this run's empty folders still go

    alone = tmp_path / "alone"
    with pytest.raises(UserError), remove_created_on_error([alone / "ckpt"]):
        (alone / "ckpt" / "cache").mkdir(parents=True)
        (alone / "ckpt" / "cache" / "index.json").write_text("{}")  # files of its own: all removed
        raise UserError("bad input")
    assert not alone.exists()


def test_a_file_named_as_a_checkpoint_is_none(tmp_path):
    # only a folder is a checkpoint a resume can read: a file of that name made a fresh run a resume
    from vits_trainer.training.checkpoint_names import list_checkpoints
    from vits_trainer.training.config import TrainConfig

    (tmp_path / "step_00000007").write_text("mine", encoding="utf-8")
    assert list_checkpoints(tmp_path) == []
    assert not TrainConfig(checkpoint_dir=str(tmp_path)).may_restore()
    (tmp_path / "step_00000003").mkdir()
    assert list_checkpoints(tmp_path) == [tmp_path / "step_00000003"]
