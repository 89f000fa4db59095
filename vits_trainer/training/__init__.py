"""Training: running a model against a time budget and never losing the work.

The budget and its LR schedule, the one training loop shared by both trainers, the step, session
set-up, checkpoints and train state, recovery from runs of non-finite steps, evaluation, reporting,
the runtime (devices, precision, threads). May import the root modules, `data` and `model`.
"""
