"""Feedback rounds (train_feedback.py): fold a few corrected recordings into a trained model.

The settings, the replay data (feedback clips mixed with original ones), the round and its report,
the version folders and the `latest` pointer, and the promotion rule with its noise-aware judgement.
The training itself is `training`'s one loop. May import everything else in the package; nothing
imports it.
"""
