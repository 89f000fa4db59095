"""Time-budgeted fine-tuning of VITS / Meta MMS text-to-speech models.

The three command-line scripts at the repository root are thin wrappers around this package:
``prepare_data.py`` (corpus -> training set), ``train_vits.py`` (the budgeted runner) and
``train_feedback.py`` (incremental fine-tuning from corrected recordings).
"""

__version__ = "0.1.0"
