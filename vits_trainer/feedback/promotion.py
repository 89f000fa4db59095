"""Whether a feedback version becomes `latest`: the promotion rule on the before/after losses and the
per-clip judgement (judgement.py); round.py's docstring gives the rule in words.

Apart from round.py because it is a pure function of numbers, tested alone.
"""

from __future__ import annotations

import math

from .judgement import finite_score


def loss_values(record: dict, prefix: str) -> dict[str, float]:
    """The losses of one evaluation record for one set ("feedback_", or "" for the original validation)."""
    # the free-running scores exist for the primary (feedback) set only: see freerun.free_running_eval
    keys = ("val_mel", "val_kl", "val_duration", "val_loss", "val_mel_dtw", "val_mcd", "val_duration_ratio")
    return {k: float(record[prefix + k]) for k in keys if prefix + k in record}


# a rise of the free-running distance this large is far beyond its measured noise (docs/feedback.md)
SPOKEN_RISE_WARNING = 0.10


def spoken_warning(fb_before: dict, fb_after: dict, samples: str) -> str | None:
    """A warning line when the feedback sentences spoken from text alone moved clearly away from their
    recordings (`val_mel_dtw` up by more than SPOKEN_RISE_WARNING), whatever the teacher-forced mel did:
    a round that improves the mel while slurring words. The promotion rule does not weigh it; the user
    is told to listen (`samples`: the after-samples' folder)."""
    b, a = fb_before.get("val_mel_dtw"), fb_after.get("val_mel_dtw")
    if not (finite_score(a) and finite_score(b)) or b <= 0:
        return None
    if a / b - 1.0 <= SPOKEN_RISE_WARNING:
        return None
    mcd_b, mcd_a = fb_before.get("val_mcd"), fb_after.get("val_mcd")
    mcd = f", val_mcd {mcd_b:.2f} -> {mcd_a:.2f} dB" if mcd_b is not None and mcd_a is not None else ""
    return (
        f"warning: the feedback sentences spoken from text alone moved away from their recordings: "
        f"val_mel_dtw {b:.4f} -> {a:.4f} ({a / b - 1.0:+.1%}){mcd}; listen to {samples} before relying "
        "on this version"
    )


def mel_change(before: dict, after: dict) -> float | None:
    """Relative change of the mel loss (negative = better)."""
    b, a = before.get("val_mel"), after.get("val_mel")
    if not (finite_score(a) and finite_score(b)) or b == 0:
        return None
    return a / b - 1.0


def promotion(
    fb_before: dict,
    fb_after: dict,
    ov_before: dict,
    ov_after: dict,
    max_regression: float,
    judgement: dict | None = None,
):
    """(promoted, why): the held-out feedback clips improved beyond the measurement noise
    (`judgement`, from judgement.paired_judgement on per-clip mel losses; None = not judged), the
    feedback mel mean fell, and the original validation mel mean rose by at most `max_regression`
    (relative). The regression guard takes the measured change as it is: a rise within the noise still
    counts, so noise can only block a promotion, never let a regression through unnoticed. Mel is the
    loss the runner selects its best model by."""
    fb_b, fb_a = fb_before.get("val_mel"), fb_after.get("val_mel")
    ov_b, ov_a = ov_before.get("val_mel"), ov_after.get("val_mel")
    if fb_b is None or fb_a is None:
        return False, "no before/after evaluation on the feedback clips"
    if not (math.isfinite(fb_b) and math.isfinite(fb_a)):
        return False, f"the feedback loss is not finite ({fb_b} -> {fb_a})"
    if not fb_a < fb_b:
        return False, f"the feedback mel loss did not improve ({fb_b:.4f} -> {fb_a:.4f})"
    feedback = f"feedback mel {fb_b:.4f} -> {fb_a:.4f} ({fb_a / fb_b - 1:+.1%})"
    if judgement is None or not judgement.get("improved"):
        why = judgement["why"] if judgement else "not enough held-out clips to judge (none measured per clip)"
        return False, f"{why}; {feedback}"
    feedback = f"{feedback}; held-out clips {judgement['why']}"
    if ov_b is None or ov_a is None:
        return False, f"{feedback}, but there is no original validation to check for forgetting"
    if not (math.isfinite(ov_a) and math.isfinite(ov_b) and ov_b > 0):
        # a NaN "before" made the change NaN, which passed the limit check below
        return False, f"{feedback}, but the original validation loss is not finite ({ov_b} -> {ov_a})"
    change = ov_a / ov_b - 1.0
    original = (
        f"original validation mel {ov_b:.4f} -> {ov_a:.4f} ({change:+.1%}, limit +{max_regression:.1%})"
    )
    if not change <= max_regression:
        return False, f"the original validation regressed beyond the limit: {original}; {feedback}"
    return True, f"{feedback}, {original}"
