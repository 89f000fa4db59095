"""What a run writes while it trains (`RunOutputs`, one part of loop.Trainer): evaluations (with samples,
alignments and pictures), checkpoints and exports (best_model, and final_model for run_end.py, each with
its model card), when budget.py's rules say they are due: at epoch ends (overhead_due) and, for
checkpoints, after any step (save_minutes_passed).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from ..data.metadata import SPLIT_FILE
from ..model.alignment import maximum_path
from ..model.discriminator import save_discriminator
from ..model.vits import export_model
from ..safety import UnsafeOverwrite
from .best_model import best_model_score, install_best_model
from .budget import (
    interval_saves_per_epoch,
    overhead_due,
    overheads_per_epoch,
    save_minutes_passed,
    step_seconds_from_eval,
)
from .checkpoint import checkpoint_name, prune_checkpoints, write_checkpoint
from .evaluate import evaluate, set_prefix, synthesize
from .freerun import dtw_scores, free_running_eval, write_wavs
from .model_card import CARD_FILE, Sample, model_card, run_facts
from .pictures import alignment_paths, log_images_to_trackers, warm_up_pictures, write_pictures
from .report import (
    ARCHIVE_FILE,
    BY_SPEAKER,
    sample_folder,
    speaker_metric,
    write_references,
    write_report,
    write_report_archive,
)
from .reporting import log_audio_to_trackers
from .resume_settings import resume_command
from .runtime import git_revision
from .trainstate import checkpoint_files

SAMPLES_FOLDER = "samples"  # in an exported model folder: what its weights spoke at their evaluation


class RunOutputs:
    """Evaluations, checkpoints and exports of a run. Owns when each last happened (`last_eval`,
    `last_save`), the newest checkpoint written (`last_checkpoint`, on every rank), the last evaluation's
    results (`last_val`, at `last_val_step`, by the evaluation tagged `last_val_tag`) and why the newest
    best weights have no best_model/ (`best_model_refused`, main process only: set by the two ways into
    best_model/, run_eval's export and copy_final_to_best)."""

    def __init__(self, session, metrics, agreement, checkpoint_figures: Callable[[], dict]) -> None:
        self.s = session
        self.metrics = metrics
        self.agreement = agreement
        # the loop's own choices each checkpoint records (loop.Trainer.checkpoint_figures)
        self.checkpoint_figures = checkpoint_figures
        self.last_eval = self.last_save = time.time()
        self.last_checkpoint: Path | None = session.resumed_from
        self.last_val: dict | None = None
        self.last_val_step: int | None = None
        self.last_val_tag: str | None = None
        self.last_voices: dict = {}  # that evaluation's val_mel of each voice ({"by_speaker": ...}), if any
        self.best_model_refused: str | None = None  # why the latest best weights have no best_model/
        self.report: Path | None = None  # report.html, once written
        self.hub = self._hub_push() if session.cfg.push_to_hub and session.is_main else None

    def take_over_resumed(self) -> None:
        """Before a resumed run's first step: what its folder holds beyond the checkpoint (a better
        best_model/ to beat: TrainState's best fields may change) and an evaluation of the resumed weights."""
        self.keep_better_best_model()
        self._known_evaluation()

    def _known_evaluation(self) -> None:
        """A resumed checkpoint whose weights an evaluation scored (the final one of a run that reached
        --max_steps): that evaluation stands for a final one while no step trains them further."""
        step = self.s.budget.global_step
        known = next((r for r in reversed(self.s.state.val_history) if r.get("step") == step), None)
        if known is not None:
            meta = ("tag", "step", "epoch", "time", "seconds", "best_key")
            self.last_val = {k: v for k, v in known.items() if k not in meta and not k.endswith(BY_SPEAKER)}
            self.last_voices = {k: v for k, v in known.items() if k.endswith(BY_SPEAKER)}
            self.last_val_step, self.last_val_tag = step, known.get("tag")

    def best_key(self) -> str:
        """The result that decides the best model: --best_metric on the first validation set."""
        primary = next(iter(self.s.val_loaders))
        metric = self.s.cfg.best_metric
        return set_prefix(primary) + metric

    def keep_better_best_model(self) -> None:
        """A resumed run's best_model/ may hold weights that scored better than anything its checkpoint
        knows: exported after it, by the future an older checkpoint's resume leaves (chosen, or the
        newest being damaged) or by a session killed before its next checkpoint. They stay the best to
        beat: a worse evaluation never replaces them."""
        s = self.s
        if not s.val_loaders:
            return
        key = self.best_key()
        found = best_model_score(s.checkpoint_dir, key)
        if found is None or (s.state.best_val is not None and found[1] >= s.state.best_val):
            return
        step, score = found
        s.state.best_val, s.state.best_step, s.state.best_model_step = score, step, step
        s.log(
            f"best_model: keeps the weights of step {step} ({key} {score:.4f}), better than any evaluation "
            "this checkpoint knows; an evaluation replaces them only by beating that"
        )

    def _hub_push(self):
        """--push_to_hub's uploads (hub_push.py, imported only then); their time is kept in the final
        reserve: the final upload's, and with --push_best one more for a best_model still uploading."""
        from .hub_push import HubPush, target_of

        s = self.s
        uploads = 2 if s.cfg.push_best else 1
        folder_bytes = sum(
            p.numel() * p.element_size() for net in (s.model, s.discriminator_raw) for p in net.parameters()
        )
        return HubPush(
            target_of(s.cfg.push_to_hub, s.cfg.hub_public),
            s.checkpoint_dir,
            s.log,
            folder_bytes,
            reserve=lambda seconds: s.budget.reserve_after_loop(uploads * seconds, "hub"),
        )

    def run_eval(self, tag: str, export_best: bool = True) -> dict:
        """An evaluation: the scores (`score`), recorded in the run's history, metrics.jsonl, the log
        and the trackers, the samples written, best_model/ exported when --best_metric improved (and
        `export_best`), report.html rewritten; the scores."""
        s = self.s
        t0 = time.perf_counter()
        results, spoken, voices = self.score()
        step = s.budget.global_step
        best_key = self.best_key()
        score = results.get(best_key)
        # a NaN/Inf score (training gone wrong) never becomes the best every later one must beat
        finite = score is not None and math.isfinite(score)
        improved = finite and (s.state.best_val is None or score < s.state.best_val)
        record = {
            "event": "eval",
            "tag": tag,
            "step": step,
            "epoch": s.state.epoch,
            "time": time.time(),
            "seconds": round(time.perf_counter() - t0, 2),  # the evaluation itself (no samples written)
            "best_key": best_key,  # which result picks the best model (a feedback round: its set's)
            **results,
        }
        record.update(voices)  # a multi-speaker model's val_mel of each voice, on the first validation set
        s.state.val_history.append({k: v for k, v in record.items() if k != "event"})
        self.metrics.write(record)
        if s.is_main and s.cfg.eval_samples:
            try:
                self.write_samples(step, spoken)
            except OSError as err:
                # a full disk: the scores are recorded; the WAVs are written atomically, so any written are
                # whole (an export copies those), and training goes on, as after a failed checkpoint
                s.log(f"warning: samples of step {step} not written ({err.strerror or err})")
        if improved:
            s.state.best_val, s.state.best_step = score, step
        s.log(
            f"eval ({tag}) step {step}: "
            + ", ".join(f"{k} {v:.4f}" for k, v in results.items())
            + (" (best so far)" if improved else "")
        )
        for key, scores in voices.items():
            s.log(f"eval ({tag}) step {step}, {describe_speaker_scores(key, scores)}")
        if s.accelerator.trackers:
            s.accelerator.log(results, step=step)
        s.budget.observe_eval(time.perf_counter() - t0)
        self.last_eval = time.time()
        if improved and export_best:
            self.export_best(step)
        self.last_val = results
        self.last_voices = voices
        self.last_val_step = step
        self.last_val_tag = tag
        if s.is_main:
            self.write_report()
        return results

    def score(self) -> tuple[dict, list, dict]:
        """Every validation set scored teacher-forced (its prefix on each key), then the free-running
        scores; (scores, the sentences spoken from text alone, for the samples, and a multi-speaker
        model's val_mel of each voice on the first set: {"<prefix>by_speaker": `speaker_scores`}, the
        prefix the set's, as on its other keys; empty for one voice)."""
        s = self.s
        results = {}
        by_speaker: dict[int, tuple[float, int]] = {}
        scored_by_speaker = next(iter(s.val_loaders), "val")
        for name, loader in s.val_loaders.items():
            values = evaluate(
                s.generator_raw,
                loader,
                s.device,
                s.accelerator.autocast,
                weights=s.cfg.loss_weights(),
                by_speaker=by_speaker if name == scored_by_speaker else None,
            )
            results.update({set_prefix(name) + k: v for k, v in values.items()})
        freerun, spoken = free_running_eval(s)  # spoken from text alone, scored against the recordings
        results.update(freerun)
        voices = {}
        if s.model.config.num_speakers > 1 and by_speaker:
            voices[set_prefix(scored_by_speaker) + BY_SPEAKER] = speaker_scores(by_speaker, s.speakers)
        return results, spoken, voices

    def export_best(self, step: int) -> None:
        """The weights that just scored best exported to best_model/ (and queued for the hub with
        --push_best); a file of the user's there refuses it, with a warning."""
        s = self.s
        t0 = time.perf_counter()
        try:
            if self.export(s.checkpoint_dir / "best_model"):
                s.state.best_model_step = step
                self.best_model_refused = None
                if self.hub is not None and s.cfg.push_best:  # queued: uploaded in the background
                    self.hub.best(s.checkpoint_dir / "best_model", step)
        except UnsafeOverwrite as err:  # a file the user put into best_model/ is never deleted
            self.best_model_refused = str(err)
            s.log(f"warning: best model not exported: {err}")
        except OSError as err:
            # a full disk: best_model/ keeps what it had, as when the final weights' copy fails, and
            # training goes on (it ended the run, checkpoints failing the same way only warned)
            self.best_model_refused = str(err.strerror or err)
            s.log(f"warning: best model not updated ({self.best_model_refused})")
        s.budget.observe_export(time.perf_counter() - t0)

    def write_report(self) -> None:
        """report.html from the folder's files (main process); a failure is a warning, never fatal."""
        s = self.s
        command = s.resume_command or resume_command(
            "train_vits.py", s.cfg, "--checkpoint_dir", s.checkpoint_dir
        )
        try:
            written = write_report(
                s.checkpoint_dir, command, s.cfg.best_metric, resumable_after_end=s.resumable_after_end
            )
        except Exception as err:  # a page is never worth losing the run over
            s.log(f"warning: report.html not written ({err})")
            return
        try:
            archive = write_report_archive(s.checkpoint_dir)
        except Exception as err:
            archive = None
            s.log(f"warning: {ARCHIVE_FILE} not written ({err})")
        if self.report is None:  # said once: a long run's page can be opened while it trains
            packed = f"; {archive.name} holds it with its samples, to download as one file" if archive else ""
            s.log(
                f"report: {written} (open it in a browser: samples, curves, the budget; "
                f"rewritten at each evaluation{packed})"
            )
        self.report = written

    def sampled_clips(self):
        """(items, count): each evaluation speaks the first `count` clips (--eval_samples) of the first
        validation set to WAV; (None, 0) without one."""
        items = next(iter(self.s.data.val_sets.values()), None)
        return items, min(self.s.cfg.eval_samples, len(items)) if items is not None else 0

    def write_samples(self, step: int, spoken=()) -> None:
        s = self.s
        items, count = self.sampled_clips()
        if items is None:
            return
        sentences = []
        for k in range(count):
            sentences.append((items.clip_id(k), items.text(k), int(items.speaker_ids[k])))
        folder = s.checkpoint_dir / "samples" / checkpoint_name(step)
        if len(spoken) >= count:  # the free-running pass already spoke them (same seed, same order)
            paths = write_wavs(list(spoken[:count]), folder, s.model.config.sampling_rate)
        else:
            paths = synthesize(s.model, s.text, sentences, folder, s.device)
        log_audio_to_trackers(s.accelerator, paths, step, s.model.config.sampling_rate)
        voices = s.speakers if s.model.config.num_speakers > 1 else None
        write_references(s.checkpoint_dir / "samples", items, count, voices)  # the recordings, once per run
        names = [name for name, _, _ in sentences]
        alignments = alignment_paths(s.generator_raw, items, count, s.device)
        np.savez_compressed(folder / "alignments.npz", **dict(zip(names, alignments, strict=True)))
        pngs = write_pictures(folder, names, alignments, list(spoken[:count]))
        log_images_to_trackers(s.accelerator, pngs, step)

    def trainer_state(self) -> dict:
        s = self.s
        return {
            "global_step": s.budget.global_step,
            "train_state": s.state.to_dict(),
            "budget": s.budget.state_dict(),
            "lr_schedule": s.budget_lr.state_dict(),
            "val_ids": s.data.val_ids,
            "speakers": s.speakers,
            "config": s.cfg.to_dict(),
            "working_dir": os.getcwd(),  # what the config's relative folders are relative to
            "model_source": s.model_source,
            "git_revision": git_revision(),
            **self.checkpoint_figures(),  # threads, micro_batch_size, micro_batches_per_step
            "versions": {"torch": torch.__version__, "transformers": _version("transformers")},
        }

    def name_final_as_best(self) -> int | None:
        """The final weights scored best (RunEnd.finish): named as best_model's before the final checkpoint,
        which is saved before `copy_final_to_best` makes the copy; the step named before, to pass it."""
        earlier = self.s.state.best_model_step
        self.s.state.best_model_step = self.s.budget.global_step
        return earlier

    def copy_final_to_best(self, exported: Path | None, earlier_best_model: int | None) -> bool:
        """The exported final weights, the best ones (`name_final_as_best`), copied to best_model/; whether
        a copy was made (not when an epoch's evaluation of these very weights exported them already, or
        the copy failed: then best_model/ holds what it held, and is named so again)."""
        s, step = self.s, self.s.budget.global_step
        copied = False
        if exported and earlier_best_model != step:
            try:
                install_best_model(exported, s.checkpoint_dir, step)
            except (OSError, UnsafeOverwrite) as err:  # the final model is exported; only this copy failed
                self.best_model_refused = str(getattr(err, "strerror", None) or err)
                s.log(f"warning: best model not updated ({self.best_model_refused})")
            else:
                self.best_model_refused = None  # best_model/ holds the best weights now
                copied = True
        if not copied:
            s.state.best_model_step = earlier_best_model
        return copied

    def save_checkpoint(self, why: str) -> Path | None:
        """Write a complete checkpoint (main process); a failed write warns and training goes on."""
        s = self.s
        t0 = time.perf_counter()
        path = None
        if s.is_main:
            files = checkpoint_files(
                s.model,
                s.text.tokenizer,
                s.discriminator_raw,
                s.g_optimizer,
                s.d_optimizer,
                s.accelerator.scaler,
                self.trainer_state(),
            )
            try:
                path = write_checkpoint(s.checkpoint_dir, s.budget.global_step, files, info={"why": why})
            except OSError as err:
                # a new run whose first saves fail has no previous checkpoint to speak of
                kept = (
                    "the previous one is intact"
                    if self.last_checkpoint is not None
                    else "no checkpoint of this run is saved yet"
                )
                s.log(
                    f"warning: checkpoint at step {s.budget.global_step} failed ({err.strerror or err}); "
                    f"{kept}, retrying at the next interval"
                )
            else:
                self.last_checkpoint = path
                prune_checkpoints(s.checkpoint_dir, s.cfg.keep_checkpoints, protect=path)
        s.accelerator.wait_for_everyone()
        # every rank's recovery reloads the newest checkpoint: the other ranks learn that it was written
        if self.agreement.flag(path is not None) and not s.is_main:
            self.last_checkpoint = s.checkpoint_dir / checkpoint_name(s.budget.global_step)
        s.budget.observe_save(time.perf_counter() - t0)
        self.last_save = time.time()
        return path

    def export(self, folder: Path) -> Path | None:
        """The current weights exported into `folder` (model/vits.export_model), with the discriminator,
        the validation split, the samples of their evaluation and the model card: the folder, or None on
        every process but the main one. `folder` is the run's best_model/ (export_best) or --output_dir
        (RunEnd.export_final); the marker and the card name which by the folder's place."""
        s = self.s
        if not s.is_main:
            return None
        speakers = s.speakers if s.model.config.num_speakers > 1 else None
        kind = "best_model" if folder == s.checkpoint_dir / "best_model" else "final_model"

        def extras(tmp: Path) -> None:
            save_discriminator(s.discriminator_raw, tmp)
            # the held-out clips, so a later feedback run keeps validating on clips never trained on;
            # no path of this machine's: the folder is what a hub push uploads
            split = {"val_ids": s.data.val_ids, "seed": s.cfg.seed}
            (tmp / SPLIT_FILE).write_text(json.dumps(split, ensure_ascii=False), encoding="utf-8")
            try:
                samples = self.copy_samples(tmp)
            except OSError as err:  # the folder is complete without them
                shutil.rmtree(tmp / SAMPLES_FOLDER, ignore_errors=True)  # this export's own temp copies
                s.log(f"warning: samples not copied into {kind} ({err.strerror or err})")
                samples = ()
            # the model card, into the temp folder: the marker lists it, so only a later export replaces it
            try:
                card = model_card(run_facts(s, kind, samples))
            except Exception as err:  # a card is never worth losing the export over
                s.log(f"warning: model card not written ({err})")
            else:
                (tmp / CARD_FILE).write_text(card, encoding="utf-8")

        return export_model(
            s.model,
            s.text.tokenizer,
            folder,
            speakers,
            extras=extras,
            kind=kind,
            run=s.checkpoint_dir,
            step=s.budget.global_step,
        )

    def copy_samples(self, folder: Path) -> tuple[Sample, ...]:
        """The sentences these weights spoke at their evaluation (samples/step_N, N the current step),
        copied into an export's samples/ as sample_1.wav, ...: the model card lists them and the hub page
        plays them, so whoever the folder is shared with hears the voice. Empty when no evaluation of
        these weights wrote them."""
        s = self.s
        step = s.budget.global_step
        items, count = self.sampled_clips()
        source = sample_folder(s.checkpoint_dir, step)  # None when no evaluation wrote it
        # this run's evaluation of these weights (a folder of that name could be an unrelated run's)
        evaluated = any(r.get("step") == step for r in s.state.val_history)
        if items is None or source is None or not evaluated:
            return ()
        voices = s.model.config.num_speakers > 1
        names = {v: k for k, v in (s.speakers or {}).items()}  # speaker id -> its name in the data
        found = []
        for k in range(count):
            wav = source / f"{items.clip_id(k)}.wav"
            if not wav.is_file():
                continue
            name = f"{SAMPLES_FOLDER}/sample_{len(found) + 1}.wav"
            (folder / SAMPLES_FOLDER).mkdir(exist_ok=True)
            shutil.copyfile(wav, folder / name)
            speaker = int(items.speaker_ids[k]) if voices else None
            found.append(Sample(name, items.text(k), items.clip_id(k), speaker, names.get(speaker)))
        return tuple(found)

    def expected_per_epoch(self, epoch_seconds: float) -> tuple[float, float]:
        """(evaluations, checkpoints) to expect per epoch of `epoch_seconds` of training, for the plan: as
        many as evaluate_and_save_if_due's rule (budget.overheads_per_epoch) allows, and a checkpoint at
        least every --save_minutes (budget.interval_saves_per_epoch)."""
        s, budget = self.s, self.s.budget
        evals = overheads_per_epoch(epoch_seconds, budget.eval_seconds()) if s.val_loaders else 0.0
        interval = interval_saves_per_epoch(epoch_seconds, s.cfg.save_minutes)
        return evals, max(overheads_per_epoch(epoch_seconds, budget.save_seconds()), interval)

    def interval_save_due(self) -> bool:
        """--save_minutes passed since the last checkpoint (budget.save_minutes_passed) and one still fits
        (rank 0's clock: the loop sends the answer to every rank with its stop decision and saves after
        the step)."""
        budget = self.s.budget
        save_due = save_minutes_passed(time.time() - self.last_save, self.s.cfg.save_minutes)
        return save_due and budget.can_afford(budget.save_seconds())

    def evaluate_and_save_if_due(self) -> None:
        """At an epoch's end: an evaluation when budget.overhead_due says so (at most OVERHEAD_SHARE of the
        time since the last one) and it still fits in the budget, then a checkpoint by the same rule; every
        rank does what rank 0 decides."""
        s, budget = self.s, self.s.budget
        since_eval = time.time() - self.last_eval
        eval_due = bool(s.val_loaders) and overhead_due(since_eval, budget.eval_seconds())
        if self.agreement.flag(
            eval_due and budget.can_afford(budget.eval_seconds() + budget.export_seconds())
        ):
            self.run_eval(f"epoch {s.state.epoch}")
        since_save = time.time() - self.last_save
        # none while steps are being skipped (as the loop's interval save)
        save_due = overhead_due(since_save, budget.save_seconds()) and not s.state.consecutive_skips
        if self.agreement.flag(save_due and budget.can_afford(budget.save_seconds())):
            self.save_checkpoint("epoch")

    def warm_up_first_calls(self) -> None:
        """Pay the one-time costs of an evaluation's libraries (numba's alignment search, librosa's DTW,
        matplotlib) before the start evaluation is timed: its time is the budget's estimate for every
        later evaluation, the final one included, until another is measured (a short run measures none),
        and first-call costs in it would make the final reserve too large. The time is spent either way;
        figures in docs/performance.md ("Evaluation warm-up")."""
        s, cfg = self.s, self.s.cfg
        log_lik = torch.zeros(1, 2, 3, device=s.device)
        maximum_path(
            log_lik,
            torch.tensor([2], device=s.device),
            torch.tensor([3], device=s.device),
            backend=s.generator_raw.mas_backend,
        )
        if cfg.freerun_samples:
            dtw_scores(np.zeros((4, 3), dtype=np.float32), np.zeros((4, 5), dtype=np.float32))
        if cfg.eval_samples and s.is_main:
            warm_up_pictures()

    def estimate_step_from_eval(self, clips_trained: int) -> None:
        """The budget's step time before the first step, from the start evaluation
        (budget.step_seconds_from_eval); none without a validation clip."""
        s = self.s
        clips = sum(len(v) for v in s.data.val_sets.values())
        step_seconds = step_seconds_from_eval(s.budget.eval_seconds(), clips, clips_trained)
        if step_seconds is not None:
            s.budget.set_estimates(step_seconds=step_seconds)


def speaker_scores(by_speaker: dict[int, tuple[float, int]], speakers: dict[str, int]) -> dict[str, dict]:
    """An evaluation record's BY_SPEAKER entry: {speaker name: {"speaker_id", "val_mel", "clips"}} for
    every voice of the speaker map (by id), from `evaluate`'s {speaker id: (val_mel, clips)}; a voice
    with no validation clip has "clips": 0 and no val_mel (nothing measured it)."""
    names: dict[int, list[str]] = {}
    for name, sid in sorted(speakers.items(), key=lambda kv: (kv[1], kv[0])):
        names.setdefault(sid, []).append(name)
    found = {}
    for sid, named in names.items():
        entry: dict = {"speaker_id": sid, "clips": 0}
        if sid in by_speaker:
            mel, clips = by_speaker[sid]
            entry.update(val_mel=mel, clips=clips)
        found[", ".join(named)] = entry
    return found


def describe_speaker_scores(key: str, voices: dict[str, dict], limit: int = 8) -> str:
    """`val_mel by speaker: ali 1.3012 (2 clips), zin 1.4471 (2 clips)` of the record's `key`
    ("feedback_by_speaker": `feedback_val_mel by speaker: ...`, the set it scored), by speaker id as
    every evaluation prints it; a voice without a validation clip says so; a long list is cut short
    (report.html has it all)."""
    parts = []
    for name, entry in sorted(voices.items(), key=lambda kv: (kv[1]["speaker_id"], kv[0])):
        clips = entry["clips"]
        if "val_mel" in entry:
            parts.append(f"{name} {entry['val_mel']:.4f} ({clips} clip{'s' if clips != 1 else ''})")
        else:
            parts.append(f"{name} – (no validation clip)")
    more = f" and {len(parts) - limit} more in report.html" if len(parts) > limit else ""
    return f"{speaker_metric(key)} by speaker: " + ", ".join(parts[:limit]) + more


def _version(package: str) -> str | None:
    try:
        from importlib.metadata import version

        return version(package)
    except Exception:
        return None
