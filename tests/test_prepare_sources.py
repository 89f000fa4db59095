"""Every source format, read end to end into a training set (format named and auto-detected)."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import soundfile as sf
from test_prepare_fixtures import output_rows, run_prepare, skipped_reasons, speech, wav_info, write_audio

from vits_trainer.data.corpus import detect_format
from vits_trainer.data.synthetic import make_corpus
from vits_trainer.errors import UserError


def test_ljspeech_uses_normalized_column_when_present(tmp_path):
    src = tmp_path / "lj"
    for i in range(3):
        write_audio(src / "wavs" / f"LJ{i}.wav", speech("abc de", 22050), 22050)
    (src / "metadata.csv").write_text(
        'LJ0|Dr. "Smith" 2|doctor smith two\nLJ1|plain text|\nLJ2|only two fields\n', encoding="utf-8"
    )
    assert detect_format(str(src))[0] == "ljspeech"
    result, _ = run_prepare(src, tmp_path / "out", format="ljspeech")
    assert output_rows(tmp_path / "out") == {
        "LJ0": ("doctor smith two", "0"),
        "LJ1": ("plain text", "0"),
        "LJ2": ("only two fields", "0"),
    }
    assert wav_info(tmp_path / "out" / "wavs" / "LJ0.wav") == (16000, 1, "PCM_16")
    assert result.report["counts"]["kept"] == 3


def test_a_pipe_inside_an_ljspeech_text_is_reported_not_taken_for_a_column(tmp_path):
    """One id|text|x row among id|text ones is a '|' in the text: it used to cut the text, and a
    one-word rest became a speaker id."""
    src = tmp_path / "lj"
    for i in range(3):
        write_audio(src / "wavs" / f"a{i}.wav", speech("abc de", 22050), 22050)
    (src / "metadata.csv").write_text(
        "a0|silav tu çawa yî\na1|ez baş im | spas.\na2|roja me xweş e\n", encoding="utf-8"
    )
    run_prepare(src, tmp_path / "out")
    assert output_rows(tmp_path / "out") == {"a0": ("silav tu çawa yî", "0"), "a2": ("roja me xweş e", "0")}
    assert skipped_reasons(tmp_path / "out")["a1"] == "text_has_pipe"


def test_an_ljspeech_header_row_is_a_note_not_a_missing_clip(tmp_path):
    """A metadata.csv saved from a spreadsheet: a BOM, CRLF lines and an id|text header row, which was
    reported as a clip 'id' with missing audio."""
    src = tmp_path / "lj"
    for i in range(2):
        write_audio(src / "wavs" / f"a{i}.wav", speech("abc de", 22050), 22050)
    (src / "metadata.csv").write_bytes("\ufeffID|Text\r\na0|silav\r\na1|roj baş\r\n".encode())
    result, printed = run_prepare(src, tmp_path / "out")
    assert output_rows(tmp_path / "out") == {"a0": ("silav", "0"), "a1": ("roj baş", "0")}
    assert result.report["skipped_rows"] == []
    assert any("first line (ID|Text) is a header row" in line for line in printed), printed


@pytest.mark.parametrize(("name", "sep"), [("metadata.csv", "|"), ("list.csv", ",")])
def test_files_joined_with_their_byte_order_marks_keep_every_clip(tmp_path, name, sep):
    """Two files saved with a byte-order mark and joined (cat a.csv b.csv > metadata.csv): the second
    mark began a row's id, and its clip was reported missing as 'wavs/a1.wav: no such file' beside the
    file of that very name (the mark does not show)."""
    src = tmp_path / "lj"
    for i in range(3):
        write_audio(src / "wavs" / f"a{i}.wav", speech("abc de", 22050), 22050)
    first = "wavs/a" if sep == "," else "a"
    ext = ".wav" if sep == "," else ""
    part = [f"{first}{i}{ext}{sep}text {i}\n" for i in range(3)]
    header = f"file_name{sep}text\n" if sep == "," else ""
    data = "\ufeff" + header + part[0] + "\ufeff" + part[1] + part[2]
    (src / name).write_text(data, encoding="utf-8")
    run_prepare(src / name, tmp_path / "out")
    ids = [f"{first.replace('/', '_')}{i}" for i in range(3)]
    assert output_rows(tmp_path / "out") == {ids[i]: (f"text {i}", "0") for i in range(3)}


def test_an_ljspeech_id_finds_its_clip_with_an_upper_case_extension(tmp_path):
    """wavs/a1.WAV (a recorder's or Windows' name) was reported missing for the id a1."""
    src = tmp_path / "lj"
    write_audio(src / "wavs" / "a0.wav", speech("abc de", 22050), 22050)
    write_audio(src / "wavs" / "a1.WAV", speech("abc de", 22050), 22050)
    (src / "metadata.csv").write_text("a0|silav\na1|roj baş\n", encoding="utf-8")
    run_prepare(src, tmp_path / "out")
    assert output_rows(tmp_path / "out") == {"a0": ("silav", "0"), "a1": ("roj baş", "0")}


def test_ljspeech_clips_beside_metadata_without_wavs_folder(tmp_path):
    # a common home-made layout: metadata.csv next to the WAVs; once read as .txt pairs, all "missing_text"
    src = tmp_path / "corpus"
    for i in range(3):
        write_audio(src / f"kmr_{i}.wav", speech("abc de", 22050), 22050)
    (src / "metadata.csv").write_text("kmr_0|silav tu\nkmr_1|ez baş im\nkmr_2|spas\n", encoding="utf-8")
    assert detect_format(str(src)) == ("ljspeech", src)
    assert detect_format(str(src / "metadata.csv")) == ("ljspeech", src)
    result, lines = run_prepare(src, tmp_path / "out")
    assert output_rows(tmp_path / "out") == {
        "kmr_0": ("silav tu", "0"),
        "kmr_1": ("ez baş im", "0"),
        "kmr_2": ("spas", "0"),
    }
    assert result.report["source"]["format"] == "ljspeech"
    assert any("read as ljspeech" in line for line in lines)
    assert any("beside metadata.csv" in line for line in lines)
    # a pipe-separated metadata.csv whose ids have no audio beside it is not taken for LJSpeech
    (src / "metadata.csv").write_text("other_0|silav tu\n", encoding="utf-8")
    assert detect_format(str(src))[0] == "pairs"


@pytest.mark.parametrize(
    "folder, first",
    [("wavs", "{}.wav"), ("wavs", "wavs/{}.wav"), ("", "{}.wav"), ("wavs", "{}")],
    ids=["file-name", "path-from-metadata", "file-name-beside", "id"],
)
def test_ljspeech_first_column_as_file_name_or_path(tmp_path, folder, first):
    # home-made metadata.csv files often name the clip's file, or its path, instead of its id
    src = tmp_path / "corpus"
    for i in range(2):
        write_audio(src / folder / f"c{i}.wav", speech("abc de", 22050), 22050)
    lines = [f"{first.format(f'c{i}')}|text {i}\n" for i in range(2)]
    (src / "metadata.csv").write_text("".join(lines), encoding="utf-8")
    assert detect_format(str(src))[0] == "ljspeech"
    run_prepare(src, tmp_path / "out")
    assert output_rows(tmp_path / "out") == {"c0": ("text 0", "0"), "c1": ("text 1", "0")}


def test_utf16_tables_are_read_and_utf16_without_its_mark_is_reported(tmp_path):
    """Windows Notepad saves "Unicode" text and Excel exports "Unicode Text" as UTF-16 with a byte-order
    mark: read as such. UTF-16 without the mark has NUL bytes: its rows are reported, never a traceback."""
    src = tmp_path / "lj"
    for i in range(2):
        write_audio(src / "wavs" / f"c{i}.wav", speech("abc", 16000), 16000)
    (src / "metadata.csv").write_text("c0|çawa yî\nc1|baş im\n", encoding="utf-16")
    run_prepare(src, tmp_path / "out")
    assert output_rows(tmp_path / "out") == {"c0": ("çawa yî", "0"), "c1": ("baş im", "0")}
    table = src / "excel.txt"
    table.write_text("file\ttext\nwavs/c0.wav\tçawa yî\n", encoding="utf-16")
    run_prepare(table, tmp_path / "out_table")
    assert output_rows(tmp_path / "out_table") == {"wavs_c0": ("çawa yî", "0")}
    (src / "metadata.csv").write_text("c0|çawa yî\nc1|baş im\n", encoding="utf-16-le")
    with pytest.raises(UserError, match="no usable clips"):
        run_prepare(src, tmp_path / "out_le", format="ljspeech")
    assert set(skipped_reasons(tmp_path / "out_le").values()) == {"malformed_row"}


def test_own_output_layout_reads_third_column_as_speaker(tmp_path):
    make_corpus(tmp_path / "corpus", num_clips=6, sample_rate=16000, num_speakers=2)
    run_prepare(tmp_path / "corpus", tmp_path / "out")
    assert {speaker for _, speaker in output_rows(tmp_path / "out").values()} == {"0", "1"}


def test_speaker_names_with_spaces_are_not_taken_for_normalized_text(tmp_path):
    """id|text|Ana Lopez: a third column with spaces was read as LJSpeech's normalized text, and the
    speaker names replaced every transcript with no word said."""
    src = tmp_path / "lj"
    rows = [("s1", "Good morning to you all.", "Ana Lopez"), ("s2", "How is the weather?", "Ana Lopez")]
    rows += [("s3", "I like green tea.", "Bob Stone"), ("s4", "See you later, Ana.", "Bob Stone")]
    for clip_id, _, _ in rows:
        write_audio(src / "wavs" / f"{clip_id}.wav", speech("abc de", 16000), 16000)
    (src / "metadata.csv").write_text("".join(f"{i}|{t}|{s}\n" for i, t, s in rows), encoding="utf-8")
    _, printed = run_prepare(src, tmp_path / "out")
    assert output_rows(tmp_path / "out") == {i: (t, s.replace(" ", "_")) for i, t, s in rows}
    assert any("used as speaker" in line for line in printed), printed
    # names sharing only short words with the texts ("The Narrator"), and a single-word corpus of names
    for rows in (
        [("s1", "the cat sat down", "The Narrator"), ("s2", "a dog ran off", "A Reader")]
        + [("s3", "the sun is up", "The Narrator"), ("s4", "a bird flew by", "A Reader")],
        [
            (f"s{k}", word, name)
            for k, (word, name) in enumerate(
                zip(["yes", "no", "one", "two"], ["Bob Smith", "Ana Lopez"] * 2, strict=True)
            )
        ],
    ):
        for clip_id, _, _ in rows:
            write_audio(src / "wavs" / f"{clip_id}.wav", speech("abc de", 16000), 16000)
        (src / "metadata.csv").write_text("".join(f"{i}|{t}|{n}\n" for i, t, n in rows), encoding="utf-8")
        out = tmp_path / f"out_{rows[0][1].split()[0]}"
        run_prepare(src, out)
        assert output_rows(out) == {i: (t, n.replace(" ", "_")) for i, t, n in rows}
    # normalized text shares words with the text: it is used, and a note says so
    lines = ["s1|Dr. Smith came at 2.|doctor smith came at two", "s2|Hi there|hi there"]
    lines += ["s3|St. Paul, 1869|saint paul eighteen sixty-nine", "s4|No change.|No change."]
    (src / "metadata.csv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    _, printed = run_prepare(src, tmp_path / "out2")
    assert output_rows(tmp_path / "out2")["s1"] == ("doctor smith came at two", "0")
    assert any("normalized text" in line and "3 row(s)" in line for line in printed), printed


def test_a_single_word_corpus_of_our_own_layout_keeps_its_speakers(tmp_path):
    """id|word|speaker, every text one word (a digit or keyword corpus): the speaker ids became the
    texts, read as LJSpeech's normalized column. Normalized single words stay texts."""
    src = tmp_path / "words"
    words = ["yek", "du", "sê", "çar", "pênc", "şeş"]
    for i in range(6):
        write_audio(src / "wavs" / f"w{i}.wav", speech("abc de", 16000), 16000)
    rows = [f"w{i}|{word}|{i % 2}" for i, word in enumerate(words)]
    (src / "metadata.csv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    run_prepare(src, tmp_path / "out")
    assert output_rows(tmp_path / "out") == {f"w{i}": (word, str(i % 2)) for i, word in enumerate(words)}
    normalized = [f"w{i}|{i}|{word}" for i, word in enumerate(words)]  # digits and their words: texts
    (src / "metadata.csv").write_text("\n".join(normalized) + "\n", encoding="utf-8")
    run_prepare(src, tmp_path / "out2")
    assert output_rows(tmp_path / "out2") == {f"w{i}": (word, "0") for i, word in enumerate(words)}


def _common_voice(root, rows, tsv="validated.tsv"):
    header = "client_id\tpath\tsentence\tup_votes\tdown_votes\tage\n"
    lines = [f"{client}\t{name}\t{text}\t2\t0\t\n" for client, name, text in rows]
    (root / tsv).write_text(header + "".join(lines), encoding="utf-8")


def test_common_voice_mp3_clips_and_split(tmp_path):
    src = tmp_path / "cv"
    for i in range(4):
        write_audio(src / "clips" / f"common_voice_xx_{i}.mp3", speech("abcd efg", 48000, i % 2), 48000)
    # Quotes are ordinary characters in Common Voice TSVs (no CSV quoting).
    _common_voice(
        src,
        [
            ("aaa111", "common_voice_xx_0.mp3", 'He said "hello"'),
            ("bbb222", "common_voice_xx_1.mp3", "second one"),
            ("aaa111", "common_voice_xx_2", "no extension in the tsv"),
        ],
    )
    _common_voice(src, [("ccc333", "common_voice_xx_3.mp3", "from train")], tsv="train.tsv")
    assert detect_format(str(src))[0] == "commonvoice"
    run_prepare(src, tmp_path / "out", sample_rate=22050)
    rows = output_rows(tmp_path / "out")
    assert rows == {
        "common_voice_xx_0": ('He said "hello"', "aaa111"),
        "common_voice_xx_1": ("second one", "bbb222"),
        "common_voice_xx_2": ("no extension in the tsv", "aaa111"),
    }
    assert wav_info(tmp_path / "out" / "wavs" / "common_voice_xx_0.wav") == (22050, 1, "PCM_16")
    run_prepare(src, tmp_path / "out_train", split="train", format="commonvoice")
    assert output_rows(tmp_path / "out_train") == {"common_voice_xx_3": ("from train", "ccc333")}
    run_prepare(src / "train.tsv", tmp_path / "out_file")  # that TSV, not the folder's validated.tsv
    assert output_rows(tmp_path / "out_file") == {"common_voice_xx_3": ("from train", "ccc333")}


@pytest.mark.parametrize(
    ("name", "sep"), [("list.csv", ","), ("list.tsv", "\t"), ("list.txt", ";"), ("list.csv", "|")]
)
def test_csv_table_with_sniffed_delimiter_and_relative_paths(tmp_path, name, sep):
    src = tmp_path / "table"
    write_audio(src / "audio" / "one.flac", speech("abc", 16000), 16000)
    write_audio(src / "audio" / "two.ogg", speech("def", 44100), 44100)
    lines = [sep.join(["file", "transcript", "who"]), sep.join(["audio/one.flac", "first clip", "anna"])]
    lines.append(sep.join(["audio/two.ogg", "second clip", "ben"]))
    (src / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
    args = dict(audio_column="file", text_column="transcript", speaker_column="who")
    run_prepare(src / name, tmp_path / "out", **args)
    assert output_rows(tmp_path / "out") == {
        "audio_one": ("first clip", "anna"),
        "audio_two": ("second clip", "ben"),
    }


@pytest.mark.parametrize(
    ("name", "lines", "speakers", "columns"),
    [
        ("list.tsv", ["audio/one.wav\tfirst clip", "audio/two.wav\tsecond clip"], ("0", "0"), "audio, text"),
        # VITS's own filelists: path|speaker|text, a .txt file, no header
        (
            "train.txt",
            ["audio/one.wav|7|first clip", "audio/two.wav|9|second clip"],
            ("7", "9"),
            "audio, speaker, text",
        ),
    ],
)
def test_table_without_header_row(tmp_path, name, lines, speakers, columns):
    src = tmp_path / "table"
    for stem in ("one", "two"):
        write_audio(src / "audio" / f"{stem}.wav", speech("abc", 16000), 16000)
    (src / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
    result, printed = run_prepare(src / name, tmp_path / "out")
    assert output_rows(tmp_path / "out") == {
        "audio_one": ("first clip", speakers[0]),
        "audio_two": ("second clip", speakers[1]),
    }
    assert any(f"no header row: columns read as {columns}" in line for line in printed), printed
    # a first row of column names is still the header, named audio/text columns or not
    (src / name).write_text("file|words\naudio/one.wav|first clip\n", encoding="utf-8")
    with pytest.raises(UserError, match="no (audio|text) column found"):
        run_prepare(src / name, tmp_path / "out2")


def test_a_headerless_path_text_speaker_list_keeps_its_texts(tmp_path):
    """path|text|speaker, as this tool's own id|text|speaker with paths: the texts (with spaces) were
    taken for an unused column and every clip was written with its speaker's name as its text. A
    middle column of names with spaces beside texts stays as it was: unused."""
    src = tmp_path / "table"
    for stem in ("a0", "a1", "a2"):
        write_audio(src / "wavs" / f"{stem}.wav", speech("abc", 16000), 16000)
    lines = [
        "wavs/a0.wav|hello there world|ana",
        "wavs/a1.wav|how are you|ben",
        "wavs/a2.wav|fine thanks|ana",
    ]
    (src / "train.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    _, printed = run_prepare(src / "train.txt", tmp_path / "out")
    assert output_rows(tmp_path / "out") == {
        "wavs_a0": ("hello there world", "ana"),
        "wavs_a1": ("how are you", "ben"),
        "wavs_a2": ("fine thanks", "ana"),
    }
    assert any("columns read as audio, text, speaker" in line for line in printed), printed
    lines = ["wavs/a0.wav|Ana Lopez|hello there world", "wavs/a1.wav|Ben Ali|how are you"]
    (src / "names.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    run_prepare(src / "names.txt", tmp_path / "out2")
    assert output_rows(tmp_path / "out2") == {
        "wavs_a0": ("hello there world", "0"),
        "wavs_a1": ("how are you", "0"),
    }


def test_a_vits_filelist_finds_its_clips_from_the_folder_it_is_run_in(tmp_path, monkeypatch):
    """VITS's filelists (filelists/x.txt) name their clips from the repository's root, where training
    runs, not from the list's own folder: run there as the docs show, every clip was missing_audio.
    A path found beside the list still wins."""
    repo = tmp_path / "vits"
    for stem in ("one", "two"):
        write_audio(repo / "wavs" / f"{stem}.wav", speech("abc", 16000), 16000)
    (repo / "filelists").mkdir()
    lines = ["wavs/one.wav|first clip", "wavs/two.wav|second clip"]
    (repo / "filelists" / "train.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    monkeypatch.chdir(repo)
    run_prepare("filelists/train.txt", tmp_path / "out")
    assert output_rows(tmp_path / "out") == {
        "wavs_one": ("first clip", "0"),
        "wavs_two": ("second clip", "0"),
    }
    # a clip beside the list is the one it names, whatever the current folder holds
    write_audio(repo / "filelists" / "wavs" / "one.wav", speech("abc de fg", 16000), 16000)
    run_prepare("filelists/train.txt", tmp_path / "out2")
    beside, from_root = (sf.info(tmp_path / out / "wavs" / "wavs_one.wav").frames for out in ("out2", "out"))
    assert beside > from_root


def test_a_pipe_filelist_keeps_its_quotes_and_commas(tmp_path):
    """A headerless path|text list whose first text has more commas than the line has pipes was read as
    a CSV (no audio column found); an opening quote swallowed the rows after it."""
    src = tmp_path / "table"
    for stem in ("one", "two", "three"):
        write_audio(src / "audio" / f"{stem}.wav", speech("abc", 16000), 16000)
    texts = ["Hello, world, how are you?", '"Unbalanced quote starts here.', 'The "last" one.']
    lines = [f"audio/{stem}.wav|{text}" for stem, text in zip(("one", "two", "three"), texts, strict=True)]
    (src / "filelist.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    run_prepare(src / "filelist.txt", tmp_path / "out")
    assert output_rows(tmp_path / "out") == {
        "audio_one": (texts[0], "0"),
        "audio_two": (texts[1], "0"),
        "audio_three": (texts[2], "0"),
    }


def test_absolute_paths_sharing_a_file_name_are_different_clips(tmp_path):
    """A filelist of absolute paths whose speakers' folders hold the same file names (spk1/000.wav,
    spk2/000.wav): each id was the bare file name, so every second speaker's clip was dropped as a
    duplicate_id. The same file listed twice is still a duplicate."""
    src = tmp_path / "corpus"
    for speaker in ("spk1", "spk2"):
        for stem in ("000", "001"):
            write_audio(src / speaker / f"{stem}.wav", speech("abc", 16000), 16000)
    lines = [
        f"{src}/{speaker}/{stem}.wav|{speaker}|clip {stem}"
        for speaker in ("spk1", "spk2")
        for stem in ("000", "001")
    ]
    lines.append(f"{src}/spk1/000.wav|spk1|clip again")
    (tmp_path / "train.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    run_prepare(tmp_path / "train.txt", tmp_path / "out")
    assert output_rows(tmp_path / "out") == {
        f"{speaker}_{stem}": (f"clip {stem}", speaker)
        for speaker in ("spk1", "spk2")
        for stem in ("000", "001")
    }
    assert list(skipped_reasons(tmp_path / "out").values()) == ["duplicate_id"]
    # file names that differ keep their ids as they were: the file name alone
    (tmp_path / "one.txt").write_text(f"{src}/spk1/000.wav|a\n{src}/spk2/001.wav|b\n", encoding="utf-8")
    run_prepare(tmp_path / "one.txt", tmp_path / "out2")
    assert output_rows(tmp_path / "out2") == {"000": ("a", "0"), "001": ("b", "0")}


def test_a_headerless_lists_columns_are_those_of_most_rows_not_of_its_first(tmp_path):
    """A headerless file,text list whose first text holds an unquoted comma was read as
    audio,speaker,text from that row alone: its clip was kept with the text 'world' and the speaker
    'Hello', and every row after it was malformed."""
    src = tmp_path / "table"
    for stem in ("a0", "a1", "a2", "a3"):
        write_audio(src / "wavs" / f"{stem}.wav", speech("abc", 16000), 16000)
    lines = [
        "wavs/a0.wav,Hello, world",
        "wavs/a1.wav,plain text",
        "wavs/a2.wav,more text",
        'wavs/a3.wav,"quoted, fine"',
    ]
    (src / "list.csv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    result, printed = run_prepare(src / "list.csv", tmp_path / "out")
    assert output_rows(tmp_path / "out") == {
        "wavs_a1": ("plain text", "0"),
        "wavs_a2": ("more text", "0"),
        "wavs_a3": ("quoted, fine", "0"),
    }
    assert skipped_reasons(tmp_path / "out") == {"wavs_a0": "malformed_row"}
    assert result.report["skipped_rows"][0]["origin"] == "list.csv:1"
    assert any("no header row: columns read as audio, text" in line for line in printed), printed


@pytest.mark.parametrize("layout", ["ljspeech", "audiofolder"])
def test_absolute_paths_sharing_a_file_name_are_different_clips_in_any_list(tmp_path, layout):
    """As in a table: metadata.csv's path|text rows, and an audiofolder's metadata.jsonl, naming
    spk1/000.wav and spk2/000.wav by absolute paths gave both the id 000, and the second was dropped."""
    clips = tmp_path / "clips"
    for speaker in ("spk1", "spk2"):
        write_audio(clips / speaker / "000.wav", speech("abc", 16000), 16000)
    src = tmp_path / "list"
    src.mkdir()
    if layout == "ljspeech":
        lines = [f"{clips}/{speaker}/000.wav|clip of {speaker}" for speaker in ("spk1", "spk2")]
        (src / "metadata.csv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    else:
        records = [
            {"file_name": f"{clips}/{speaker}/000.wav", "text": f"clip of {speaker}"}
            for speaker in ("spk1", "spk2")
        ]
        (src / "metadata.jsonl").write_text("\n".join(map(json.dumps, records)) + "\n", encoding="utf-8")
    result, _ = run_prepare(src, tmp_path / "out", format=layout)
    assert output_rows(tmp_path / "out") == {
        "spk1_000": ("clip of spk1", "0"),
        "spk2_000": ("clip of spk2", "0"),
    }


def test_a_tables_bad_rows_are_reported_by_their_id_and_first_line(tmp_path):
    """A malformed row was reported by its first field (a speaker, here) and a quoted record spanning
    lines by its last line."""
    src = tmp_path / "t"
    for stem in ("a", "b"):
        write_audio(src / "clips" / f"{stem}.wav", speech("abc", 16000), 16000)
    lines = [
        "speaker,path,text",
        "bob,clips/a.wav,hello",
        'ann,clips/b.wav,"two',
        'lines"',
        "bob,clips/c.wav,x,extra",
    ]
    (src / "t.csv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    run_prepare(src / "t.csv", tmp_path / "out", speaker_column="speaker")
    report = json.loads((tmp_path / "out" / "prepare_report.json").read_text(encoding="utf-8"))
    assert [(r["id"], r["origin"], r["reason"]) for r in report["skipped_rows"]] == [
        ("clips_b", "t.csv:3", "text_has_newline"),
        ("clips_c", "t.csv:5", "malformed_row"),
    ]


def test_rows_taken_in_by_a_quote_never_closed_are_each_reported(tmp_path):
    """A CSV text opening a '"' it never closes runs on to the end of the file: the rows after it became
    part of its text, reported as one text_has_newline, and their clips were listed nowhere."""
    src = tmp_path / "t"
    for stem in ("a0", "a1", "a2", "a3"):
        write_audio(src / "wavs" / f"{stem}.wav", speech("abc", 16000), 16000)
    lines = [
        "file,text",
        "wavs/a0.wav,hello",
        'wavs/a1.wav,"unclosed quote',
        "wavs/a2.wav,third",
        "wavs/a3.wav,fourth",
    ]
    (src / "list.csv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    result, _ = run_prepare(src / "list.csv", tmp_path / "out")
    assert output_rows(tmp_path / "out") == {"wavs_a0": ("hello", "0")}
    skips = {s["id"]: (s["origin"], s["reason"]) for s in result.report["skipped_rows"]}
    assert skips == {
        "wavs_a1": ("list.csv:3", "malformed_row"),
        "wavs_a2": ("list.csv:4", "malformed_row"),
        "wavs_a3": ("list.csv:5", "malformed_row"),
    }
    detail = result.report["skipped_rows"][0]["detail"]
    assert "line 3" in detail and "never closed" in detail, detail
    # a quoted text on two lines takes in no row: a line break in its text, as before
    lines = ["file,text", "wavs/a0.wav,hello", 'wavs/a1.wav,"a text on', 'two lines"', "wavs/a2.wav,third"]
    (src / "two.csv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    run_prepare(src / "two.csv", tmp_path / "out2")
    assert skipped_reasons(tmp_path / "out2") == {"wavs_a1": "text_has_newline"}
    assert set(output_rows(tmp_path / "out2")) == {"wavs_a0", "wavs_a2"}


def test_a_closed_quoted_text_on_two_lines_before_the_audio_column_takes_in_no_row(tmp_path):
    """text,file: a quoted text on two lines ends its second line with the file's cell, which named an
    audio file, so a well-formed table was reported as a quote never closed, with a row that is none."""
    from vits_trainer.data.corpus import read_table
    from vits_trainer.data.corpus_rows import Problem

    lines = ["text,file", "hello,wavs/a0.wav", '"a text on', 'two lines",wavs/a1.wav', "third,wavs/a2.wav"]
    (tmp_path / "t.csv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    rows = read_table(tmp_path / "t.csv").rows
    assert not [r for r in rows if isinstance(r, Problem)]
    assert [(r.source_id, r.text) for r in rows][1] == ("wavs/a1", "a text on\ntwo lines")
    # one never closed there is still each row's
    lines = ["text,file", "hello,wavs/a0.wav", '"unclosed,wavs/a1.wav', "third,wavs/a2.wav"]
    (tmp_path / "u.csv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    rows = read_table(tmp_path / "u.csv").rows
    assert [(r.origin, r.reason) for r in rows if isinstance(r, Problem)] == [
        ("u.csv:3", "malformed_row"),
        ("u.csv:4", "malformed_row"),
    ]


def test_a_headerless_list_whose_texts_hold_unquoted_commas_keeps_its_two_columns(tmp_path):
    """path,text without a header, most texts holding an unquoted comma: most rows have 3 cells, and the
    list was read as path,speaker,text, every such text's first word a speaker and the rest its text,
    while the one row that was right was reported malformed."""
    from vits_trainer.data.corpus import read_table
    from vits_trainer.data.corpus_rows import Problem

    lines = ["wavs/a.wav,Hello world", "wavs/b.wav,Well, that is fine", "wavs/c.wav,Yes, I think so"]
    (tmp_path / "t.csv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    source = read_table(tmp_path / "t.csv")
    assert "no header row: columns read as audio, text (the first row is a clip)" in source.notes
    assert [(r.source_id, r.text) for r in source.rows if not isinstance(r, Problem)] == [
        ("wavs/a", "Hello world")
    ]
    assert [r.origin for r in source.rows if isinstance(r, Problem)] == ["t.csv:2", "t.csv:3"]
    # a first row lacking its speaker among path,speaker,text rows: the list's columns are theirs
    lines = ["wavs/a.wav,Hello world", "wavs/b.wav,ali,Well that is fine", "wavs/c.wav,zin,Yes I think so"]
    (tmp_path / "s.csv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    rows = read_table(tmp_path / "s.csv").rows
    assert [(r.text, r.speaker) for r in rows if not isinstance(r, Problem)] == [
        ("Well that is fine", "ali"),
        ("Yes I think so", "zin"),
    ]


def test_csv_default_columns_and_quoted_text(tmp_path):
    src = tmp_path / "t"
    write_audio(src / "x.wav", speech("abc", 16000), 16000)
    (src / "data.csv").write_text('path,text\nx.wav,"hello, world"\n', encoding="utf-8")
    run_prepare(src / "data.csv", tmp_path / "out")
    assert output_rows(tmp_path / "out") == {"x": ("hello, world", "0")}


def test_csv_capitalised_header_as_a_spreadsheet_writes_it(tmp_path):
    """Excel's CSV export of a "File,Transcript" sheet: a UTF-8 BOM, CRLF lines, capitalised column names
    (they used to be refused: no audio column found)."""
    src = tmp_path / "t"
    write_audio(src / "x.wav", speech("abc", 16000), 16000)
    (src / "data.csv").write_bytes('\ufeffFile,Transcript\r\nx.wav,"hello, world"\r\n'.encode())
    run_prepare(src / "data.csv", tmp_path / "out")
    assert output_rows(tmp_path / "out") == {"x": ("hello, world", "0")}


def test_paths_written_on_windows_find_their_clips(tmp_path):
    """A table and an LJSpeech metadata.csv made on Windows name clips as wavs\\a.wav: every row was
    reported missing_audio, and the run ended with no usable clip."""
    src = tmp_path / "t"
    for i in range(2):
        write_audio(src / "wavs" / f"a{i}.wav", speech("abc", 16000), 16000)
    (src / "data.csv").write_text("path;text\nwavs\\a0.wav;silav\nwavs\\a1.wav;roj baş\n", encoding="utf-8")
    run_prepare(src / "data.csv", tmp_path / "csv_out")
    assert output_rows(tmp_path / "csv_out") == {"wavs_a0": ("silav", "0"), "wavs_a1": ("roj baş", "0")}
    (src / "metadata.csv").write_text("wavs\\a0.wav|silav\nwavs\\a1.wav|roj baş\n", encoding="utf-8")
    run_prepare(src, tmp_path / "lj_out", format="ljspeech")
    assert output_rows(tmp_path / "lj_out") == {"a0": ("silav", "0"), "a1": ("roj baş", "0")}


def test_csv_missing_column_is_a_user_error(tmp_path):
    (tmp_path / "data.csv").write_text("path,words\nx.wav,hi\n", encoding="utf-8")
    with pytest.raises(UserError, match="--text_column"):
        run_prepare(tmp_path / "data.csv", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def _hf_rows(tmp_path, n=4):
    audio, texts, speakers = [], [], []
    for i in range(n):
        wav = write_audio(tmp_path / "raw" / f"utt{i}.wav", speech("abc def", 24000), 24000, "PCM_16")
        audio.append({"bytes": wav.read_bytes(), "path": f"utt{i}.wav"})
        texts.append(f"sentence {i}")
        speakers.append(f"spk{i % 2}")
    return {"audio": audio, "sentence": texts, "speaker_id": speakers}


def test_hf_save_to_disk_dataset_dict_and_split(tmp_path):
    from datasets import Audio, Dataset, DatasetDict

    data = _hf_rows(tmp_path)
    train = Dataset.from_dict(data).cast_column("audio", Audio(decode=False))
    test = Dataset.from_dict({k: v[:1] for k, v in data.items()}).cast_column("audio", Audio(decode=False))
    DatasetDict({"train": train, "test": test}).save_to_disk(str(tmp_path / "ds"))
    assert detect_format(str(tmp_path / "ds"))[0] == "hf"
    run_prepare(tmp_path / "ds", tmp_path / "out", speaker_column="speaker_id")
    rows = output_rows(tmp_path / "out")
    assert rows == {f"utt{i}": (f"sentence {i}", f"spk{i % 2}") for i in range(4)}
    assert wav_info(tmp_path / "out" / "wavs" / "utt0.wav") == (16000, 1, "PCM_16")
    run_prepare(tmp_path / "ds", tmp_path / "out_test", split="test")
    assert output_rows(tmp_path / "out_test") == {"utt0": ("sentence 0", "0")}


def test_hf_single_dataset_mp3_bytes_without_paths(tmp_path):
    from datasets import Audio, Dataset

    clips = []
    for i in range(3):
        mp3 = write_audio(tmp_path / "raw" / f"{i}.mp3", speech("ab cd", 16000), 16000)
        clips.append({"bytes": mp3.read_bytes(), "path": None})
    ds = Dataset.from_dict({"audio": clips, "transcription": ["one", "two", "three"]})
    ds.cast_column("audio", Audio(decode=False)).save_to_disk(str(tmp_path / "ds"))
    run_prepare(tmp_path / "ds", tmp_path / "out", format="hf")
    # No file names in the dataset: ids come from the split and row number.
    assert output_rows(tmp_path / "out") == {
        "train_000000": ("one", "0"),
        "train_000001": ("two", "0"),
        "train_000002": ("three", "0"),
    }


def test_audio_bytes_that_are_not_audio_are_reported_without_a_python_object(tmp_path):
    """A dataset row whose bytes are no audio file was reported as "Error opening <_io.BytesIO object at
    0x7f...>: Format not recognised.": the address of an object in memory, not the row's audio."""
    from datasets import Audio, Dataset

    good = write_audio(tmp_path / "raw" / "0.wav", speech("ab cd", 16000), 16000).read_bytes()
    clips = [{"bytes": good, "path": None}, {"bytes": b"not audio at all", "path": None}]
    ds = Dataset.from_dict({"audio": clips, "text": ["one", "two"]})
    ds.cast_column("audio", Audio(decode=False)).save_to_disk(str(tmp_path / "ds"))
    result, _ = run_prepare(tmp_path / "ds", tmp_path / "out")
    (skip,) = result.report["skipped_rows"]
    assert skip["reason"] == "unreadable_audio"
    assert "BytesIO" not in skip["detail"] and "0x" not in skip["detail"], skip["detail"]
    assert "Format not recognised" in skip["detail"]


@pytest.mark.parametrize("layout", ["struct", "binary", "path"])
def test_a_parquet_file_written_without_datasets_reads_its_audio_bytes(tmp_path, layout):
    """A parquet file written by pandas or pyarrow (a dataset's to_pandas().to_parquet(), say) holds
    audio as {bytes, path} records or bare bytes, without the datasets Audio type: it was refused as
    "column 'audio' holds {'bytes': Value('binary'), ...}, not audio or paths"."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    blobs = [
        write_audio(tmp_path / "raw" / f"{i}.wav", speech("ab cd", 16000), 16000).read_bytes()
        for i in range(2)
    ]
    if layout == "struct":
        audio = pa.array([{"bytes": blob, "path": f"clip{i}.wav"} for i, blob in enumerate(blobs)])
    elif layout == "binary":
        audio = pa.array(blobs, pa.binary())
    else:  # {path} records alone: files beside the parquet file
        audio = pa.array([{"path": f"raw/{i}.wav"} for i in range(2)])
    pq.write_table(pa.table({"audio": audio, "text": ["one", "two"]}), tmp_path / "data.parquet")
    run_prepare(tmp_path / "data.parquet", tmp_path / "out")
    ids = {"struct": ["clip0", "clip1"], "binary": ["train_000000", "train_000001"], "path": ["0", "1"]}[
        layout
    ]
    assert output_rows(tmp_path / "out") == {ids[0]: ("one", "0"), ids[1]: ("two", "0")}
    assert wav_info(tmp_path / "out" / "wavs" / f"{ids[0]}.wav") == (16000, 1, "PCM_16")


def test_hf_path_column_and_id_column(tmp_path):
    from datasets import Dataset

    ds_dir = tmp_path / "ds"
    for i in range(2):
        write_audio(ds_dir / "audio" / f"{i}.flac", speech(rate=16000), 16000)
    data = {"audio": ["audio/0.flac", "audio/1.flac"], "text": ["zero", "one"], "key": ["k-0", "k/1"]}
    Dataset.from_dict(data).save_to_disk(str(ds_dir))  # a plain string column: paths relative to the folder
    run_prepare(ds_dir, tmp_path / "out", id_column="key")
    assert output_rows(tmp_path / "out") == {"k-0": ("zero", "0"), "k_1": ("one", "0")}
    # a column named `path` is found as --audio_column's help says (only `audio` was tried)
    ds_dir2 = tmp_path / "ds2"
    shutil.copytree(ds_dir / "audio", ds_dir2 / "audio")
    Dataset.from_dict({"path": data["audio"], "text": data["text"]}).save_to_disk(str(ds_dir2))
    run_prepare(ds_dir2, tmp_path / "out2")
    assert output_rows(tmp_path / "out2") == {"0": ("zero", "0"), "1": ("one", "0")}


def test_hf_parquet_folder(tmp_path):
    from datasets import Audio, Dataset

    ds = Dataset.from_dict(_hf_rows(tmp_path, 3)).cast_column("audio", Audio(decode=False))
    (tmp_path / "pq" / "data").mkdir(parents=True)
    ds.to_parquet(str(tmp_path / "pq" / "data" / "train-00000-of-00001.parquet"))
    assert detect_format(str(tmp_path / "pq"))[0] == "hf"
    run_prepare(tmp_path / "pq", tmp_path / "out", text_column="sentence")
    assert set(output_rows(tmp_path / "out")) == {"utt0", "utt1", "utt2"}


def test_hf_single_data_file_and_its_unused_speaker_column(tmp_path):
    # one data file of a hub dataset, downloaded alone; its speaker column is named, not used unasked
    from datasets import Audio, Dataset

    ds = Dataset.from_dict(_hf_rows(tmp_path, 3)).cast_column("audio", Audio(decode=False))
    data_file = tmp_path / "train-00000-of-00001.parquet"
    ds.to_parquet(str(data_file))
    assert detect_format(str(data_file))[0] == "hf"
    result, lines = run_prepare(data_file, tmp_path / "out")
    assert output_rows(tmp_path / "out") == {f"utt{i}": (f"sentence {i}", "0") for i in range(3)}
    assert result.report["source"]["location"] == str(data_file)
    assert any(
        "column 'speaker_id' is not used" in line and "--speaker_column speaker_id" in line for line in lines
    )
    _, lines = run_prepare(data_file, tmp_path / "out2", speaker_column="speaker_id")
    assert set(output_rows(tmp_path / "out2").values()) == {
        (f"sentence {i}", f"spk{i % 2}") for i in range(3)
    }
    assert not any("is not used" in line for line in lines)
    (tmp_path / "notes.json").write_text("{}")
    with pytest.raises(UserError, match="not a .csv/.tsv table or a .parquet/.arrow data file"):
        detect_format(str(tmp_path / "notes.json"))


def test_a_hub_datasets_column_named_speaker_is_read_as_the_speaker(tmp_path):
    # as a table's is: without --speaker_column every clip of a parquet file became speaker 0
    from datasets import Audio, Dataset

    rows = _hf_rows(tmp_path, 3)
    rows["speaker"] = rows.pop("speaker_id")
    ds = Dataset.from_dict(rows).cast_column("audio", Audio(decode=False))
    data_file = tmp_path / "train-00000-of-00001.parquet"
    ds.to_parquet(str(data_file))
    _, lines = run_prepare(data_file, tmp_path / "out")
    assert set(output_rows(tmp_path / "out").values()) == {(f"sentence {i}", f"spk{i % 2}") for i in range(3)}
    assert any("column 'speaker' is read as each clip's speaker" in line for line in lines), lines


def test_a_table_saved_in_windows_1252_gets_one_note_saying_so(tmp_path):
    for i in range(3):
        write_audio(tmp_path / "clips" / f"c{i}.wav", speech("abc", 16000), 16000)
    (tmp_path / "clips.csv").write_bytes(
        "path,text\nclips/c0.wav,çawa yî\nclips/c1.wav,plain\nclips/c2.wav,êvarê baş\n".encode(
            "cp1252", "replace"
        )
    )
    _, lines = run_prepare(tmp_path / "clips.csv", tmp_path / "out")
    assert output_rows(tmp_path / "out") == {"clips_c1": ("plain", "0")}
    [note] = [line for line in lines if "not valid UTF-8" in line]
    assert (
        note.startswith("note: 2 row(s) are not valid UTF-8 (the first at clips.csv:2)")
        and "Windows-1252" in note
    )


def test_an_ljspeech_row_not_in_utf8_keeps_its_id_in_the_report(tmp_path):
    src = tmp_path / "lj"
    for i in range(2):
        write_audio(src / "wavs" / f"a{i}.wav", speech("abc", 16000), 16000)
    (src / "metadata.csv").write_bytes("a0|plain\na1|çawa\n".encode("latin-1"))
    run_prepare(src, tmp_path / "out")
    assert skipped_reasons(tmp_path / "out") == {"a1": "malformed_row"}


def test_table_names_an_unused_speaker_column(tmp_path):
    for i in range(2):
        write_audio(tmp_path / "clips" / f"c{i}.wav", speech("abc", 16000), 16000)
    (tmp_path / "clips.csv").write_text(
        "path,text,Speaker_ID\nclips/c0.wav,first,anna\nclips/c1.wav,second,ben\n", encoding="utf-8"
    )
    _, lines = run_prepare(tmp_path / "clips.csv", tmp_path / "out")
    assert output_rows(tmp_path / "out") == {"clips_c0": ("first", "0"), "clips_c1": ("second", "0")}
    assert any("column 'Speaker_ID' is not used" in line for line in lines), lines


def test_a_column_named_speaker_is_read_as_the_speaker(tmp_path):
    # a table with a "speaker" column made every clip speaker 0 unless --speaker_column speaker was given
    for i in range(2):
        write_audio(tmp_path / "clips" / f"c{i}.wav", speech("abc", 16000), 16000)
    for header in ("path,text,speaker", "File,Transcript,Speaker"):
        table = tmp_path / f"{header[0]}.csv"
        table.write_text(f"{header}\nclips/c0.wav,first,anna\nclips/c1.wav,second,ben\n", encoding="utf-8")
        out = tmp_path / f"out_{header[0]}"
        _, lines = run_prepare(table, out)
        assert output_rows(out) == {"clips_c0": ("first", "anna"), "clips_c1": ("second", "ben")}
        said = [line for line in lines if "is read as each clip's speaker" in line]
        assert len(said) == 1 and repr(header.split(",")[2]) in said[0], lines
        assert not any("is not used" in line for line in lines), lines
    # an audiofolder's metadata.jsonl too
    write_audio(tmp_path / "af" / "a.wav", speech("abc", 16000), 16000)
    record = {"file_name": "a.wav", "transcription": "third", "speaker": "cem"}
    (tmp_path / "af" / "metadata.jsonl").write_text(json.dumps(record) + "\n", encoding="utf-8")
    _, lines = run_prepare(tmp_path / "af", tmp_path / "out_af")
    assert output_rows(tmp_path / "out_af") == {"a": ("third", "cem")}
    assert any("column 'speaker' is read as each clip's speaker" in line for line in lines), lines


def test_audiofolder_with_metadata(tmp_path):
    src = tmp_path / "af"
    write_audio(src / "train" / "a.wav", speech("abc", 16000), 16000)
    write_audio(src / "train" / "sub" / "b.flac", speech("de", 16000), 16000)
    (src / "train" / "metadata.csv").write_text(
        "file_name,transcription,speaker_id\na.wav,first,x\nsub/b.flac,second,y\n", encoding="utf-8"
    )
    write_audio(src / "test" / "c.wav", speech("abc", 16000), 16000)
    (src / "test" / "metadata.jsonl").write_text(
        json.dumps({"file_name": "c.wav", "transcription": "third"}) + "\n", encoding="utf-8"
    )
    assert detect_format(str(src))[0] == "audiofolder"
    _, lines = run_prepare(src, tmp_path / "out")
    assert output_rows(tmp_path / "out") == {"a": ("first", "0"), "sub_b": ("second", "0")}
    assert any("column 'speaker_id' is not used" in line for line in lines), lines
    run_prepare(src, tmp_path / "out_test", split="test")
    assert output_rows(tmp_path / "out_test") == {"c": ("third", "0")}


def test_pairs_folder_all_formats(tmp_path):
    src = tmp_path / "pairs"
    rate = 22050
    x = speech("abc def", rate)
    write_audio(src / "w16.wav", x, rate, "PCM_16")
    write_audio(src / "w24.wav", x, rate, "PCM_24")
    write_audio(src / "wfl.wav", x, rate, "FLOAT")
    write_audio(src / "f.flac", x, rate)
    write_audio(src / "o.ogg", x, rate)
    write_audio(src / "m.mp3", x, rate)
    write_audio(src / "nested" / "st.wav", np.stack([x, x * 0.5], axis=1), rate)
    for stem in ["w16", "w24", "wfl", "f", "o", "m"]:
        (src / f"{stem}.txt").write_text(f"text of {stem}\n", encoding="utf-8")
    (src / "nested" / "st.lab").write_text("text of nested/st\n", encoding="utf-8")  # an aligner corpus's
    write_audio(src / "UP.WAV", x, rate)
    (src / "UP.TXT").write_text("text of up\n", encoding="utf-8")  # names in capitals (old recorders)
    write_audio(src / "notext.wav", x, rate)
    (src / "orphan.txt").write_text("no audio", encoding="utf-8")
    (src / "orphan_lab.lab").write_text("no audio", encoding="utf-8")
    (src / "phone.m4a").write_bytes(b"not read here")  # reported as such, not as a missing file
    (src / "phone.txt").write_text("from a phone", encoding="utf-8")
    assert detect_format(str(src))[0] == "pairs"
    result, _ = run_prepare(src, tmp_path / "out")
    rows = output_rows(tmp_path / "out")
    assert set(rows) == {"w16", "w24", "wfl", "f", "o", "m", "nested_st", "UP"}
    assert rows["nested_st"] == ("text of nested/st", "0")
    for clip_id in rows:
        assert wav_info(tmp_path / "out" / "wavs" / f"{clip_id}.wav") == (16000, 1, "PCM_16")
    assert skipped_reasons(tmp_path / "out") == {
        "notext": "missing_text",
        "orphan": "missing_audio",
        "orphan_lab": "missing_audio",
        "phone": "unsupported_audio",
    }
    # Lossless inputs give the same samples whatever their container; the stereo one is the channel mean.
    ref, _ = sf.read(tmp_path / "out" / "wavs" / "w16.wav", dtype="float32")
    for clip_id in ("w24", "wfl", "f"):
        other, _ = sf.read(tmp_path / "out" / "wavs" / f"{clip_id}.wav", dtype="float32")
        assert np.max(np.abs(other - ref)) < 2e-4
    stereo, _ = sf.read(tmp_path / "out" / "wavs" / "nested_st.wav", dtype="float32")
    assert len(stereo) == len(ref)
    assert np.max(np.abs(stereo - 0.75 * ref)) < 2e-4
    assert result.report["counts"]["skipped_by_reason"] == {
        "missing_text": 1,
        "missing_audio": 2,
        "unsupported_audio": 1,
    }


def test_a_data_folder_prepared_inside_a_pairs_source_is_not_read_as_more_clips(tmp_path):
    """--data_dir inside the pairs folder: the next prepare of that folder read its wavs/ as 3 more
    clips, each skipped as missing_text ("kept 3 of 6")."""
    src = tmp_path / "corpus"
    for i in range(3):
        write_audio(src / f"s{i}.wav", speech(rate=16000), 16000)
        (src / f"s{i}.txt").write_text(f"clip {i}\n", encoding="utf-8")
    run_prepare(src, src / "training")
    result, lines = run_prepare(src, tmp_path / "out")
    assert set(output_rows(tmp_path / "out")) == {"s0", "s1", "s2"}
    assert result.report["counts"]["skipped_by_reason"] == {}
    assert any(
        f"{src / 'training'} is not read: a data folder prepare_data.py wrote" in line for line in lines
    )
    # the same data_dir again: the output is left out as before, with no note
    _, lines = run_prepare(src, src / "training")
    assert not any("is not read" in line for line in lines)
    # that data folder itself, and an LJSpeech corpus with one inside, still read as before
    run_prepare(src / "training", tmp_path / "again")
    assert set(output_rows(tmp_path / "again")) == {"s0", "s1", "s2"}
    lj = tmp_path / "lj"
    make_corpus(lj, num_clips=4, sample_rate=16000)
    run_prepare(lj, lj / "training")
    run_prepare(lj, tmp_path / "lj_out")
    assert len(output_rows(tmp_path / "lj_out")) == 4
    # a folder holding nothing but a data folder of ours: that one is named
    only = tmp_path / "only"
    shutil.copytree(src / "training", only / "training")
    with pytest.raises(UserError, match=f"but {only / 'training'}, a data folder prepare_data.py wrote"):
        run_prepare(only, tmp_path / "out_only")


def _corpus_with_table(folder, name: str, header: list[str], sep: str, clips: str = "wavs") -> list[dict]:
    """make_corpus's clips under `folder/clips`, listed in `folder/name` below a header row instead of
    its own metadata.csv (column order: audio path, text, speaker)."""
    rows = make_corpus(folder, num_clips=3)
    (folder / "metadata.csv").unlink()
    if clips != "wavs":
        (folder / "wavs").rename(folder / clips)
    lines = [sep.join(header)]
    lines += [sep.join([f"{clips}/{r['id']}.wav", r["text"], r["speaker"]][: len(header)]) for r in rows]
    (folder / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
    return rows


@pytest.mark.parametrize(
    ("name", "header", "sep", "clips"),
    [
        ("metadata.csv", ["file", "text", "speaker"], ",", "wavs"),
        ("transcripts.tsv", ["path", "sentence"], "\t", "audio"),
        ("list.csv", ["File", "Transcript"], ";", "recordings"),
    ],
)
def test_a_folder_with_one_table_is_read_through_that_table(tmp_path, name, header, sep, clips):
    src = tmp_path / "corpus"
    rows = _corpus_with_table(src, name, header, sep, clips)
    assert detect_format(str(src)) == ("csv", src / name)
    _, lines = run_prepare(src, tmp_path / "out")
    assert output_rows(tmp_path / "out") == {f"{clips}_{r['id']}": (r["text"], r["speaker"]) for r in rows}
    notes = [line for line in lines if name in line and line.startswith("note:")]
    assert len(notes) == 1 and "--source" in notes[0] and "--format" in notes[0], lines


def test_a_folder_with_one_headerless_table_and_hidden_files_is_read_through_that_table(tmp_path):
    # a list without a header row (wavs/a.wav|text) lists the clips too; a hidden ._list.csv (macOS's
    # AppleDouble file in a zip) is no second table, which made it an error naming both
    src = tmp_path / "corpus"
    rows = _corpus_with_table(src, "list.csv", ["file", "text"], "|")
    table = src / "list.csv"
    table.write_text(
        "".join(table.read_text(encoding="utf-8").splitlines(keepends=True)[1:]), encoding="utf-8"
    )
    (src / "._list.csv").write_bytes(b"\0\5\26\7 Mac OS X")
    assert detect_format(str(src)) == ("csv", table)
    run_prepare(src, tmp_path / "out")
    assert {text for text, _ in output_rows(tmp_path / "out").values()} == {r["text"] for r in rows}


def test_a_folder_with_several_tables_names_them_and_reads_none(tmp_path):
    src = tmp_path / "corpus"
    _corpus_with_table(src, "metadata.csv", ["file", "text"], ",")
    (src / "speakers.tsv").write_text("speaker\tname\n0\tAna\n", encoding="utf-8")
    with pytest.raises(UserError, match=r"metadata\.csv, speakers\.tsv.*--source") as err:
        run_prepare(src, tmp_path / "out")
    assert "\n" not in str(err.value)
    assert not (tmp_path / "out").exists()
    run_prepare(src / "metadata.csv", tmp_path / "out")  # the one named is read
    assert len(output_rows(tmp_path / "out")) == 3


def test_a_table_beside_transcribed_clips_leaves_the_folder_read_as_pairs(tmp_path):
    src = tmp_path / "pairs"
    write_audio(src / "a.wav", speech("abc", 16000), 16000)
    (src / "a.txt").write_text("from the pair", encoding="utf-8")
    (src / "notes.csv").write_text("file,text\na.wav,from the table\n", encoding="utf-8")
    assert detect_format(str(src))[0] == "pairs"
    make_corpus(tmp_path / "lj", num_clips=2)  # LJSpeech's own headerless id|text|text stays LJSpeech
    (tmp_path / "lj" / "extra.csv").write_text("file,text\n", encoding="utf-8")
    assert detect_format(str(tmp_path / "lj"))[0] == "ljspeech"


def test_wavs_folder_given_instead_of_the_corpus_names_the_table(tmp_path):
    src = tmp_path / "lj"
    write_audio(src / "wavs" / "a.wav", speech("abc", 16000), 16000)
    (src / "metadata.csv").write_text("a|some text\n", encoding="utf-8")
    with pytest.raises(
        UserError, match=r"no clip has an x\.txt or x\.lab beside it\. Are the transcripts in .*metadata\.csv"
    ):
        run_prepare(src / "wavs", tmp_path / "out")
    (src / "metadata.csv").unlink()
    with pytest.raises(UserError) as err:  # no table near it: no guess
        run_prepare(src / "wavs", tmp_path / "out2")
    assert "no usable clips" in str(err.value) and "Are the transcripts" not in str(err.value)


def test_transcripts_named_x_normalized_txt_are_named_not_asked_for(tmp_path):
    """LibriTTS's layout: x.wav beside x.normalized.txt and x.original.txt. The error said to write x.txt
    for x.wav, beside the two transcripts the corpus has for it."""
    src = tmp_path / "LibriTTS" / "19" / "198"
    write_audio(src / "19_198_000000_000000.wav", speech("abc", 16000), 16000)
    (src / "19_198_000000_000000.normalized.txt").write_text("Hello there.", encoding="utf-8")
    (src / "19_198_000000_000000.original.txt").write_text("Hello there.", encoding="utf-8")
    with pytest.raises(UserError) as err:
        run_prepare(tmp_path / "LibriTTS", tmp_path / "out")
    message = str(err.value)
    assert "write them" not in message, message
    assert "19_198_000000_000000.normalized.txt is beside 19_198_000000_000000.wav" in message, message


def test_transcripts_in_a_folder_of_their_own_are_named_not_asked_for(tmp_path):
    """VCTK's layout: wav48/p225/p225_001.wav and txt/p225/p225_001.txt. The error said to write
    p225_001.txt for p225_001.wav, a file the corpus has, only not beside its clip."""
    src = tmp_path / "vctk"
    for stem in ("p225_001", "p225_002"):
        write_audio(src / "wav48" / "p225" / f"{stem}.wav", speech("abc", 16000), 16000)
        (src / "txt" / "p225").mkdir(parents=True, exist_ok=True)
        (src / "txt" / "p225" / f"{stem}.txt").write_text("Please call Stella.\n", encoding="utf-8")
    with pytest.raises(UserError) as err:
        run_prepare(src, tmp_path / "out")
    message = str(err.value)
    assert "write them" not in message, message
    where = src / "txt" / "p225" / "p225_001.txt"
    assert f"{where} is not beside {src / 'wav48' / 'p225' / 'p225_001.wav'}" in message, message


@pytest.mark.parametrize(
    "content", [b"", b"\n\n", b"\xef\xbb\xbf\r\n"], ids=["empty", "blank lines", "a mark"]
)
def test_an_empty_metadata_csv_beside_the_clips_is_named_as_empty(tmp_path, content):
    # the folder was read as audio + .txt pairs and the error asked "Are the transcripts in
    # .../metadata.csv? Pass it as --source", which then only said the file is empty
    src = tmp_path / "lj"
    write_audio(src / "wavs" / "a.wav", speech("abc", 16000), 16000)
    (src / "metadata.csv").write_bytes(content)
    with pytest.raises(UserError) as err:
        run_prepare(src, tmp_path / "out")
    message = str(err.value)
    assert f"{src / 'metadata.csv'} is empty" in message and "Pass it as --source" not in message, message


def test_a_table_whose_first_64_kib_are_blank_is_not_called_empty(tmp_path):
    # only the first 64 KiB were read: a clip listed after them was in a table "is empty"; the blank
    # lines are skipped now, and the folder is read as LJSpeech
    src = tmp_path / "lj"
    write_audio(src / "wavs" / "a.wav", speech("abc", 16000), 16000)
    (src / "metadata.csv").write_text(" \n" * 40000 + "a|some text\n", encoding="utf-8")
    run_prepare(src, tmp_path / "out")
    assert output_rows(tmp_path / "out") == {"a": ("some text", "0")}
    (src / "metadata.csv").write_text(" \n" * 40000, encoding="utf-8")  # blank to its end: empty
    with pytest.raises(UserError, match="metadata.csv is empty"):
        run_prepare(src, tmp_path / "out2")


@pytest.mark.parametrize("sep", ["\t", ","], ids=["tabs", "commas"])
def test_a_table_of_ids_without_a_header_says_its_first_line_is_a_clip(tmp_path, sep):
    # LJSpeech's id|text written with tabs: its first clip was read as the header, and the error listed
    # that clip's id and text as the columns and asked for --audio_column (naming them dropped that clip)
    src = tmp_path / "lj"
    for name in ("a", "b"):
        write_audio(src / "wavs" / f"{name}.wav", speech("abc", 16000), 16000)
    (src / "metadata.csv").write_text(f"a{sep}some text\nb{sep}more text\n", encoding="utf-8")
    with pytest.raises(UserError) as err:
        run_prepare(src / "metadata.csv", tmp_path / "out")
    message = str(err.value)
    assert "first line" in message and "is a clip" in message and "--audio_column" not in message, message
    assert not (tmp_path / "out").exists()


def test_an_ljspeech_metadata_csv_with_old_mac_line_ends_keeps_every_clip(tmp_path):
    # lines ended by a lone CR (classic Mac OS, some exporters) were read as one malformed row
    make_corpus(tmp_path / "lj", num_clips=3)
    meta = tmp_path / "lj" / "metadata.csv"
    meta.write_bytes(meta.read_bytes().replace(b"\n", b"\r"))
    run_prepare(tmp_path / "lj", tmp_path / "out")
    assert len(output_rows(tmp_path / "out")) == 3


def test_a_parent_folder_that_cannot_be_listed_gives_no_table_hint(tmp_path, monkeypatch):
    from pathlib import Path

    src = tmp_path / "lj"
    write_audio(src / "wavs" / "a.wav", speech("abc", 16000), 16000)
    (src / "metadata.csv").write_text("a|some text\n", encoding="utf-8")
    iterdir = Path.iterdir

    def refusing(self):  # as a folder with execute but no read permission (root passes any chmod)
        if self == src.resolve():
            raise PermissionError(13, "Permission denied", str(self))
        return iterdir(self)

    monkeypatch.setattr(Path, "iterdir", refusing)
    with pytest.raises(UserError) as err:
        run_prepare(src / "wavs", tmp_path / "out")
    assert "no usable clips" in str(err.value) and "Are the transcripts" not in str(err.value)


def test_hub_id_offline_is_one_clear_error(tmp_path):
    with pytest.raises(UserError, match="(?i)hub.*(network|offline)"):
        run_prepare("some-org/some-dataset-that-is-not-cached", tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        ("missing", "no such file or folder"),
        ("empty", "could not detect the format"),
        ("binary", "not a .csv/.tsv"),
    ],
)
def test_detection_failures(tmp_path, setup, message):
    src = tmp_path / "src"
    if setup == "empty":
        src.mkdir()
        (src / "readme.md").write_text("hi", encoding="utf-8")
    elif setup == "binary":
        src = tmp_path / "thing.bin"
        src.write_bytes(b"\x00\x01")
    with pytest.raises(UserError, match=message):
        run_prepare(src, tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("name", ["s01.txt", "s01.lab", "S01.TXT"])
def test_one_clips_transcript_as_source_names_the_folder(tmp_path, name):
    src = tmp_path / "corpus"
    write_audio(src / f"{name[:3]}.{'WAV' if name.isupper() else 'wav'}", speech(rate=16000), 16000)
    (src / name).write_text("Rojbaş, tu çawa yî?\n", encoding="utf-8")
    with pytest.raises(UserError, match="transcript of one clip") as err:
        run_prepare(src / name, tmp_path / "out")
    assert f"--source {src}" in str(err.value) and "audio column" not in str(err.value)
    assert not (tmp_path / "out").exists()
    # a .txt table with no clip of its name beside it is still read as a table
    (src / "list.txt").write_text(f"file_name|text\n{name[:3]}.wav|hello\n", encoding="utf-8")
    assert detect_format(str(src / "list.txt"))[0] == "csv"


def test_unknown_format_name(tmp_path):
    with pytest.raises(UserError, match="unknown format"):
        run_prepare(tmp_path, tmp_path / "out", format="wav2vec")


def test_several_tables_beside_transcribed_clips_are_named_in_one_note_as_not_read(tmp_path):
    from vits_trainer.data.corpus import read_pairs

    src = tmp_path / "pairs"
    write_audio(src / "a0.wav", speech(rate=16000), 16000)
    (src / "a0.txt").write_text("pair", encoding="utf-8")
    for name in ("metadata.csv", "other.tsv"):
        (src / name).write_text("file,text\na0.wav,table\n", encoding="utf-8")
    (note,) = read_pairs(src).notes
    assert "metadata.csv, other.tsv beside them are not read (pass one as --source" in note, note
    (src / "other.tsv").unlink()
    (note,) = read_pairs(src).notes
    assert "metadata.csv beside them is not read (pass it as --source" in note, note


BLANK_TOP = "\n \r\n\t\n"  # blank and whitespace-only lines above the header or the first row


@pytest.mark.parametrize(
    ("name", "header", "sep", "source"),
    [
        ("list.csv", ["file", "text"], ",", "table"),
        ("list.tsv", ["path", "sentence"], "\t", "table"),
        ("list.csv", ["file", "text"], ",", "folder"),
        ("list.txt", [], "|", "table"),  # no header row: the first clip after the blank lines
        ("metadata.csv", ["file_name", "text"], ",", "folder"),  # an audiofolder
    ],
)
def test_blank_lines_above_a_tables_header_are_skipped(tmp_path, name, header, sep, source):
    # the header was taken from the first (blank) line: "no audio column found (... columns: )"
    src = tmp_path / "corpus"
    rows = _corpus_with_table(src, name, header or ["file", "text"], sep)
    table = src / name
    lines = table.read_text(encoding="utf-8").splitlines(keepends=True)[0 if header else 1 :]
    if name == "metadata.csv":  # an audiofolder's names are from its folder
        lines = [line.replace("wavs/", "", 1) for line in lines]
        for r in rows:
            (src / "wavs" / f"{r['id']}.wav").rename(src / f"{r['id']}.wav")
        (src / "wavs").rmdir()
    table.write_text(BLANK_TOP + "".join(lines), encoding="utf-8")
    _, printed = run_prepare(table if source == "table" else src, tmp_path / "out")
    assert sorted(t for t, _ in output_rows(tmp_path / "out").values()) == sorted(r["text"] for r in rows)
    assert skipped_reasons(tmp_path / "out") == {}


def test_blank_lines_above_an_ljspeech_metadata_csv_keep_it_ljspeech(tmp_path):
    # a folder with such a metadata.csv was read as audio + .txt pairs (every clip missing its text)
    rows = make_corpus(tmp_path / "lj", num_clips=3)
    meta = tmp_path / "lj" / "metadata.csv"
    meta.write_text(BLANK_TOP + "id|text\n" + meta.read_text(encoding="utf-8"), encoding="utf-8")
    assert detect_format(str(tmp_path / "lj"))[0] == "ljspeech"
    for source, out in ((tmp_path / "lj", "out"), (meta, "out2")):
        _, printed = run_prepare(source, tmp_path / out)
        assert len(output_rows(tmp_path / out)) == len(rows)
        assert skipped_reasons(tmp_path / out) == {}
        assert any("first line (id|text) is a header row" in line for line in printed), printed


def test_a_bad_row_after_blank_lines_is_reported_at_its_own_line(tmp_path):
    src = tmp_path / "table"
    write_audio(src / "a.wav", speech("abc", 16000), 16000)
    (src / "list.csv").write_text("\n\nfile,text\na.wav,one\nb.wav\n", encoding="utf-8")
    run_prepare(src / "list.csv", tmp_path / "out")
    assert skipped_reasons(tmp_path / "out") == {"b": "malformed_row"}
    report = json.loads((tmp_path / "out" / "prepare_report.json").read_text(encoding="utf-8"))
    assert [s["origin"] for s in report["skipped_rows"]] == ["list.csv:5"]


def test_an_empty_third_column_is_no_speaker_column(tmp_path):
    """id|text| on every line (CRLF, as some exporters write): the texts were right, but a note said the
    empty third column looked like speaker ids and was used as speaker."""
    sentences = {"a0": "silav tu çawa yî", "a1": "roja me xweş e", "a2": "ez baş im spas"}
    words = {f"w{i}": w for i, w in enumerate(["yek", "du", "sê", "çar"])}  # single words: read the same
    for k, rows in enumerate((sentences, words)):
        src, out = tmp_path / f"lj{k}", tmp_path / f"out{k}"
        for clip_id in rows:
            write_audio(src / "wavs" / f"{clip_id}.wav", speech("abc de", 16000), 16000)
        (src / "metadata.csv").write_bytes("".join(f"{i}|{t}|\r\n" for i, t in rows.items()).encode())
        _, printed = run_prepare(src, out)
        assert output_rows(out) == {i: (t, "0") for i, t in rows.items()}
        assert not any("used as speaker" in line for line in printed), printed


@pytest.mark.parametrize(("top", "first"), [("", 1), (BLANK_TOP, 4)])
def test_a_headerless_tables_first_row_spanning_lines_is_reported_at_its_first_line(tmp_path, top, first):
    # the first row's origin was the line its quoted text ended on (2, not 1): reader.line_num after it
    from vits_trainer.data.corpus import read_table

    table = tmp_path / "list.csv"
    table.write_text(top + 'a.wav,"hello\nworld"\nb.wav,second\n', encoding="utf-8")
    origins = [row.origin for row in read_table(table).rows]
    assert origins == [f"list.csv:{first}", f"list.csv:{first + 2}"], origins
