#!/usr/bin/env python
"""Listen to a model folder: speak sentences to 16-bit WAV files and report the real-time factor.

Examples:
  python speak.py --model training/final_model --text "silav, tu çawa yî?" --out hello.wav
  python speak.py --model training/checkpoints/best_model --text_file lines.txt --out listen

Beside train_vits.py so that it runs from any folder, as they do; the command is vits_trainer/speak.py
(also `python -m vits_trainer.speak` from this folder).
"""

import sys

from vits_trainer.errors import run_command
from vits_trainer.speak import main

if __name__ == "__main__":
    sys.exit(run_command(main, one_process=True))  # SIGTERM stops as Ctrl-C does: "interrupted"
