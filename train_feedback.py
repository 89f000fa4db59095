"""Fold feedback (sentences a trained model said badly, re-recorded or corrected) into the model, quickly
and without forgetting: the runner's loop, budget and checkpoints on feedback clips mixed with a replay of
the original training data, evaluated before and after, written as a new version.

    python prepare_data.py --source my_feedback --data_dir feedback       # same layout as training data
    python train_feedback.py --base_model training/checkpoints/best_model --feedback_dir feedback \\
        --data_dir training --output_dir training/feedback_models --target_hours 0.5
    python train_feedback.py --base_model training/feedback_models/latest ...   # the next round
    python train_feedback.py --resume auto ...                            # continue after an interruption

Each run writes <output_dir>/vN/ (model/, checkpoints/, samples/before|after/, feedback_report.json).
It becomes <output_dir>/latest only when the held-out feedback clips improved beyond the measurement
noise (a paired per-clip test on at least 3 clips) and the original validation loss got at most
--max_regression worse; the last line printed says which, and why.
"""

from __future__ import annotations

import sys

from vits_trainer.training.runtime import configure_threads, process_start_time

PROCESS_START = process_start_time()  # before the heavy imports: they count against the budget too
configure_threads()  # before torch and numba load: they read the thread settings once


def main(argv: list[str] | None = None) -> int:
    from vits_trainer.errors import ArgumentParser
    from vits_trainer.feedback.config import HIDDEN_FLAGS, FeedbackConfig
    from vits_trainer.feedback.round import run_feedback
    from vits_trainer.training.config import add_arguments, parse_config

    parser = ArgumentParser(description=__doc__.split("\n\n")[0])
    add_arguments(parser, FeedbackConfig, skip=HIDDEN_FLAGS)
    # cfg.explicit: the flags given (a resume keeps the rest)
    cfg = parse_config(parser, argv, FeedbackConfig)
    result = run_feedback(cfg, PROCESS_START)  # validates first: a bad flag never loads torch
    return 1 if result.get("exported") is False else 0  # the export failed: its error line said so


if __name__ == "__main__":
    from vits_trainer.errors import run_command

    sys.exit(run_command(main))
