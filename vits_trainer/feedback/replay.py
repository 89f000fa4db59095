"""A feedback run's data: its inputs checked before anything is written, and the replay mix it trains
on (every feedback clip plus a fresh draw of the original training clips each epoch), with the held-out
feedback clips and the original validation split it is judged on.

Apart from round.py (the round and its report); `FeedbackData` is the data half of `FeedbackRun`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..data.audio import AUDIO_EXTENSIONS
from ..data.metadata import METADATA_NAME, SPLIT_FILE, WAVS_DIR, read_metadata
from ..errors import UserError
from .config import MIN_HELD_OUT_CLIPS, check_base_model_folder
from .judgement import MIN_JUDGED_CLIPS
from .versions import REPORT_NAME

if TYPE_CHECKING:
    from ..data.clipstore import ClipStore
    from ..data.items import TrainingItems
    from ..data.text import TextEncoder
    from .config import FeedbackConfig


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


def check_feedback_inputs(cfg: FeedbackConfig, log) -> Inputs:
    """Every input a feedback run needs, checked before anything is written; one UserError line each."""
    base = check_base_model_folder(cfg.base_model)
    from ..training.modelfolder import check_model_folder

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
        if any(p.suffix.lower() in AUDIO_EXTENSIONS for p in feedback.iterdir()):  # the recordings
            named = feedback if feedback.name else feedback.resolve()  # "." has no name to extend
            prepared = named.with_name(named.name + "_prepared")
            how = (
                f"these look like the recordings: python prepare_data.py --source {feedback} "
                f"--data_dir {prepared}, then --feedback_dir {prepared}"
            )
        raise UserError(f"--feedback_dir {feedback}: no {METADATA_NAME} ({how})")
    rows, _ = read_metadata(feedback / METADATA_NAME)  # its unusable lines: warned about when it loads
    if not rows:
        raise UserError(f"--feedback_dir {feedback}: {METADATA_NAME} lists no clips")

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
    """The same rules as items.build_items, from the WAV header alone (cheap, writes nothing)."""
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
    from ..data.items import held_out_positions
    from ..training.checkpoint import find_resumable
    from ..training.trainstate import LoadedCheckpoint

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
    positions = held_out_positions(store_ids, cfg.val_fraction, cfg.seed)
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
            # said, not silent: a feedback folder prepared without a speaker column is all speaker "0",
            # which is taken as speaker_id 0, the voice of whichever speaker had that id (or of none)
            voice = sorted(n for n, i in speakers.items() if i == int(name) and n != name)
            whose = (
                f"the voice of {', '.join(voice)}" if voice else "a voice no speaker of the original data has"
            )
            log(
                f"note: feedback speaker {name!r} is not a speaker of the original data; its clips train "
                f"speaker_id {name}, {whose} (a speaker column naming the voice says which one: "
                f"prepare_data.py --speaker_column)"
            )
        else:
            log(
                f"warning: feedback speaker {name!r} is not a speaker of the original data; its clips are skipped"
            )


def _norm(text: str) -> str:
    # NFC as the tokenizer sees it (data/text.py): a sentence typed in decomposed form (a folder not made
    # by prepare_data.py) was another sentence here, so a validation sentence was trained on
    return " ".join(unicodedata.normalize("NFC", text).lower().split())


def _accelerate_state():
    """accelerate's process state once build_session has made its Accelerator; None before (tests
    that call data_fn directly), so this never initialises one with other settings."""
    from accelerate import PartialState

    return PartialState() if getattr(PartialState, "_shared_state", None) else None


def clip_digest(text: str, audio: np.ndarray) -> str:
    """What a feedback clip says and sounds like, in 16 hex digits: a resumed version checks that its
    clips are still the ones its "before" numbers were taken on (prepare_data names clips by file name,
    so another recording session easily reuses the ids)."""
    digest = hashlib.blake2b(text.encode("utf-8"), digest_size=8)
    digest.update(np.ascontiguousarray(audio, dtype=np.float32).tobytes())
    return digest.hexdigest()


def replay_per_epoch(ratio: float, trained_clips: int) -> int:
    """Original clips replayed per epoch: rounded up, so --replay_ratio 0.1 of 4 clips replays one
    (round() made it none, and 0.5 of 1 too); only 0 means none."""
    return math.ceil(ratio * trained_clips - 1e-9)  # 0.3 x 10 is 3.0000000000000004


def replay_record(earlier: dict | None, ratio: float, per_epoch: int, pool: int) -> dict:
    """feedback_run.json's "replay" for this session; a resumed round trained with another --replay_ratio
    before keeps those ratios (`earlier_ratios`, oldest first), where the report named the last alone."""
    record: dict = {"ratio": ratio, "per_epoch": per_epoch, "pool": pool}
    if isinstance(earlier, dict):
        ratios = list(earlier.get("earlier_ratios") or [])
        if earlier.get("ratio") is not None and earlier["ratio"] != ratio:
            ratios.append(earlier["ratio"])
        if ratios:
            record["earlier_ratios"] = ratios
    return record


def _world() -> tuple[int, int]:
    """(processes, this rank)."""
    state = _accelerate_state()
    return (state.num_processes, state.process_index) if state is not None else (1, 0)


def _main_process_first():
    """The main process builds the feedback cache first; the others then read it."""
    state = _accelerate_state()
    return state.main_process_first() if state is not None else contextlib.nullcontext()


class FeedbackData:
    """The data half of a `FeedbackRun` (its base class): build_session's `data_fn` and the feedback
    split. Uses the run's `cfg`, `inputs` (check_feedback_inputs), `info` (feedback_run.json) and `version`;
    sets its `feedback_train` and `feedback_eval` items."""

    cfg: FeedbackConfig
    inputs: Inputs | None
    info: dict
    version: Path | None
    feedback_eval: TrainingItems | None
    feedback_train: TrainingItems | None

    def data_fn(self, cfg, store: ClipStore, text, speakers: dict, hop: int, val_ids: list[str] | None, log):
        """build_session's data hook: feedback + replay pool to train, {feedback, val} to evaluate."""
        from ..data.clipstore import load_clip_store
        from ..data.items import CombinedItems, build_items
        from ..data.sampler import ReplayBatchSampler
        from ..training.datasplit import DataSplit, by_voice, interleave_voices

        if val_ids is None:
            val_ids, source = original_val_ids(self.inputs.base_model, store.ids, cfg, log)
        else:
            source = self.info.get("original_split_source", "checkpoint")
        self.info["original_split_source"] = source
        wanted = set(val_ids)
        orig_val_idx = [i for i, clip_id in enumerate(store.ids) if clip_id in wanted]
        orig_train_idx = [i for i, clip_id in enumerate(store.ids) if clip_id not in wanted]
        replay_pool, dropped = build_items(store, orig_train_idx, text.encode, speakers, hop, log=log)
        orig_val_idx = interleave_voices(orig_val_idx, store.speakers, speakers)  # as train_vits.py's
        orig_val, dropped_val = build_items(store, orig_val_idx, text.encode, speakers, hop, log=log)

        with _main_process_first():
            fb_store, fb_report = load_clip_store(
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
        digests = [clip_digest(text, feedback.audio(k)) for k, text in enumerate(texts)]
        train_pos, eval_pos = self.feedback_split(feedback.ids(), texts, digests, protected, log)
        # the samples and free-running scores take the first evaluated clips: every voice in turn
        eval_pos = by_voice(eval_pos, [int(feedback.speaker_ids[k]) for k in eval_pos])
        self.feedback_train, self.feedback_eval = subset(feedback, train_pos), subset(feedback, eval_pos)

        replay_count = replay_per_epoch(cfg.replay_ratio, len(self.feedback_train))
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
        # every feedback clip given and not used, with why: unusable for training, or unreadable audio;
        # and metadata.csv lines that name no clip (both were warned about as they were found)
        self.info["dropped_feedback_clips"] = [list(d) for d in [*dropped_fb, *fb_report.skipped]]
        self.info["unusable_feedback_lines"] = [list(p) for p in fb_report.metadata_problems]
        self.info["replay"] = replay_record(
            self.info.get("replay"), cfg.replay_ratio, replay_count, len(replay_pool)
        )
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
            feedback_clips=len(self.feedback_train),
            # too few clips to hold any out: the feedback evaluation is of clips also trained on
            val_trained_clips=len(set(self.feedback_eval.ids()) & set(self.feedback_train.ids())),
        )

    def check_same_clips(self, stored: dict[str, str], position: dict[str, int], digests: list[str]) -> None:
        """A resumed version's clips must be those it started with: its "before" numbers are theirs.
        (`stored` is empty for a version from before digests were kept.)"""
        changed = [i for i, d in stored.items() if i in position and digests[position[i]] != d]
        if changed:
            shown = ", ".join(changed[:3]) + (f" and {len(changed) - 3} more" if len(changed) > 3 else "")
            raise UserError(
                f"--feedback_dir {self.cfg.feedback_dir}: {shown} now say or sound different from when "
                f"{self.version} started, and its 'before' numbers are of those: finish it with the clips it "
                f"started with, or start a new version on these with --resume none"
            )

    def feedback_split(
        self, ids: list[str], texts: list[str], digests: list[str], protected: set[str], log
    ) -> tuple[list[int], list[int]]:
        """(train, evaluation) positions into the usable feedback clips; fixed for the version's life.
        Clips whose sentence is in `protected` (the original validation's) are evaluated, never trained.
        `digests` (clip_digest) tell a resumed version its own clips from others under the same ids."""
        from ..data.items import hash_order

        stored = self.info.get("feedback_split")
        if stored is not None:  # a resumed version keeps the split its "before" numbers were taken on
            position = {clip_id: i for i, clip_id in enumerate(ids)}
            self.check_same_clips(stored.get("digests") or {}, position, digests)
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
                    f"{self.version}: the feedback clips it started with are gone from --feedback_dir "
                    f"{self.cfg.feedback_dir}; --resume none starts a new version on this folder"
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
        # takes of one sentence stay together: held out, or trained on (a held-out take of a sentence
        # trained on measures memorising it). A group is named by its first clip's id, so a set of
        # distinct sentences splits as clip by clip.
        sentences: dict[str, list[int]] = {}
        for i in rest:
            sentences.setdefault(_norm(texts[i]), []).append(i)
        groups = list(sentences.values())
        n = len(groups)
        if n < MIN_HELD_OUT_CLIPS or self.cfg.feedback_val_fraction == 0:
            usable = f"only {n} usable clip(s)" if n == len(rest) else f"only {n} distinct sentence(s)"
            why = usable if n < MIN_HELD_OUT_CLIPS else "--feedback_val_fraction 0"
            note = f"all {len(rest)}, also trained on: {why}, so the feedback numbers are not held-out"
            log(
                f"feedback: {why}: evaluating on all of them, which are also trained on (not a held-out test)"
            )
            train_pos, eval_pos = rest, sorted(rest + fixed_eval)
            held_out = False
        else:
            # enough held out for a promotion to be judged (see judgement.py), when that leaves enough to train
            min_val = MIN_JUDGED_CLIPS if len(rest) >= MIN_JUDGED_CLIPS + MIN_HELD_OUT_CLIPS else 1
            # whole sentences held out, in the split's hash order, until the clips held out reach the
            # share asked for (counted in clips: a sentence of many takes counts as many)
            wanted = max(min_val, round(self.cfg.feedback_val_fraction * len(rest)))
            held: list[int] = []
            for k in hash_order([ids[g[0]] for g in groups], self.cfg.seed)[: n - 1]:
                if len(held) >= wanted:
                    break
                held += groups[k]
            train_pos = sorted(set(rest) - set(held))
            eval_pos = sorted(held + fixed_eval)
            note = f"{len(eval_pos)} held out"
            held_out = True
        judged = len(set(eval_pos) - set(train_pos))  # the clips a promotion is judged on
        if judged < MIN_JUDGED_CLIPS:
            log(
                f"warning: {judged} feedback clip(s) held out and never trained on: this round cannot be "
                f"promoted (it is judged on at least {MIN_JUDGED_CLIPS}); its samples/after are there to "
                f"listen to. Record at least {MIN_JUDGED_CLIPS + MIN_HELD_OUT_CLIPS} feedback clips"
            )
        self.info["feedback_split"] = {
            "train": [ids[i] for i in train_pos],
            "eval": [ids[i] for i in eval_pos],
            "held_out": held_out,
            "digests": {ids[i]: digests[i] for i in sorted(set(train_pos) | set(eval_pos))},
        }
        self.info["feedback_eval"] = note
        return train_pos, eval_pos
