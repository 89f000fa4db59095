"""train_feedback.py: feedback + replay through the runner's loop, versions, promotion, resume, bad input.

The end-to-end tests start from a tiny model trained briefly on the tone corpus by the real Trainer, and
feed back sentences of new, longer "words" of the same tone language.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import shlex
import shutil
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.helpers import PYTHON, ROOT, TINY_SETTINGS, cli_args, train_tiny
from vits_trainer.data.clipstore import load_clip_store
from vits_trainer.data.synthetic import make_corpus
from vits_trainer.errors import UserError
from vits_trainer.feedback.config import HIDDEN_FLAGS, FeedbackConfig
from vits_trainer.feedback.judgement import paired_judgement
from vits_trainer.feedback.promotion import promotion
from vits_trainer.feedback.replay import add_feedback_speakers, check_feedback_inputs, original_val_ids
from vits_trainer.feedback.round import FeedbackRun, run_feedback
from vits_trainer.feedback.versions import REPORT_NAME, choose_version, read_latest, write_latest
from vits_trainer.training.checkpoint import write_checkpoint

UNKNOWN_TEXT_ID = "fb00011"  # its sentence gets characters the tiny vocabulary (a-o) lacks


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Two cores shared with other jobs: spinning OpenMP threads made steps ~30x slower; one is steady."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def quiet_env() -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def base(tmp_path_factory, tiny_model_dir, tone_corpus):
    """A base model: 20 steps of the runner on the tone corpus; its best_model is what users pass. (Few:
    from the VITS initialisation 60 steps already reach a val_mel ~0.97, where 30 feedback steps move it
    less than the guard's noise threshold.)"""
    tmp = tmp_path_factory.mktemp("feedback_base")
    session, _ = train_tiny(tmp, tone_corpus, tiny_model_dir, max_steps=20, target_hours=0.5)
    return {
        "model": tmp / "checkpoints" / "best_model",
        "data": tone_corpus,
        "val_ids": list(session.data.val_ids),
        "train_ids": session.data.train.ids(),
    }


@pytest.fixture(scope="module")
def light_base(tmp_path_factory, tiny_model_dir, tone_corpus):
    """An untrained base with a recorded split: enough for the data tests (no training needed)."""
    import shutil

    model = tmp_path_factory.mktemp("light_base") / "model"
    shutil.copytree(tiny_model_dir, model)
    ids = [line.split("|")[0] for line in (tone_corpus / "metadata.csv").read_text().splitlines()]
    val_ids = ids[3:40:10]
    (model / "training_split.json").write_text(json.dumps({"val_ids": val_ids}))
    return {
        "model": model,
        "data": tone_corpus,
        "val_ids": val_ids,
        "train_ids": [i for i in ids if i not in val_ids],
    }


def with_text(row: str, text: str) -> str:
    clip_id, _, speaker = row.split("|")
    return f"{clip_id}|{text}|{speaker}"


def make_feedback(folder: Path, num_clips: int = 12, seed: int = 7) -> Path:
    """Longer sentences of fresh words than the base corpus has; one text with unknown characters."""
    make_corpus(folder, num_clips=num_clips, seed=seed, id_prefix="fb", min_words=5, max_words=7)
    meta = folder / "metadata.csv"
    lines = meta.read_text(encoding="utf-8").splitlines()
    lines = [
        with_text(line, line.split("|")[1] + " xz") if line.startswith(UNKNOWN_TEXT_ID + "|") else line
        for line in lines
    ]
    meta.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return folder


@pytest.fixture(scope="module")
def feedback_dir(tmp_path_factory) -> Path:
    return make_feedback(tmp_path_factory.mktemp("feedback") / "feedback")


def feedback_cfg(out: Path, base: dict, feedback: Path, **overrides) -> FeedbackConfig:
    settings = dict(TINY_SETTINGS)
    settings.update(
        base_model=str(base["model"]),
        feedback_dir=str(feedback),
        data_dir=str(base["data"]),
        output_dir=str(out),
        learning_rate=1e-4,  # the tiny model is far from converged: 1e-5 would move it too little to see
        target_hours=0.5,
        save_minutes=10.0,
    )
    settings.update(overrides)
    return dataclasses.replace(FeedbackConfig(), **settings)


# ---- settings and small pieces ------------------------------------------------------------------------


def test_command_line_hides_derived_settings_and_has_feedback_defaults():
    import argparse

    from vits_trainer.training.config import add_arguments, config_from_args

    parser = argparse.ArgumentParser()
    add_arguments(parser, FeedbackConfig, skip=HIDDEN_FLAGS)
    flags = {s.lstrip("-") for a in parser._actions for s in a.option_strings}
    assert {"model_name", "checkpoint_dir", "extend_vocab", "demo"}.isdisjoint(flags)
    assert {"base_model", "feedback_dir", "replay_ratio", "max_regression", "resume", "fp16", "bf16"} <= flags
    cfg = config_from_args(parser.parse_args([]), FeedbackConfig)
    assert (cfg.learning_rate, cfg.target_hours, cfg.replay_ratio, cfg.max_regression) == (
        1e-5,
        0.5,
        1.0,
        0.02,
    )
    assert cfg.output_dir == "training/feedback_models"
    with pytest.raises(UserError, match="replay_ratio"):
        dataclasses.replace(cfg, replay_ratio=-1.0).validate()


def test_a_small_replay_ratio_replays_at_least_one_clip():
    from vits_trainer.feedback.replay import replay_per_epoch

    assert [replay_per_epoch(r, n) for r, n in ((0.1, 4), (0.5, 1), (0.3, 10), (1.0, 7), (0.0, 9))] == [
        1,
        1,
        3,
        7,
        0,
    ]


def test_a_round_resumed_with_another_replay_ratio_keeps_the_earlier_one_in_its_report():
    # feedback_run.json's "replay" (the report's) was rewritten by each session: a round that trained
    # with --replay_ratio 1 and was resumed with 0.5 reported 0.5 alone
    from vits_trainer.feedback.replay import replay_record

    first = replay_record(None, 1.0, 8, 100)
    assert first == {"ratio": 1.0, "per_epoch": 8, "pool": 100}
    assert replay_record(first, 1.0, 8, 100) == first  # resumed as it was
    second = replay_record(first, 0.5, 4, 100)
    assert second == {"ratio": 0.5, "per_epoch": 4, "pool": 100, "earlier_ratios": [1.0]}
    assert replay_record(second, 0.5, 4, 100) == second
    assert replay_record(second, 2.0, 16, 100)["earlier_ratios"] == [1.0, 0.5]


def test_promotion_rule():
    fb = ({"val_mel": 2.0}, {"val_mel": 1.5})
    clear = paired_judgement({"a": 2.0, "b": 2.1, "c": 1.9}, {"a": 1.5, "b": 1.62, "c": 1.41})
    assert promotion(*fb, {"val_mel": 1.0}, {"val_mel": 1.019}, 0.02, clear)[0]
    ok, why = promotion(*fb, {"val_mel": 1.0}, {"val_mel": 1.03}, 0.02, clear)
    assert not ok and "regressed" in why and "+3.0%" in why
    assert promotion(*fb, {"val_mel": 2.0}, {"val_mel": 2.5}, 0.25, clear)[0]  # at most the limit: exactly
    ok, why = promotion({"val_mel": 2.0}, {"val_mel": 2.0}, {"val_mel": 1.0}, {"val_mel": 0.9}, 0.02)
    assert not ok and "did not improve" in why
    ok, why = promotion({"val_mel": 2.0}, {"val_mel": float("nan")}, {"val_mel": 1.0}, {"val_mel": 1.0}, 0.02)
    assert not ok and "not finite" in why
    assert not promotion(*fb, {}, {}, 0.02, clear)[0]  # forgetting not measurable: never promoted
    for before in (float("nan"), float("inf"), 0.0):  # a broken "before": its change passed the limit
        ok, why = promotion(*fb, {"val_mel": before}, {"val_mel": 9.9}, 0.02, clear)
        assert not ok and "not finite" in why, before
    ok, why = promotion(*fb, {"val_mel": 1.0}, {"val_mel": 1.0}, 0.02)  # no per-clip judgement
    assert not ok and "not enough held-out clips" in why


def test_a_round_whose_spoken_sentences_drift_from_their_recordings_is_warned_about():
    """The mel improved (-4.2 %) while the sentences spoken from text alone moved 26 % further from
    their recordings: the promotion rule does not weigh it, a warning line says it."""
    from vits_trainer.feedback.promotion import spoken_warning

    before = {"val_mel": 3.2010, "val_mel_dtw": 1.8933, "val_mcd": 68.76}
    after = {"val_mel": 3.0665, "val_mel_dtw": 2.3828, "val_mcd": 80.91}
    assert spoken_warning(before, after, "v2/samples/after") == (
        "warning: the feedback sentences spoken from text alone moved away from their recordings: "
        "val_mel_dtw 1.8933 -> 2.3828 (+25.9%), val_mcd 68.76 -> 80.91 dB; listen to v2/samples/after "
        "before relying on this version"
    )
    assert spoken_warning(before, {**after, "val_mel_dtw": 2.05}, "x") is None  # +8.3 %: no warning
    assert spoken_warning({"val_mel": 1.0}, {"val_mel": 0.9}, "x") is None  # free-running not scored


def test_judgement_needs_an_improvement_beyond_the_noise_on_enough_clips():
    # the case seen: 1.2717911 -> 1.2717762 on one held-out clip
    one = paired_judgement({"a": 1.2717911}, {"a": 1.2717762})
    assert not one["improved"] and "not enough held-out clips to judge (1 measured" in one["why"]
    # a mean that fell, by less than its noise: per-clip changes of both signs
    before = {"a": 1.20, "b": 1.30, "c": 1.25, "d": 1.22}
    noisy = paired_judgement(before, {"a": 1.15, "b": 1.33, "c": 1.21, "d": 1.24})
    assert noisy["mean_diff"] < 0 and not noisy["improved"], noisy
    assert "no improvement beyond the noise" in noisy["why"] and noisy["threshold"] > -noisy["mean_diff"]
    ok, why = promotion(
        {"val_mel": 1.2425}, {"val_mel": 1.2325}, {"val_mel": 1.0}, {"val_mel": 1.0}, 0.02, noisy
    )
    assert not ok and "no improvement beyond the noise" in why
    # the same mean change, consistent across the clips: real
    real = paired_judgement(before, {k: v - 0.01 + 0.001 * i for i, (k, v) in enumerate(before.items())})
    assert real["improved"] and real["clips"] == 4 and real["t_critical"] == pytest.approx(2.353, abs=1e-3)
    # the noise is the sample standard deviation (n - 1) of the changes: -1.5 +- 1 over 3 clips is
    # within t(0.95, 2) x 1 / sqrt(3) = 1.686 (with the population deviation it passed, at 1.376)
    by_hand = paired_judgement({"a": 3.0, "b": 3.0, "c": 3.0}, {"a": 2.5, "b": 1.5, "c": 0.5})
    assert by_hand["std_error"] == pytest.approx(1 / math.sqrt(3))
    assert by_hand["threshold"] == pytest.approx(2.919986 / math.sqrt(3), rel=1e-5)
    assert by_hand["mean_diff"] == pytest.approx(-1.5) and not by_hand["improved"]
    # a worse model is never "improved", however clear
    assert not paired_judgement(before, {k: v + 0.1 for k, v in before.items()})["improved"]
    # non-finite clips are not counted
    assert paired_judgement({**before, "e": 1.0}, {**before, "e": float("nan")})["clips"] == 4
    # nor those a resumed round read back as null from feedback_run.json
    assert paired_judgement({**before, "e": None}, {**before, "e": 1.0})["clips"] == 4


def test_feedback_files_write_a_nan_score_as_null_which_strict_json_readers_accept(tmp_path):
    from vits_trainer.jsonfile import write_json_atomic

    write_json_atomic(tmp_path / REPORT_NAME, {"per_clip_before": {"a": float("nan"), "b": 1.5}})
    text = (tmp_path / REPORT_NAME).read_text(encoding="utf-8")
    assert json.loads(text, parse_constant=lambda word: pytest.fail(f"{word} in {text}")) == {
        "per_clip_before": {"a": None, "b": 1.5}
    }


def test_versions_resume_auto_takes_only_the_newest_unfinished(tmp_path):
    root = tmp_path / "models"
    assert choose_version(root, "auto") == (root / "v1", False)
    (root / "v1").mkdir(parents=True)
    (root / "v1" / REPORT_NAME).write_text("{}")
    assert choose_version(root, "auto") == (root / "v2", False)
    (root / "v2").mkdir()  # started, never saved a checkpoint: started again
    assert choose_version(root, "auto") == (root / "v2", False)
    ckpt = write_checkpoint(root / "v2" / "checkpoints", 5, {"x.json": b"{}"})
    assert choose_version(root, "auto") == (root / "v2", True)
    assert choose_version(root, "none") == (root / "v3", False)
    assert choose_version(root, str(ckpt)) == (root / "v2", True)
    with pytest.raises(UserError, match="finished"):
        v1 = write_checkpoint(root / "v1" / "checkpoints", 3, {"x.json": b"{}"})
        choose_version(root, str(v1))


def test_a_users_own_vN_folder_is_never_taken_for_a_version(tmp_path, tiny_model_dir, tone_corpus):
    """A `v1/` of the user's under --output_dir was taken for an unfinished version: its checkpoints/
    and samples/ were deleted and the round wrote into it. It is refused, untouched."""
    from vits_trainer.feedback.versions import VERSION_MARKER, claim_version

    out = tmp_path / "models"
    (out / "v1" / "checkpoints").mkdir(parents=True)
    (out / "v1" / "checkpoints" / "my_notes.txt").write_text("precious")
    feedback = tmp_path / "feedback"
    make_corpus(feedback, num_clips=4, seed=1, id_prefix="fb")
    base = {"model": tiny_model_dir, "data": tone_corpus}
    proc = subprocess.run(
        feedback_cmd(out, base, feedback), capture_output=True, text=True, timeout=120, env=quiet_env()
    )
    errors = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode != 0 and len(errors) == 1 and "v1/ was not made by train_feedback.py" in errors[0]
    assert sorted(p.name for p in (out / "v1").rglob("*")) == ["checkpoints", "my_notes.txt"]
    # a version this tool makes carries its marker from the start; then it is its own
    assert claim_version(out / "v2") and (out / "v2" / VERSION_MARKER).is_file()
    assert not claim_version(out / "v2")


def test_latest_pointer_is_replaced_atomically(tmp_path):
    for name in ("v1", "v2"):
        (tmp_path / name / "model").mkdir(parents=True)
    write_latest(tmp_path, tmp_path / "v1", print)
    write_latest(tmp_path, tmp_path / "v2", print)
    latest = read_latest(tmp_path)
    assert latest["version"] == "v2" and Path(latest["path"]) == (tmp_path / "v2" / "model").resolve()
    if (tmp_path / "latest").is_symlink():
        assert (tmp_path / "latest").resolve() == (tmp_path / "v2" / "model").resolve()
    assert not list(tmp_path.glob(".*tmp*"))


def test_a_round_from_another_model_than_the_current_one_is_warned_and_not_promoted(
    tmp_path, light_base, feedback_dir
):
    """Round 1's command run again started v3 from the original base; judged against that base alone it
    was promoted over v1, worse than v1 on both scores. Such a round is warned about before training,
    and the check that keeps it from being promoted names the current model."""
    from types import SimpleNamespace

    out = tmp_path / "models"
    shutil.copytree(light_base["model"], out / "v1" / "model")
    write_latest(out, out / "v1", lambda _line: None)
    lines: list[str] = []
    run = FeedbackRun(feedback_cfg(out, light_base, feedback_dir), time.time(), lines.append)
    run.inputs = SimpleNamespace(base_model=Path(light_base["model"]))
    assert run.base_is_not_current(read_latest(out)) == f"v1 ({out / 'v1' / 'model'})"
    run.warn_base_not_current()
    assert len(lines) == 1 and lines[0].startswith("warning: --base_model"), lines
    assert "will not be promoted" in lines[0] and f"--base_model {out / 'latest'}" in lines[0]
    # the documented next round: from latest (or the version's model folder), nothing said
    for base in (out / "v1" / "model", *([out / "latest"] if (out / "latest").exists() else [])):
        run.inputs = SimpleNamespace(base_model=base)
        assert run.base_is_not_current(read_latest(out)) is None
    # the decision: a clear improvement on its own base is not promoted over v1 (the round's figures are
    # made up: the rule under test is the base's, not the evaluation's) ...
    shutil.copytree(light_base["model"], out / "v2" / "model")
    run.version, run.feedback_eval, run.feedback_train = out / "v2", [], []
    run.info = {
        "per_clip_before": {"a": 2.0, "b": 2.1, "c": 1.9},
        "feedback_split": {"held_out": ["a", "b", "c"]},
    }
    session = SimpleNamespace(
        state=SimpleNamespace(val_history=[{"tag": "start", "feedback_val_mel": 2.0, "val_mel": 1.0}])
    )
    summary = {
        "steps": 5,
        "final_val": {"feedback_val_mel": 1.5, "val_mel": 1.0},
        "final_model": str(out / "v2" / "model"),
    }
    after = {"a": 1.5, "b": 1.62, "c": 1.41}
    run.inputs = SimpleNamespace(base_model=Path(light_base["model"]))
    report = run.report(session, summary, after)
    assert not report["promoted"], report["reason"]
    assert "trained from another model than the current one, v1" in report["reason"]
    assert read_latest(out)["version"] == "v1"
    # ... where the same round from the current model is
    run.inputs = SimpleNamespace(base_model=out / "v1" / "model")
    assert run.report(session, summary, after)["promoted"] and read_latest(out)["version"] == "v2"
    # no current model yet (the first round): nothing to compare with
    (out / "latest.json").unlink()
    run.inputs = SimpleNamespace(base_model=Path(light_base["model"]))
    assert run.base_is_not_current(read_latest(out)) is None


def test_unknown_characters_are_reported_before_training(tmp_path, tiny_model_dir, tone_corpus):
    feedback = tmp_path / "fb"
    make_corpus(feedback, num_clips=3, seed=5, id_prefix="fb")
    rows = (feedback / "metadata.csv").read_text().splitlines()
    rows[0] = with_text(rows[0], rows[0].split("|")[1] + " qxq")
    rows[1] = with_text(rows[1], "xyzqrs")  # nothing the model can say: unusable
    (feedback / "metadata.csv").write_text("\n".join(rows) + "\n")
    lines: list[str] = []
    base = {"model": tiny_model_dir, "data": tone_corpus}
    inputs = check_feedback_inputs(feedback_cfg(tmp_path / "out", base, feedback), lines.append)
    assert inputs.unknown_characters == {"fb00000": ["q", "x"], "fb00001": ["q", "r", "s", "x", "y", "z"]}
    assert inputs.usable == 2 and inputs.unusable[0][0] == "fb00001"
    text = "\n".join(lines)
    assert "2 of 3 sentence(s) use characters outside the model's vocabulary" in text
    assert "fb00000" in text and "'q', 'x'" in text
    assert not (tmp_path / "out").exists()


# ---- the replay mix -----------------------------------------------------------------------------------


@pytest.mark.parametrize("ratio", [1.0, 2.0])
def test_replay_mix_per_epoch_and_no_validation_clip_replayed(tmp_path, light_base, feedback_dir, ratio):
    base = light_base
    cfg = feedback_cfg(tmp_path / "out", base, feedback_dir, replay_ratio=ratio)
    lines: list[str] = []
    run = FeedbackRun(cfg, time.time(), lines.append)
    run.inputs = check_feedback_inputs(cfg, lines.append)
    store, _ = load_clip_store(base["data"], 16000, log=lines.append, progress=False)
    val_ids, source = original_val_ids(run.inputs.base_model, store.ids, cfg, lines.append)
    assert sorted(val_ids) == sorted(base["val_ids"])
    assert source.endswith("training_split.json")

    split = run.data_fn(cfg, store, run.inputs.text, {"0": 0}, 256, None, lines.append)
    assert list(split.val_sets) == ["feedback", "val"]  # feedback first: it is what the run is for
    assert sorted(split.val_sets["val"].ids()) == sorted(base["val_ids"])
    n_fb = len(run.feedback_train)
    assert n_fb == 9 and len(run.feedback_eval) == 3  # 12 clips: 20 %, but 3 held out to judge a promotion
    assert not any("cannot be promoted" in line for line in lines)
    assert not set(run.feedback_train.ids()) & set(run.feedback_eval.ids())
    expected_replay = round(ratio * n_fb)
    assert split.epoch_samples == n_fb + expected_replay

    sampler, draws = split.sampler, []
    for epoch in range(3):
        sampler.set_epoch(epoch)
        positions = [i for batch in sampler for i in batch]
        assert len(list(sampler)) == len(sampler)
        fb = sorted(i for i in positions if i < n_fb)
        replay = [i for i in positions if i >= n_fb]
        assert fb == list(range(n_fb))  # every feedback clip, exactly once per epoch
        assert len(replay) == expected_replay
        ids = {split.train.clip_id(i) for i in replay}
        assert not ids & set(base["val_ids"]) and ids <= set(base["train_ids"])
        draws.append(sorted(replay))
    assert draws[0] != draws[1]  # a fresh replay draw every epoch...
    sampler.set_epoch(1)
    assert sorted(i for batch in sampler for i in batch if i >= n_fb) == draws[1]  # ...repeatable on resume


def data_of_a_round(tmp_path, light_base, feedback):
    """A round's data set-up as train_feedback.py runs it, without training: (run, split, log lines)."""
    cfg = feedback_cfg(tmp_path / "out", light_base, feedback)
    lines: list[str] = []
    run = FeedbackRun(cfg, time.time(), lines.append)
    run.inputs = check_feedback_inputs(cfg, lines.append)
    store, _ = load_clip_store(light_base["data"], 16000, log=lines.append, progress=False)
    split = run.data_fn(cfg, store, run.inputs.text, {"0": 0}, 256, None, lines.append)
    return run, split, lines


def test_a_feedback_speaker_taken_as_an_id_of_a_voice_says_whose_voice_it_trains():
    """Feedback prepared without a speaker column is all speaker "0": on a model of named voices its clips
    trained speaker_id 0, whoever that is (here "7"), and nothing said so; an id no original speaker has
    trains a voice never trained before."""
    speakers, lines = {"7": 0, "ali": 1, "zin": 2}, []
    add_feedback_speakers(speakers, ["0", "ali"], 3, lines.append)
    assert speakers["0"] == 0 and speakers["ali"] == 1
    assert lines == [
        "note: feedback speaker '0' is not a speaker of the original data; its clips train speaker_id 0, "
        "the voice of 7 (a speaker column naming the voice says which one: prepare_data.py --speaker_column)"
    ]
    speakers, lines = {"0": 0, "2": 2}, []
    add_feedback_speakers(speakers, ["1"], 3, lines.append)
    assert speakers["1"] == 1 and "speaker_id 1, a voice no speaker of the original data has" in lines[0]
    lines = []
    add_feedback_speakers({"0": 0}, ["0", "bob"], 1, lines.append)  # one voice: nothing to say
    assert lines == []


@pytest.mark.parametrize("clips, judged", [(6, 1), (3, 0)])
def test_too_few_feedback_clips_to_judge_are_said_before_training(tmp_path, light_base, clips, judged):
    """6 clips hold 1 out, 3 are all trained on: neither round can be promoted, which is said at the
    start rather than only in the verdict at the end."""
    feedback = make_feedback(tmp_path / "fb", num_clips=clips)
    run, split, lines = data_of_a_round(tmp_path, light_base, feedback)
    # the model card's facts: the trained-on feedback clips, and the evaluated ones also trained on
    assert split.feedback_clips == len(run.feedback_train)
    assert split.val_trained_clips == (clips if judged == 0 else 0)
    warning = (
        f"warning: {judged} feedback clip(s) held out and never trained on: this round cannot be promoted"
    )
    assert any(line.startswith(warning) and "at least 8 feedback clips" in line for line in lines), lines


# ---- end to end ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def promoted_run(tmp_path_factory, base, feedback_dir):
    out = tmp_path_factory.mktemp("feedback_runs") / "models"
    lines: list[str] = []
    cfg = feedback_cfg(out, base, feedback_dir, max_steps=30)
    torch.manual_seed(0)
    report = run_feedback(cfg, time.time(), log=lines.append)
    return out, report, lines


@pytest.mark.slow
def test_feedback_run_improves_feedback_and_is_promoted(promoted_run, base):
    from transformers import VitsModel

    out, report, lines = promoted_run
    v1 = out / "v1"
    assert json.loads((v1 / REPORT_NAME).read_text()) == json.loads(json.dumps(report))
    fb, orig = report["feedback"], report["original_validation"]
    assert fb["after"]["val_mel"] < fb["before"]["val_mel"], report
    assert fb["held_out"] and fb["clips_evaluated"] == 3 and fb["clips_trained"] == 9
    assert report["spoken_warning"] is None  # free-running scores are off here (--freerun_samples 0)
    judged = fb["judgement"]
    assert judged["improved"] and judged["clips"] == 3 and -judged["mean_diff"] > judged["threshold"] > 0
    assert sorted(judged["per_clip_after"]) == sorted(judged["per_clip_before"])
    assert orig["clips"] == len(base["val_ids"]) and orig["after"]["val_mel"] > 0
    assert report["promoted"] is True, report["reason"]
    assert report["replay"] == {"ratio": 1.0, "per_epoch": 9, "pool": len(base["train_ids"])}
    assert report["training"]["steps"] == 30
    assert read_latest(out)["version"] == "v1"
    VitsModel.from_pretrained(read_latest(out)["path"])
    if (out / "latest").is_symlink():
        assert (out / "latest").resolve() == (v1 / "model").resolve()
    # the original held-out split travels with the model, for the next round
    # (and no path of this machine's: the folder is what gets shared)
    split = json.loads((v1 / "model" / "training_split.json").read_text())
    assert split["val_ids"] == base["val_ids"] and set(split) == {"val_ids", "seed"}
    # the model card names the base folder and the feedback clips trained on, not the 3 held out (the
    # judgement comes after the export)
    card = (v1 / "model" / "README.md").read_text(encoding="utf-8")
    assert "Trained from the local folder `best_model`" in card and "9 feedback clips trained on" in card
    assert "held-out feedback clips" in card and "`feedback_report.json`" in card
    # the round is judged and finished: its page offers no command to "continue" it (a new version)
    page = (v1 / "checkpoints" / "report.html").read_text(encoding="utf-8")
    assert "Training report" in page and "--resume auto" not in page
    # every feedback sentence, before and after
    for when in ("before", "after"):
        wavs = {p.stem for p in (v1 / "samples" / when).glob("*.wav")}
        assert wavs == {f"fb{i:05d}" for i in range(12)}
    # characters outside the vocabulary: reported before training, and in the report
    assert report["unknown_characters"] == {UNKNOWN_TEXT_ID: ["x", "z"]}
    first_unknown = next(i for i, line in enumerate(lines) if "outside the model's vocabulary" in line)
    assert first_unknown < next(i for i, line in enumerate(lines) if line.startswith("starting"))
    assert lines[-1].startswith("promoted v1:") and "feedback mel" in lines[-1]


@pytest.mark.slow
def test_a_diverged_round_is_kept_in_its_checkpoints_but_not_exported_or_promoted(
    promoted_run, base, feedback_dir
):
    out, _, _ = promoted_run
    lines: list[str] = []
    # a learning rate 10^5 x too high with no clipping wrecks the weights within a step or two
    cfg = feedback_cfg(
        out, base, feedback_dir, max_steps=6, learning_rate=1.0, max_grad_norm=1e6, sample_sentences=2
    )
    torch.manual_seed(0)
    report = run_feedback(cfg, time.time(), log=lines.append)
    assert report["version"] == "v2" and report["promoted"] is False
    assert report["reason"] and json.loads((out / "v2" / REPORT_NAME).read_text())["promoted"] is False
    # weights that diverged are not exported as v2's model (run_end.py), but its checkpoints stay
    summary = json.loads((out / "v2" / "checkpoints" / "train_summary.json").read_text())
    assert summary["diverged"] and summary["final_model"] is None
    assert not (out / "v2" / "model" / "config.json").exists()
    assert list((out / "v2" / "checkpoints").glob("step_*"))
    assert read_latest(out)["version"] == "v1"
    if (out / "latest").is_symlink():
        assert (out / "latest").resolve() == (out / "v1" / "model").resolve()
    assert lines[-1].startswith("not promoted: ") and report["reason"] in lines[-1]
    assert "stays v1" in lines[-1]
    assert any(
        re.fullmatch(r"samples: 2 feedback sentences \(2 of \d+: --sample_sentences\) .*", x) for x in lines
    )


def feedback_cmd(out: Path, base: dict, feedback: Path, **overrides) -> list[str]:
    settings = dict(TINY_SETTINGS)
    settings.update(
        base_model=base["model"],
        feedback_dir=feedback,
        data_dir=base["data"],
        output_dir=out,
        learning_rate=1e-4,
        log_every=1,
    )
    settings.update(overrides)
    settings.pop("val_fraction")
    return [PYTHON, str(ROOT / "train_feedback.py"), *cli_args(settings)]


@pytest.mark.slow
def test_interrupted_run_resumes_the_same_version(tmp_path, base, feedback_dir):
    out = tmp_path / "models"
    proc = subprocess.Popen(
        feedback_cmd(out, base, feedback_dir, target_hours=300 / 3600),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=quiet_env(),
    )
    metrics = out / "v1" / "checkpoints" / "metrics.jsonl"
    deadline = time.monotonic() + 200
    while time.monotonic() < deadline and proc.poll() is None:
        if metrics.exists() and any(
            json.loads(x).get("step", 0) >= 4 and "loss_g" in x for x in metrics.read_text().splitlines()
        ):
            break
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    out1, err1 = proc.communicate(timeout=120)
    assert proc.returncode == 0, err1[-3000:]
    assert "SIGTERM received" in out1 and "--resume auto" in out1.splitlines()[-1]
    assert not (out / "v1" / REPORT_NAME).exists()  # unfinished: the next run continues it
    assert "--resume auto" in (out / "v1" / "checkpoints" / "report.html").read_text(encoding="utf-8")
    stopped = json.loads((out / "v1" / "checkpoints" / "train_summary.json").read_text())["steps"]
    assert stopped >= 4
    before = list((out / "v1" / "samples" / "before").glob("*.wav"))
    mtimes = {p: p.stat().st_mtime_ns for p in before}
    # read now: the resumed run may rightly prune step_<stopped> (--keep_checkpoints 2) when it saves
    # at an epoch end before its final save, which happens only when its steps are slow (a loaded
    # machine); reading it afterwards made this test fail with FileNotFoundError only then
    first_state = json.loads(
        (out / "v1" / "checkpoints" / f"step_{stopped:08d}" / "trainer_state.json").read_text()
    )
    printed = shlex.split(out1.splitlines()[-1].split("continue with: ", 1)[1])
    assert printed[:2] == ["python", "train_feedback.py"]
    # exactly the printed command (no --base_model, --feedback_dir, --data_dir, --learning_rate...),
    # with a budget for H and a step limit to keep the test short
    argv = [a if a != "H" else str(300 / 3600) for a in printed[2:]] + ["--max_steps", str(stopped + 4)]

    resumed = subprocess.run(
        [PYTHON, str(ROOT / "train_feedback.py"), *argv],
        capture_output=True,
        text=True,
        timeout=300,
        env=quiet_env(),
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"continuing {out / 'v1'}" in resumed.stdout
    assert f"resuming from step_{stopped:08d}" in resumed.stdout
    report = json.loads((out / "v1" / REPORT_NAME).read_text())
    assert report["training"]["resumed_from_step"] == stopped
    assert report["training"]["steps"] == stopped + 4
    assert sorted(p.name for p in out.iterdir() if p.name.startswith("v")) == ["v1"]
    assert {p: p.stat().st_mtime_ns for p in before} == mtimes  # the "before" samples were kept
    start = first_state["train_state"]["val_history"][0]
    assert start["tag"] == "start"
    assert report["feedback"]["before"]["val_mel"] == pytest.approx(start["feedback_val_mel"])
    newest = sorted((out / "v1" / "checkpoints").glob("step_*"))[-1]
    settings = json.loads((newest / "trainer_state.json").read_text())["config"]
    for name in ("learning_rate", "base_model", "feedback_dir", "data_dir", "batch_size", "warmup_steps"):
        assert settings[name] == first_state["config"][name], name  # the version's own settings
    assert resumed.stdout.strip().splitlines()[-1].startswith(("promoted v1:", "not promoted: "))


@pytest.mark.slow
def test_a_round_interrupted_while_judged_says_so_and_is_judged_when_it_continues(
    tmp_path, base, feedback_dir, monkeypatch
):
    """Ctrl-C (or SIGTERM, which the CLI turns into it) after training, while the round is judged: the
    loop's signal handling has ended, so the run stops there. Its training is saved; a line says so and
    gives the command that continues it, and continuing judges the same version."""
    out = tmp_path / "models"
    judge = FeedbackRun.judge
    calls = []

    def interrupted_once(self, session, summary):
        calls.append(summary["steps"])
        if len(calls) == 1:
            raise KeyboardInterrupt
        return judge(self, session, summary)

    monkeypatch.setattr(FeedbackRun, "judge", interrupted_once)
    lines: list[str] = []
    with pytest.raises(KeyboardInterrupt):
        run_feedback(feedback_cfg(out, base, feedback_dir, max_steps=4), time.time(), log=lines.append)
    assert lines[-1].startswith(
        "interrupted while judging v1: its training (step 4) is saved in its checkpoints"
    )
    assert "continue with: python train_feedback.py" in lines[-1] and "--resume auto" in lines[-1]
    assert not (out / "v1" / REPORT_NAME).exists() and (out / "v1" / "checkpoints" / "step_00000004").is_dir()

    lines.clear()
    report = run_feedback(feedback_cfg(out, base, feedback_dir, max_steps=4), time.time(), log=lines.append)
    assert calls == [4, 4] and report["version"] == "v1" and report["training"]["session_steps"] == 0
    assert report["after_measured"] and report["feedback"]["after"]["val_mel"] > 0  # the final evaluation
    assert json.loads((out / "v1" / REPORT_NAME).read_text())["promoted"] == report["promoted"]


# ---- bad input ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", ["no_base", "no_feedback_dir", "empty_feedback", "nothing_usable"])
def test_bad_input_is_one_error_line_and_writes_nothing(tmp_path, tiny_model_dir, tone_corpus, case):
    base = {"model": tiny_model_dir, "data": tone_corpus}
    feedback = tmp_path / "feedback"
    if case == "no_base":
        base["model"] = tmp_path / "no_such_model"
        make_corpus(feedback, num_clips=2, seed=1, id_prefix="fb")
    elif case == "empty_feedback":
        feedback.mkdir()
        (feedback / "metadata.csv").write_text("")
    elif case == "nothing_usable":
        make_corpus(feedback, num_clips=2, seed=1, id_prefix="fb")
        (feedback / "metadata.csv").write_text("fb00000|xyz|0\nfb00001|qrstuv|0\n")
    out = tmp_path / "models"
    proc = subprocess.run(
        feedback_cmd(out, base, feedback), capture_output=True, text=True, timeout=120, env=quiet_env()
    )
    assert proc.returncode != 0
    errors = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and errors[0].startswith("error: "), proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    assert {
        "no_base": "--base_model",
        "no_feedback_dir": "--feedback_dir",
        "empty_feedback": "no clips",
        "nothing_usable": "none of its 2 clip(s) is usable",
    }[case] in errors[0]
    assert not out.exists()


def test_a_wrong_base_model_folder_names_the_one_to_pass(tmp_path, tiny_model_dir):
    """The usual wrong guesses for --base_model, each one line, checked before the folders' overlaps
    (the data folder as the base once said the output folder must not be inside it)."""
    from types import SimpleNamespace

    from vits_trainer.feedback.config import check_base_model_folder, check_feedback_paths

    root = tmp_path / "feedback_models"
    (root / "v1").mkdir(parents=True)
    shutil.copytree(tiny_model_dir, root / "v1" / "model")
    (root / "latest").symlink_to("v1/model")
    (root / "latest.json").write_text("{}")
    data = tmp_path / "training"
    data.mkdir()
    for value, expected in (
        (
            root,
            f"not a model folder (no config.json); the current model of these feedback versions is {root / 'latest'}",
        ),
        (root / "v1", f"this version's model is {root / 'v1' / 'model'}"),
        (root / "latest.json", f"is a file, not a model folder; pass {root / 'latest'}"),
        # a file of a model (its weights, its config.json): its folder
        (root / "v1" / "model" / "model.safetensors", f"not a model folder; pass {root / 'v1' / 'model'}"),
        (tmp_path / "nowhere", "no such folder"),
    ):
        with pytest.raises(UserError, match=re.escape(expected)):
            check_base_model_folder(str(value))
    assert check_base_model_folder(str(root / "latest")) == root / "latest"
    cfg = SimpleNamespace(
        base_model=str(data),
        output_dir=str(data / "out"),
        data_dir=str(tmp_path / "d"),
        feedback_dir=str(tmp_path / "f"),
    )
    with pytest.raises(
        UserError, match=re.escape(f"--base_model {data}: not a model folder (no config.json)")
    ):
        check_feedback_paths(cfg)


def test_latest_before_any_promotion_names_the_current_model(tmp_path):
    """After a first round that was not promoted, the next round's documented command (--base_model
    <output_dir>/latest) said only "no such folder": the current model is still the rounds' base."""
    from vits_trainer.feedback.config import check_base_model_folder

    root = tmp_path / "feedback_models"
    (root / "v1").mkdir(parents=True)
    (root / "v1" / REPORT_NAME).write_text(json.dumps({"base_model": "/m/best_model", "promoted": False}))
    expected = (
        f"--base_model {root / 'latest'}: no such folder; no feedback version in {root} has been promoted "
        "yet, so there is no latest: the current model is still the base model, /m/best_model; pass it"
    )
    with pytest.raises(UserError, match=re.escape(expected)):
        check_base_model_folder(str(root / "latest"))
    with pytest.raises(UserError, match=re.escape("promoted yet, so there is no latest: the current model")):
        check_base_model_folder(str(root))
    with pytest.raises(UserError, match=re.escape("no such folder (the model to improve")):
        check_base_model_folder(str(tmp_path / "elsewhere" / "latest"))


def test_unprepared_recordings_as_feedback_dir_get_the_prepare_command(tmp_path, tiny_model_dir, tone_corpus):
    # the recordings themselves given as --feedback_dir: preparing them into that folder would be refused
    recordings = tmp_path / "recordings"
    make_corpus(recordings, num_clips=2, seed=1, id_prefix="fb")
    for wav in (recordings / "wavs").iterdir():
        wav.rename(recordings / wav.name)
    (recordings / "metadata.csv").unlink()
    cfg = feedback_cfg(tmp_path / "out", {"model": tiny_model_dir, "data": tone_corpus}, recordings)
    expected = (
        f"--source {recordings} --data_dir {recordings}_prepared, then --feedback_dir {recordings}_prepared"
    )
    with pytest.raises(UserError, match="these look like the recordings") as err:
        check_feedback_inputs(cfg, print)
    assert expected in str(err.value)


def test_data_fn_keeps_the_feedback_split_of_a_resumed_version(tmp_path, light_base, feedback_dir):
    """A resumed version evaluates the clips its "before" numbers were taken on, even if more arrive."""
    base = light_base
    cfg = feedback_cfg(tmp_path / "out", base, feedback_dir)
    lines: list[str] = []
    run = FeedbackRun(cfg, time.time(), lines.append)
    run.inputs, run.version = check_feedback_inputs(cfg, lines.append), tmp_path / "out" / "v1"
    run.info = {
        "feedback_split": {"train": ["fb00000", "fb00001", "fb00002"], "eval": ["fb00003"], "held_out": True}
    }
    store, _ = load_clip_store(base["data"], 16000, log=lines.append, progress=False)
    split = run.data_fn(cfg, store, run.inputs.text, {"0": 0}, 256, base["val_ids"], lines.append)
    assert split.val_sets["feedback"].ids() == ["fb00003"]
    assert run.feedback_train.ids() == ["fb00000", "fb00001", "fb00002"]
    assert any("8 feedback clip(s) are new" in line for line in lines)
    assert np.array_equal(np.sort(split.val_sets["val"].ids()), np.sort(base["val_ids"]))


def test_a_resumed_version_refuses_other_clips_under_its_ids(tmp_path, light_base, feedback_dir):
    """Another recording session prepared into a new folder reuses the ids (file names): the resumed
    version compared its 'before' numbers of the old clips with 'after' numbers of the new ones."""
    import shutil

    run, _, _ = data_of_a_round(tmp_path / "first", light_base, feedback_dir)
    stored = run.info["feedback_split"]
    assert set(stored["digests"]) == set(stored["train"]) | set(stored["eval"])
    other = tmp_path / "other_session"
    shutil.copytree(feedback_dir, other, ignore=shutil.ignore_patterns("cache"))
    rows = (other / "metadata.csv").read_text(encoding="utf-8").splitlines()
    clip = rows[0].split("|")[0]
    rows[0] = with_text(rows[0], "a new take of another sentence")
    (other / "metadata.csv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    cfg = feedback_cfg(tmp_path / "out", light_base, other)
    resumed = FeedbackRun(cfg, time.time(), print)
    resumed.inputs, resumed.version = check_feedback_inputs(cfg, print), tmp_path / "out" / "v1"
    resumed.info = {"feedback_split": stored}
    store, _ = load_clip_store(light_base["data"], 16000, log=print, progress=False)
    with pytest.raises(UserError, match=f"{clip} now say or sound different.*--resume none"):
        resumed.data_fn(cfg, store, resumed.inputs.text, {"0": 0}, 256, light_base["val_ids"], print)


def test_takes_of_one_sentence_are_held_out_together(tmp_path, light_base, feedback_dir):
    """Two takes of a sentence could fall on both sides of the feedback split: the judgement then
    measured memorising a sentence trained on."""
    import shutil

    feedback = tmp_path / "takes"
    shutil.copytree(feedback_dir, feedback, ignore=shutil.ignore_patterns("cache"))
    rows = (feedback / "metadata.csv").read_text(encoding="utf-8").splitlines()
    rows = [with_text(row, f"sentence number {k // 2}") for k, row in enumerate(rows)]  # 2 takes each
    (feedback / "metadata.csv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    run, _, _ = data_of_a_round(tmp_path, light_base, feedback)
    said = {clip: row.split("|")[1] for clip, row in ((r.split("|")[0], r) for r in rows)}
    trained = {said[c] for c in run.feedback_train.ids()}
    held_out = {said[c] for c in run.feedback_eval.ids()}
    assert held_out and trained and not held_out & trained
    # the share asked for, in clips: 20 % of 12, at least 3 to judge, in whole sentences: 2 of 6 (4 clips)
    assert len(run.feedback_eval) == 4 and len(run.feedback_train) == 8


def test_a_rerecorded_validation_sentence_is_evaluated_never_trained(tmp_path, light_base, feedback_dir):
    import shutil

    feedback = tmp_path / "feedback"
    shutil.copytree(feedback_dir, feedback, ignore=shutil.ignore_patterns("cache"))
    val_id = light_base["val_ids"][0]
    row = next(
        r for r in (light_base["data"] / "metadata.csv").read_text().splitlines() if r.startswith(val_id)
    )
    shutil.copy(light_base["data"] / "wavs" / f"{val_id}.wav", feedback / "wavs" / "fbval.wav")
    with open(feedback / "metadata.csv", "a") as f:
        f.write(with_text("fbval|x|0", row.split("|")[1].upper()) + "\n")  # case does not hide it
    run, split, lines = data_of_a_round(tmp_path, light_base, feedback)
    assert "fbval" in split.val_sets["feedback"].ids()
    assert "fbval" not in run.feedback_train.ids()
    assert any("say sentences of the original validation split" in line for line in lines)


def test_a_validation_sentence_in_decomposed_unicode_is_still_that_sentence(
    tmp_path, light_base, feedback_dir
):
    """The tokenizer reads text as NFC: "şev baş" typed decomposed (s + U+0327) is the same sentence, so
    it is held out as the original validation's, not trained on."""
    import unicodedata

    from vits_trainer.feedback.replay import _norm

    sentence = "Şev baş, tu çawa yî?"
    assert _norm(unicodedata.normalize("NFD", sentence)) == _norm(sentence)
    cfg = feedback_cfg(tmp_path / "out", light_base, feedback_dir)
    run = FeedbackRun(cfg, time.time(), [].append)
    texts = ["şev baş", "ez baş im", "tu çawa yî", "silav heval", "rojbaş"]
    ids = [f"fb{i}" for i in range(len(texts))]
    nfd = [unicodedata.normalize("NFD", t) for t in texts]
    train, evaluated = run.feedback_split(ids, nfd, ["0" * 16] * len(ids), {_norm("şev baş")}, [].append)
    assert 0 in evaluated and 0 not in train


def test_feedback_clips_left_out_are_in_the_report_and_warned_about_once(tmp_path, light_base, feedback_dir):
    """A metadata.csv line naming no clip, and a clip whose audio cannot be read: each warned about once,
    and recorded for feedback_report.json (unusable_feedback_lines, dropped_feedback_clips)."""
    import shutil

    feedback = tmp_path / "feedback"
    shutil.copytree(feedback_dir, feedback, ignore=shutil.ignore_patterns("cache"))
    (feedback / "wavs" / "fbbroken.wav").write_bytes(b"not audio")
    with open(feedback / "metadata.csv", "a") as f:
        f.write("fbempty||0\nfbbroken|abc def|0\n")
    run, _, lines = data_of_a_round(tmp_path, light_base, feedback)
    assert [line for line in lines if "unusable line" in line] == [
        f"warning: {feedback / 'metadata.csv'}: 1 unusable line(s) ignored (line 13: empty id or text)"
    ]
    assert run.info["unusable_feedback_lines"] == [[13, "empty id or text"]]
    assert [d[0] for d in run.info["dropped_feedback_clips"]] == ["fbbroken"]


def test_combined_items_and_replay_sampler_across_ranks(light_base, feedback_dir):
    from vits_trainer.data.items import CombinedItems, build_items
    from vits_trainer.data.sampler import BucketBatchSampler, ReplayBatchSampler
    from vits_trainer.data.text import TextEncoder

    text = TextEncoder.from_pretrained(light_base["model"])
    parts = []
    for folder in (feedback_dir, light_base["data"]):
        store, _ = load_clip_store(folder, 16000, log=lambda _: None, progress=False)
        parts.append(build_items(store, range(len(store)), text.encode, {"0": 0}, 256)[0])
    both = CombinedItems(parts)
    assert len(both) == len(parts[0]) + len(parts[1]) and both.ids() == parts[0].ids() + parts[1].ids()
    k = len(parts[0]) + 3
    assert both.clip_id(k) == parts[1].clip_id(3) and both.text(k) == parts[1].text(3)
    assert np.array_equal(both.audio(k), parts[1].audio(3)) and both.token_ids[k] is parts[1].token_ids[3]
    assert both.audio_lengths()[k] == len(parts[1].audio(3)) and both.speaker_ids.shape == (len(both),)

    n_fb = len(parts[0])
    ranks = [
        ReplayBatchSampler(
            both.audio_lengths(),
            both.part_range(0),
            both.part_range(1),
            15,
            4,
            seed=3,
            num_replicas=2,
            rank=r,
        )
        for r in range(2)
    ]
    for sampler in ranks:
        sampler.set_epoch(2)
    shards = [[i for batch in s for i in batch] for s in ranks]
    reference = BucketBatchSampler(np.zeros(n_fb + 15), 4, num_replicas=2, rank=0)
    assert len(ranks[0]) == len(ranks[1]) == len(reference) == len(list(ranks[0]))
    # together the ranks cover the epoch; only a padding batch (equal shares) repeats
    assert set(shards[0] + shards[1]) == set(ranks[0].epoch_items(2).tolist())
    assert n_fb + 15 <= len(shards[0] + shards[1]) <= n_fb + 15 + 4
    ranks[0].set_start(2)
    assert len(list(ranks[0])) == len(ranks[0]) - 2  # a resumed epoch skips its trained batches, once
    assert len(list(ranks[0])) == len(ranks[0])


def test_skipped_final_evaluation_is_not_measured_and_not_promoted(
    tmp_path, light_base, feedback_dir, monkeypatch
):
    """The final evaluation is made to not fit: the loop's own skip path runs (its cost estimate is set
    huge when finish() decides, in-process), so there is nothing measured after training."""
    from vits_trainer.training.run_end import RunEnd

    real_finish = RunEnd.finish

    def finish_with_no_time_to_evaluate(self, stop_reason, loop_figures):
        monkeypatch.setattr(self.s.budget, "eval_seconds", lambda: 1e9)
        return real_finish(self, stop_reason, loop_figures)

    monkeypatch.setattr(RunEnd, "finish", finish_with_no_time_to_evaluate)
    lines: list[str] = []
    cfg = feedback_cfg(tmp_path / "models", light_base, feedback_dir, max_steps=3, sample_sentences=0)
    torch.manual_seed(0)
    report = run_feedback(cfg, time.time(), log=lines.append)
    assert report["promoted"] is False and report["after_measured"] is False
    assert "no time left" in report["after_not_measured_because"]
    for part in ("feedback", "original_validation"):
        assert report[part]["measured"] is False and report[part]["after"] is None
        assert report[part]["change"] is None and report[part]["before"]["val_mel"] > 0
    assert report["feedback"]["judgement"]["per_clip_after"] is None
    assert read_latest(tmp_path / "models") is None
    assert lines[-1].startswith("not promoted: nothing was measured after training")


def test_a_round_that_trains_no_step_says_so_instead_of_comparing_the_start_with_itself(
    tmp_path, light_base, feedback_dir, monkeypatch
):
    """A budget that fits no step: "the feedback mel loss did not improve (x -> x)" compared the start
    evaluation with itself and hid why."""
    from vits_trainer.training.budget import Budget

    monkeypatch.setattr(Budget, "should_stop", lambda self: True)  # no step fits
    lines: list[str] = []
    cfg = feedback_cfg(tmp_path / "models", light_base, feedback_dir, max_steps=3, sample_sentences=0)
    torch.manual_seed(0)
    report = run_feedback(cfg, time.time(), log=lines.append)
    assert report["promoted"] is False and read_latest(tmp_path / "models") is None
    assert lines[-1].startswith("not promoted: no training step fitted in the budget (--target_hours)"), (
        lines[-1]
    )
    # the first version of this folder: the model the user keeps is the one the round started from (it
    # said "there is no promoted model yet", as if they had none)
    base_model = light_base["model"].resolve()
    assert lines[-1].endswith(f"the current model stays the base model ({base_model})"), lines[-1]


def blocked_voices(folder: Path, voices: int) -> list[str]:
    """Rewrite a corpus's speakers so that its clips come voice by voice (make_corpus alternates them):
    the order a folder of one recording session after another has. Returns the ids in folder order."""
    meta = folder / "metadata.csv"
    rows = meta.read_text(encoding="utf-8").splitlines()
    per_voice = math.ceil(len(rows) / voices)
    rows = [f"{row.rsplit('|', 1)[0]}|{k // per_voice}" for k, row in enumerate(rows)]
    meta.write_text("\n".join(rows) + "\n", encoding="utf-8")
    return [row.split("|")[0] for row in rows]


def test_a_rounds_evaluated_and_sampled_clips_take_each_voice_in_turn(tmp_path, light_base, feedback_dir):
    """Evaluations speak the first --eval_samples / --freerun_samples clips of the first validation set
    (the feedback clips in a round) and the round's samples the first --sample_sentences: in folder
    order, recordings of one voice after another left the other voices unheard. They go voice by voice,
    as train_vits.py's validation clips do; one voice keeps the folder's order."""
    from vits_trainer.model.tiny import make_tiny_model

    data = tmp_path / "data"
    make_corpus(data, num_clips=16, num_speakers=2, seed=3)
    data_ids = blocked_voices(data, 2)
    model = make_tiny_model(tmp_path / "model", num_speakers=2)
    val_ids = data_ids[:2] + data_ids[8:10]  # two of each voice
    (model / "training_split.json").write_text(json.dumps({"val_ids": val_ids}))
    feedback = make_feedback(tmp_path / "fb")
    blocked_voices(feedback, 2)  # fb00000-05 voice 0, fb00006-11 voice 1
    for fraction, evaluated in ((0.0, 12), (0.5, 6)):
        cfg = feedback_cfg(tmp_path / f"out{fraction}", {"model": model, "data": data}, feedback)
        cfg.feedback_val_fraction = fraction
        run = FeedbackRun(cfg, time.time(), print)
        run.inputs = check_feedback_inputs(cfg, print)
        store, _ = load_clip_store(data, 16000, log=print, progress=False)
        split = run.data_fn(cfg, store, run.inputs.text, {"0": 0, "1": 1}, 256, None, print)
        voices = split.val_sets["feedback"].speaker_ids.tolist()
        assert len(voices) == evaluated and sorted(voices[:2]) == [0, 1], voices
        assert voices == [0, 1] * (evaluated // 2) or fraction, voices  # every clip evaluated: 0, 1, 0, 1...
        assert split.val_sets["val"].speaker_ids.tolist() == [0, 1, 0, 1]
        assert split.val_sets["val"].ids() == [val_ids[0], val_ids[2], val_ids[1], val_ids[3]]
        sampled = [voice for _, _, voice in run.sample_sentences()]
        assert sorted(sampled[:2]) == [0, 1] and sorted(sampled) == [0] * 6 + [1] * 6, sampled
        held_out = len(run.feedback_eval) if fraction else 0
        trained = sampled[held_out:]  # after the held-out clips, the trained ones: also by voice
        assert sorted(trained[:2]) == [0, 1], sampled
    # one voice: the folder's order, as before
    run, split, _ = data_of_a_round(tmp_path / "one", light_base, feedback_dir)
    assert split.val_sets["feedback"].ids() == sorted(split.val_sets["feedback"].ids())
    assert [
        clip for clip, _, _ in run.sample_sentences()
    ] == run.feedback_eval.ids() + run.feedback_train.ids()
    assert split.val_sets["val"].ids() == sorted(light_base["val_ids"])
