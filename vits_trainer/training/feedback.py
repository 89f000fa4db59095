"""Incremental fine-tuning from feedback: fold re-recorded or corrected sentences into a trained model
without forgetting what it already says well.

A feedback run is the runner's loop (loop.Trainer) on a different data split: every epoch trains on
all feedback clips plus a fresh replay draw of the original training clips (`--replay_ratio` per
feedback clip), while a held-out part of the feedback and the original validation split are
evaluated before and after. Each run is a new version folder:

    <output_dir>/v3/model/                the exported model (the loop's output_dir)
    <output_dir>/v3/checkpoints/          the loop's checkpoint_dir (resume, metrics, best_model)
    <output_dir>/v3/samples/{before,after}/<id>.wav   the feedback sentences, for listening
    <output_dir>/v3/feedback_run.json     the run's set-up (base, feedback split), kept across resumes
    <output_dir>/v3/feedback_report.json  before/after losses, promoted or not and why
    <output_dir>/latest.json (+ a `latest` symlink)   the current model: the last promoted version

A version is promoted only when all of these hold (one that is not keeps its files but never becomes
`latest`; the report gives the numbers and the reason):
- the final weights were evaluated: a final evaluation skipped for lack of time (or a signal) is
  reported as not measured (`"after": null`, `"measured": false`, the reason), never as a copy of
  "before", and is not promoted;
- the held-out feedback clips (evaluated, never trained on; at least 3 of them, see judgement.py)
  improved beyond the measurement noise: each is evaluated alone before and after training (another
  noise seed after), and the mean per-clip mel change must be below -t(0.95, n-1) x its standard error
  (a one-sided paired t-test); the report's `feedback.judgement` has n, the per-clip values, the mean
  change, the standard error, the threshold and the verdict;
- the feedback mel mean fell, and the original validation mel mean rose by at most `--max_regression`.
  That guard takes the measured change as it is: a rise within the noise still counts as a rise, so
  noise can only block a promotion, never let forgetting through.
With 8 or more usable feedback clips at least 3 are held out (more if --feedback_val_fraction says
so); with fewer, fewer than 3 are held out (none under 5: all are evaluated and trained on), so such a
round cannot be judged and is never promoted: add feedback clips.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import shutil
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from ..data.metadata import METADATA_NAME, SPLIT_FILE, WAVS_DIR, read_metadata
from ..errors import UserError
from ..jsonfile import write_json_atomic
from ..runlock import RunLock, is_main_process
from .config import TrainConfig, _f
from .judgement import MIN_JUDGED_CLIPS, SEED_AFTER, SEED_BEFORE, paired_judgement
from .resume_settings import resume_command

# torch/transformers are imported where used: a bad command line is reported without paying for them
if TYPE_CHECKING:
    from ..data.clipstore import ClipStore
    from ..data.items import TrainingItems
    from ..data.text import TextEncoder

REPORT_NAME = "feedback_report.json"
RUN_NAME = "feedback_run.json"
LATEST_JSON = "latest.json"
LATEST_LINK = "latest"
MIN_HELD_OUT_CLIPS = 5  # fewer usable feedback clips: evaluate on all of them, and train on them too
SAMPLE_RESERVE_FACTOR = 1.25  # the after-samples get this multiple of the before-samples' time
_VERSION = re.compile(r"^v(\d+)$")
# settings a feedback run derives or does not support: hidden from its command line
HIDDEN_FLAGS = ("model_name", "checkpoint_dir", "max_samples", "extend_vocab", "demo", "overwrite_output_dir")


@dataclass
class FeedbackConfig(TrainConfig):
    """TrainConfig plus the feedback inputs; model_name/checkpoint_dir are derived per version."""

    hidden_flags: ClassVar[tuple[str, ...]] = HIDDEN_FLAGS

    base_model: str = _f(
        "training/checkpoints/best_model",
        "the model to improve: a folder from train_vits.py or an earlier feedback run "
        "(e.g. training/feedback_models/latest)",
    )
    feedback_dir: str = _f(
        "feedback", "feedback clips: wavs/ + metadata.csv, made with prepare_data.py --data_dir FEEDBACK"
    )
    replay_ratio: float = _f(
        1.0, "original training clips replayed per feedback clip, drawn afresh every epoch (0 = none)"
    )
    max_regression: float = _f(
        0.02, "promote only if the original validation mel got at most this much worse (0.02 = 2 %%)"
    )
    sample_sentences: int = _f(
        50, "feedback sentences synthesised to WAV before and after, held-out ones first (0 = none)"
    )
    feedback_val_fraction: float = _f(
        0.2,
        f"feedback clips held out for the before/after comparison (with fewer than {MIN_HELD_OUT_CLIPS} "
        "clips, or 0: all of them are evaluated and also trained on)",
    )
    # --- runner settings with other defaults or meanings here ---
    output_dir: str = _f(
        "training/feedback_models",
        "versions v1, v2, ... (model/, checkpoints/, feedback_report.json); latest.json names the current one",
    )
    val_fraction: float = _f(
        0.02,
        "only when the base model has no recorded split: the --val_fraction it was trained with "
        "(its held-out split is then recomputed with --seed)",
    )
    target_hours: float = _f(0.5, "wall-clock budget of this process, start-up to exit included")
    learning_rate: float = _f(
        1e-5, "peak learning rate (lower than a first fine-tuning: the model is already trained)"
    )
    save_minutes: float = _f(10.0, "checkpoint at least this often (and at epoch ends, overhead permitting)")
    resume: str = _f(
        "auto",
        "auto (continue the newest version if it is unfinished, else start a new one) | none (always a "
        "new version) | PATH of a checkpoint folder inside a version",
    )

    def validate(self) -> None:
        super().validate()
        if not (math.isfinite(self.replay_ratio) and self.replay_ratio >= 0):
            raise UserError(f"--replay_ratio must be 0 or more (got {self.replay_ratio})")
        if not (math.isfinite(self.max_regression) and self.max_regression >= 0):
            raise UserError(f"--max_regression must be 0 or more (got {self.max_regression})")
        if self.sample_sentences < 0:
            raise UserError(f"--sample_sentences must be 0 or more (got {self.sample_sentences})")
        if not 0.0 <= self.feedback_val_fraction <= 0.5:
            raise UserError(f"--feedback_val_fraction must be in [0, 0.5] (got {self.feedback_val_fraction})")


# ---- versions and the `latest` pointer ---------------------------------------------------------------


def list_versions(root: Path) -> list[tuple[int, Path]]:
    """(number, folder) of every version under `root`, oldest first."""
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if p.is_dir() and (m := _VERSION.match(p.name))]
    return sorted(found)


def is_finished(version: Path) -> bool:
    return (version / REPORT_NAME).is_file()


def has_resumable_checkpoint(version: Path) -> bool:
    from .checkpoint import find_resumable

    return find_resumable(version / "checkpoints", log=lambda _: None)[0] is not None


def choose_version(root: Path, resume: str) -> tuple[Path, bool]:
    """(version folder, whether it continues an interrupted run) for `--resume`.

    auto: the newest version when it has no report yet (resumed from its checkpoint, or started again
    when it never saved one); else a new number. Only the newest: an older unfinished run would start
    from a base that a newer version has since replaced. none: always a new number.
    """
    versions = list_versions(root)
    next_version = root / f"v{(versions[-1][0] if versions else 0) + 1}"
    if resume == "none":
        return next_version, False
    if resume == "auto":
        if versions and not is_finished(versions[-1][1]):
            newest = versions[-1][1]
            return newest, has_resumable_checkpoint(newest)
        return next_version, False
    path = Path(resume).expanduser()
    if not path.is_dir():
        raise UserError(f"--resume {resume}: no such checkpoint folder")
    version = path.resolve().parent.parent
    if path.resolve().parent.name != "checkpoints" or version.parent != root.resolve():
        raise UserError(
            f"--resume {resume}: not a checkpoint of a version in {root} (<version>/checkpoints/step_*)"
        )
    if is_finished(version):
        raise UserError(
            f"--resume {resume}: {version.name} is finished (it has {REPORT_NAME}); start a new version"
        )
    return version, True


def read_latest(root: Path) -> dict | None:
    try:
        return json.loads((root / LATEST_JSON).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def write_latest(root: Path, version: Path, log) -> dict:
    """Make `version` the current model: latest.json (atomic) and a `latest` symlink where possible."""
    pointer = {
        "version": version.name,
        "path": str((version / "model").resolve()),
        "relative_path": f"{version.name}/model",
        "report": f"{version.name}/{REPORT_NAME}",
        "promoted_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    write_json_atomic(root / LATEST_JSON, pointer)  # refused up front unless ours (check_feedback_paths)
    link = root / LATEST_LINK
    if link.exists() and not link.is_symlink():
        log(f"warning: {link} is not a symlink; left as it is ({LATEST_JSON} names the current model)")
        return pointer
    tmp = root / f".{LATEST_LINK}.tmp-{os.getpid()}"
    try:
        tmp.unlink(missing_ok=True)  # our pid's temp link
        os.symlink(pointer["relative_path"], tmp, target_is_directory=True)
        os.replace(tmp, link)  # `link` is missing or a symlink (a real folder was left alone above)
    except OSError:  # a filesystem without symlinks: latest.json alone says it
        tmp.unlink(missing_ok=True)
    return pointer


# ---- inputs --------------------------------------------------------------------------------------------


@dataclass
class Inputs:
    """What the checks before training found out (nothing is written while they run)."""

    base_model: Path
    text: TextEncoder
    sample_rate: int
    hop_length: int
    num_speakers: int
    feedback_rows: int
    usable: int
    unknown_characters: dict[str, list[str]] = field(default_factory=dict)  # clip id -> characters
    unusable: list[tuple[str, str]] = field(default_factory=list)  # (clip id, reason)


def check_inputs(cfg: FeedbackConfig, log) -> Inputs:
    """Every input a feedback run needs, checked before anything is written; one UserError line each."""
    base = Path(cfg.base_model).expanduser()
    if not base.is_dir():
        raise UserError(
            f"--base_model {base}: no such folder (the model to improve, e.g. training/checkpoints/best_model)"
        )
    if not (base / "config.json").is_file():
        raise UserError(f"--base_model {base}: not a model folder (no config.json)")
    from .modelfolder import check_model_folder

    check_model_folder(base, "--base_model")
    data_dir = Path(cfg.data_dir)
    if not (data_dir / METADATA_NAME).is_file():
        raise UserError(
            f"--data_dir {data_dir}: no {METADATA_NAME} (the original training data is needed for replay "
            f"and for the original validation split)"
        )
    feedback = Path(cfg.feedback_dir)
    how = f"prepare it with: python prepare_data.py --source YOUR_FEEDBACK --data_dir {feedback}"
    if not feedback.is_dir():
        raise UserError(f"--feedback_dir {feedback}: no such folder ({how})")
    if not (feedback / METADATA_NAME).is_file():
        raise UserError(f"--feedback_dir {feedback}: no {METADATA_NAME} ({how})")
    rows, problems = read_metadata(feedback / METADATA_NAME)
    if not rows:
        raise UserError(f"--feedback_dir {feedback}: {METADATA_NAME} lists no clips")
    if problems:
        first = "; ".join(f"line {n}: {why}" for n, why in problems[:3])
        log(f"warning: {feedback / METADATA_NAME}: {len(problems)} unusable line(s) ignored ({first})")

    from ..data.text import TextEncoder

    config = json.loads((base / "config.json").read_text(encoding="utf-8"))
    sample_rate = int(config.get("sampling_rate", 16000))
    hop = int(math.prod(config.get("upsample_rates", [8, 8, 2, 2])))
    text = TextEncoder.from_pretrained(base)
    inputs = Inputs(base, text, sample_rate, hop, int(config.get("num_speakers", 1)), len(rows), 0)

    for row in rows:
        missing = text.unknown_characters([row.text])
        if missing:
            inputs.unknown_characters[row.id] = sorted(missing)
        reason = _unusable_reason(
            feedback / WAVS_DIR / f"{row.id}.wav", text.encode(row.text), sample_rate, hop
        )
        if reason:
            inputs.unusable.append((row.id, reason))
    inputs.usable = len(rows) - len(inputs.unusable)
    report_unknown_feedback_characters(inputs.unknown_characters, {r.id: r.text for r in rows}, log)
    if inputs.usable == 0:
        first = "; ".join(f"{i}: {why}" for i, why in inputs.unusable[:3])
        raise UserError(f"--feedback_dir {feedback}: none of its {len(rows)} clip(s) is usable ({first})")
    if inputs.unusable:
        first = "; ".join(f"{i}: {why}" for i, why in inputs.unusable[:3])
        log(f"warning: {len(inputs.unusable)} feedback clip(s) cannot be used ({first})")
    return inputs


def _unusable_reason(wav: Path, tokens: list[int], sample_rate: int, hop: int) -> str | None:
    """The same rules as dataset.build_items, from the WAV header alone (cheap, writes nothing)."""
    import soundfile as sf

    try:
        info = sf.info(str(wav))
    except Exception:  # soundfile raises several types for missing or corrupt files
        return "missing file" if not wav.exists() else "unreadable audio"
    frames = int(info.frames * sample_rate / max(1, info.samplerate)) // hop
    if not tokens:
        return "no tokens (no character of the text is in the model's vocabulary)"
    if len(tokens) > frames:
        return f"{len(tokens)} tokens but only {frames} frames of audio (clip too short)"
    return None


def report_unknown_feedback_characters(unknown: dict[str, list[str]], texts: dict[str, str], log) -> None:
    """One line per sentence (the first ten) whose characters the model cannot say."""
    if not unknown:
        return
    log(
        f"feedback: {len(unknown)} of {len(texts)} sentence(s) use characters outside the model's vocabulary "
        f"(the tokenizer drops them, so training cannot teach those sounds):"
    )
    for clip_id, chars in list(unknown.items())[:10]:
        shown = texts[clip_id] if len(texts[clip_id]) <= 60 else texts[clip_id][:57] + "..."
        log(f"  {clip_id} {shown!r}: {', '.join(repr(c) for c in chars)}")
    if len(unknown) > 10:
        log(f"  ... and {len(unknown) - 10} more (all listed in {REPORT_NAME})")
    log("  (rewrite those sentences, or retrain with train_vits.py --extend_vocab on data that has them)")


def read_split_file(path: Path) -> list[str] | None:
    """The held-out ids of a `training_split.json`: a list, or a dict with `val_ids`."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    ids = data.get("val_ids") if isinstance(data, dict) else data
    return [str(i) for i in ids] if isinstance(ids, list) else None


