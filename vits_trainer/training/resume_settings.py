"""A resumed run keeps the settings of the run it continues.

Every checkpoint stores the run's settings (trainer_state.json "config"). On resume they replace this
command line's values, except:
- flags given explicitly on this command line (TrainConfig.explicit): they win, and each one that
  differs from the saved value is printed; but not --model_name, nor train_feedback.py's --base_model
  (RUN_BASE): the checkpoint's weights came from the saved one, which the model card names, and a
  different one is said to be unused;
  nor RUN_FIXED (--val_fraction, --seed, --extend_vocab, --discriminator, --discriminator_width,
  --num_speakers, --best_metric): the validation clips, the random state, the vocabulary, the
  discriminator, the voices and the best model's score are the checkpoint's, so a different value
  would change nothing but what the run's settings say (or, for --best_metric, compare one metric's
  scores with another's);
- NOT_RESTORED: what belongs to this session or this machine, not to the run:
    --target_hours      this process's budget (--total_hours, the whole run's horizon, is restored)
    --resume            how this session finds the checkpoint
    --checkpoint_dir    where the checkpoint was found (and the feedback --output_dir root)
    --cpu, --num_workers, --max_ram_gb, --mixed_precision, --mas_backend, --length_buckets, --compile
                        this machine's hardware
    --report_to         this machine's tracker set-up (logins differ between machines)
    --push_to_hub, --hub_public, --push_best
                        where this invocation shares the model (checked at its start-up, with this
                        machine's token)
Everything else is restored: data_dir, output_dir, the optimisation (learning rate, accumulation,
warmup, batch size, loss weights, segment size...), saving and evaluation, seed, freeze, max_steps.
A relative data_dir or output_dir (and train_feedback.py's feedback_dir and base_model) is relative to
the run's folder: the one it was started in, as the checkpoint folder shows it now. Resumed from
another folder with --checkpoint_dir pointing back into the run's, they still name the run's data and
model, not those of the folder the resume runs in; a project folder copied or moved whole, resumed
inside the copy, uses the copy's.
A config built in code (explicit is None) is used as it is: nothing is restored.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from ..launch import world_size

# this machine's settings: not restored, and repeated by the printed resume command
MACHINE = (
    "cpu",
    "num_workers",
    "max_ram_gb",
    "mixed_precision",
    "mas_backend",
    "length_buckets",
    "compile",
    "report_to",
)
# this invocation's choices the printed command repeats (not restored either): the continuation shares too
SHARING = ("push_to_hub", "hub_public", "push_best")
# never restored (module docstring): this session's budget and how it found its checkpoint, the above
NOT_RESTORED = frozenset({"target_hours", "resume", "checkpoint_dir", "explicit", *MACHINE, *SHARING})


# what the run's weights started from: a resumed run's checkpoint decides it, whatever is given; each
# with how to start from the one given instead. train_feedback.py's --base_model too: given anew to a
# resumed version it was printed as winning, and named in the version's model card as its base (and
# loaded for "before" numbers not yet taken), while the weights continued from the version's own base
RUN_BASE = {
    "model_name": "to train {value} from the start, give another --checkpoint_dir",
    "base_model": "to start a new version from {value}, add --resume none",
}
# fixed for the run's life: the checkpoint holds the validation ids and every random generator's state
RUN_FIXED = {
    "val_fraction": "the validation clips are the checkpoint's, the same in every session",
    "seed": "the random state is the checkpoint's",
    "extend_vocab": "the vocabulary is the checkpoint's, settled when the run started",
    "discriminator": "the discriminator is the checkpoint's",
    "discriminator_width": "the discriminator is the checkpoint's",
    # a resumed model keeps its speaker embeddings and map (model/speakers.py): a count given now changed
    # nothing but the run's saved settings
    "num_speakers": "the voices are the checkpoint's, its model and speaker map kept",
    # best_val and best_model/ are scores and weights of the run's metric: another would be compared
    # with the old one's values
    "best_metric": "best_model is chosen by the run's own metric, which its best so far is a score of",
}


# the run's folders, saved as given: relative to the folder the run was started in (feedback_dir and
# base_model: train_feedback.py's, always folders; --model_name may be a hub id, and is the checkpoint's)
RUN_FOLDERS = ("data_dir", "output_dir", "feedback_dir", "base_model")


def restore_settings(
    cfg,
    saved: dict | None,
    log,
    source: str,
    keep: frozenset[str] = frozenset(),
    working_dir=None,
    checkpoint_dir=None,
):
    """`cfg` with the saved settings of a resumed run (see the module docstring); `keep` adds fields
    not to restore (feedback: its --output_dir root and the settings it derives per version);
    `working_dir`, the folder the saved run ran in (None: a checkpoint from before it was kept);
    `checkpoint_dir`, where the run's checkpoints are now (None: cfg.checkpoint_dir)."""
    if cfg.explicit is None or not isinstance(saved, dict):
        return cfg
    now = cfg.checkpoint_dir if checkpoint_dir is None else checkpoint_dir
    saved = anchored(saved, run_folder(saved.get("checkpoint_dir"), now, working_dir))
    fields = {f.name for f in dataclasses.fields(cfg) if f.metadata.get("cli", True)}
    skip = NOT_RESTORED | keep
    hidden = set(cfg.hidden_flags)
    changes, overridden, restored = {}, [], []
    for name in sorted(fields - skip):
        if name not in saved:  # a checkpoint of an older version: this command line's value
            continue
        value, old = getattr(cfg, name), saved[name]
        if value == old:
            continue
        if name in cfg.explicit and name in RUN_BASE:
            changes[name] = old  # the checkpoint's weights came from it: the card must name it
            log(
                f"resume: --{name} {_show(value)} is not used: this run continues its checkpoint, trained "
                f"from {_show(old)}; {RUN_BASE[name].format(value=_show(value))}"
            )
        elif name in cfg.explicit and name in RUN_FIXED:
            changes[name] = old
            given = _flag(name, value)
            unset = "the model's own" if name == "num_speakers" else "none"  # "" = not given: the default
            was = _flag(name, old) if isinstance(old, bool) else _show(old) if old != "" else unset
            log(f"resume: {given} is not used: {RUN_FIXED[name]} ({was} in this run)")
        elif name in cfg.explicit:
            if name not in hidden:
                used = _flag(name, old) if isinstance(old, bool) else _show(old)
                overridden.append(f"{_flag(name, value)} (the checkpoint's run used {used})")
        else:
            changes[name] = old
            if name not in hidden:
                restored.append(_flag(name, old))
    for line in overridden:
        log(f"resume: {line}")
    if restored:
        log(
            f"resume: the run's own settings from {source}: {', '.join(restored)} (give a flag to change one)"
        )
    return dataclasses.replace(cfg, **changes) if changes else cfg


