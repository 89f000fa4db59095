"""`python prepare_data.py ...` as a subprocess: bad input is one `error:` line, no traceback, nothing written."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_prepare_fixtures import (
    output_rows,
    run_prepare,
    skipped_reasons,
    speech,
    vocab_model_dir,
    write_audio,
)

from vits_trainer.data.prepare import format_summary
from vits_trainer.errors import UserError

ROOT = Path(__file__).resolve().parent.parent


def cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT))
    return subprocess.run(
        [sys.executable, str(ROOT / "prepare_data.py"), *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd or ROOT,
        timeout=120,
    )


def assert_one_error_line(proc: subprocess.CompletedProcess, contains: str) -> None:
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error:") and contains in lines[0], lines[0]
    assert "Traceback" not in proc.stderr + proc.stdout


@pytest.fixture()
def small_pairs(tmp_path):
    src = tmp_path / "pairs"
    for i in range(3):
        write_audio(src / f"p{i}.wav", speech("abc def", 22050), 22050)
        (src / f"p{i}.txt").write_text(f"clip {i}", encoding="utf-8")
    return src


def test_successful_run(tmp_path, small_pairs):
    out = tmp_path / "training"
    proc = cli("--source", str(small_pairs), "--data_dir", str(out), "--num_workers", "2")
    assert proc.returncode == 0, proc.stderr
    assert "kept 3 of 3 rows" in proc.stdout
    assert output_rows(out) == {f"p{i}": (f"clip {i}", "0") for i in range(3)}
    assert (out / "prepare_report.json").is_file()


@pytest.mark.parametrize(
    ("args", "contains"),
    [
        (["--source", "{tmp}/nope"], "no such file or folder"),
        (["--source", "{src}", "--format", "mp4"], "invalid choice"),
        (["--source", "{src}", "--sample_rate", "0"], "--sample_rate"),
        (["--source", "{src}", "--min_seconds", "30", "--max_seconds", "20"], "greater than --max_seconds"),
        (["--source", "{tmp}/empty"], "could not detect the format"),
        (
            ["--source", "{src}", "--data_dir", "{tmp}/blocker/training"],
            "cannot be created ({tmp}/blocker is a file): choose another --data_dir",
        ),
        # an existing file: what to do, not only what is wrong
        (
            ["--source", "{src}", "--data_dir", "{tmp}/blocker"],
            "exists and is a file, not a folder: choose another --data_dir (a folder",
        ),
        (["--source", "someone/not-cached-dataset"], "hub"),
        (["--data_dir", "{tmp}/out"], "--source"),
        # an archive: unpack it, not --format (no format reads inside one)
        (["--source", "{tmp}/corpus.zip"], "an archive (.zip); unpack it (unzip "),
        # one clip: what to pass instead, not --format (no format reads a lone clip)
        (
            ["--source", "{src}/p0.wav"],
            "pass the folder that holds it and its transcript (p0.txt beside p0.wav)",
        ),
        # one clip's transcript: the folder, not a table whose header is the sentence
        (
            ["--source", "{src}/p0.txt"],
            "the transcript of one clip (p0.wav beside it), not a corpus; pass the folder",
        ),
        (
            ["--source", "{src}", "--text_column", "t", "--split", "dev"],
            "--text_column, --split: not used by the pairs layout",
        ),
    ],
)
def test_bad_input_is_one_error_line_and_writes_nothing(tmp_path, small_pairs, args, contains):
    (tmp_path / "empty").mkdir()
    (tmp_path / "blocker").write_text("a file, not a folder", encoding="utf-8")
    (tmp_path / "corpus.zip").write_bytes(b"PK\x05\x06" + bytes(18))  # an empty zip archive
    args = [a.format(tmp=tmp_path, src=small_pairs) for a in args]
    contains = contains.format(tmp=tmp_path)
    if "--data_dir" not in args:
        args += ["--data_dir", str(tmp_path / "out")]
    proc = cli(*args)
    assert_one_error_line(proc, contains)
    assert not (tmp_path / "out").exists()


def test_a_folder_of_clips_and_its_table_is_read_through_the_table(tmp_path):
    src = tmp_path / "corpus"
    for i in range(2):
        write_audio(src / "wavs" / f"c{i}.wav", speech("abc def", 22050), 22050)
    (src / "metadata.csv").write_text("file,text\nwavs/c0.wav,clip zero\nwavs/c1.wav,clip one\n", "utf-8")
    proc = cli("--source", str(src), "--data_dir", str(tmp_path / "out"))
    assert proc.returncode == 0, proc.stderr
    assert output_rows(tmp_path / "out") == {"wavs_c0": ("clip zero", "0"), "wavs_c1": ("clip one", "0")}
    assert sum(line.startswith("note:") and "metadata.csv" in line for line in proc.stdout.splitlines()) == 1
    (src / "other.tsv").write_text("path\tsentence\n", encoding="utf-8")
    proc = cli("--source", str(src), "--data_dir", str(tmp_path / "out2"))
    assert_one_error_line(proc, "metadata.csv, other.tsv")
    assert not (tmp_path / "out2").exists()


def test_format_csv_with_a_folder_reads_its_only_table_or_names_the_tables(tmp_path):
    src = tmp_path / "corpus"
    for i in range(2):
        write_audio(src / "wavs" / f"c{i}.wav", speech("abc def", 22050), 22050)
    (src / "metadata.csv").write_text("file,text\nwavs/c0.wav,clip zero\nwavs/c1.wav,clip one\n", "utf-8")
    proc = cli("--source", str(src), "--format", "csv", "--data_dir", str(tmp_path / "out"))
    assert proc.returncode == 0, proc.stderr
    assert output_rows(tmp_path / "out") == {"wavs_c0": ("clip zero", "0"), "wavs_c1": ("clip one", "0")}
    assert any(line.startswith("note:") and "metadata.csv" in line for line in proc.stdout.splitlines())
    (src / "other.tsv").write_text("path\tsentence\n", encoding="utf-8")
    proc = cli("--source", str(src), "--format", "csv", "--data_dir", str(tmp_path / "out2"))
    assert_one_error_line(proc, "metadata.csv, other.tsv; pass the one listing the clips as --source")
    assert not (tmp_path / "out2").exists()
    empty = tmp_path / "no_table"
    write_audio(empty / "a.wav", speech("abc", 22050), 22050)
    proc = cli("--source", str(empty), "--format", "csv", "--data_dir", str(tmp_path / "out3"))
    assert_one_error_line(proc, "no .csv/.tsv table")
    assert not (tmp_path / "out3").exists()


def test_rows_past_max_samples_are_filtered_not_dropped_for_their_characters(tmp_path):
    # with --drop_unknown_chars, a row after --max_samples was reached was reported as dropped for its
    # characters (and its characters counted), though --max_samples left it out whatever its text
    model = vocab_model_dir(tmp_path, rate=16000)
    src = tmp_path / "pairs"
    texts = {"a1": "abc", "a2": "abc xy", "a3": "abc", "a4": "zzz", "a5": "abc d"}
    for stem, text in texts.items():
        write_audio(src / f"{stem}.wav", speech(rate=16000), 16000)
        (src / f"{stem}.txt").write_text(text, encoding="utf-8")
    out = tmp_path / "out"
    proc = cli(
        "--source", str(src), "--data_dir", str(out), "--model_name", str(model),
        "--drop_unknown_chars", "--max_samples", "2", "--no_progress",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert set(output_rows(out)) == {"a1", "a3"}
    assert skipped_reasons(out) == {"a2": "unknown_chars"}
    lines = proc.stdout.splitlines()
    assert "  skipped 1: unknown_chars 1" in lines, lines
    assert "  filtered 2: filtered_max_samples 2" in lines, lines
    vocab_line = next(line for line in lines if "not in the model's vocabulary" in line)
    assert vocab_line.endswith("'x' 1, 'y' 1"), vocab_line


def test_a_table_beside_transcribed_clips_is_named_in_a_note_as_not_read(tmp_path):
    src = tmp_path / "pairs"
    for i in range(2):
        write_audio(src / f"a{i}.wav", speech("abc def", 22050), 22050)
        (src / f"a{i}.txt").write_text(f"pair {i}", encoding="utf-8")
    (src / "metadata.csv").write_text("file,text\na0.wav,table 0\na1.wav,table 1\n", encoding="utf-8")
    (src / "._metadata.csv").write_bytes(b"\0\5\26\7 Mac OS X")  # macOS's AppleDouble file: no table
    proc = cli("--source", str(src), "--data_dir", str(tmp_path / "out"), "--no_progress")
    assert proc.returncode == 0, proc.stderr
    assert output_rows(tmp_path / "out") == {"a0": ("pair 0", "0"), "a1": ("pair 1", "0")}
    notes = [line for line in proc.stdout.splitlines() if line.startswith("note:") and "metadata.csv" in line]
    assert len(notes) == 1 and "._metadata.csv" not in notes[0], proc.stdout
    assert ".txt" in notes[0] and "not read" in notes[0] and "--source" in notes[0], notes


def test_a_wavs_folder_given_names_the_table_above_it_but_no_hidden_file(tmp_path):
    src = tmp_path / "lj"
    write_audio(src / "wavs" / "a.wav", speech("abc", 16000), 16000)
    (src / "metadata.csv").write_text("a|some text\n", encoding="utf-8")
    (src / "._metadata.csv").write_bytes(b"\0\5\26\7 Mac OS X")  # macOS's AppleDouble file: no table
    proc = cli("--source", str(src / "wavs"), "--data_dir", str(tmp_path / "out"), "--no_progress")
    assert_one_error_line(proc, f"Are the transcripts in {src / 'metadata.csv'}? Pass it as --source")
    (src / "metadata.csv").unlink()  # only the hidden file is left: no table to name
    proc = cli("--source", str(src / "wavs"), "--data_dir", str(tmp_path / "out2"), "--no_progress")
    assert_one_error_line(proc, "no usable clips (missing_text 1)")
    assert "Are the transcripts" not in proc.stderr, proc.stderr


def test_a_folder_of_clips_without_transcripts_says_what_to_add(tmp_path):
    # "no usable clips (missing_text 2)" alone: which file each clip lacks was not said
    src = tmp_path / "recordings"
    for name in ("my clip 1", "my clip 2"):
        write_audio(src / f"{name}.wav", speech("abc", 16000), 16000)
    proc = cli("--source", str(src), "--data_dir", str(tmp_path / "out"), "--no_progress")
    assert_one_error_line(proc, "no usable clips (missing_text 2)")
    assert (
        "no clip has an x.txt or x.lab transcript beside it (my clip 1.txt for my clip 1.wav)" in proc.stderr
    )
    assert "pass it as --source" in proc.stderr and "Are the transcripts" not in proc.stderr


def test_output_piped_into_head_ends_without_a_traceback(tmp_path, small_pairs):
    script = (
        f"{shlex.quote(sys.executable)} {shlex.quote(str(ROOT / 'prepare_data.py'))} --source "
        f"{shlex.quote(str(small_pairs))} --data_dir {shlex.quote(str(tmp_path / 'out'))} --no_progress "
        "| head -1; echo rc=${PIPESTATUS[0]}"
    )
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT))
    proc = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert "Traceback" not in proc.stderr and "BrokenPipeError" not in proc.stderr, proc.stderr
    assert proc.stdout.splitlines()[-1] in ("rc=141", "rc=0"), proc.stdout  # 0: all written before head left


def test_no_surviving_row_fails_but_writes_the_report(tmp_path, small_pairs):
    out = tmp_path / "out"
    proc = cli(
        "--source", str(small_pairs), "--data_dir", str(out), "--min_seconds", "10", "--max_seconds", "20"
    )
    assert_one_error_line(proc, "no usable clips (too_short 3)")
    assert (out / "prepare_report.json").is_file() and not (out / "metadata.csv").exists()
    # no row kept: no empty "speakers (0): " or "characters (0): " line, as no audio: line
    assert not any(line.rstrip().endswith(":") for line in proc.stdout.splitlines()), proc.stdout
    assert "speakers (" not in proc.stdout and "characters (" not in proc.stdout, proc.stdout


@pytest.mark.parametrize(("table", "fmt"), [("list.csv", "csv"), ("metadata.csv", "ljspeech")])
def test_a_table_that_lists_no_clip_says_so(tmp_path, table, fmt):
    # a header row alone (or an empty metadata.csv) ended in "no usable clips (none)"
    src = tmp_path / "corpus"
    write_audio(src / "wavs" / "a.wav", speech("abc def", 22050), 22050)
    (src / table).write_text("file,text\n" if fmt == "csv" else "", encoding="utf-8")
    given = src / table if fmt == "csv" else src
    proc = cli("--source", str(given), "--format", fmt, "--data_dir", str(tmp_path / "out"), "--no_progress")
    assert_one_error_line(proc, f"no usable clips: {given} (read as {fmt}) lists no clip")
    assert "(none)" not in proc.stderr


def test_no_surviving_row_claims_no_character_is_in_the_vocabulary(tmp_path, small_pairs):
    # the texts have a 'p' the model lacks; with no row kept, none was checked against the vocabulary
    out = tmp_path / "out"
    model = vocab_model_dir(tmp_path, rate=16000)
    proc = cli(
        "--source", str(small_pairs), "--data_dir", str(out), "--model_name", str(model),
        "--min_seconds", "10", "--max_seconds", "20", "--no_progress",
    )  # fmt: skip
    assert_one_error_line(proc, "no usable clips (too_short 3)")
    assert "every character" not in proc.stdout, proc.stdout
    assert "  no row kept: no character checked against the model's vocabulary" in proc.stdout.splitlines()


def test_drop_unknown_chars_with_no_row_left_by_speaker_says_none_was_checked(tmp_path, small_pairs):
    # --speaker left no row to check; "every character is in the model's vocabulary" was claimed
    model = vocab_model_dir(tmp_path, rate=16000)
    proc = cli(
        "--source", str(small_pairs), "--data_dir", str(tmp_path / "out"), "--model_name", str(model),
        "--drop_unknown_chars", "--speaker", "bob", "--no_progress",
    )  # fmt: skip
    assert_one_error_line(proc, "--speaker kept no row")
    assert "every character" not in proc.stdout, proc.stdout
    line = "  no row left to check against the model's vocabulary (--speaker left out 3)"
    assert line in proc.stdout.splitlines(), proc.stdout


def test_drop_unknown_chars_dropping_every_row_says_what_to_do(tmp_path):
    # a Kurdish corpus and a model of letters a-o: every row dropped, and the error said only
    # "no usable clips (unknown_chars 2)", where keeping them for --extend_vocab was the way on
    model = vocab_model_dir(tmp_path, rate=16000)
    src = tmp_path / "pairs"
    for stem, text in {"k1": "rojbaş", "k2": "çawa yî"}.items():
        write_audio(src / f"{stem}.wav", speech(rate=16000), 16000)
        (src / f"{stem}.txt").write_text(text, encoding="utf-8")
    proc = cli(
        "--source", str(src), "--data_dir", str(tmp_path / "out"), "--model_name", str(model),
        "--drop_unknown_chars", "--no_progress",
    )  # fmt: skip
    assert_one_error_line(
        proc,
        "--drop_unknown_chars dropped 2 row(s) for characters the model's vocabulary lacks: leave it out "
        "to keep them (train_vits.py --extend_vocab adds the characters)",
    )


@pytest.mark.parametrize(("config", "expected"), [("[1, 2]", "holds a JSON list"), ("{", "cannot be read")])
def test_a_model_whose_config_json_is_no_json_object_is_one_error_line(
    tmp_path, small_pairs, config, expected
):
    # --model_name with such a config.json ended in a traceback (AttributeError, JSONDecodeError)
    model = vocab_model_dir(tmp_path)
    (model / "config.json").write_text(config, encoding="utf-8")
    proc = cli("--source", str(small_pairs), "--data_dir", str(tmp_path / "out"), "--model_name", str(model))
    assert_one_error_line(proc, f"--model_name {model}: its config.json {expected}")
    assert not (tmp_path / "out").exists()


def test_help_shows_defaults():
    proc = cli("--help")
    assert proc.returncode == 0
    text = " ".join(proc.stdout.split())
    for default in [
        "(default: auto)",
        "(default: training)",
        "(default: 0.5)",
        "(default: 20.0)",
        "(default: 0)",
    ]:
        assert default in text


def _children(pid: int) -> set[int]:
    found: set[int] = set()
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found |= {int(c) for c in (task / "children").read_text().split()}
        except OSError:
            pass
    return found


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_a_run_stopped_alone_leaves_no_worker_and_a_rerun_goes_on(tmp_path, sig):
    """A job manager or `kill PID` signals the main process alone. Its conversion workers converted on,
    kept the folder's lock (inherited at fork), and the re-run was refused twice: the lock, then the
    WAVs written but never recorded."""
    src, out = tmp_path / "pairs", tmp_path / "out"
    for i in range(80):
        write_audio(src / f"p{i:02d}.wav", speech("abc def gh", 44100, seconds=4.0), 44100)
        (src / f"p{i:02d}.txt").write_text(f"clip {i}", encoding="utf-8")
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT))
    args = ["--source", str(src), "--data_dir", str(out), "--no_progress"]
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "prepare_data.py"), *args, "--num_workers", "2"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while proc.poll() is None and not any((out / "wavs").glob("p*.wav")) and time.monotonic() < deadline:
        time.sleep(0.01)
    workers = _children(proc.pid)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    assert "Traceback" not in err, err
    if sig == signal.SIGTERM and proc.returncode != 0:  # 0: it had finished before the signal
        assert proc.returncode == 130 and err.strip().splitlines()[-1] == "interrupted", err
    deadline = time.monotonic() + 30
    while any(Path(f"/proc/{w}").exists() for w in workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [w for w in workers if Path(f"/proc/{w}").exists()], "a worker outlived the main process"

    rerun = cli(*args)
    assert rerun.returncode == 0, rerun.stderr
    assert len(output_rows(out)) == 80


@pytest.mark.parametrize("given", ["table", "folder"])
def test_a_source_table_that_cannot_be_read_is_one_error_line(tmp_path, monkeypatch, capsys, given):
    # permission denied on the --source table was a traceback; on an LJSpeech folder's metadata.csv the
    # folder was read as audio + .txt pairs, "no usable clips ... Are the transcripts in metadata.csv?"
    import builtins

    import prepare_data
    from vits_trainer.data.synthetic import make_corpus
    from vits_trainer.errors import run_cli

    make_corpus(tmp_path / "lj", num_clips=2)
    meta = tmp_path / "lj" / "metadata.csv"
    if given == "table":
        meta = tmp_path / "lj" / "list.csv"
        meta.write_text("file_name,text\nwavs/x.wav,hello\n", encoding="utf-8")
    real_open = builtins.open

    def refusing(path, *args, **kwargs):  # as a file without read permission (root reads any)
        if Path(path) == meta:
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", refusing)

    def read_bytes(self):
        with refusing(self, "rb") as f:
            return f.read()

    monkeypatch.setattr(Path, "read_bytes", read_bytes)
    source = meta if given == "table" else meta.parent
    code = run_cli(prepare_data.main, ["--source", str(source), "--data_dir", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith(f"error: {meta}: cannot be read (Permission denied)"), err
    assert not (tmp_path / "out").exists()


def test_the_summary_leaves_out_counts_of_zero(tmp_path, small_pairs):
    # "skipped 0: -" and "(0 converted, 0 reused from an earlier run)" were printed where other
    # lines of nothing (filtered, warnings) are left out
    out = tmp_path / "out"
    _, lines = run_prepare(small_pairs, out)
    assert f"kept 3 of 3 rows in {out} (3 converted)" in lines[-1].splitlines(), lines
    assert "skipped" not in lines[-1], lines
    _, lines = run_prepare(small_pairs, out)
    assert f"kept 3 of 3 rows in {out} (3 reused from an earlier run)" in lines[-1].splitlines(), lines
    none = tmp_path / "none"
    with pytest.raises(UserError, match="no usable clips"):
        run_prepare(small_pairs, none, min_seconds=10.0, max_seconds=20.0)
    report = json.loads((none / "prepare_report.json").read_text(encoding="utf-8"))
    lines = format_summary(report, none).splitlines()
    assert lines[:2] == [f"kept 0 of 3 rows in {none}", "  skipped 3: too_short 3"], lines
