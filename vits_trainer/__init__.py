"""Time-budgeted fine-tuning of VITS / Meta MMS text-to-speech models.

The three command-line scripts at the repository root are thin wrappers around this package:
``prepare_data.py`` (corpus -> training set), ``train_vits.py`` (the budgeted runner) and
``train_feedback.py`` (incremental fine-tuning from corrected recordings).

Layout, following the data flow (each part imports only the parts listed before it):
- root modules: errors, safety (what may be written or removed), runlock, hub, jsonfile, profiling, launch;
- ``data``: corpus -> prepared folder -> batches;
- ``model``: VITS training forward, discriminator, losses, alignment search;
- ``training``: budget, the one training loop, checkpoints, evaluation, recovery;
- ``feedback``: feedback rounds (train_feedback.py) on top of that loop.

``speak`` (``python speak.py``, or ``python -m vits_trainer.speak``) is a command, like the scripts: it
speaks text with a model folder to WAV files, may import every part, and only speak.py imports it.
"""

__version__ = "0.1.0"