def original_val_ids(base: Path, store_ids: list[str], cfg: FeedbackConfig, log) -> tuple[list[str], str]:
    """(held-out ids of the run that made `base`, where they came from).

    In order: `<base>/training_split.json`; the newest checkpoint of the run beside it (best_model sits
    in its checkpoint dir, a feedback version's model beside its checkpoints/); else recomputed as the
    runner does with --val_fraction and --seed (right when the base was trained with the defaults).
    """
    from ..data.items import split_train_val
    from .checkpoint import find_resumable
    from .trainstate import LoadedCheckpoint

    known = set(store_ids)
    candidates: list[tuple[str, list[str] | None]] = [
        (str(base / SPLIT_FILE), read_split_file(base / SPLIT_FILE))
    ]
    for folder in (base.parent, base.parent / "checkpoints"):
        path, manifest = find_resumable(folder, log=lambda _: None)
        if path is not None:
            try:
                ids = LoadedCheckpoint(path, manifest).json("trainer_state.json").get("val_ids")
            except Exception:  # a damaged or foreign checkpoint is just not a source
                ids = None
            candidates.append((f"checkpoint {path}", ids))
    for source, ids in candidates:
        if ids is None:
            continue
        present = [i for i in ids if i in known]
        if present:
            if len(present) < len(ids):
                log(f"warning: {len(ids) - len(present)} held-out clip(s) of {source} are not in --data_dir")
            return present, source
        log(f"warning: none of the held-out ids of {source} is in --data_dir; not using it")
    positions = split_train_val(store_ids, cfg.val_fraction, seed=cfg.seed)[1] if cfg.val_fraction > 0 else []
    log(
        f"original validation split: {base} records none, recomputed as train_vits.py does "
        f"(--val_fraction {cfg.val_fraction}, --seed {cfg.seed}; pass those the base was trained with)"
    )
    return [store_ids[i] for i in positions], f"recomputed (val_fraction {cfg.val_fraction}, seed {cfg.seed})"


