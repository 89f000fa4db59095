"""Fine-tune a VITS / MMS text-to-speech model inside a wall-clock budget.

    python train_vits.py --demo                                   # 2-minute CPU demo, no network
    python train_vits.py --model_name facebook/mms-tts-kmr-script_latin --target_hours 9.5
    python train_vits.py --target_hours 9.5 --total_hours 28     # one of three 9.5 h sessions
    python train_vits.py --resume auto                            # continue after an interruption

Reads training/metadata.csv + training/wavs (prepare_data.py), checkpoints to training/checkpoints,
writes the final model (a plain transformers VitsModel folder) to training/final_model.
"""

from __future__ import annotations

import sys

from vits_trainer.runtime import configure_threads, process_start_time

PROCESS_START = process_start_time()  # before the heavy imports: they count against the budget too
configure_threads()  # before torch and numba load: they read the thread settings once


def main(argv: list[str] | None = None) -> int:
    from vits_trainer.config import TrainConfig, add_arguments, config_from_args
    from vits_trainer.demo import apply_demo_settings
    from vits_trainer.errors import ArgumentParser

    parser = ArgumentParser(description=__doc__.split("\n\n")[0])
    add_arguments(parser, TrainConfig)
    args = parser.parse_args(argv)
    cfg = config_from_args(args, TrainConfig)
    if cfg.demo:
        cfg = apply_demo_settings(
            cfg, explicit={a for a in vars(args) if getattr(args, a) != parser.get_default(a)}
        )
    cfg.validate()

    from vits_trainer.loop import Trainer
    from vits_trainer.session import build_session

    session = build_session(cfg, PROCESS_START)
    summary = Trainer(session).train()
    log = session.log
    if summary["stopped_reason"] == "signal":
        log(
            f"stopped by a signal at step {summary['steps']}; continue with: python train_vits.py --resume auto "
            f"--checkpoint_dir {cfg.checkpoint_dir} --data_dir {cfg.data_dir} --target_hours H"
        )
    if summary["final_model"] is None and session.is_main:
        return 1  # the export failed; the error line named the last good checkpoint
    log(
        f"done: {summary['steps']} steps in {summary['wall_seconds'] / 60:.1f} min "
        f"(budget {cfg.target_hours * 60:.1f} min); final model: {summary['final_model']}; "
        f"best model: {summary['best_model']}"
    )
    return 0


if __name__ == "__main__":
    from vits_trainer.errors import run_cli

    sys.exit(run_cli(main))
