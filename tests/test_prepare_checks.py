"""Row checks (every skip reason), text/id rules, filters, vocabulary, trimming and the incremental re-run."""

from __future__ import annotations

import json
import os
import re

import numpy as np
import pytest
import soundfile as sf
from test_prepare_fixtures import (
    output_rows,
    run_prepare,
    skipped_reasons,
    speech,
    vocab_model_dir,
    write_audio,
)

from vits_trainer.data.prepare import prepare
from vits_trainer.data.prepare_checks import clean_text, safe_id, validate_settings
from vits_trainer.data.prepare_settings import PrepareSettings
from vits_trainer.data.prepare_state import STATE_NAME
from vits_trainer.errors import UserError

RATE = 22050


def _ljspeech(root, rows: list[str]) -> None:
    (root / "wavs").mkdir(parents=True, exist_ok=True)
    (root / "metadata.csv").write_text("\n".join(rows) + "\n", encoding="utf-8")


@pytest.fixture()
def messy_corpus(tmp_path):
    """An LJSpeech folder with one row of every kind of problem, plus good and warned rows."""
    src = tmp_path / "messy"
    wavs = src / "wavs"
    good = speech("abc def", RATE)
    write_audio(wavs / "good1.wav", good, RATE)
    write_audio(wavs / "good2.wav", speech("gh ij", RATE), RATE)
    write_audio(wavs / "dup.wav", good, RATE)
    write_audio(wavs / "a b.wav", good, RATE)
    write_audio(wavs / "a_b.wav", good, RATE)
    (wavs / "corrupt.wav").write_bytes(b"RIFF$\x00\x00\x00WAVEfmt " + os.urandom(200))
    (wavs / "empty.wav").write_bytes(b"")
    (wavs / "textfile.wav").write_text("just some words", encoding="utf-8")
    write_audio(wavs / "short.wav", speech("a", RATE, seconds=0.0)[: int(0.2 * RATE)], RATE)
    write_audio(wavs / "long.wav", np.tile(good, 30), RATE)
    write_audio(wavs / "silent.wav", np.zeros(RATE, dtype=np.float32), RATE)
    write_audio(wavs / "hiss.wav", 1e-4 * np.random.default_rng(0).standard_normal(RATE), RATE)
    nan = good.copy()
    nan[100] = np.nan
    write_audio(wavs / "nan.wav", nan, RATE, "FLOAT")
    clipped = np.clip(good * 20, -1, 1)
    write_audio(wavs / "clipped.wav", clipped, RATE, "FLOAT")
    write_audio(wavs / "emptytext.wav", good, RATE)
    write_audio(wavs / "blank.wav", good, RATE)
    _ljspeech(
        src,
        [
            "good1|abc def",
            "good2|  gh \t ij  ",
            "dup|first copy",
            "dup|second copy",
            "a b|space id",
            "a_b|collides after sanitizing",
            "corrupt|x",
            "empty|x",
            "textfile|x",
            "missing|x",
            "short|x",
            "long|x",
            "silent|x",
            "hiss|x",
            "nan|x",
            "clipped|x",
            "emptytext|",
            "blank|   ",
            "only_one_field",
            "a|b|c|d",
        ],
    )
    return src


def test_every_bad_row_is_skipped_and_reported(tmp_path, messy_corpus):
    result, lines = run_prepare(messy_corpus, tmp_path / "out")
    rows = output_rows(tmp_path / "out")
    assert rows == {
        "good1": ("abc def", "0"),
        "good2": ("gh ij", "0"),
        "dup": ("first copy", "0"),
        "a_b": ("space id", "0"),
        "a_b_c311a49b": ("collides after sanitizing", "0"),  # another source id: its digest keeps it apart
        "clipped": ("x", "0"),
    }
    reasons = skipped_reasons(tmp_path / "out")
    assert reasons == {
        "dup": "duplicate_id",
        "corrupt": "unreadable_audio",
        "empty": "empty_audio",
        "textfile": "unreadable_audio",
        "missing": "missing_audio",
        "short": "too_short",
        "long": "too_long",
        "silent": "silent",
        "hiss": "silent",
        "nan": "nan_or_inf",
        "emptytext": "empty_text",
        "blank": "empty_text",
        "only_one_field": "malformed_row",
        "a": "malformed_row",
    }
    report = json.loads(result.report_path.read_text(encoding="utf-8"))
    assert report["counts"]["kept"] == 6 and report["counts"]["skipped"] == 14
    assert sum(report["counts"]["skipped_by_reason"].values()) == 14
    assert [w["id"] for w in report["warnings"]] == ["clipped"]
    assert report["warnings"][0]["warning"] == "clipping"
    by_origin = {s["origin"]: s["reason"] for s in report["skipped_rows"]}
    assert by_origin["metadata.csv:4"] == "duplicate_id" and by_origin["metadata.csv:19"] == "malformed_row"
    assert report["settings"]["min_seconds"] == 0.5 and report["settings"]["resolved_sample_rate"] == 16000
    assert report["durations"]["total_hours"] > 0 and report["speakers"] == {"0": 6}
    assert report["characters"][" "] >= 3
    summary = "\n".join(lines)
    assert "kept 6 of 20 rows" in summary and "duplicate_id 1" in summary and "clipping 1" in summary
    # Every WAV written is listed: nothing half-made or unlisted in wavs/.
    assert sorted(p.stem for p in (tmp_path / "out" / "wavs").iterdir()) == sorted(rows)


