"""`python speak.py`: WAVs from a model folder, one RTF line per file, one-line errors.

The tiny models are freshly initialised, so they speak noise-like audio; what is checked is that it is
there (peak above a small threshold), 16-bit at the model's rate, in the files promised. Nothing here
depends on how fast anything runs: the RTF lines are checked for their form only.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from tests.helpers import PYTHON, ROOT, refuse_reading
from vits_trainer.errors import run_cli
from vits_trainer.speak import main
from vits_trainer.training.checkpoint import MANIFEST

FILE_LINE = re.compile(r"^.+\.wav +\d+\.\d\d s audio +\d+\.\d\d s taken +RTF \d+\.\d{3}$", re.M)
TOTAL_LINE = re.compile(
    r"^total \((\d+) files?\) +\d+\.\d\d s audio +\d+\.\d\d s taken +RTF \d+\.\d{3}$", re.M
)
SPEAKERS = {"alice": 0, "bob": 1, "carol": 2}


@pytest.fixture(scope="module")
def multi_model_dir(tmp_path_factory) -> Path:
    """A tiny three-speaker model with the speakers.json an export of this tool carries."""
    from vits_trainer.model.tiny import make_tiny_model

    folder = make_tiny_model(tmp_path_factory.mktemp("tiny_multi"), num_speakers=3)
    (folder / "speakers.json").write_text(json.dumps(SPEAKERS), encoding="utf-8")
    return folder


def speak(capsys, *args) -> tuple[int, str, str]:
    code = run_cli(main, [str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def check_wav(path: Path, sample_rate: int = 16000) -> np.ndarray:
    info = sf.info(path)
    assert (info.format, info.subtype, info.samplerate, info.channels) == ("WAV", "PCM_16", sample_rate, 1)
    audio, _ = sf.read(path, dtype="float32")
    assert len(audio) > 0 and np.abs(audio).max() > 1e-3, path  # not silent
    return audio


def test_one_sentence_to_a_wav_and_never_over_an_existing_one(tmp_path, capsys, tiny_model_dir):
    out = tmp_path / "sub" / "hello.wav"
    code, stdout, _ = speak(capsys, "--model", tiny_model_dir, "--text", "Abc def ghi", "--out", out)
    assert code == 0
    check_wav(out)
    assert len(FILE_LINE.findall(stdout)) == 1 and TOTAL_LINE.search(stdout).group(1) == "1", stdout
    assert len(stdout.strip().splitlines()) == 3, stdout  # model line, the file, the total

    before = out.read_bytes()
    code, stdout, err = speak(capsys, "--model", tiny_model_dir, "--text", "abc", "--out", out)
    assert code == 2 and stdout == ""
    assert err.startswith("error:") and "--overwrite" in err and len(err.splitlines()) == 1, err
    assert out.read_bytes() == before

    code, _, _ = speak(capsys, "--model", tiny_model_dir, "--text", "abc", "--out", out, "--overwrite")
    assert code == 0 and out.read_bytes() != before


def test_text_file_gives_one_file_per_sentence_and_speakers_by_name(tmp_path, capsys, multi_model_dir):
    lines = tmp_path / "lines.txt"
    lines.write_text("abc de\n\n   \nfgh ij\nklm no\n\n", encoding="utf-8")
    by_name = tmp_path / "by_name"
    code, stdout, _ = speak(
        capsys, "--model", multi_model_dir, "--text_file", lines, "--out", by_name, "--speaker", "bob"
    )
    assert code == 0, stdout
    assert sorted(p.name for p in by_name.iterdir()) == ["0001.wav", "0002.wav", "0003.wav"]
    for path in by_name.iterdir():
        check_wav(path)
    assert len(FILE_LINE.findall(stdout)) == 3 and TOTAL_LINE.search(stdout).group(1) == "3", stdout
    assert "speaker 1 = bob," in stdout  # as --speaker_id 1 names it below: "bob = 1" read backwards

    # the name is the id speakers.json gives it; the same seed gives the same takes
    by_id = tmp_path / "by_id"
    code, stdout, _ = speak(
        capsys, "--model", multi_model_dir, "--text_file", lines, "--out", by_id, "--speaker_id", "1"
    )
    assert code == 0
    assert "speaker 1 = bob," in stdout  # which voice an id is, as speakers.json names it
    for name in ("0001.wav", "0002.wav", "0003.wav"):
        assert (by_id / name).read_bytes() == (by_name / name).read_bytes()


def test_bad_input_is_one_error_line(tmp_path, capsys, tiny_model_dir, multi_model_dir):
    blank = tmp_path / "blank.txt"
    blank.write_text("\n  \n", encoding="utf-8")
    existing = tmp_path / "existing.wav"
    existing.write_bytes(b"mine")
    wav = tmp_path / "new.wav"
    no_vocab = shutil.copytree(tiny_model_dir, tmp_path / "no_vocab")
    (no_vocab / "vocab.json").unlink()
    truncated = shutil.copytree(tiny_model_dir, tmp_path / "truncated")
    (truncated / "model.safetensors").write_bytes((tiny_model_dir / "model.safetensors").read_bytes()[:100])
    step = shutil.copytree(tiny_model_dir, tmp_path / "checkpoints" / "step_00000010")
    (step / MANIFEST).write_text("{}", encoding="utf-8")
    half = tmp_path / "checkpoints" / "step_00000020"  # a save cut before its manifest
    half.mkdir()
    (half / "generator.safetensors").write_bytes(b"partial")
    (half / "config.json").write_text("{}", encoding="utf-8")
    cases = {
        "no vocab.json": (["--model", no_vocab, "--text", "abc", "--out", wav], "no vocab.json"),
        "damaged weights": (["--model", truncated, "--text", "abc", "--out", wav], "damaged or incomplete"),
        "a damaged checkpoint": (["--model", step, "--text", "abc", "--out", wav], "damaged checkpoint"),
        "a half-saved checkpoint": (["--model", half, "--text", "abc", "--out", wav], "no manifest"),
        "out under a file": (
            ["--model", tiny_model_dir, "--text", "abc", "--out", blank / "x.wav"],
            "cannot be written",
        ),
        "missing folder": (["--model", tmp_path / "nope", "--text", "abc", "--out", wav], "no such folder"),
        "single speaker, id 1": (
            ["--model", tiny_model_dir, "--text", "abc", "--out", wav, "--speaker_id", "1"],
            "single-speaker",
        ),
        "id out of range": (
            ["--model", multi_model_dir, "--text", "abc", "--out", wav, "--speaker_id", "3"],
            "speakers 0..2",
        ),
        "unknown name": (
            ["--model", multi_model_dir, "--text", "abc", "--out", wav, "--speaker", "dave"],
            "alice, bob, carol",
        ),
        "empty text": (["--model", tiny_model_dir, "--text", "  ", "--out", wav], "--text is empty"),
        "only blank lines": (
            ["--model", tiny_model_dir, "--text_file", blank, "--out", tmp_path / "f"],
            "every line is blank",
        ),
        "not a wav name": (["--model", tiny_model_dir, "--text", "abc", "--out", tmp_path / "a.mp3"], ".wav"),
        "existing file": (["--model", tiny_model_dir, "--text", "abc", "--out", existing], "--overwrite"),
        "nothing speakable": (
            ["--model", tiny_model_dir, "--text", "€€ ¥", "--out", wav],
            "--text: '€€ ¥' has no character",
        ),
        # a traceback once the model had loaded: the frame count overflowed, torch refused the seed
        "a rate far too slow": (
            ["--model", tiny_model_dir, "--text", "abc", "--out", wav, "--speaking_rate", "1e-30"],
            "--speaking_rate: must be between 0.1 and 10",
        ),
        "a seed torch cannot take": (
            ["--model", tiny_model_dir, "--text", "abc", "--out", wav, "--seed", str(10**20)],
            "--seed: must be from -2**63 to 2**64 - 1",
        ),
    }
    for name, (args, expected) in cases.items():
        code, stdout, err = speak(capsys, *args)
        assert code == 2, name
        assert err.startswith("error:") and len(err.splitlines()) == 1, (name, err)
        assert expected in err, (name, err)
    assert existing.read_bytes() == b"mine" and not wav.exists() and not (tmp_path / "f").exists()


def test_a_text_file_in_another_encoding_is_named_with_its_line_and_utf16_is_read(
    tmp_path, capsys, tiny_model_dir
):
    # a Latin-1 file was "not UTF-8 text (... at byte 7)": no line, no fix; Notepad's UTF-16 was refused
    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes("abc\ncafé abc\n".encode("latin-1"))
    code, _, err = speak(capsys, "--model", tiny_model_dir, "--text_file", latin1, "--out", tmp_path / "a")
    assert code == 2 and err.startswith("error:") and len(err.splitlines()) == 1, err
    assert f"--text_file {latin1}: line 2 is not UTF-8 text" in err and "save it as UTF-8" in err, err
    utf16 = tmp_path / "utf16.txt"
    utf16.write_text("abc de\nfgh ij\n", encoding="utf-16")  # with its byte-order mark
    code, stdout, err = speak(
        capsys, "--model", tiny_model_dir, "--text_file", utf16, "--out", tmp_path / "b"
    )
    assert code == 0, err
    assert sorted(p.name for p in (tmp_path / "b").iterdir()) == ["0001.wav", "0002.wav"]


@pytest.mark.parametrize("how", ["script", "module"])
def test_in_a_subprocess_as_the_script_from_any_folder_and_as_a_module(tmp_path, tiny_model_dir, how):
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    out = tmp_path / "sub.wav"
    # the script runs from any folder, as train_vits.py does; the module from the repository's
    head, cwd = (
        ([str(ROOT / "speak.py")], tmp_path) if how == "script" else (["-m", "vits_trainer.speak"], ROOT)
    )
    command = [PYTHON, *head, "--model", str(tiny_model_dir), "--out", str(out)]
    done = subprocess.run(
        [*command, "--text", "abc de", "--seed", "3", "--speaking_rate", "0.8", "--device", "cpu"],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    check_wav(out)
    assert FILE_LINE.search(done.stdout) and TOTAL_LINE.search(done.stdout), done.stdout

    again = subprocess.run([*command, "--text", "abc"], cwd=ROOT, env=env, capture_output=True, text=True)
    assert again.returncode == 2 and "Traceback" not in again.stderr
    assert again.stderr.startswith("error:") and len(again.stderr.splitlines()) == 1, again.stderr


def test_a_file_of_the_model_given_as_the_model_names_its_folder(tmp_path, tiny_model_dir, monkeypatch):
    # --model_name model/config.json said "folder has no config.json", of the very file given
    from vits_trainer.errors import UserError
    from vits_trainer.hub import resolve_model_dir

    for name in ("config.json", "model.safetensors"):
        given = tiny_model_dir / name
        with pytest.raises(
            UserError, match=re.escape(f"is a file, not a model folder: pass {tiny_model_dir}")
        ):
            resolve_model_dir(str(given), "--model_name")
    # given from inside the model folder: "pass ." read as a sentence cut short; the folder is named
    monkeypatch.chdir(tiny_model_dir)
    with pytest.raises(UserError, match=re.escape(f"not a model folder: pass {tiny_model_dir.resolve()}")):
        resolve_model_dir("model.safetensors", "--model")
    notes = tmp_path / "notes.txt"
    notes.write_text("x", encoding="utf-8")
    with pytest.raises(UserError, match=r"notes\.txt: is a file, not a model folder \(expected"):
        resolve_model_dir(str(notes), "--model")


def test_a_checkpoint_folder_given_as_the_model_names_the_model_folders_in_it(tmp_path, tiny_model_dir):
    """`--model training/checkpoints` (the run's folder, not a model in it) said only 'no config.json'."""
    from vits_trainer.errors import UserError
    from vits_trainer.hub import resolve_model_dir

    run = tmp_path / "checkpoints"
    for name in ("best_model", "step_00000010", "step_00000020"):
        shutil.copytree(tiny_model_dir, run / name)
    (run / "samples").mkdir()
    expected = f"pass one of them, e.g. {run / 'best_model'} (best_model, step_00000020)"
    with pytest.raises(UserError, match=re.escape(expected)):
        resolve_model_dir(str(run), "--model")
    # a folder holding no model folder: the message as before, no list
    with pytest.raises(UserError, match=r"no config.json \(expected a saved VitsModel folder\)$"):
        resolve_model_dir(str(run / "samples"), "--model")


def test_a_speaker_named_by_its_own_id_is_not_named_twice(tmp_path):
    # a speaker column of 0, 1, ...: "speaker 1 = 1" says nothing the id does not
    from vits_trainer.speak import _name_of

    state = {"speakers": {"0": 0, "1": 1, "bob": 1}}
    assert _name_of(0, tmp_path, state) == ""
    assert _name_of(1, tmp_path, state) == " = bob"
    (tmp_path / "speakers.json").write_text(json.dumps({"0": 0, "1": 1}), encoding="utf-8")
    assert _name_of(1, tmp_path, None) == ""


def test_a_text_file_that_cannot_be_read_is_one_error_line(tmp_path, capsys, tiny_model_dir, monkeypatch):
    # permission denied was a traceback, and a folder given as the file "no such file"
    lines = tmp_path / "lines.txt"
    lines.write_text("abc\n", encoding="utf-8")
    folder = tmp_path / "texts"
    folder.mkdir()
    refuse_reading(monkeypatch, lines)
    for given, expected in (
        (lines, f"--text_file {lines}: cannot be read (Permission denied); make it readable"),
        (folder, f"--text_file {folder}: is a folder where a file is expected"),
    ):
        code, _, err = speak(capsys, "--model", tiny_model_dir, "--text_file", given, "--out", tmp_path / "o")
        assert code == 2 and err.startswith("error:") and len(err.splitlines()) == 1, err
        assert expected in err and "Traceback" not in err, err
    assert not (tmp_path / "o").exists()


def test_a_long_text_is_cut_into_pieces_at_its_sentences_and_each_fits():
    """A text over PIECE_CHARS is spoken in pieces: whole sentences where they fit (several to a piece),
    a longer one cut at its commas, then between words, a longer word where the limit falls; nothing of
    the text is lost or reordered. One forward over a long text took memory with the square of its
    tokens (4,000 characters: 5 GB with the tiny model; ~18,000 were killed)."""
    from vits_trainer.model.synthesis import pieces_of

    assert pieces_of("abc, def.  ghi") == ["abc, def.  ghi"]  # within the limit: as it is
    sentences = [f"sentence {k} has some words in it." for k in range(40)]
    text = " ".join(sentences)
    pieces = pieces_of(text, limit=100)
    assert all(len(p) <= 100 for p in pieces) and " ".join(pieces) == text
    assert all(p.endswith(".") for p in pieces)  # cut between sentences only
    # packed: the next piece's first sentence did not fit in the one before
    assert all(len(a) + 1 + len(b.split(".")[0]) + 1 > 100 for a, b in zip(pieces, pieces[1:], strict=False))

    clauses = ", ".join(["a clause of words"] * 12) + "."
    assert [len(p) for p in pieces_of(clauses, limit=60)] == [56] * 4  # three 18-character clauses each
    assert all(p.endswith((",", ".")) for p in pieces_of(clauses, limit=60))
    words = " ".join(["word"] * 30)
    assert all(len(p) <= 12 for p in pieces_of(words, limit=12)) and " ".join(pieces_of(words, 12)) == words
    assert pieces_of("x" * 25, limit=10) == ["x" * 10, "x" * 10, "x" * 5]


def test_a_long_text_is_spoken_in_pieces_into_one_file(tmp_path, capsys, tiny_model_dir):
    """Over PIECE_CHARS characters: one WAV, the pieces joined by a short silence, and a note saying so."""
    from vits_trainer.model.synthesis import PIECE_CHARS

    sentence = "abc def ghi jkl mno abc def ghi jkl mno."
    text = " ".join([sentence] * (2 * PIECE_CHARS // len(sentence) + 2))
    out = tmp_path / "long.wav"
    code, stdout, _ = speak(capsys, "--model", tiny_model_dir, "--text", text, "--out", out)
    assert code == 0, stdout
    check_wav(out)
    assert f"{len(text)} characters, spoken in 3 pieces of at most {PIECE_CHARS}" in stdout, stdout
    assert len(FILE_LINE.findall(stdout)) == 1 and TOTAL_LINE.search(stdout).group(1) == "1", stdout


def test_a_model_whose_weights_diverged_writes_no_wav(tmp_path, capsys, tiny_model_dir):
    """A model trained to NaN (a --learning_rate far too high) spoke NaN samples, which the 16-bit
    conversion wrote as a WAV of noise or silence, exit 0: nothing said the model was broken."""
    import torch
    from transformers import VitsModel

    broken = tmp_path / "broken"
    shutil.copytree(tiny_model_dir, broken)
    model = VitsModel.from_pretrained(broken)
    with torch.no_grad():
        next(model.decoder.parameters()).fill_(float("nan"))
    model.save_pretrained(broken)
    capsys.readouterr()  # the progress bars of loading and saving it
    out = tmp_path / "out.wav"
    code, _, err = speak(capsys, "--model", broken, "--text", "Abc def ghi", "--out", out)
    assert code == 2 and not out.exists()
    assert err.startswith("error:") and "NaN" in err and len(err.splitlines()) == 1, err
