"""Free-running validation: speak the validation sentences from text alone, as at inference, and
score each against its recording.

The teacher-forced `val_mel` reads the recording through the posterior encoder, so it never runs
the duration predictor or the text-to-frame alignment: the parts that break when a fine-tune starts
skipping or slurring words. Here the plain `VitsModel` forward speaks the text (fixed seed, the same
path as `evaluate.synthesize`), and the two log-mels are compared after dynamic time warping:

- val_mel_dtw: mean L1 distance of log-mel frames along the DTW path (per mel bin, like val_mel);
- val_mcd: mel-cepstral distortion (dB) along the same path, from the DCT of the log-mels, c0 dropped;
- val_duration_ratio: synthesised length / recorded length (1.0 = same speaking rate).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from .evaluate import set_prefix, speak_texts, write_wav

MCD_COEFFICIENTS = 24  # c1..c24, the usual order of mel-cepstral distortion
MCD_SCALE = 10.0 / math.log(10.0) * math.sqrt(2.0)  # dB from natural-log cepstra


@dataclass
class Spoken:
    """One validation sentence spoken from its text."""

    name: str
    waveform: np.ndarray  # float32, the model's output
    recorded_mel: np.ndarray  # [n_mels, frames] log-mel of the recording
    spoken_mel: np.ndarray  # [n_mels, frames] log-mel of the synthesis


def mel_cepstrum(log_mel: np.ndarray, order: int = MCD_COEFFICIENTS) -> np.ndarray:
    """[n_mels, frames] log-mel -> [order, frames] cepstra c1..c_order (DCT-II, orthonormal; c0, the
    loudness, is dropped so a level difference alone costs nothing)."""
    from scipy.fft import dct

    return dct(log_mel, type=2, norm="ortho", axis=0)[1 : order + 1]


def dtw_scores(recorded_mel: np.ndarray, spoken_mel: np.ndarray) -> dict[str, float]:
    """val_mel_dtw, val_mcd and val_duration_ratio of one pair of [n_mels, frames] log-mels."""
    import librosa
    from scipy.spatial.distance import cdist

    n_mels = recorded_mel.shape[0]
    ratio = spoken_mel.shape[1] / max(1, recorded_mel.shape[1])
    if not (np.isfinite(recorded_mel).all() and np.isfinite(spoken_mel).all()):
        # a diverged model speaks NaN: scored NaN (never the best), as val_mel is; librosa's DTW refused
        # the cost matrix with a traceback
        return {"val_mel_dtw": math.nan, "val_mcd": math.nan, "val_duration_ratio": ratio}
    # the frame cost is the L1 log-mel distance per bin: the same unit as the teacher-forced val_mel
    cost = cdist(recorded_mel.T, spoken_mel.T, metric="cityblock") / n_mels
    _, path = librosa.sequence.dtw(C=cost, backtrack=True)
    i, j = path[:, 0], path[:, 1]
    c_rec, c_syn = mel_cepstrum(recorded_mel), mel_cepstrum(spoken_mel)
    mcd = MCD_SCALE * np.sqrt(np.sum((c_rec[:, i] - c_syn[:, j]) ** 2, axis=0))
    return {
        "val_mel_dtw": float(cost[i, j].mean()),
        "val_mcd": float(mcd.mean()),
        "val_duration_ratio": ratio,
    }


@torch.no_grad()
def speak(model, frontend, text_encoder, items, count: int, device: torch.device, seed: int = 1234):
    """The first `count` items of `items` spoken from text (evaluate.speak_texts, as synthesize speaks
    them: same seed and order, so its first WAVs are these waveforms), with both log-mels."""
    n = min(count, len(items))
    texts = [(items.text(k), int(items.speaker_ids[k])) for k in range(n)]
    spoken = []
    for k, waveform in enumerate(speak_texts(model, text_encoder, texts, device, seed)):
        recording = torch.from_numpy(items.audio(k).astype(np.float32) / 32768.0).to(device)
        mels = frontend.mel(recording.view(1, 1, -1)), frontend.mel(waveform.view(1, 1, -1))
        spoken.append(
            Spoken(
                items.clip_id(k), waveform.cpu().numpy(), mels[0][0].cpu().numpy(), mels[1][0].cpu().numpy()
            )
        )
    return spoken


def freerun_metrics(spoken: list[Spoken]) -> dict[str, float]:
    """Means over the sentences of each score (empty when nothing was spoken)."""
    if not spoken:
        return {}
    scores = [dtw_scores(s.recorded_mel, s.spoken_mel) for s in spoken]
    return {key: float(np.mean([s[key] for s in scores])) for key in scores[0]}


def write_wavs(spoken: list[Spoken], folder, sample_rate: int) -> list:
    """16-bit WAVs of spoken sentences, as evaluate.synthesize writes them."""
    folder.mkdir(parents=True, exist_ok=True)
    return [write_wav(folder / f"{item.name}.wav", item.waveform, sample_rate) for item in spoken]


def free_running_eval(session) -> tuple[dict[str, float], list[Spoken]]:
    """The free-running scores of the primary validation set (first --freerun_samples sentences) and
    what was spoken: also the first --eval_samples sentences, whose WAVs and pictures reuse it.

    Runs on every process (no collective inside; same weights and seed give the same numbers)."""
    s, cfg = session, session.cfg
    name, items = next(iter(s.data.val_sets.items()), (None, None))
    count = max(cfg.freerun_samples, cfg.eval_samples)
    if items is None or count == 0:
        return {}, []
    spoken = speak(s.model, s.generator_raw.frontend, s.text, items, count, s.device)
    metrics = freerun_metrics(spoken[: cfg.freerun_samples])
    return {set_prefix(name) + k: v for k, v in metrics.items()}, spoken