def test_text_rules_and_lowercase(tmp_path):
    src = tmp_path / "t"
    for name in ["nfc", "pipe", "newline", "upper", "tabs"]:
        write_audio(src / f"{name}.wav", speech(rate=16000), 16000)
    decomposed = "Cafe\u0301  au   lait"  # e + combining acute: NFC makes it one character
    (src / "list.csv").write_text(
        "path,text\n"
        f"nfc.wav,{decomposed}\n"
        'pipe.wav,"a|b"\n'
        'newline.wav,"line one\nline two"\n'
        "upper.wav,ÀB Cd\n"
        'tabs.wav,"\tx\t y "\n',
        encoding="utf-8",
    )
    run_prepare(src / "list.csv", tmp_path / "out", lowercase=True)
    assert output_rows(tmp_path / "out") == {
        "nfc": ("café au lait", "0"),
        "upper": ("àb cd", "0"),
        "tabs": ("x y", "0"),
    }
    assert skipped_reasons(tmp_path / "out") == {"pipe": "text_has_pipe", "newline": "text_has_newline"}


def test_clean_text_and_safe_id_units():
    assert clean_text("  a\u00a0 b  ") == ("a b", None, "")
    assert clean_text("x\u2028y")[1] == "text_has_newline"
    assert clean_text("ABC", lowercase=True)[0] == "abc"
    assert safe_id("spk 1/utt#2.flac") == "spk_1_utt_2.flac"
    assert safe_id(".hidden") == "_hidden"
    long_a, long_b = safe_id("x" * 300 + "a"), safe_id("x" * 300 + "b")
    assert len(long_a) <= 120 and long_a != long_b


def test_ids_sanitized_in_output(tmp_path):
    src = tmp_path / "t"
    write_audio(src / "dir one" / "utt#1.wav", speech(rate=16000), 16000)
    (src / "list.csv").write_text("path,text\ndir one/utt#1.wav,hello\n", encoding="utf-8")
    run_prepare(src / "list.csv", tmp_path / "out")
    assert output_rows(tmp_path / "out") == {"dir_one_utt_1": ("hello", "0")}
    assert (tmp_path / "out" / "wavs" / "dir_one_utt_1.wav").is_file()


