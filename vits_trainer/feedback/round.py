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

import json
import os
import shutil
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import UserError
from ..jsonfile import write_json_atomic
from ..runlock import RunLock, is_main_process
from ..safety import remove_dead_writers_temp
from ..training.resume_settings import resume_command
from .config import HIDDEN_FLAGS, FeedbackConfig, check_feedback_paths
from .judgement import SEED_AFTER, SEED_BEFORE, paired_judgement
from .promotion import loss_values, mel_change, promotion, spoken_warning
from .replay import FeedbackData, Inputs, check_feedback_inputs, subset
from .versions import REPORT_NAME, RUN_NAME, choose_version, claim_version, read_latest, write_latest

# torch/transformers are imported where used: a bad command line is reported without paying for them
if TYPE_CHECKING:
    from ..data.items import TrainingItems

SAMPLE_RESERVE_FACTOR = 1.25  # the after-samples get this multiple of the before-samples' time


# ---- the run -----------------------------------------------------------------------------------------


class FeedbackRun(FeedbackData):
    """One version: picks its folder, builds the data split for the shared session (FeedbackData,
    replay.py), runs the loop, writes samples, report and pointer."""

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

    # -- samples -------------------------------------------------------------------------------------

    def sample_sentences(self) -> list[tuple[str, str, int]]:
        """The sentences spoken before and after (--sample_sentences): the evaluated clips first (already
        by voice), then the trained ones, every voice in turn so that a cap leaves none unheard."""
        from ..training.datasplit import by_voice

        chosen, seen = [], set()
        for items in (self.feedback_eval, self.feedback_train):
            for k in by_voice(list(range(len(items))), items.speaker_ids.tolist()):
                clip_id = items.clip_id(k)
                if clip_id not in seen:
                    seen.add(clip_id)
                    chosen.append((clip_id, items.text(k), int(items.speaker_ids[k])))
        return chosen[: self.cfg.sample_sentences]

    def write_samples(self, model, text, folder: Path, device, deadline: float | None = None) -> float:
        """Synthesise the feedback sentences into `folder`, one by one, stopping before `deadline`
        (a diverged model can speak for minutes); `sentences.json`, written last, lists what was made."""
        from ..training.evaluate import synthesize

        t0 = time.perf_counter()
        sentences = self.sample_sentences()
        tmp = folder.with_name(f".{folder.name}.tmp-{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)  # this pid's temp folder inside a version folder
        remove_dead_writers_temp(folder.parent, f".{folder.name}.tmp-*")  # a killed run's
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
            # of the clips the round loaded (the usable lines less any dropped while loading, an unknown
            # speaker's: the warning above named those)
            loaded = len(set(self.feedback_eval.ids()) | set(self.feedback_train.ids()))
            capped = f" ({total} of {loaded}: --sample_sentences)" if total < loaded else ""
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
        from ..training.evaluate import evaluate_per_clip

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
        self.open_version()
        created = claim_version(self.version)  # only a folder this process makes is removed on bad input
        self.log(f"{'continuing' if self.resuming else 'starting'} {self.version}")
        self.clear_restarted_version()
        self.warn_without_discriminator()
        self.warn_base_not_current()
        session = self.start_session(created)
        if session.is_main:
            self.measure_before(session)
        self.reserve_time_for_after(session)
        summary = self.train(session)
        if summary["stopped_reason"] == "signal":
            return self.interrupted(summary, session.resume_command)
        if not session.is_main:
            return {"version": self.version.name, "status": "done", "summary": summary}
        try:
            return self.judge(session, summary)
        except KeyboardInterrupt:  # Ctrl-C or SIGTERM after the loop, which handles them only while it runs
            self.log(
                f"interrupted while judging {self.version.name}: its training (step {summary['steps']}) is "
                f"saved in its checkpoints; continue with: {session.resume_command} (the round is judged at "
                f"its end)"
            )
            raise

    def open_version(self) -> None:
        """Which version this run writes; when it continues one, that version's settings and set-up."""
        self.version, self.resuming = choose_version(self.root, self.cfg.resume)
        if self.resuming:  # the version's own settings (base, feedback, data, LR...), before checking them
            self.cfg = self.restore_settings(self.cfg)
        self.inputs = check_feedback_inputs(self.cfg, self.log)
        if not self.resuming:
            return
        try:
            self.info = json.loads((self.version / RUN_NAME).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            self.log(f"warning: {self.version / RUN_NAME} is missing; the feedback split is recomputed")
        if self.info.get("base_model") not in (None, str(self.inputs.base_model.resolve())):
            self.log(
                f"note: {self.version.name} started from {self.info['base_model']}; it continues from its "
                f"checkpoint (--base_model is used only for a new version)"
            )

    def clear_restarted_version(self) -> None:
        """A new version whose folder exists never saved a checkpoint: it starts again from nothing."""
        if not self.resuming and self.version.exists():
            # vN/ is a version folder numbered by choose_version under the root, which overlaps no data
            # folder and no base model (check_feedback_paths); checkpoints/ and samples/ are ours
            shutil.rmtree(self.version / "checkpoints", ignore_errors=True)
            shutil.rmtree(self.version / "samples", ignore_errors=True)

    def base_is_not_current(self, previous: dict | None) -> str | None:
        """The current model (`latest`) as a folder when this version's base is another one: a round
        from an older base is judged against that base alone, so it could replace a better current model
        (round 1's command run again promoted v3, worse than v1 on both scores, over v1). `previous` is
        the root's latest.json as read_latest gives it (None: no current model yet)."""
        if not previous or not previous.get("relative_path"):
            return None
        current = (self.root / previous["relative_path"]).resolve()
        base = Path(self.info.get("base_model") or self.inputs.base_model).resolve()
        return (
            None
            if base == current
            else f"{previous.get('version', '?')} ({self.root / previous['relative_path']})"
        )

    def warn_base_not_current(self) -> None:
        current = None if self.resuming else self.base_is_not_current(read_latest(self.root))
        if current:
            self.log(
                f"warning: --base_model {self.inputs.base_model} is not the current model {current}: this "
                f"round is judged against its base only, so it will not be promoted; to improve the current "
                f"model, pass --base_model {self.root / 'latest'}"
            )

    def warn_without_discriminator(self) -> None:
        if (
            not self.resuming
            and self.cfg.discriminator == ""
            and not (self.inputs.base_model / "discriminator.safetensors").is_file()
        ):
            self.log(
                f"warning: {self.inputs.base_model} has no discriminator.safetensors: a fresh discriminator "
                f"starts from scratch, so the first steps' adversarial signal is noise (keep the base "
                f"model's discriminator beside it next time)"
            )

    def start_session(self, created: bool):
        """The runner's session on this version's folders, with the feedback data split (data_fn)."""
        from ..training.session import build_session

        cfg = self.cfg
        session_cfg = replace(
            cfg,
            model_name=str(self.inputs.base_model),
            checkpoint_dir=str(self.version / "checkpoints"),
            output_dir=str(self.version / "model"),
            # a new version's checkpoint dir is empty: "none" also guards against reusing a stranger's
            resume=cfg.resume if self.resuming else "none",
            explicit=None,  # settings already restored by open_version: build_session uses them as they are
        )
        try:
            session = build_session(session_cfg, self.process_start, data_fn=self.data_fn)
        except UserError:
            if created:  # bad input found while setting up: leave nothing behind (this process made vN/)
                shutil.rmtree(self.version, ignore_errors=True)
            raise
        session.resume_command = resume_command("train_feedback.py", self.cfg, "--output_dir", self.root)
        session.resumable_after_end = False  # a round that ends (but by a signal) is judged: finished
        return session

    def measure_before(self, session) -> None:
        """Main process: the version's set-up, the base model's samples and per-clip losses, saved."""
        if not self.resuming:
            self.info.update(
                base_model=str(self.inputs.base_model.resolve()),
                feedback_dir=str(Path(self.cfg.feedback_dir).resolve()),
                data_dir=str(Path(self.cfg.data_dir).resolve()),
                unknown_characters=self.inputs.unknown_characters,
                started=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            )
        self.before_samples(session)
        self.before_per_clip(session)
        write_json_atomic(self.version / RUN_NAME, self.info)

    def reserve_time_for_after(self, session) -> None:
        # the after-samples and per-clip evaluation come after the loop's final export: keep their time
        # out of its budget
        reserve = (
            SAMPLE_RESERVE_FACTOR
            * (float(self.info.get("sample_seconds", 0.0)) + float(self.info.get("per_clip_seconds", 0.0)))
            + 1.0
        )
        session.budget.reserve_after_loop(reserve)

    def train(self, session) -> dict:
        from ..training.loop import Trainer

        return Trainer(session).train()

    def interrupted(self, summary: dict, command: str) -> dict:
        self.log(f"stopped by a signal at step {summary['steps']}; continue with: {command}")
        return {"version": self.version.name, "status": "interrupted", "summary": summary}

    def judge(self, session, summary: dict) -> dict:
        """Main process, after training: the after-samples, the per-clip judgement, the report and,
        when promoted, the `latest` pointer."""
        # the after-samples may use the reserve kept for them, not the safety margin
        deadline = session.budget.deadline() - session.budget.safety_seconds()
        self.write_samples(
            session.model, session.text, self.version / "samples" / "after", session.device, deadline
        )
        per_clip_after = None
        if summary.get("final_val") is not None:  # the final weights were evaluated: judge them per clip
            from ..training.evaluate import evaluate_per_clip

            per_clip_after = evaluate_per_clip(
                session.generator_raw,
                self.judged_items(),
                session.device,
                session.accelerator.autocast,
                SEED_AFTER,
            )
        report = self.report(session, summary, per_clip_after)
        write_json_atomic(self.version / REPORT_NAME, report)
        self.log(f"report: {self.version / REPORT_NAME}")
        if report["spoken_warning"]:
            self.log(report["spoken_warning"])
        self.log(report["message"])
        return report

    def restore_settings(self, cfg: FeedbackConfig) -> FeedbackConfig:
        """`cfg` with the settings saved in the checkpoint this version resumes from (resume_settings.py);
        the --output_dir root and the settings derived per version stay as they are."""
        from ..training.checkpoint import find_resumable, verify_checkpoint
        from ..training.resume_settings import restore_settings
        from ..training.trainstate import LoadedCheckpoint

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
        state = LoadedCheckpoint(path, manifest).json("trainer_state.json")
        keep = frozenset({"output_dir", *HIDDEN_FLAGS})
        return restore_settings(
            cfg,
            state.get("config"),
            self.log,
            source=path.name,
            keep=keep,
            working_dir=state.get("working_dir"),
            # the run's relative folders are found from where this version's checkpoints are now
            checkpoint_dir=self.version / "checkpoints",
        )

    def report(self, session, summary: dict, per_clip_after: dict | None = None) -> dict:
        cfg = self.cfg
        history = session.state.val_history
        before = history[0] if history and history[0].get("tag") == "start" else {}
        measured = summary.get("final_val") is not None  # of these weights, never of earlier ones
        after = summary.get("final_val") or {}
        fb_before, fb_after = loss_values(before, "feedback_"), loss_values(after, "feedback_")
        ov_before, ov_after = loss_values(before, ""), loss_values(after, "")
        judgement = paired_judgement(self.info.get("per_clip_before") or {}, per_clip_after or {})
        judgement["per_clip_before"] = self.info.get("per_clip_before")
        judgement["per_clip_after"] = per_clip_after
        not_measured = summary.get("final_eval_skipped") or "not run"
        if summary.get("steps") == 0:  # "after" would be the start's figures again
            ended = (
                " fitted in the budget (--target_hours)" if summary.get("stopped_reason") == "budget" else ""
            )
            promoted, reason = False, f"no training step{ended}: nothing to promote"
        elif not measured:
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
        previous = read_latest(self.root)  # read once: the check below and the message name the same model
        other_current = self.base_is_not_current(previous)  # the current model, when it is not our base
        if promoted and other_current:
            promoted, reason = (
                False,
                f"{reason}; but it was trained from another model than the current one, {other_current}, and "
                f"not compared with it (start a round from {self.root / 'latest'})",
            )
        if promoted:
            latest = write_latest(self.root, self.version, self.log)
            message = f"promoted {self.version.name}: {reason}; latest -> {self.version / 'model'}"
        else:
            latest = previous
            stays = (
                f"the current model stays {previous['version']} ({self.root / previous['relative_path']})"
                if previous
                else f"the current model stays the base model ({self.info.get('base_model') or self.inputs.base_model})"
            )
            message = f"not promoted: {reason}; {self.version.name} is kept in {self.version}, {stays}"
        return {
            "version": self.version.name,
            "promoted": promoted,
            "reason": reason,
            "message": message,
            "spoken_warning": spoken_warning(fb_before, fb_after, str(self.version / "samples" / "after"))
            if measured
            else None,
            "base_model": self.info.get("base_model"),
            "model": str(self.version / "model"),
            "exported": bool(summary.get("final_model")),
            "after_measured": measured,
            "after_not_measured_because": None if measured else not_measured,
            "feedback": {
                "before": fb_before,
                "after": fb_after if measured else None,
                "measured": measured,
                "change": mel_change(fb_before, fb_after) if measured else None,
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
                "change": mel_change(ov_before, ov_after) if measured else None,
                "clips": self.info.get("original_validation_clips", 0),
                "max_regression": cfg.max_regression,
                "split_source": self.info.get("original_split_source"),
            },
            "replay": self.info.get("replay"),
            "unknown_characters": self.info.get("unknown_characters", {}),
            "dropped_feedback_clips": self.info.get("dropped_feedback_clips", []),
            "unusable_feedback_lines": self.info.get("unusable_feedback_lines", []),
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


def run_feedback(cfg: FeedbackConfig, process_start: float, log=None) -> dict:
    """The whole feedback run (train_feedback.py calls this); returns the report, or a status dict
    when it was interrupted."""
    cfg.validate(final=cfg.resume == "none")  # a resumed version's batch settings: checked once restored
    check_feedback_paths(cfg)  # overlapping folders: refused before any work or write
    if log is None:
        from ..training.runtime import Logger

        log = Logger(is_main_process())  # lines from the main process only
    # one run per output root (it numbers the versions there); released when the run ends
    lock = RunLock.acquire(Path(cfg.output_dir), "--output_dir", log) if is_main_process() else None
    try:
        return FeedbackRun(cfg, process_start, log).run()
    finally:
        if lock is not None:
            lock.release()