def subset(items: TrainingItems, positions: list[int] | np.ndarray) -> TrainingItems:
    from ..data.items import TrainingItems

    positions = np.asarray(positions, dtype=np.int64)
    return TrainingItems(
        store=items.store,
        indices=items.indices[positions] if len(positions) else np.zeros(0, np.int64),
        token_ids=[items.token_ids[int(i)] for i in positions],
        speaker_ids=items.speaker_ids[positions] if len(positions) else np.zeros(0, np.int64),
    )


def add_feedback_speakers(speakers: dict[str, int], names: list[str], num_speakers: int, log) -> None:
    """Give feedback speakers ids in place (the session saves this map): one voice -> 0; several ->
    the original map, or a name that is an id of the model; other names are dropped by build_items."""
    for name in sorted(set(names) - set(speakers)):
        if num_speakers <= 1:
            speakers[name] = 0
        elif name.isascii() and name.isdigit() and int(name) < num_speakers and str(int(name)) == name:
            speakers[name] = int(name)
        else:
            log(
                f"warning: feedback speaker {name!r} is not a speaker of the original data; its clips are skipped"
            )


# ---- the run -----------------------------------------------------------------------------------------


def _accelerate_state():
    """accelerate's process state once build_session has made its Accelerator; None before (tests
    that call data_fn directly), so this never initialises one with other settings."""
    from accelerate import PartialState

    return PartialState() if getattr(PartialState, "_shared_state", None) else None