def _speaker_table(tmp_path, n=6):
    src = tmp_path / "spk"
    lines = ["path,text,speaker"]
    for i in range(n):
        write_audio(src / f"u{i}.wav", speech(rate=16000), 16000)
        lines.append(f"u{i}.wav,text {i},s{i % 3}")
    (src / "list.csv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return src / "list.csv"


def test_speaker_and_max_samples_filters_are_counted_not_errors(tmp_path):
    table = _speaker_table(tmp_path)
    result, lines = run_prepare(
        table, tmp_path / "out", speaker_column="speaker", speakers=["s0", "s1"], max_samples=3
    )
    assert output_rows(tmp_path / "out") == {
        "u0": ("text 0", "s0"),
        "u1": ("text 1", "s1"),
        "u3": ("text 3", "s0"),
    }
    counts = result.report["counts"]
    assert counts["filtered_by_reason"] == {"filtered_speaker": 2, "filtered_max_samples": 1}
    assert counts["skipped"] == 0 and result.report["skipped_rows"] == []
    assert any("filtered 3" in line for line in lines)

    with pytest.raises(UserError) as err:  # a --speaker that names none of them says so, with theirs
        run_prepare(table, tmp_path / "none", speaker_column="speaker", speakers=["zzz"])
    assert "filtered_speaker 6" in str(err.value)
    assert "--speaker kept no row: the source's speakers are s0, s1, s2" in str(err.value)


def test_a_rejected_row_leaves_its_id_to_a_later_usable_one(tmp_path):
    src = tmp_path / "lj"
    write_audio(src / "wavs" / "a.wav", speech(rate=16000), 16000)
    (src / "metadata.csv").write_text("a|\na|the text\n", encoding="utf-8")
    run_prepare(src, tmp_path / "out")
    assert output_rows(tmp_path / "out") == {"a": ("the text", "0")}


def test_model_sets_rate_and_unknown_characters_are_counted_or_dropped(tmp_path):
    model = vocab_model_dir(tmp_path)
    src = tmp_path / "pairs"
    for stem, text in {"ok": "ABC def", "odd": "abc xyz!", "accent": "café"}.items():
        write_audio(src / f"{stem}.wav", speech(rate=16000), 16000)
        (src / f"{stem}.txt").write_text(text, encoding="utf-8")
    result, lines = run_prepare(src, tmp_path / "keep", model_name=str(model))
    assert set(output_rows(tmp_path / "keep")) == {"ok", "odd", "accent"}
    assert sf.info(tmp_path / "keep" / "wavs" / "ok.wav").samplerate == 22050
    # Upper case is fine (the tokenizer lower-cases); x, y, z, '!' and é are not in the vocabulary.
    assert result.report["unknown_characters"] == {"x": 1, "y": 1, "z": 1, "!": 1, "é": 1}
    assert any("not in the model's vocabulary" in line for line in lines)
    # both ways out: leave the rows out, or teach the model the characters
    assert any("--drop_unknown_chars" in line and "--extend_vocab" in line for line in lines), lines

    result, _ = run_prepare(src, tmp_path / "drop", model_name=str(model), drop_unknown_chars=True)
    assert set(output_rows(tmp_path / "drop")) == {"ok"}
    assert skipped_reasons(tmp_path / "drop") == {"odd": "unknown_chars", "accent": "unknown_chars"}
    # the characters of the rows dropped for them
    assert result.report["unknown_characters"] == {"x": 1, "y": 1, "z": 1, "!": 1, "é": 1}


def test_unknown_characters_are_those_of_the_rows_kept(tmp_path):
    """Counted before the audio checks, they took in rows then skipped (a missing WAV, a clip too long),
    and disagreed with the character inventory printed above them."""
    model = vocab_model_dir(tmp_path)
    src = tmp_path / "pairs"
    write_audio(src / "ok.wav", speech(rate=16000), 16000)
    (src / "ok.txt").write_text("abc z", encoding="utf-8")
    write_audio(src / "long.wav", speech(rate=16000, seconds=25.0), 16000)
    (src / "long.txt").write_text("zzz yyy", encoding="utf-8")
    result, _ = run_prepare(src, tmp_path / "out", model_name=str(model))
    assert set(output_rows(tmp_path / "out")) == {"ok"}
    assert result.report["characters"]["z"] == 1
    assert result.report["unknown_characters"] == {"z": 1}


def test_sample_rate_disagreeing_with_model_is_an_error(tmp_path):
    model = vocab_model_dir(tmp_path)
    with pytest.raises(UserError, match="disagrees"):
        run_prepare(tmp_path, tmp_path / "out", model_name=str(model), sample_rate=16000)
    assert not (tmp_path / "out").exists()


def test_trim_silence_before_duration_check(tmp_path):
    src = tmp_path / "pairs"
    voice = speech("abc de fg", RATE, seconds=0.0)
    padded = np.concatenate([np.zeros(RATE, np.float32), voice, np.zeros(RATE, np.float32)])
    write_audio(src / "p.wav", padded, RATE)
    (src / "p.txt").write_text("abc de fg", encoding="utf-8")
    run_prepare(src, tmp_path / "plain")
    run_prepare(src, tmp_path / "trim", trim_silence=True, trim_top_db=30)
    plain = sf.info(tmp_path / "plain" / "wavs" / "p.wav").duration
    trimmed = sf.info(tmp_path / "trim" / "wavs" / "p.wav").duration
    assert plain == pytest.approx(len(padded) / RATE, abs=1e-3)
    assert trimmed < len(voice) / RATE + 0.1
    with pytest.raises(UserError):
        run_prepare(src, tmp_path / "trim_short", trim_silence=True, min_seconds=2.0)
    assert skipped_reasons(tmp_path / "trim_short") == {"p": "too_short"}


def test_no_surviving_row_is_an_error_but_the_report_is_written(tmp_path):
    src = tmp_path / "pairs"
    write_audio(src / "s.wav", np.zeros(RATE, np.float32), RATE)
    (src / "s.txt").write_text("silence", encoding="utf-8")
    with pytest.raises(UserError, match="no usable clips.*silent 1"):
        run_prepare(src, tmp_path / "out")
    assert skipped_reasons(tmp_path / "out") == {"s": "silent"}
    assert not (tmp_path / "out" / "metadata.csv").exists()


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("sample_rate", 0, "--sample_rate"),
        ("sample_rate", -16000, "--sample_rate"),
        ("sample_rate", 1, "between 4000 and 192000 Hz"),  # wrote 1 Hz WAVs
        ("min_seconds", float("nan"), "--min_seconds must be a number"),  # every comparison false
        ("min_seconds", 25.0, "greater than --max_seconds"),
        ("max_seconds", 0.0, "--max_seconds"),
        ("max_samples", -1, "--max_samples"),
        ("trim_top_db", 0.0, "--trim_top_db"),
        ("trim_top_db", float("nan"), "--trim_top_db must be > 0, got nan"),  # trimmed every clip away
    ],
)
def test_bad_settings(field, value, message):
    settings = PrepareSettings(source="x")
    setattr(settings, field, value)
    with pytest.raises(UserError, match=message):
        validate_settings(settings)


