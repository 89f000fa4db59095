"""Fine-tune a VITS / MMS text-to-speech model inside a wall-clock budget.

    python train_vits.py --demo                                   # 2-minute CPU demo, no network
    python train_vits.py --model_name facebook/mms-tts-kmr-script_latin --target_hours 9.5
    python train_vits.py --target_hours 9.5 --total_hours 28     # one of three 9.5 h sessions
    python train_vits.py --resume auto                            # continue after an interruption
                                                  # (with the run's own settings; flags given win)

Reads training/metadata.csv + training/wavs (prepare_data.py), checkpoints to training/checkpoints,
writes the final model (a plain transformers VitsModel folder) to training/final_model.
"""

from __future__ import annotations

import sys
from functools import partial
from pathlib import Path

from vits_trainer.training.runtime import configure_threads, process_start_time

PROCESS_START = process_start_time()  # before the heavy imports: they count against the budget too
configure_threads()  # before torch and numba load: they read the thread settings once


def main(argv: list[str] | None = None) -> int:
    from vits_trainer.errors import ArgumentParser
    from vits_trainer.training.config import (
        TrainConfig,
        add_arguments,
        check_given_paths,
        check_train_paths,
        parse_config,
    )
    from vits_trainer.training.demo import apply_demo_settings, make_demo_inputs

    parser = ArgumentParser(description=__doc__.split("\n\n")[0])
    add_arguments(parser, TrainConfig)
    cfg = parse_config(parser, argv, TrainConfig)  # cfg.explicit: the flags given (a resume keeps the rest)
    if cfg.demo:
        cfg = apply_demo_settings(cfg, explicit=cfg.explicit)
    cfg.validate(final=not cfg.may_restore())  # a resume's batch settings: checked once restored
    if not cfg.demo:  # the demo writes its own data and model
        check_given_paths(cfg)  # a mistyped folder: one line before torch loads
    check_train_paths(cfg)  # overlapping folders, a folder the export would wrongly replace: before any work
    if cfg.push_to_hub:
        check_hub(cfg)  # network, token, write permission: a push that cannot happen stops the run now
    if cfg.demo:
        make_demo_inputs(cfg)  # once every check passed: a refused demo leaves nothing behind

    from vits_trainer.training.loop import Trainer
    from vits_trainer.training.report import REPORT_FILE
    from vits_trainer.training.resume_settings import resume_command
    from vits_trainer.training.session import build_session

    session = build_session(cfg, PROCESS_START, check_paths=partial(check_train_paths, settings_known=True))
    cfg = session.cfg  # a resumed run's settings come from its checkpoint
    summary = Trainer(session).train()
    log = session.log
    if summary["stopped_reason"] == "signal":
        # complete: every other setting of the run is restored from its checkpoint
        command = resume_command("train_vits.py", cfg, "--checkpoint_dir", cfg.checkpoint_dir)
        log(f"stopped by a signal at step {summary['steps']}; continue with: {command}")
    if summary["final_model"] is None and session.is_main:
        return 1  # the export failed; the error line named the last good checkpoint
    report = Path(cfg.checkpoint_dir) / REPORT_FILE
    log(
        f"done: {steps_words(summary)} in {summary['wall_seconds'] / 60:.1f} min "
        f"(budget {cfg.target_hours * 60:.1f} min); final model: {summary['final_model']}; "
        + best_model_words(summary)
        + (f"; report: {report}" if report.is_file() else "")
    )
    return 0


def check_hub(cfg) -> None:
    """--push_to_hub's repo, checked (and created when missing) by the main process before torch loads."""
    from vits_trainer.runlock import is_main_process
    from vits_trainer.training.hub_push import check_push_target

    if not is_main_process():
        return
    target = check_push_target(cfg.push_to_hub, cfg.hub_public, cfg.output_dir)
    how = f"created {'private' if target.private else 'public'}" if target.created else "exists"
    print(
        f"hub: {target.repo_id} ({how}) is writable by {target.user}; the final model is uploaded there at "
        f"the end{' and best_model/ whenever it changes' if cfg.push_best else ''}",
        flush=True,
    )


def steps_words(summary: dict) -> str:
    """The steps the done line counts: a resumed session's minutes trained only its own steps."""
    steps, session = summary["steps"], summary.get("session_steps")
    if summary.get("resumed_from_step") is None or session is None:
        return f"{steps} step{'' if steps == 1 else 's'}"
    return f"step {steps} ({session} step{'' if session == 1 else 's'} this session)"


def best_model_words(summary: dict) -> str:
    """Names best_model only when it holds the best weights; else says why it does not, or why there is
    none."""
    if summary["best_model"] and summary.get("best_model_not_exported"):
        # the newest best weights were refused (a damaged marker, a file of the user's): the folder
        # holds an earlier export, or whatever the user left there, not the best model
        return (
            f"best model not updated (the best weights, step {summary['best_step']}, were not exported: "
            f"{summary['best_model_not_exported']}); {summary['best_model']} was left as it was"
        )
    if summary["best_model"]:
        return f"best model: {summary['best_model']} (step {summary['best_model_step']})"
    if summary["best_step"] is None:
        return "no best model (no validation)"
    if summary.get("steps") == 0:  # the start evaluation scored the weights the run started from
        ended = " fitted in the budget" if summary.get("stopped_reason") == "budget" else ""
        return (
            f"no best model (no training step{ended}: the final model holds the weights the run started from)"
        )
    if summary.get("best_model_not_exported"):
        return f"no best model (the best weights, step {summary['best_step']}, were not exported: {summary['best_model_not_exported']})"
    if summary.get("last_eval_step") == summary["best_step"]:  # e.g. stopped before an epoch ended
        why = summary.get("final_eval_skipped") or "none ran"
        return f"no best model (no evaluation since step {summary['best_step']}: {why})"
    return f"no best model (no evaluation of the trained weights beat the one at step {summary['best_step']})"


if __name__ == "__main__":
    from vits_trainer.errors import run_command

    sys.exit(run_command(main))