def _world() -> tuple[int, int]:
    """(processes, this rank)."""
    state = _accelerate_state()
    return (state.num_processes, state.process_index) if state is not None else (1, 0)


def _main_process_first():
    """The main process builds the feedback cache first; the others then read it."""
    state = _accelerate_state()
    return state.main_process_first() if state is not None else contextlib.nullcontext()


class FeedbackRun:
    """One version: picks its folder, builds the data split for the shared session, runs the loop,
    writes samples, report and pointer."""

    def __init__(self, cfg: FeedbackConfig, process_start: float, log):
        self.cfg = cfg
        self.process_start = process_start
        self.log = log
        self.root = Path(cfg.output_dir)
        self.inputs: Inputs | None = None
        self.version: Path | None = None
        self.resuming = False
        self.info: dict = {}  # feedback_run.json: set up on the first start, read back on resume
        self.feedback_eval: TrainingItems | None = None
        self.feedback_train: TrainingItems | None = None

    # -- data ----------------------------------------------------------------------------------------

    def data_fn(self, cfg, store: ClipStore, text, speakers: dict, hop: int, val_ids: list[str] | None, log):
        """build_session's data hook: feedback + replay pool to train, {feedback, val} to evaluate."""
        from ..data.clipstore import load_clip_store
        from ..data.items import CombinedItems, build_items
        from ..data.sampler import ReplayBatchSampler
        from .datasplit import DataSplit

        if val_ids is None:
            val_ids, source = original_val_ids(self.inputs.base_model, store.ids, cfg, log)
        else:
            source = self.info.get("original_split_source", "checkpoint")
        self.info["original_split_source"] = source
        wanted = set(val_ids)
        orig_val_idx = [i for i, clip_id in enumerate(store.ids) if clip_id in wanted]
        orig_train_idx = [i for i, clip_id in enumerate(store.ids) if clip_id not in wanted]
        replay_pool, dropped = build_items(store, orig_train_idx, text.encode, speakers, hop, log=log)
        orig_val, dropped_val = build_items(store, orig_val_idx, text.encode, speakers, hop, log=log)

        with _main_process_first():
            fb_store, _ = load_clip_store(
                Path(cfg.feedback_dir), store.sample_rate, max_ram_gb=cfg.max_ram_gb, log=log, progress=False
            )
        add_feedback_speakers(speakers, fb_store.speakers, self.inputs.num_speakers, log)
        feedback, dropped_fb = build_items(
            fb_store, range(len(fb_store)), text.encode, speakers, hop, log=log
        )
        if len(feedback) == 0:
            raise UserError(
                f"--feedback_dir {cfg.feedback_dir}: no usable feedback clip (see the warnings above)"
            )
        # a re-recorded validation sentence must not be trained on: the original validation would leak
        protected = {_norm(store.texts[i]) for i in orig_val_idx}
        texts = [feedback.text(k) for k in range(len(feedback))]
        train_pos, eval_pos = self.feedback_split(feedback.ids(), texts, protected, log)
        self.feedback_train, self.feedback_eval = subset(feedback, train_pos), subset(feedback, eval_pos)

        replay_count = round(cfg.replay_ratio * len(self.feedback_train))
        if replay_count and len(replay_pool) == 0:
            raise UserError(f"--data_dir {cfg.data_dir}: no usable original training clip to replay")
        if replay_count == 0:
            log("warning: --replay_ratio 0: no original clips are replayed, the voice may drift")
        train = CombinedItems([self.feedback_train, replay_pool])
        processes, rank = _world()
        sampler = ReplayBatchSampler(
            train.audio_lengths(),
            fixed=train.part_range(0),
            replay_pool=train.part_range(1),
            replay_count=replay_count,
            batch_size=cfg.batch_size,
            seed=cfg.seed,
            num_replicas=processes,
            rank=rank,
        )
        val_sets = {"feedback": self.feedback_eval}
        if len(orig_val):
            val_sets["val"] = orig_val
        else:
            log(
                "warning: no original validation clips: forgetting cannot be measured, the run cannot be promoted"
            )
        self.info["dropped_feedback_clips"] = [list(d) for d in dropped_fb]
        self.info["replay"] = {"ratio": cfg.replay_ratio, "per_epoch": replay_count, "pool": len(replay_pool)}
        self.info["original_validation_clips"] = len(orig_val)
        log(
            f"feedback: {len(self.feedback_train)} clip(s) to train on, {len(self.feedback_eval)} evaluated "
            f"({self.info.get('feedback_eval', 'as when this version started')}); replay: {replay_count} of {len(replay_pool)} original training "
            f"clips per epoch, drawn afresh each epoch; original validation: {len(orig_val)} clips, held out "
            f"({source})"
        )
        return DataSplit(
            store=store,
            train=train,
            val_sets=val_sets,
            val_ids=list(val_ids),  # the original split: the next version must hold out the same clips
            dropped=dropped + dropped_val + dropped_fb,
            sampler=sampler,
            epoch_samples=sampler.epoch_size,
        )

    def feedback_split(
        self, ids: list[str], texts: list[str], protected: set[str], log
    ) -> tuple[list[int], list[int]]:
        """(train, evaluation) positions into the usable feedback clips; fixed for the version's life.
        Clips whose sentence is in `protected` (the original validation's) are evaluated, never trained."""
        from ..data.items import split_train_val

        stored = self.info.get("feedback_split")
        if stored is not None:  # a resumed version keeps the split its "before" numbers were taken on
            position = {clip_id: i for i, clip_id in enumerate(ids)}
            eval_pos = [position[i] for i in stored["eval"] if i in position]
            train_pos = [position[i] for i in stored["train"] if i in position]
            new = len(set(ids) - set(stored["eval"]) - set(stored["train"]))
            if new:
                log(
                    f"warning: {new} feedback clip(s) are new since {self.version.name} started and are not "
                    f"used; let it finish, then run again (or --resume none) to fold them in"
                )
            if not eval_pos or not train_pos:
                raise UserError(
                    f"{self.version}: the feedback clips it started with are gone from --feedback_dir"
                )
            return train_pos, eval_pos
        in_val = [_norm(t) in protected for t in texts]
        fixed_eval = [i for i, v in enumerate(in_val) if v]
        rest = [i for i, v in enumerate(in_val) if not v]
        if fixed_eval:
            log(
                f"warning: {len(fixed_eval)} feedback clip(s) say sentences of the original validation split "
                f"({', '.join(ids[i] for i in fixed_eval[:5])}): evaluated, never trained on, so that split "
                f"stays a fair test"
            )
        if not rest:
            raise UserError(
                "every usable feedback sentence is one of the original validation sentences: nothing to train on"
            )
        n = len(rest)
        if n < MIN_HELD_OUT_CLIPS or self.cfg.feedback_val_fraction == 0:
            why = f"only {n} usable clip(s)" if n < MIN_HELD_OUT_CLIPS else "--feedback_val_fraction 0"
            note = f"all {n}, also trained on: {why}, so the feedback numbers are not held-out"
            log(
                f"feedback: {why}: evaluating on all of them, which are also trained on (not a held-out test)"
            )
            train_pos, eval_pos = rest, sorted(rest + fixed_eval)
            held_out = False
        else:
            # enough held out for a promotion to be judged (see judgement.py), when that leaves enough to train
            min_val = MIN_JUDGED_CLIPS if n >= MIN_JUDGED_CLIPS + MIN_HELD_OUT_CLIPS else 1
            train_sub, eval_sub = split_train_val(
                [ids[i] for i in rest], self.cfg.feedback_val_fraction, min_val=min_val, seed=self.cfg.seed
            )
            train_pos, eval_pos = (
                [rest[i] for i in train_sub],
                sorted([rest[i] for i in eval_sub] + fixed_eval),
            )
            note = f"{len(eval_pos)} held out"
            held_out = True
        self.info["feedback_split"] = {
            "train": [ids[i] for i in train_pos],
            "eval": [ids[i] for i in eval_pos],
            "held_out": held_out,
        }
        self.info["feedback_eval"] = note
        return train_pos, eval_pos

    # -- samples -------------------------------------------------------------------------------------

    def sample_sentences(self) -> list[tuple[str, str, int]]:
        chosen, seen = [], set()
        for items in (self.feedback_eval, self.feedback_train):
            for k in range(len(items)):
                clip_id = items.clip_id(k)
                if clip_id not in seen:
                    seen.add(clip_id)
                    chosen.append((clip_id, items.text(k), int(items.speaker_ids[k])))
        return chosen[: self.cfg.sample_sentences]

    def write_samples(self, model, text, folder: Path, device, deadline: float | None = None) -> float:
        """Synthesise the feedback sentences into `folder`, one by one, stopping before `deadline`
        (a diverged model can speak for minutes); `sentences.json`, written last, lists what was made."""
        from .evaluate import synthesize

        t0 = time.perf_counter()
        sentences = self.sample_sentences()
        tmp = folder.with_name(f".{folder.name}.tmp-{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)  # this pid's temp folder inside a version folder
        tmp.mkdir(parents=True)
        done, slowest = [], 0.0
        for sentence in sentences:
            if deadline is not None and time.time() + slowest > deadline:
                self.log(
                    f"samples: stopped after {len(done)} of {len(sentences)} sentences to end within the budget"
                )
                break
            t1 = time.perf_counter()
            synthesize(model, text, [sentence], tmp, device)  # seeded per call: a sentence's take is stable
            slowest = max(slowest, time.perf_counter() - t1)
            done.append(sentence)
        (tmp / "sentences.json").write_text(
            json.dumps([{"id": i, "text": t} for i, t, _ in done], ensure_ascii=False, indent=1),
            encoding="utf-8",
        )
        shutil.rmtree(folder, ignore_errors=True)  # vN/samples/before|after: only this tool writes there
        os.replace(tmp, folder)
        return time.perf_counter() - t0

    def before_samples(self, session) -> None:
        """The base model's voice, before training; kept when a resumed version already has them."""
        folder = self.version / "samples" / "before"
        if (folder / "sentences.json").is_file():
            return
        if session.resumed_from is None:
            model, text = session.model, session.text
        else:  # interrupted before they were written: the session holds trained weights, load the base
            from ..model.vits import load_vits_model

            model, text = load_vits_model(self.inputs.base_model).to(session.device), self.inputs.text
        seconds = self.write_samples(model, text, folder, session.device)
        self.info["sample_seconds"] = seconds
        total = len(self.sample_sentences())
        if total:
            capped = (
                f" ({total} of {self.inputs.usable}: --sample_sentences)"
                if total < self.inputs.usable
                else ""
            )
            self.log(f"samples: {total} feedback sentences{capped} as the base model says them -> {folder}")

    # -- per-clip judgement -----------------------------------------------------------------------

    def judged_items(self) -> TrainingItems:
        """The evaluated feedback clips never trained on: the only ones a promotion may be judged on."""
        trained = set(self.feedback_train.ids())
        return subset(
            self.feedback_eval, [k for k, i in enumerate(self.feedback_eval.ids()) if i not in trained]
        )

    def before_per_clip(self, session) -> None:
        """Per-clip mel of the base model on the judged clips (kept across resumes in feedback_run.json)."""
        if self.info.get("per_clip_before") is not None:
            return
        from .evaluate import evaluate_per_clip

        generator = session.generator_raw
        if session.resumed_from is not None:  # interrupted before they were taken: the base model's
            from ..model.vits import VitsGenerator, load_vits_model

            generator = VitsGenerator(load_vits_model(self.inputs.base_model)).to(session.device)
        t0 = time.perf_counter()
        self.info["per_clip_before"] = evaluate_per_clip(
            generator, self.judged_items(), session.device, session.accelerator.autocast, SEED_BEFORE
        )
        self.info["per_clip_seconds"] = time.perf_counter() - t0

    # -- the whole run -------------------------------------------------------------------------------

    def run(self) -> dict:
        cfg, log = self.cfg, self.log
        self.version, self.resuming = choose_version(self.root, cfg.resume)
        if self.resuming:  # the version's own settings (base, feedback, data, LR...), before checking them
            cfg = self.cfg = self.restore_settings(cfg)
        self.inputs = check_inputs(cfg, log)
        if self.resuming:
            try:
                self.info = json.loads((self.version / RUN_NAME).read_text(encoding="utf-8"))
            except (OSError, ValueError):
                log(f"warning: {self.version / RUN_NAME} is missing; the feedback split is recomputed")
            if self.info.get("base_model") not in (None, str(self.inputs.base_model.resolve())):
                log(
                    f"note: {self.version.name} started from {self.info['base_model']}; it continues from its "
                    f"checkpoint (--base_model is used only for a new version)"
                )
        created = not self.version.exists()
        log(f"{'continuing' if self.resuming else 'starting'} {self.version}")
        session_cfg = replace(
            cfg,
            model_name=str(self.inputs.base_model),
            checkpoint_dir=str(self.version / "checkpoints"),
            output_dir=str(self.version / "model"),
            # a new version's checkpoint dir is empty: "none" also guards against reusing a stranger's
            resume=cfg.resume if self.resuming else "none",
            explicit=None,  # settings already restored above: build_session uses them as they are
        )
        if not self.resuming and self.version.exists():  # never saved a checkpoint: start it again
            # vN/ is a version folder numbered by choose_version under the root, which overlaps no data
            # folder and no base model (check_feedback_paths); checkpoints/ and samples/ are ours
            shutil.rmtree(self.version / "checkpoints", ignore_errors=True)
            shutil.rmtree(self.version / "samples", ignore_errors=True)
        if (
            not self.resuming
            and cfg.discriminator == ""
            and not (self.inputs.base_model / "discriminator.safetensors").is_file()
        ):
            log(
                f"warning: {self.inputs.base_model} has no discriminator.safetensors: a fresh discriminator "
                f"starts from scratch, so the first steps' adversarial signal is noise (keep the base "
                f"model's discriminator beside it next time)"
            )

        from .loop import Trainer
        from .session import build_session

        try:
            session = build_session(session_cfg, self.process_start, data_fn=self.data_fn)
        except UserError:
            if created:  # bad input found while setting up: leave nothing behind (this process made vN/)
                shutil.rmtree(self.version, ignore_errors=True)
            raise
        main = session.is_main
        if main:
            if not self.resuming:
                self.info.update(
                    base_model=str(self.inputs.base_model.resolve()),
                    feedback_dir=str(Path(cfg.feedback_dir).resolve()),
                    data_dir=str(Path(cfg.data_dir).resolve()),
                    unknown_characters=self.inputs.unknown_characters,
                    started=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                )
            self.before_samples(session)
            self.before_per_clip(session)
            write_json_atomic(self.version / RUN_NAME, self.info)
        # the after-samples and per-clip evaluation come after the loop's final export: keep their time
        # out of its budget
        reserve = (
            SAMPLE_RESERVE_FACTOR
            * (float(self.info.get("sample_seconds", 0.0)) + float(self.info.get("per_clip_seconds", 0.0)))
            + 1.0
        )
        session.budget.extra_final_seconds = reserve

        summary = Trainer(session).train()
        if summary["stopped_reason"] == "signal":
            log(
                f"stopped by a signal at step {summary['steps']}; continue with: "
                + resume_command("train_feedback.py", cfg, "--output_dir", self.root)
            )
            return {"version": self.version.name, "status": "interrupted", "summary": summary}
        if not main:
            return {"version": self.version.name, "status": "done", "summary": summary}

        # the after-samples may use the reserve kept for them, not the safety margin
        deadline = session.budget.deadline() - session.budget.safety_seconds()
        self.write_samples(
            session.model, session.text, self.version / "samples" / "after", session.device, deadline
        )
        per_clip_after = None
        if summary.get("final_val") is not None:  # the final weights were evaluated: judge them per clip
            from .evaluate import evaluate_per_clip

            per_clip_after = evaluate_per_clip(
                session.generator_raw,
                self.judged_items(),
                session.device,
                session.accelerator.autocast,
                SEED_AFTER,
            )
        report = self.report(session, summary, per_clip_after)
        write_json_atomic(self.version / REPORT_NAME, report)
        log(f"report: {self.version / REPORT_NAME}")
        log(report["message"])
        return report

    def restore_settings(self, cfg: FeedbackConfig) -> FeedbackConfig:
        """`cfg` with the settings saved in the checkpoint this version resumes from (resume_settings.py);
        the --output_dir root and the settings derived per version stay as they are."""
        from .checkpoint import find_resumable, verify_checkpoint
        from .resume_settings import restore_settings
        from .trainstate import LoadedCheckpoint

        if cfg.resume == "auto":
            path, manifest = find_resumable(self.version / "checkpoints", log=self.log)
        else:
            path = Path(cfg.resume).expanduser()
            try:
                manifest = verify_checkpoint(path, checksums=True)
            except Exception as err:
                raise UserError(f"--resume {cfg.resume}: not a usable checkpoint ({err})") from None
        if path is None:
            return cfg
        saved = LoadedCheckpoint(path, manifest).json("trainer_state.json").get("config")
        keep = frozenset({"output_dir", *HIDDEN_FLAGS})
        return restore_settings(cfg, saved, self.log, source=path.name, keep=keep)

    def report(self, session, summary: dict, per_clip_after: dict | None = None) -> dict:
        cfg = self.cfg
        history = session.state.val_history
        before = history[0] if history and history[0].get("tag") == "start" else {}
        measured = summary.get("final_val") is not None  # never an earlier evaluation standing in
        after = summary.get("final_val") or {}
        fb_before, fb_after = _losses(before, "feedback_"), _losses(after, "feedback_")
        ov_before, ov_after = _losses(before, ""), _losses(after, "")
        judgement = paired_judgement(self.info.get("per_clip_before") or {}, per_clip_after or {})
        judgement["per_clip_before"] = self.info.get("per_clip_before")
        judgement["per_clip_after"] = per_clip_after
        not_measured = summary.get("final_eval_skipped") or "not run"
        if not measured:
            promoted, reason = (
                False,
                f"nothing was measured after training (final evaluation skipped: {not_measured})",
            )
        else:
            promoted, reason = promotion(
                fb_before, fb_after, ov_before, ov_after, cfg.max_regression, judgement
            )
        if not summary.get("final_model"):
            promoted, reason = False, "the model could not be exported (see the error above)"
        previous = read_latest(self.root)
        if promoted:
            latest = write_latest(self.root, self.version, self.log)
            message = f"promoted {self.version.name}: {reason}; latest -> {self.version / 'model'}"
        else:
            latest = previous
            current = (
                f"the current model stays {previous['version']} ({self.root / previous['relative_path']})"
                if previous
                else "there is no promoted model yet"
            )
            message = f"not promoted: {reason}; {self.version.name} is kept in {self.version}, {current}"
        return {
            "version": self.version.name,
            "promoted": promoted,
            "reason": reason,
            "message": message,
            "base_model": self.info.get("base_model"),
            "model": str(self.version / "model"),
            "exported": bool(summary.get("final_model")),
            "after_measured": measured,
            "after_not_measured_because": None if measured else not_measured,
            "feedback": {
                "before": fb_before,
                "after": fb_after if measured else None,
                "measured": measured,
                "change": _change(fb_before, fb_after) if measured else None,
                "judgement": judgement,
                "clips_evaluated": len(self.feedback_eval),
                "clips_trained": len(self.feedback_train),
                "held_out": self.info["feedback_split"]["held_out"],
                "evaluation": self.info.get("feedback_eval"),
            },
            "original_validation": {
                "before": ov_before,
                "after": ov_after if measured else None,
                "measured": measured,
                "change": _change(ov_before, ov_after) if measured else None,
                "clips": self.info.get("original_validation_clips", 0),
                "max_regression": cfg.max_regression,
                "split_source": self.info.get("original_split_source"),
            },
            "replay": self.info.get("replay"),
            "unknown_characters": self.info.get("unknown_characters", {}),
            "dropped_feedback_clips": self.info.get("dropped_feedback_clips", []),
            "samples": {
                "before": str(self.version / "samples" / "before"),
                "after": str(self.version / "samples" / "after"),
            },
            "training": {
                k: summary.get(k)
                for k in (
                    "steps",
                    "session_steps",
                    "resumed_from_step",
                    "stopped_reason",
                    "epochs_trained",
                    "skipped_steps",
                    "wall_seconds",
                    "target_seconds",
                )
            },
            "latest": latest,
            "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }


def _norm(text: str) -> str:
    return " ".join(text.lower().split())


def _losses(record: dict, prefix: str) -> dict[str, float]:
    # the free-running scores exist for the primary (feedback) set only: see freerun.free_running_eval
    keys = ("val_mel", "val_kl", "val_duration", "val_loss", "val_mel_dtw", "val_mcd", "val_duration_ratio")
    return {k: float(record[prefix + k]) for k in keys if prefix + k in record}


def _change(before: dict, after: dict) -> float | None:
    """Relative change of the mel loss (negative = better)."""
    b, a = before.get("val_mel"), after.get("val_mel")
    if b is None or a is None or not (math.isfinite(a) and math.isfinite(b)) or b == 0:
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
    if not math.isfinite(ov_a):
        return False, f"{feedback}, but the original validation loss is not finite"
    change = ov_a / ov_b - 1.0
    original = (
        f"original validation mel {ov_b:.4f} -> {ov_a:.4f} ({change:+.1%}, limit +{max_regression:.1%})"
    )
    if change > max_regression:
        return False, f"the original validation regressed beyond the limit: {original}; {feedback}"
    return True, f"{feedback}, {original}"


def run_feedback(cfg: FeedbackConfig, process_start: float, log=None) -> dict:
    """The whole feedback run (train_feedback.py calls this); returns the report, or a status dict
    when it was interrupted."""
    cfg.validate()
    from ..safety import check_feedback_paths

    check_feedback_paths(cfg)  # overlapping folders: refused before any work or write
    if log is None:
        from .runtime import Logger

        log = Logger(is_main_process())  # lines from the main process only
    # one run per output root (it numbers the versions there); released when the run ends
    lock = RunLock.acquire(Path(cfg.output_dir), "--output_dir", log) if is_main_process() else None
    try:
        return FeedbackRun(cfg, process_start, log).run()
    finally:
        if lock is not None:
            lock.release()