def test_unwritable_data_dir_writes_nothing(tmp_path):
    make_src = tmp_path / "pairs"
    write_audio(make_src / "a.wav", speech(rate=16000), 16000)
    (make_src / "a.txt").write_text("abc", encoding="utf-8")
    blocker = tmp_path / "file.txt"
    blocker.write_text("not a folder", encoding="utf-8")
    with pytest.raises(UserError, match="data_dir"):
        run_prepare(make_src, blocker / "training")
    with pytest.raises(UserError, match="source folder"):
        run_prepare(make_src, make_src)
    assert sorted(p.name for p in make_src.iterdir()) == ["a.txt", "a.wav"]


# --- incremental re-run ---------------------------------------------------------------------------------


@pytest.fixture()
def pairs_corpus(tmp_path):
    src = tmp_path / "pairs"
    for i in range(6):
        write_audio(src / f"c{i}.wav", speech("abc def gh", RATE, speaker=i % 2), RATE)
        (src / f"c{i}.txt").write_text(f"clip {i}", encoding="utf-8")
    return src


def test_rerun_reuses_and_reconverts_only_changed_sources(tmp_path, pairs_corpus):
    out = tmp_path / "out"
    first, _ = run_prepare(pairs_corpus, out)
    assert first.report["counts"]["converted"] == 6
    mtimes = {p.name: p.stat().st_mtime_ns for p in (out / "wavs").iterdir()}

    second, lines = run_prepare(pairs_corpus, out)
    assert (second.report["counts"]["converted"], second.report["counts"]["reused"]) == (0, 6)
    assert any("6 reused" in line for line in lines)
    assert {p.name: p.stat().st_mtime_ns for p in (out / "wavs").iterdir()} == mtimes

    write_audio(pairs_corpus / "c2.wav", speech("mno", RATE), RATE)  # a changed source file
    (pairs_corpus / "c3.txt").write_text("new text only", encoding="utf-8")
    third, _ = run_prepare(pairs_corpus, out)
    assert (third.report["counts"]["converted"], third.report["counts"]["reused"]) == (1, 5)
    changed = {p.name for p in (out / "wavs").iterdir() if p.stat().st_mtime_ns != mtimes[p.name]}
    assert changed == {"c2.wav"}
    assert output_rows(out)["c3"] == ("new text only", "0")  # text is always re-read

    fourth, _ = run_prepare(pairs_corpus, out, sample_rate=22050)  # new target settings: all re-made
    assert fourth.report["counts"]["converted"] == 6
    assert sf.info(out / "wavs" / "c0.wav").samplerate == 22050

    (out / "wavs" / "c1.wav").write_bytes(b"damaged")  # a WAV changed behind our back is re-made
    fifth, _ = run_prepare(pairs_corpus, out, sample_rate=22050)
    assert (fifth.report["counts"]["converted"], fifth.report["counts"]["reused"]) == (1, 5)


