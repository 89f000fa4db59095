"""The end of a run (`RunEnd`, one part of loop.Trainer): the final evaluation (when it still fits), the
last checkpoint, the export of the final model, best_model updated when the final weights are the
best, the --push_to_hub upload (hub_push.py), and train_summary.json.

Apart from loop.py because it runs once, after the loop, and decides what the run leaves behind.
"""

from __future__ import annotations

import time
from pathlib import Path

from ..jsonfile import strict_json
from ..safety import (
    UnsafeOverwrite,
    check_own_export,
    foreign_entries,
    made_by,
    marker_step,
    read_marker,
    write_export_file,
)
from .best_model import existing_best_model
from .reporting import plot_losses


class RunEnd:
    """`finish` and the summary of a run; `outputs` (outputs.RunOutputs) evaluates, saves and exports.
    Owns why the final evaluation did not run (`final_eval_skipped`)."""

    def __init__(self, session, outputs, agreement) -> None:
        self.s = session
        self.outputs = outputs
        self.agreement = agreement
        self.final_eval_skipped: str | None = None

    def finish(self, stop_reason: str | None, loop_figures: dict) -> dict:
        """The run's end; `loop_figures`: what the loop measured, for the summary (samples_per_second,
        threads, budget_stop, resumed_from_step, data_wait_fraction, device_wait_fraction, the micro-batch
        and compile choices)."""
        s, budget, outputs = self.s, self.s.budget, self.outputs
        training_end = time.time()
        self.final_evaluation(stop_reason)
        # the final weights are the best: the checkpoint names the best_model/ copy made after the export
        final_is_best = self.final_is_best()
        earlier_best_model = outputs.name_final_as_best() if final_is_best else None
        outputs.save_checkpoint(stop_reason or "end")
        t0 = time.perf_counter()
        kept = self.kept_final_model()
        diverged = None if kept else self.diverged()
        if diverged:
            self.refuse_diverged(diverged)
        exported = kept or (None if diverged else self.export_final())
        best_updated = final_is_best and outputs.copy_final_to_best(exported, earlier_best_model)
        budget.observe_export(time.perf_counter() - t0)
        # after the local export, which never waits on it
        hub = self.push(stop_reason, exported, best_updated)
        summary = self.summary(stop_reason, exported, loop_figures)
        summary["diverged"] = diverged
        if hub is not None:
            summary["hub"] = hub
        if s.is_main:
            if exported and not kept:  # a kept export keeps the summary of the session that trained it
                write_export_file(exported, "train_summary.json", strict_json(summary, indent=1))  # + marker
            # checkpoint dir: the run's own folder, never a data folder or --output_dir (safety.py)
            (s.checkpoint_dir / "train_summary.json").write_text(
                strict_json(summary, indent=1), encoding="utf-8"
            )
            outputs.metrics.write(
                {
                    "event": "end",
                    "step": budget.global_step,
                    "time": time.time(),
                    "training_end": training_end,
                    "stopped_reason": summary["stopped_reason"],
                    "final_eval_skipped": summary["final_eval_skipped"],
                    "samples_per_second": summary["samples_per_second"],  # this session's
                }
            )
            try:
                plot_losses(s.checkpoint_dir / "metrics.jsonl", s.checkpoint_dir / "loss_curve.png")
            except Exception as err:  # a plot is never worth losing the run's ending over
                s.log(f"warning: loss curve not written ({err})")
            outputs.write_report()
        if s.accelerator.trackers:
            s.accelerator.end_training()
        s.accelerator.wait_for_everyone()
        return summary

    def final_evaluation(self, stop_reason: str | None) -> None:
        """The final weights evaluated, unless an evaluation of them exists, a signal stopped the run or
        it no longer fits (then `final_eval_skipped` says why)."""
        s, budget, outputs = self.s, self.s.budget, self.outputs
        if outputs.last_val_step == budget.global_step:
            # an evaluation (the start's, an epoch's) scored these very weights: it stands for the final one
            s.log(
                f"final evaluation skipped: no training step since the {outputs.last_val_tag} evaluation, "
                "which stands for it"
            )
        elif stop_reason == "signal":
            self.final_eval_skipped = "stopped by a signal"
        elif s.val_loaders:
            # the last steps may have been slower than planned (a busy machine): the checkpoint, the
            # export and the work after it come first, the final evaluation only if it still fits
            left = budget.time_for_final_eval()
            if self.agreement.flag(left >= budget.eval_seconds()):
                outputs.run_eval("final", export_best=False)
            else:
                self.final_eval_skipped = f"no time left: {max(0.0, left):.0f} s left for it, it takes ~{budget.eval_seconds():.0f} s"
                s.log(f"final evaluation skipped: {self.final_eval_skipped}")
        else:  # --val_fraction 0, or no validation clip was usable: the summary says so, not "not run"
            self.final_eval_skipped = "no validation clips to evaluate on"

    def final_is_best(self) -> bool:
        """Whether the final weights scored best. Only weights this session trained: with no step, they
        are the model it started from (never a best_model) or a resumed checkpoint's, whose best_model
        is there already."""
        s, budget = self.s, self.s.budget
        return (
            budget.session_steps > 0 and bool(s.state.val_history) and s.state.best_step == budget.global_step
        )

    def diverged(self) -> str | None:
        """Why the final weights are not a model anyone should use (NaN/Inf weights, or their evaluation's
        val_mel or --best_metric not finite: a --learning_rate far too high), else None. Exported, they
        spoke noise or silence in final_model, and the run ended as if it went well."""
        import math

        s, outputs = self.s, self.outputs
        bad = sum(not bool(p.isfinite().all()) for p in s.model.parameters())
        if bad:
            return f"{bad} of the final weights' tensors hold NaN/Inf values"
        if outputs.last_val_step != s.budget.global_step or not outputs.last_val:
            return None  # not scored: the weights are finite, which is all that is known
        prefix = outputs.best_key().removesuffix(s.cfg.best_metric)
        for key in dict.fromkeys([prefix + "val_mel", outputs.best_key()]):
            value = outputs.last_val.get(key)
            if isinstance(value, float) and not math.isfinite(value):
                return (
                    f"the final weights' {key} is {value} (their evaluation at step {s.budget.global_step})"
                )
        return None

    def refuse_diverged(self, why: str) -> None:
        """The error line of a run whose final weights diverged: what is kept, and what to do."""
        s, state = self.s, self.s.state
        last = self.outputs.last_checkpoint
        best = existing_best_model(s.checkpoint_dir, state.best_model_step)
        s.log(
            f"error: training diverged: {why}; they are not exported as the final model ({s.output_dir} "
            f"{'keeps what it held' if s.output_dir.exists() else 'is not written'})"
            + (f", {last.name} holds them" if last is not None else "")
            + (
                f"; the best weights are in {best[0]}"
                if best
                else "; no evaluation of trained weights beat the start"
            )
            + f"; start a new run (another --checkpoint_dir: resumed, this one goes on from these weights) "
            f"with a lower --learning_rate (this run's: {s.cfg.learning_rate:g})"
        )

    def kept_final_model(self) -> Path | None:
        """--output_dir, when a resumed session that trained no step finds this run's export of these very
        weights there: exported again, their card would describe this session's data (another corpus,
        given on resume), which never trained them. None: export as usual."""
        s, step = self.s, self.s.budget.global_step
        if s.resumed_from is None or s.budget.session_steps or not s.is_main:
            return None
        marker = read_marker(s.output_dir)
        if marker_step(marker) != step or not made_by(marker, s.output_dir, s.checkpoint_dir):
            return None
        if not (s.output_dir / "model.safetensors").is_file() or foreign_entries(s.output_dir):
            return None
        s.log(
            f"final model: {s.output_dir} holds the weights of step {step} already (no training step this "
            "session): kept as it is, its model card with it"
        )
        return s.output_dir

    def export_final(self) -> Path | None:
        """The final model into --output_dir (main process); a failure is an error line naming the last
        good checkpoint, and None."""
        s = self.s
        try:
            if s.is_main and not getattr(s.cfg, "overwrite_output_dir", False):
                check_own_export(s.output_dir, s.checkpoint_dir, "--output_dir")  # checked at start-up too
            return self.outputs.export(s.output_dir)
        except (OSError, UnsafeOverwrite) as err:
            last = self.outputs.last_checkpoint
            # a new run whose every save failed too (a full disk) has no checkpoint to name: "is None" read
            # as one to resume from
            where = (
                f"the last good checkpoint is {last}"
                if last is not None
                else "no checkpoint of this run could be saved either (see the warnings above): free "
                "space on the disk and start it again with another --checkpoint_dir"
            )
            s.log(
                f"error: exporting the final model to {s.output_dir} failed ({getattr(err, 'strerror', None) or err}); "
                + where
            )
            return None

    def push(self, stop_reason: str | None, exported: Path | None, best_updated: bool) -> dict | None:
        """--push_to_hub (main process): the background best_model uploads finished within the time left,
        then the final model uploaded; the record for train_summary.json ("hub"), None without the flag.
        A failure is a warning with the command to push by hand; the run still ends well."""
        s, budget, hub = self.s, self.s.budget, self.outputs.hub
        if hub is None:
            return None
        step = budget.global_step
        if stop_reason == "signal":  # the platform's grace period is for the checkpoint, not an upload
            hub.drop_waiting()
            record = {"repo": hub.target.repo_id, "pushed": False, "error": "stopped by a signal"}
            if exported:
                from .hub_push import manual_command

                s.log(
                    f"hub: not uploaded (stopped by a signal); the resumed run uploads at its end, or push "
                    f"{exported} by hand with: {manual_command(hub.target.repo_id, exported, hub.target.private)}"
                )
        else:
            if best_updated and s.cfg.push_best:  # the final weights are the best: best_model/ follows
                hub.best(s.checkpoint_dir / "best_model", step)
            hub.wait(budget.remaining() - hub.seconds - budget.safety_seconds())
            record = hub.final(exported, step)
        if s.cfg.push_best:
            record["best_model"] = hub.best_record
        return record

    def summary(self, stop_reason: str | None, exported: Path | None, loop_figures: dict) -> dict:
        s, budget, state, outputs = self.s, self.s.budget, self.s.state, self.outputs
        first = budget.first_plan
        best, marked = existing_best_model(s.checkpoint_dir, state.best_model_step) or (None, None)
        # the final weights were scored: by the final evaluation, or an earlier one at the same step
        final_scored = outputs.last_val_step == budget.global_step
        return {
            "target_seconds": budget.target_seconds,
            "wall_seconds": budget.elapsed(),
            "steps": budget.global_step,
            "session_steps": budget.session_steps,
            "epochs_planned": round(first.epochs, 3) if first else None,
            "epochs_completed": state.epoch,
            "epochs_trained": state.samples_seen / max(1, s.data.samples_per_epoch),
            "samples_per_second": loop_figures["samples_per_second"],
            "threads": loop_figures["threads"],
            "best_val_loss": state.best_val,  # of best_metric, which picks best_model
            "best_metric": s.cfg.best_metric,
            "best_step": state.best_step,
            "last_eval_step": max((r["step"] for r in state.val_history), default=None),
            # the evaluation of the final weights only (the final one, or an earlier one of these very
            # weights), never one of earlier weights
            "final_val": outputs.last_val if final_scored else None,
            # a multi-speaker model's: the same evaluation's val_mel of each voice ("final_by_speaker")
            **{f"final_{k}": v for k, v in (outputs.last_voices if final_scored else {}).items()},
            "final_eval_skipped": None if final_scored else self.final_eval_skipped or "not run",
            # which evaluation scored the final weights: "final", or an earlier one at the same step
            "final_eval_tag": outputs.last_val_tag if final_scored else None,
            "stopped_reason": stop_reason or "end",
            "budget_stop": loop_figures["budget_stop"],
            "resumed_from_step": loop_figures["resumed_from_step"],
            "data_wait_fraction": loop_figures["data_wait_fraction"],
            "device_wait_fraction": loop_figures["device_wait_fraction"],
            "preload_seconds": s.preload_seconds,
            "skipped_steps": state.skipped_steps,
            "plan": first.to_dict() if first else None,
            # the plan the session ended with (re-planned each epoch from the speed measured since)
            "last_plan": budget.current_plan.to_dict() if budget.current_plan else None,
            "micro_batch_size": loop_figures["micro_batch_size"],
            "micro_batches_per_step": loop_figures["micro_batches_per_step"],
            "micro_batch_trial": state.micro_batch_trial,
            "length_buckets": s.pad is not None,
            # clips of the data this session did not train or validate on, and why (the log names a few)
            "dropped_clips": [list(d) for d in s.data.dropped],
            "compile": loop_figures["compile"],
            "final_model": str(exported) if exported else None,
            "last_checkpoint": str(outputs.last_checkpoint) if outputs.last_checkpoint else None,
            "best_model": str(best) if best is not None else None,
            # the folder's own step; an export made before markers had one: the step this run recorded
            "best_model_step": (marked if marked is not None else state.best_model_step) if best else None,
            # the best weights' export refused (a file of the user's in best_model/) or failed
            "best_model_not_exported": outputs.best_model_refused,
        }
