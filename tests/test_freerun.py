"""Free-running validation scores, the alignment/mel pictures and --best_metric."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import soundfile as sf
from helpers import tiny_config, train_tiny
from scipy.fft import idct

from vits_trainer.errors import UserError
from vits_trainer.training.freerun import MCD_SCALE, dtw_scores, mel_cepstrum
from vits_trainer.training.pictures import is_monotonic_cover

FREERUN_KEYS = ("val_mel_dtw", "val_mcd", "val_duration_ratio")


def _mel(frames: int = 40, n_mels: int = 20, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(-4.0, 2.0, size=(n_mels, frames))


def test_identical_mels_score_zero_distance_and_ratio_one():
    mel = _mel()
    scores = dtw_scores(mel, mel.copy())
    assert scores["val_mel_dtw"] == pytest.approx(0.0, abs=1e-12)
    assert scores["val_mcd"] == pytest.approx(0.0, abs=1e-9)
    assert scores["val_duration_ratio"] == 1.0


def test_dtw_absorbs_a_slower_speaking_rate_and_the_ratio_reports_it():
    mel = _mel()
    slow = np.repeat(mel, 2, axis=1)  # every frame twice: the same speech at half the rate
    scores = dtw_scores(mel, slow)
    assert scores["val_mel_dtw"] == pytest.approx(0.0, abs=1e-12)
    assert scores["val_duration_ratio"] == 2.0
    # without alignment the same pair is far apart: the DTW is what makes it a fair comparison
    assert np.abs(mel - slow[:, : mel.shape[1]]).mean() > 1.0


def test_mcd_ignores_loudness_and_follows_the_standard_formula():
    mel = _mel()
    louder = mel + 3.0  # a level change moves c0 only, which MCD leaves out
    scores = dtw_scores(mel, louder)
    assert scores["val_mcd"] == pytest.approx(0.0, abs=1e-9)
    assert scores["val_mel_dtw"] == pytest.approx(3.0)
    # one cepstral coefficient off by d everywhere: MCD = 10 / ln 10 * sqrt(2 d^2)
    cep = np.random.default_rng(1).normal(size=(20, 30))
    shifted = cep.copy()
    shifted[2] += 0.5
    a, b = idct(cep, type=2, norm="ortho", axis=0), idct(shifted, type=2, norm="ortho", axis=0)
    assert np.allclose(mel_cepstrum(a)[1], cep[2])
    expected = 10.0 / math.log(10.0) * math.sqrt(2 * 0.5**2)
    assert MCD_SCALE * 0.5 == pytest.approx(expected)
    # the frames differ little from their partners and much from the others: DTW pairs them diagonally
    assert dtw_scores(a, b)["val_mcd"] == pytest.approx(expected)


def test_monotonic_cover_check():
    diagonal = np.zeros((3, 6))
    diagonal[0, :2] = diagonal[1, 2:4] = diagonal[2, 4:] = 1
    assert is_monotonic_cover(diagonal)
    skipped = np.zeros((3, 6))
    skipped[0, :3] = skipped[2, 3:] = 1  # token 1 never read
    assert not is_monotonic_cover(skipped)
    backwards = diagonal[:, ::-1]
    assert not is_monotonic_cover(backwards)
    unassigned = diagonal.copy()
    unassigned[:, 3] = 0
    assert not is_monotonic_cover(unassigned)


def test_best_metric_dtw_needs_free_running_samples(tmp_path, tone_corpus, tiny_model_dir):
    with pytest.raises(UserError, match="--freerun_samples"):
        tiny_config(tmp_path, tone_corpus, tiny_model_dir, best_metric="val_mel_dtw", freerun_samples=0)


def test_every_evaluation_scores_free_running_speech_and_draws_pictures(
    tmp_path, tone_corpus, tiny_model_dir
):
    from vits_trainer.training.evaluate import synthesize

    session, summary = train_tiny(
        tmp_path,
        tone_corpus,
        tiny_model_dir,
        max_steps=3,
        eval_samples=2,
        freerun_samples=4,
        best_metric="val_mel_dtw",
    )
    ckpt = tmp_path / "checkpoints"
    evals = [
        json.loads(line)
        for line in (ckpt / "metrics.jsonl").read_text().splitlines()
        if json.loads(line).get("event") == "eval"
    ]
    assert [e["tag"] for e in evals] == ["start", "final"]
    for record in evals:
        for key in FREERUN_KEYS:
            assert math.isfinite(record[key]) and record[key] >= 0
    for key in FREERUN_KEYS:
        assert summary["final_val"][key] == evals[-1][key]
    # --best_metric val_mel_dtw: the best is the lowest free-running score, not the teacher-forced one
    assert session.state.best_val == min(e["val_mel_dtw"] for e in evals)

    items = session.data.val_sets["val"]
    final = ckpt / "samples" / f"step_{evals[-1]['step']:08d}"
    alignments = np.load(final / "alignments.npz")
    for k in range(2):
        name = items.clip_id(k)
        path = alignments[name]
        assert path.shape == (
            len(items.token_ids[k]),
            items.audio_lengths()[k] // session.generator_raw.hop_length,
        )
        assert is_monotonic_cover(path), name
        assert (final / f"{name}_alignment.png").stat().st_size > 0
        assert (final / f"{name}_mel.png").stat().st_size > 0
    # the sample WAVs are the free-running speech, and that is exactly what inference says
    fresh = synthesize(
        session.model,
        session.text,
        [(items.clip_id(k), items.text(k), 0) for k in range(2)],
        tmp_path / "fresh",
        session.device,
    )
    for path in fresh:
        assert np.array_equal(sf.read(path)[0], sf.read(final / path.name)[0])
    assert (ckpt / "loss_curve.png").is_file()


def test_pictures_go_to_tensorboard_as_rgb_images(tmp_path):
    """tensorboard is not installed here: a stand-in tracker records what its SummaryWriter is given."""
    from types import SimpleNamespace

    from vits_trainer.training.pictures import alignment_png, log_images_to_trackers

    path = np.zeros((3, 6))
    path[0, :2] = path[1, 2:4] = path[2, 4:] = 1
    png = alignment_png(path, tmp_path / "clip_alignment.png")
    calls = []
    writer = SimpleNamespace(
        add_image=lambda tag, image, step, dataformats: calls.append((tag, image, step, dataformats))
    )
    accelerator = SimpleNamespace(trackers=[SimpleNamespace(name="tensorboard", writer=writer)])
    log_images_to_trackers(accelerator, [png], 12)
    [(tag, image, step, layout)] = calls
    assert (tag, step, layout) == ("pictures/clip_alignment", 12, "HWC")
    assert image.ndim == 3 and image.shape[2] == 3 and 0.0 <= image.min() <= image.max() <= 1.0


def test_a_diverged_duration_predictor_speaks_a_bounded_take(tiny_model_dir):
    """After a learning rate far too high (a feedback round's regression test at LR 1.0) the duration
    predictor asked for exp(huge) frames: writing the round's samples tried to allocate 197 GB and the
    round crashed instead of reporting that it was not promoted. The durations are bounded while the
    tool speaks: each token at most MAX_FRAMES_PER_TOKEN frames, a NaN one a single frame."""
    import torch

    from vits_trainer.data.text import TextEncoder
    from vits_trainer.model.synthesis import MAX_FRAMES_PER_TOKEN
    from vits_trainer.model.vits import load_vits_model
    from vits_trainer.training.evaluate import speak_texts

    model = load_vits_model(tiny_model_dir)
    text = TextEncoder.from_pretrained(tiny_model_dir)
    tokens = len(text.encode("ba da"))
    hop = math.prod(model.config.upsample_rates)
    for broken in (1000.0, float("nan")):
        handle = model.duration_predictor.register_forward_hook(lambda m, a, out, b=broken: out + b)
        try:
            (waveform,) = speak_texts(model, text, [("ba da", 0)], torch.device("cpu"))
        finally:
            handle.remove()
        assert 0 < waveform.numel() <= tokens * MAX_FRAMES_PER_TOKEN * hop


def test_a_model_with_nan_weights_is_scored_nan_not_a_traceback(tiny_model_dir):
    """One step at --learning_rate 1e4 left NaN weights: the final evaluation's free-running speech
    ended the run with a traceback (the inverse spline's check, then librosa's DTW of a NaN cost
    matrix) instead of scoring it NaN, never the best, as val_mel is."""
    import torch

    from vits_trainer.data.text import TextEncoder
    from vits_trainer.model.vits import load_vits_model
    from vits_trainer.training.evaluate import speak_texts

    model = load_vits_model(tiny_model_dir)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.fill_(float("nan"))
    text = TextEncoder.from_pretrained(tiny_model_dir)
    (waveform,) = speak_texts(model, text, [("ba da", 0)], torch.device("cpu"))
    assert waveform.numel() > 0
    spoken = _mel(frames=12)
    spoken[:, 3] = np.nan
    scores = dtw_scores(_mel(), spoken)
    assert math.isnan(scores["val_mel_dtw"]) and math.isnan(scores["val_mcd"])
    assert scores["val_duration_ratio"] == 12 / 40