def test_parallel_run_matches_in_process_run(tmp_path, pairs_corpus):
    run_prepare(pairs_corpus, tmp_path / "one", num_workers=1)
    run_prepare(pairs_corpus, tmp_path / "two", num_workers=2)
    assert (tmp_path / "one" / "metadata.csv").read_bytes() == (
        tmp_path / "two" / "metadata.csv"
    ).read_bytes()
    for wav in (tmp_path / "one" / "wavs").iterdir():
        assert wav.read_bytes() == (tmp_path / "two" / "wavs" / wav.name).read_bytes()
    state = json.loads((tmp_path / "two" / STATE_NAME).read_text(encoding="utf-8"))
    assert set(state["clips"]) == {f"c{i}" for i in range(6)}


def test_a_second_prepare_on_the_same_folder_is_refused_and_touches_nothing(tmp_path, pairs_corpus):
    from vits_trainer.runlock import LOCK_NAME, RunLock

    out = tmp_path / "out"
    run_prepare(pairs_corpus, out)
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    other = RunLock.acquire(out, "--data_dir", log=lambda _: None)  # a prepare_data.py still writing there
    try:
        with pytest.raises(UserError, match=r"--data_dir .* is in use by another run \(pid"):
            run_prepare(pairs_corpus, out, clean=True)
    finally:
        other.release()
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    run_prepare(pairs_corpus, out)  # released: the folder is free again, and no lock file is left behind
    assert not (out / LOCK_NAME).exists()


def test_other_sources_files_are_kept_and_never_replaced(tmp_path, pairs_corpus):
    out = tmp_path / "out"
    (out / "wavs").mkdir(parents=True)
    write_audio(out / "wavs" / "theirs.wav", speech(rate=16000), 16000)
    write_audio(out / "wavs" / "c0.wav", speech(rate=16000), 16000)  # same id as a new clip, not ours
    (out / "metadata.csv").write_text("theirs|their text|0\nc0|old|0\n", encoding="utf-8")
    (out / "wavs" / ".c5.wav.999.tmp").write_bytes(b"half a file from an interrupted run")
    theirs = (out / "wavs" / "c0.wav").read_bytes()

    with pytest.raises(UserError, match="c0.wav would be replaced"):  # refused before any write
        run_prepare(pairs_corpus, out)
    assert (out / "wavs" / "c0.wav").read_bytes() == theirs and not (out / STATE_NAME).exists()
    (out / "wavs" / "c0.wav").rename(tmp_path / "c0.wav")  # the user moves it away
    (out / "prepare_report.json").write_text('{"my": "notes"}', encoding="utf-8")  # a report of theirs
    with pytest.raises(UserError, match="prepare_report.json would be replaced"):
        run_prepare(pairs_corpus, out)
    assert (out / "prepare_report.json").read_text(encoding="utf-8") == '{"my": "notes"}'
    (out / "prepare_report.json").unlink()

    result, lines = run_prepare(pairs_corpus, out)
    assert (out / "wavs" / "theirs.wav").is_file()
    assert (out / "metadata.csv.bak").read_text(encoding="utf-8").startswith("theirs|")
    assert "theirs" not in output_rows(out)
    assert result.report["wavs"]["unlisted"] == 1 and result.report["counts"]["replaced_wavs"] == 0
    assert any("not listed" in line and "--clean" in line for line in lines)
    assert not (out / "wavs" / ".c5.wav.999.tmp").exists()

    with pytest.raises(UserError, match="theirs.wav would be deleted"):  # --clean never deletes theirs
        run_prepare(pairs_corpus, out, clean=True)
    assert (out / "wavs" / "theirs.wav").is_file()
    (out / "wavs" / "theirs.wav").unlink()

    run_prepare(pairs_corpus, out, max_samples=4)  # c4, c5: our own WAVs, now unlisted
    result, lines = run_prepare(pairs_corpus, out, clean=True, max_samples=4)
    assert sorted(p.stem for p in (out / "wavs").glob("*.wav")) == ["c0", "c1", "c2", "c3"]
    assert result.report["wavs"]["removed"] == 2 and any("removed 2" in line for line in lines)
    assert not (out / "metadata.csv.bak2").exists()  # same source as last time: no new backup