def run_folder(saved_checkpoint_dir, checkpoint_dir, working_dir) -> Path | None:
    """The folder the run's relative folders are relative to, now: where this --checkpoint_dir is, less
    the relative --checkpoint_dir the run was started with (training/checkpoints in /tmp/A: /tmp/A),
    else the folder the run was started in (`working_dir`, None if not known)."""
    if isinstance(saved_checkpoint_dir, str) and saved_checkpoint_dir and checkpoint_dir:
        given = Path(saved_checkpoint_dir)
        if not given.expanduser().is_absolute():
            parts = [p for p in given.parts if p != "."]
            now = Path(checkpoint_dir).expanduser().resolve()
            if parts and ".." not in parts and list(now.parts[-len(parts) :]) == parts:
                return Path(*now.parts[: -len(parts)])
    return Path(working_dir) if working_dir else None


def anchored(saved: dict, root: Path | None) -> dict:
    """`saved` with its relative RUN_FOLDERS joined to the run's folder `root`, when that is not this
    process's working folder: resumed from elsewhere, "training" named another corpus (trained on it
    silently)."""
    if root is None or root.resolve() == Path.cwd().resolve() or not root.is_dir():
        return saved  # (a run's folder that is gone names nothing: the folders as given, here)
    changed = dict(saved)
    for name in RUN_FOLDERS:
        value = saved.get(name)
        if isinstance(value, str) and value and not os.path.isabs(os.path.expanduser(value)):
            changed[name] = str(root / value)
    return changed


def _flag(name: str, value) -> str:
    """A setting as its flag is typed: --demo / --no-demo for a switch, --name value otherwise."""
    if isinstance(value, bool):
        return f"--{name}" if value else f"--no-{name}"
    return f"--{name} {_show(value)}"


def _show(value) -> str:
    # None: a setting the run never set (--total_hours not given); Python's "None" read as a value
    return "''" if value == "" else "none" if value is None else str(value)


def resume_command(script: str, cfg, folder_flag: str, folder: str) -> str:
    """The command that continues this run on this machine: the folder to find it in, the machine
    and sharing settings this run used where they differ from the defaults (not restored from the
    checkpoint), and this session's budget again (each session has its own: the user may change it);
    every other setting comes from the checkpoint. A run of several processes (`accelerate launch`
    sets WORLD_SIZE) is continued with as many: `python` alone would resume it on one GPU."""
    import shlex

    processes = world_size()
    # on a CPU-only machine accelerate needs --multi_gpu to start gloo processes (docs/multi-gpu.md)
    launch = f"accelerate launch{' --multi_gpu' if cfg.cpu else ''} --num_processes {processes}"
    runner = launch if processes > 1 else "python"
    parts = [f"{runner} {script} --resume auto {folder_flag} {shlex.quote(str(folder))}"]
    for f in dataclasses.fields(cfg):
        if f.name not in MACHINE + SHARING or getattr(cfg, f.name) == f.default:
            continue
        value = getattr(cfg, f.name)
        parts.append(
            _flag(f.name, value) if isinstance(value, bool) else f"--{f.name} {shlex.quote(str(value))}"
        )
    return " ".join(parts + [f"--target_hours {cfg.target_hours:g}"])
