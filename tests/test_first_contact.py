"""What a new user meets first: readable --help, and mistakes reported before the heavy imports.

No network here: the hub tests set HF_HUB_OFFLINE, which the tool must honour at once.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.helpers import PYTHON, ROOT

SCRIPTS = ["train_vits.py", "prepare_data.py", "train_feedback.py"]


def _help(script: str) -> str:
    env = dict(os.environ, COLUMNS="80")
    out = subprocess.run([PYTHON, str(ROOT / script), "--help"], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    return out.stdout


@pytest.mark.parametrize("script", SCRIPTS)
def test_help_shows_only_meaningful_defaults_and_keeps_values_whole(script):
    text = _help(script)
    assert "(default: None)" not in text and "(default: )" not in text
    if script != "prepare_data.py":
        assert "text_encoder,duration_predictor,flow,posterior_encoder,decoder" in text
        assert "facebook/mms-tts-kmr-script_latin" in text or script == "train_feedback.py"


def test_feedback_help_lists_its_own_flags_first():
    text = _help("train_feedback.py")
    assert text.index("\n  --base_model") < text.index("\n  --data_dir") < text.index("\n  --batch_size")
    assert text.index("\n  --feedback_dir") < text.index("\n  --data_dir")
    assert "training settings (as in train_vits.py)" in text


# a mistyped folder is reported before torch is imported: run main() in a fresh interpreter and look
_PROBE = """
import runpy, sys
sys.path.insert(0, {root!r})
sys.argv = [{script!r}, *{args!r}]
try:
    runpy.run_path({path!r}, run_name="__main__")
except SystemExit as end:
    print("exit", end.code, "torch" in sys.modules)
"""


@pytest.mark.parametrize(
    "script,args,expected",
    [
        ("train_vits.py", ["--data_dir", "no/such/folder"], "--data_dir no/such/folder: no such folder"),
        ("train_vits.py", ["--model_name", "./no_model"], "--model_name ./no_model: no such folder"),
        ("train_vits.py", ["--resume", "no/ckpt"], "--resume no/ckpt: no such checkpoint folder"),
        ("train_vits.py", ["--num_speakers", "two"], "--num_speakers must be auto"),
        (
            "train_feedback.py",
            ["--base_model", "no/model", "--feedback_dir", "no/fb"],
            "--base_model no/model: no such folder",
        ),
        ("prepare_data.py", ["--source", "./no/corpus", "--data_dir", "out"], "no such file or folder"),
    ],
)
def test_a_mistyped_path_is_reported_before_torch_loads(tmp_path, script, args, expected):
    code = _PROBE.format(script=script, args=args, path=str(ROOT / script), root=str(ROOT))
    out = subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert out.stdout.strip().splitlines()[-1] == "exit 2 False", (out.stdout, out.stderr)
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and expected in lines[0], lines
    assert list(tmp_path.iterdir()) == [], "nothing may be written"


def test_offline_a_hub_name_fails_at_once_with_the_installed_cli_named(tmp_path):
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    out = subprocess.run(
        [sys.executable, str(ROOT / "prepare_data.py"), "--source", "mistyped_corpus", "--data_dir", "out"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
    )
    assert out.returncode == 2
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "HF_HUB_OFFLINE is set" in lines[0], lines
    assert "hf download mistyped_corpus --repo-type dataset" in lines[0]
    assert "Retrying" not in out.stdout + out.stderr  # the hub clients were told not to try the network


def test_a_data_dirs_metadata_or_wavs_given_as_the_data_dir_names_the_folder_to_pass(tmp_path):
    # --data_dir data/metadata.csv was "no such folder", and --data_dir data/wavs "data/wavs/metadata.csv:
    # no such file (run prepare_data.py first)", of a folder prepare_data.py had made
    from vits_trainer.data.synthetic import make_corpus
    from vits_trainer.errors import UserError
    from vits_trainer.training.config import check_data_dir

    data = tmp_path / "data"
    make_corpus(data, num_clips=2)
    for given in (data / "metadata.csv", data / "wavs"):
        with pytest.raises(
            UserError, match=re.escape(f"--data_dir {given}: ") + f".*pass {re.escape(str(data))}$"
        ):
            check_data_dir(str(given))
    check_data_dir(str(data))


def _probe(cwd, script: str, args: list[str]) -> list[str]:
    """`script` run with `args` in a fresh interpreter: its stderr lines, after it exited 2 before torch loaded."""
    code = _PROBE.format(script=script, args=args, path=str(ROOT / script), root=str(ROOT))
    out = subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, cwd=cwd)
    assert out.stdout.strip().splitlines()[-1] == "exit 2 False", (out.stdout, out.stderr)
    return [line for line in out.stderr.splitlines() if line.strip()]


def test_a_data_dir_prepare_data_did_not_make_shows_the_command_to_run(tmp_path):
    # "no such file (run prepare_data.py first)" said neither how, nor that a folder of clips is a corpus
    empty = tmp_path / "training"
    empty.mkdir()
    (lines,) = _probe(tmp_path, "train_vits.py", ["--data_dir", str(empty)])
    assert lines.startswith(f"error: {empty / 'metadata.csv'}: no such file"), lines
    assert lines.endswith(f"python prepare_data.py --source YOUR_CORPUS --data_dir {empty}"), lines
    corpus = tmp_path / "my_corpus"
    (corpus / "clips").mkdir(parents=True)
    (corpus / "clips" / "a.wav").write_bytes(b"RIFF")
    (corpus / "clips" / "a.txt").write_text("hello", encoding="utf-8")
    (lines,) = _probe(tmp_path, "train_vits.py", ["--data_dir", str(corpus)])
    prepared = tmp_path.resolve() / "my_corpus_prepared"
    assert "holds audio files (clips/a.wav)" in lines and "may be the corpus itself" in lines, lines
    assert f"python prepare_data.py --source {corpus} --data_dir {prepared}" in lines, lines
    assert sorted(p.name for p in tmp_path.iterdir()) == ["my_corpus", "training"], "nothing may be written"


def test_a_data_dir_prepare_data_began_is_to_be_finished_not_read_as_the_corpus(tmp_path):
    # a prepare_data.py run stopped by Ctrl-C leaves wavs/ and its state, no metadata.csv: the error said
    # the folder "was not made by prepare_data.py" and proposed it as --source (no transcripts: no clip)
    import json

    data = tmp_path / "training"
    (data / "wavs").mkdir(parents=True)
    (data / "wavs" / "a.wav").write_bytes(b"RIFF")
    corpus = tmp_path / "my corpus"
    state = {"version": 1, "source": str(corpus), "clips": {"a": {}}}
    (data / ".prepare_state.json").write_text(json.dumps(state), encoding="utf-8")
    (lines,) = _probe(tmp_path, "train_vits.py", ["--data_dir", str(data)])
    assert "was not made by prepare_data.py" not in lines and "begun by prepare_data.py" in lines, lines
    assert f"python prepare_data.py --source {corpus} --data_dir {data}" in lines, lines