@pytest.mark.parametrize("state_saved", [True, False], ids=["interrupted", "killed"])
def test_wavs_an_interrupted_run_wrote_stay_its_own(tmp_path, pairs_corpus, monkeypatch, state_saved):
    """A converter writes its WAVs before the main process collects them: a Ctrl-C between the two
    (or a kill before the state is saved) left WAVs the next run refused as someone else's."""
    from vits_trainer.data import prepare_convert

    original = prepare_convert.convert_chunk

    def written_then_interrupted(jobs, target):
        original(jobs, target)  # the WAVs are on disk, their outcomes never reach the main process
        raise KeyboardInterrupt

    monkeypatch.setattr(prepare_convert, "convert_chunk", written_then_interrupted)
    if not state_saved:  # killed: the state save at the end never runs
        monkeypatch.setattr(prepare_convert, "save_state", lambda *args: None)
    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        run_prepare(pairs_corpus, out)
    assert sorted(p.stem for p in (out / "wavs").glob("*.wav")) == ["c0", "c1"]  # the first chunk's
    monkeypatch.undo()

    result, _ = run_prepare(pairs_corpus, out)  # no "c0.wav would be replaced, but prepare_data.py ..."
    assert result.report["counts"]["converted"] == 6 and len(output_rows(out)) == 6
    state = json.loads((out / STATE_NAME).read_text(encoding="utf-8"))
    assert set(state["clips"]) == {f"c{i}" for i in range(6)} and "claimed" not in state
    assert not (out / ".prepare_claims").exists()


def test_another_sources_metadata_is_backed_up_after_a_failed_run(tmp_path, pairs_corpus, monkeypatch):
    """The state's source changes with every run, failed ones too; metadata.csv's own source decides
    its backup, and a source path counts resolved, not as typed."""
    out = tmp_path / "out"
    run_prepare(pairs_corpus, out)
    first = (out / "metadata.csv").read_text(encoding="utf-8")
    other = tmp_path / "other"
    for i in range(2):
        write_audio(other / f"o{i}.wav", speech("abc", RATE), RATE)
        (other / f"o{i}.txt").write_text(f"other {i}", encoding="utf-8")
    with pytest.raises(UserError, match="no usable clips"):
        run_prepare(other, out, min_seconds=19.0)
    run_prepare(other, out)
    assert (out / "metadata.csv.bak").read_text(encoding="utf-8") == first
    monkeypatch.chdir(tmp_path)
    run_prepare("other", out)  # the same folder typed another way: no second backup
    assert not (out / "metadata.csv.bak2").exists()


def test_a_backup_whose_clips_were_replaced_says_so(tmp_path, pairs_corpus):
    out, other = tmp_path / "out", tmp_path / "other"
    run_prepare(pairs_corpus, out)
    write_audio(other / "c0.wav", speech("mno", RATE), RATE)  # the same id from another source
    (other / "c0.txt").write_text("another clip", encoding="utf-8")
    _, lines = run_prepare(other, out)
    assert (out / "metadata.csv.bak").read_text(encoding="utf-8").startswith("c0|clip 0")
    [warning] = [line for line in lines if line.startswith("warning: metadata.csv.bak")]
    assert "lists 1 clip(s) whose WAVs now hold this source's audio (c0)" in warning


def test_prepare_default_settings_use_all_cores():
    settings = PrepareSettings(source="x")
    assert settings.num_workers == (os.cpu_count() or 1)
    assert callable(prepare)


def test_ids_in_another_script_or_differing_only_there_are_kept_apart():
    """Sorani file names became '____' (every clip 'bad_id'); Kurmanji 'dîn' and 'dên' both 'd_n', the
    second a duplicate. A digest of the source id now keeps them; a real duplicate is still one."""
    from pathlib import Path

    from vits_trainer.data.corpus_rows import Candidate, Source
    from vits_trainer.data.prepare_checks import plan_rows, safe_id
    from vits_trainer.data.prepare_settings import PrepareSettings

    names = ["سڵاو", "چۆنی", "dîn", "dên", "dîn", "plain"]
    rows = [
        Candidate(n, f"text {i}", "0", f"t:{i}", audio_path=Path(f"{i}.wav")) for i, n in enumerate(names)
    ]
    planned, skipped, _, _ = plan_rows(Source("pairs", "t", rows), PrepareSettings(source="t"), None)
    assert [p.clip_id for p in planned] == [
        safe_id("سڵاو", tagged=True),
        safe_id("چۆنی", tagged=True),
        "d_n",
        safe_id("dên", tagged=True),
        "plain",
    ]
    assert len(set(p.clip_id for p in planned)) == 5 and safe_id("dên", tagged=True).startswith("d_n_")
    assert [(s.origin, s.reason) for s in skipped] == [("t:4", "duplicate_id")]  # 'dîn' twice


def test_a_row_left_out_by_speaker_leaves_its_id_to_the_row_that_is_kept():
    """Two speakers' recordings under one id, and --speaker bob: alice's row (left out by the filter)
    claimed the id first, so bob's, the one asked for, was skipped as its duplicate and nothing kept."""
    from pathlib import Path

    from vits_trainer.data.corpus_rows import Candidate, Source
    from vits_trainer.data.prepare_checks import plan_rows
    from vits_trainer.data.prepare_settings import PrepareSettings

    rows = [
        Candidate("utt1", "for alice", "alice", "t.csv:2", audio_path=Path("a.wav")),
        Candidate("utt1", "for bob", "bob", "t.csv:3", audio_path=Path("b.wav")),
        Candidate("utt1", "bob again", "bob", "t.csv:4", audio_path=Path("c.wav")),
    ]
    planned, skipped, filtered, _ = plan_rows(
        Source("csv", "t.csv", rows), PrepareSettings(source="t.csv", speakers=["bob"]), None
    )
    assert [(p.clip_id, p.text) for p in planned] == [("utt1", "for bob")]
    assert filtered["filtered_speaker"] == 1
    assert [(s.origin, s.reason) for s in skipped] == [("t.csv:4", "duplicate_id")]  # a real duplicate
    assert "already used at t.csv:3" in skipped[0].detail
    # a name with a space, as typed: matched as the rows' speakers are written (Ana_Lopez)
    rows = [Candidate("u1", "for ana", "Ana Lopez", "t.csv:2", audio_path=Path("a.wav"))]
    settings = PrepareSettings(source="t.csv", speakers=["Ana Lopez"])
    planned, _, _, _ = plan_rows(Source("csv", "t.csv", rows), settings, None)
    assert [(p.clip_id, p.speaker) for p in planned] == [("u1", "Ana_Lopez")]


def test_audio_resampled_up_is_a_warning(tmp_path):
    """8 kHz recordings made 16 kHz WAVs with no word: nothing above 4 kHz, a muffled voice."""
    src = tmp_path / "pairs"
    for name, rate in (("low", 8000), ("fine", 22050)):
        write_audio(src / f"{name}.wav", speech("abc de", rate), rate)
        (src / f"{name}.txt").write_text("abc de", encoding="utf-8")
    result, lines = run_prepare(src, tmp_path / "out")
    assert [(w["id"], w["warning"]) for w in result.report["warnings"]] == [("low", "low_sample_rate")]
    assert "recorded at 8000 Hz, resampled up to 16000 Hz" in result.report["warnings"][0]["detail"]
    assert any("low_sample_rate 1" in line for line in lines), lines
    again, _ = run_prepare(src, tmp_path / "out")  # reused clips keep their warning
    assert [w["id"] for w in again.report["warnings"]] == ["low"] and again.report["counts"]["reused"] == 2


@pytest.mark.parametrize(("suffix", "subtype"), [(".mp3", None), (".wav", "PCM_16"), (".wav", "FLOAT")])
def test_a_file_cut_short_is_a_warning(tmp_path, suffix, subtype):
    """Half a file (a copy or download that stopped midway) was kept with its whole transcript: an MP3
    decoded to a fraction of its header's 4 s with no word but the decoder's own on stderr, and a WAV gave
    no warning at all, libsndfile giving the length of the samples present, not the header's."""
    src = tmp_path / "pairs"
    whole = write_audio(
        src / f"whole{suffix}", speech("abc de fgh", 16000, seconds=4.0), 16000, subtype=subtype
    )
    (src / "whole.txt").write_text("abc de fgh", encoding="utf-8")
    data = whole.read_bytes()
    (src / f"cut{suffix}").write_bytes(data[: len(data) // 2])
    (src / "cut.txt").write_text("abc de fgh", encoding="utf-8")
    result, _ = run_prepare(src, tmp_path / "out")
    assert [(w["id"], w["warning"]) for w in result.report["warnings"]] == [("cut", "shorter_than_header")]
    assert "where its header says 4.00 s" in result.report["warnings"][0]["detail"]
    again, _ = run_prepare(src, tmp_path / "out")  # reused, still warned about
    assert [w["id"] for w in again.report["warnings"]] == ["cut"] and again.report["counts"]["reused"] == 2


def test_a_wav_whose_header_was_never_finished_says_so(tmp_path):
    """A recorder stopped before it wrote its header's sizes (both 0): the file holds seconds of audio,
    and it was reported as empty_audio 'no samples', which its size belies."""
    src = tmp_path / "pairs"
    data = bytearray(
        write_audio(src / "take.wav", speech("abc de fgh", 16000, seconds=2.0), 16000).read_bytes()
    )
    at = data.index(b"data")
    data[4:8] = data[at + 4 : at + 8] = bytes(4)
    (src / "take.wav").write_bytes(bytes(data))
    (src / "take.txt").write_text("abc de fgh", encoding="utf-8")
    (src / "ok.wav").write_bytes(write_audio(tmp_path / "ok.wav", speech("abc", 16000), 16000).read_bytes())
    (src / "ok.txt").write_text("abc", encoding="utf-8")
    result, _ = run_prepare(src, tmp_path / "out")
    (skip,) = result.report["skipped_rows"]
    assert skip["reason"] == "empty_audio"
    assert f"{len(data) - at - 8} bytes" in skip["detail"] and "header" in skip["detail"], skip["detail"]


def test_a_clip_at_a_duration_limit_gets_the_same_verdict_when_its_wav_is_reused(tmp_path):
    # checked at the source's rate when converted (1.25 s, not over --max_seconds 1.25, kept), but at the
    # model's when its WAV was reused (27563 samples at 22050 Hz, 1.25002 s: too long): the same command
    # run twice wrote two different metadata.csv
    src = tmp_path / "pairs"
    edge = speech("ab", rate=44100, seconds=1.25)[:55125]
    assert len(edge) == 55125  # 1.25 s at 44.1 kHz: 27562.5 samples at 22050 Hz, which soxr rounds up
    write_audio(src / "edge.wav", edge, 44100)
    write_audio(src / "ok.wav", speech("ab", rate=44100), 44100)
    for name in ("edge", "ok"):
        (src / f"{name}.txt").write_text("ab", encoding="utf-8")
    limits = {"sample_rate": RATE, "max_seconds": 1.25}
    first, _ = run_prepare(src, tmp_path / "out", **limits)
    kept, skipped = set(output_rows(tmp_path / "out")), skipped_reasons(tmp_path / "out")
    second, _ = run_prepare(src, tmp_path / "out", **limits)
    assert (set(output_rows(tmp_path / "out")), skipped_reasons(tmp_path / "out")) == (kept, skipped)
    assert "ok" in kept and first.report["durations"]["max_seconds"] <= 1.25
    assert second.report["durations"] == first.report["durations"]
    assert skipped == {"edge": "too_long"}  # as the WAV would hold it; said with the digits that show it
    detail = next(r["detail"] for r in second.report["skipped_rows"] if r["id"] == "edge")
    assert detail.startswith("1.250023 s outside"), detail  # not "1.25 s outside [0.5, 1.25] s"


@pytest.mark.parametrize(
    "vocab, tokenizer_config",
    [("3", "{}"), ('["a", "b"]', "{}"), ('{"a": 1}', "[]"), ('{"a": 1}', "7")],
    ids=str,
)
def test_a_tokenizer_file_of_the_wrong_shape_is_one_clear_error(tmp_path, vocab, tokenizer_config):
    # a vocab.json holding a number ended prepare_data.py in a TypeError traceback, a list was taken for
    # the model's characters, and a tokenizer_config.json that is no object raised an AttributeError
    from vits_trainer.data.prepare_checks import load_vocabulary

    (tmp_path / "vocab.json").write_text(vocab, encoding="utf-8")
    (tmp_path / "tokenizer_config.json").write_text(tokenizer_config, encoding="utf-8")
    with pytest.raises(UserError, match="unreadable tokenizer files .*not a JSON object"):
        load_vocabulary(tmp_path)


@pytest.mark.parametrize(
    "state", ["", "[]", '{"version": 1, "clips": [1]}'], ids=["empty", "a list", "clips a list"]
)
def test_a_damaged_state_file_is_named_when_the_wavs_it_listed_are_refused(tmp_path, pairs_corpus, state):
    # the refusal said the WAVs were "not in .prepare_state.json" as though another tool had written
    # them, where the state file that listed them could not be read
    out = tmp_path / "out"
    run_prepare(pairs_corpus, out)
    (out / STATE_NAME).write_text(state, encoding="utf-8")
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    with pytest.raises(UserError, match=rf"would be replaced.*{re.escape(STATE_NAME)} is damaged"):
        run_prepare(pairs_corpus, out)
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
