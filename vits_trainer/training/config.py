"""The run's settings: one dataclass, its command line, validation of the combinations, and the
folders they name, checked before torch is imported.

Every field carries its help text; `--help` shows each default. The resolved settings are stored in
every checkpoint and in the run folder, so a run can always be explained and resumed.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import ClassVar

from ..data.metadata import METADATA_NAME, WAVS_DIR
from ..errors import UserError
from ..hub import looks_like_path, resolve_model_dir
from ..runlock import refuse_if_being_written
from ..safety import check_disjoint, check_output_vs_data, check_replaceable, made_by, read_marker
from .checkpoint_names import list_checkpoints

# --discriminator_width's largest: the parameters grow with its square (4: 747 M, 16x VITS's)
MAX_DISCRIMINATOR_WIDTH = 4.0
# one flag per losses.LossWeights field (`--mel_weight` -> LossWeights.mel); kept here, not imported:
# this module is read before torch
LOSS_WEIGHT_FLAGS = (
    "mel_weight",
    "kl_weight",
    "duration_weight",
    "adversarial_weight",
    "feature_matching_weight",
)


def _f(default, help: str, **kw):
    return field(default=default, metadata={"help": help, **kw})


@dataclass
class TrainConfig:
    hidden_flags: ClassVar[tuple[str, ...]] = ()  # fields a CLI does not offer (messages must not name them)

    # --- data and folders ---
    data_dir: str = _f("training", "prepared data: wavs/ + metadata.csv (from prepare_data.py)")
    checkpoint_dir: str = _f("training/checkpoints", "checkpoints, best_model/, samples, metrics.jsonl")
    output_dir: str = _f("training/final_model", "final model folder (loadable by VitsModel.from_pretrained)")
    overwrite_output_dir: bool = _f(
        False,
        "replace an earlier export at --output_dir (needed unless it is this run's own, being resumed); "
        "a folder this tool did not export is never replaced",
    )
    model_name: str = _f(
        "facebook/mms-tts-kmr-script_latin",
        "pretrained VITS/MMS model: hub id (needs network or cache) or folder",
    )
    discriminator: str = _f(
        "", "folder with discriminator.safetensors (default: the model folder's, else a fresh one)"
    )
    max_samples: int = _f(0, "use at most this many clips (0 = all)")
    val_fraction: float = _f(
        0.02, "held-out validation share (at least a few clips, fixed across resumes; 0 = no validation)"
    )
    max_ram_gb: float = _f(
        0.0,
        "preload audio into RAM up to this size, shared by the processes of a launch on this machine "
        "(0 = 75%% of available RAM)",
    )
    num_workers: int = _f(2, "DataLoader worker processes")
    # --- budget ---
    target_hours: float = _f(9.5, "wall-clock budget of this process, start-up to exit included")
    total_hours: float | None = _f(None, "budget of the whole training across resumed sessions (LR horizon)")
    benchmark_samples: int = _f(
        200, "samples of real training used to measure throughput before planning (or a minute of slow steps)"
    )
    max_steps: int = _f(
        0,
        "stop after this many optimiser steps in total (0 = the budget decides); the LR schedule ends there",
    )
    # --- optimisation ---
    batch_size: int = _f(
        8,
        "clips per loader batch (per process); how many go through the networks at once: --micro_batch_size",
    )
    gradient_accumulation_steps: int = _f(
        4,
        "loader batches per optimiser step: batch_size x this (x processes) clips make the effective batch",
    )
    micro_batch_size: str = _f(
        "auto",
        "clips per forward/backward pass: auto (a trial of real steps at the start picks the fastest of the "
        "divisors of batch_size x gradient_accumulation_steps from batch_size up) | N (any divisor); the "
        "effective batch is kept",
    )
    learning_rate: float = _f(2e-5, "peak learning rate of both generator and discriminator")
    warmup_steps: int = _f(
        500, "linear warmup in optimiser steps (capped at 10%% of the planned steps, or of --max_steps)"
    )
    min_lr_ratio: float = _f(0.05, "the LR decays (cosine, by budget spent) to this fraction of the peak")
    weight_decay: float = _f(0.01, "AdamW weight decay")
    max_grad_norm: float = _f(10.0, "gradient clipping (global L2 norm per network)")
    max_consecutive_skips: int = _f(
        8,
        "non-finite steps in a row before reloading the last good weights with a lower LR / safer precision",
    )
    mixed_precision: str = _f(
        "auto",
        "auto (bf16 on GPUs that have it, Ampere and newer; fp16 with a loss scaler on older ones such as "
        "the T4; fp32 on CPU) | fp16 | bf16 | no",
        choices=["auto", "fp16", "bf16", "no"],
    )
    length_buckets: str = _f(
        "auto",
        "pad each batch's token and frame counts up to a small fixed set of lengths (at most +12.5%%), so "
        "shapes repeat from step to step: auto (on CUDA, where a new shape costs host time; off on CPU) | "
        "on | off",
        choices=["auto", "on", "off"],
    )
    compile: str = _f(
        "auto",
        "torch.compile the step's networks (all of them with CUDA graphs first, then the decoder on "
        "segments and the discriminator; the faster is kept): auto (on CUDA when the training time left "
        "can earn back the compilation, kept only if faster than eager) | on | off",
        choices=["auto", "on", "off"],
    )
    segment_size: int = _f(8192, "samples of each clip decoded per step (VITS: 8192 = 32 frames of hop 256)")
    mel_weight: float = _f(45.0, "weight of the mel L1 loss")
    kl_weight: float = _f(1.0, "weight of the KL loss")
    duration_weight: float = _f(1.0, "weight of the duration loss")
    adversarial_weight: float = _f(1.0, "weight of the generator's adversarial loss")
    feature_matching_weight: float = _f(2.0, "weight of the feature-matching loss")
    discriminator_width: float = _f(1.0, "channel multiplier of a fresh discriminator (1.0 = VITS size)")
    extend_vocab: bool = _f(False, "add characters the data needs to the vocabulary (new embedding rows)")
    freeze: str = _f(
        "",
        "parts not trained, comma-separated: text_encoder,duration_predictor,flow,posterior_encoder,decoder",
    )
    gradient_checkpointing: bool = _f(
        False, "recompute activations in the backward pass: less memory, slower"
    )
    mas_backend: str = _f(
        "auto",
        "alignment search: auto (numba on CPU, triton on a CUDA GPU Triton supports, else torch) | numba | "
        "triton | torch",
        choices=["auto", "numba", "triton", "torch"],
    )
    num_speakers: str = _f(
        "",
        "auto | N: a single-speaker model learns one voice per speaker of metadata.csv (default: one voice)",
    )
    seed: int = _f(42, "random seed (data order, segments, init of new parts)")
    # --- saving, evaluation, logging ---
    save_minutes: float = _f(30.0, "checkpoint at least this often (and at epoch ends, overhead permitting)")
    keep_checkpoints: int = _f(
        2, "complete checkpoints kept (older ones deleted after a newer one is complete)"
    )
    eval_samples: int = _f(
        3, "validation sentences synthesised to WAV, with alignment and mel PNGs, at each evaluation"
    )
    freerun_samples: int = _f(
        8, "validation sentences spoken from text alone and scored (val_mel_dtw, val_mcd) at each evaluation"
    )
    # lower is better for every choice (outputs.RunOutputs.run_eval, best_model.best_model_score and
    # report.best_eval keep the minimum); a free-running one needs validate()'s --freerun_samples check
    best_metric: str = _f(
        "val_mel",
        "validation metric that chooses best_model: val_mel (teacher-forced) | val_mel_dtw (free-running)",
        choices=["val_mel", "val_mel_dtw"],
    )
    resume: str = _f(
        "auto",
        "auto (newest complete checkpoint) | none | PATH of a checkpoint folder",
        # an unset shell variable (--resume "$CKPT") read as ".", the folder the command runs in
        nonempty="auto, none or a checkpoint folder, step_NNNNNNNN (an empty value would name the current "
        "folder)",
    )
    log_every: int = _f(
        10,
        "optimiser steps between metric lines (metrics.jsonl, trackers); slow steps: one a minute at least",
    )
    report_to: str = _f(
        "none",
        "none | tensorboard | wandb (through accelerate's trackers)",
        choices=["none", "tensorboard", "wandb"],
    )
    # --- sharing ---
    push_to_hub: str = _f(
        "",
        "at the end, upload the final model folder (with its model card) to this Hugging Face model repo, "
        "USER/NAME or ORG/NAME, created private unless --hub_public; network, token and write permission "
        "are checked at start-up, and a failed upload keeps the local model and prints the command to push it",
        metavar="REPO_ID",
        nonempty="a repo id, USER/NAME (an empty one would push nothing: leave the flag out to keep the "
        "model local only)",
    )
    hub_public: bool = _f(
        False, "with --push_to_hub: create the repo public (an existing repo's visibility is never changed)"
    )
    push_best: bool = _f(
        False,
        "with --push_to_hub: also upload best_model to the repo's best_model/ folder whenever it changes, "
        "in the background",
    )
    # --- hardware ---
    cpu: bool = _f(False, "run on CPU even when a GPU is present")
    demo: bool = _f(
        False, "built-in tone-language data + tiny model, ~2 minutes on CPU, under training/demo/"
    )
    # the flags given on the command line (parse_config); None = built in code, every value is meant as
    # is. A resumed run takes the other settings from its checkpoint (resume_settings.py).
    explicit: frozenset[str] | None = field(default=None, repr=False, compare=False, metadata={"cli": False})

    def loss_weights(self):
        from ..model.losses import LossWeights

        return LossWeights(
            **{flag.removesuffix("_weight"): getattr(self, flag) for flag in LOSS_WEIGHT_FLAGS}
        )

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.metadata.get("cli", True)}

    @property
    def target_seconds(self) -> float:
        return self.target_hours * 3600.0

    @property
    def step_clips(self) -> int:
        """Clips one process trains on per optimiser step: --gradient_accumulation_steps loader batches
        of --batch_size (the micro-batch size only decides how many go through the networks at once)."""
        return self.batch_size * self.gradient_accumulation_steps

    def validate(self, resumed: bool = False, final: bool = True) -> None:
        """Reject what the code does not support instead of ignoring it. `resumed`: again, once a
        checkpoint's settings are restored (a restored --gradient_checkpointing with --compile on is no
        error there: compiling stays off and says so). `final`: False before a checkpoint may restore
        the batch settings, which a --micro_batch_size must divide (checked once they are known)."""
        positive = {
            "target_hours": self.target_hours,
            "batch_size": self.batch_size,
            "gradient_accumulation_steps": self.gradient_accumulation_steps,
            "learning_rate": self.learning_rate,
            "segment_size": self.segment_size,
            "keep_checkpoints": self.keep_checkpoints,
            "save_minutes": self.save_minutes,
            "log_every": self.log_every,
            "discriminator_width": self.discriminator_width,
            "max_consecutive_skips": self.max_consecutive_skips,
            "max_grad_norm": self.max_grad_norm,  # 0 trained nothing, a negative one climbed the loss
        }
        for name, value in positive.items():
            if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
                raise UserError(f"--{name} must be positive (got {value})")
        if self.discriminator_width > MAX_DISCRIMINATOR_WIDTH:  # 1e9 was a traceback allocating 960 GB
            raise UserError(
                f"--discriminator_width {self.discriminator_width:g}: at most {MAX_DISCRIMINATOR_WIDTH:g} "
                "(it multiplies the channels: 1.0 is VITS's discriminator, 47 M parameters; 4 is 747 M)"
            )
        if self.total_hours is not None and not (math.isfinite(self.total_hours) and self.total_hours > 0):
            raise UserError(f"--total_hours must be positive (got {self.total_hours})")
        for name in LOSS_WEIGHT_FLAGS:
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise UserError(f"--{name} must be 0 or more (got {value})")
        if not any(getattr(self, name) for name in LOSS_WEIGHT_FLAGS):
            raise UserError(
                f"every loss weight is 0 (--{', --'.join(LOSS_WEIGHT_FLAGS)}): nothing would train"
            )
        for name in ("weight_decay", "max_ram_gb"):  # NaN and inf failed later, with a traceback
            if not math.isfinite(getattr(self, name)):
                raise UserError(f"--{name} must be a number (got {getattr(self, name)})")
        if not 0 <= self.seed < 2**32:  # numpy's seeds; larger ones failed after the start evaluation
            raise UserError(f"--seed must be in [0, 2**32) (got {self.seed})")
        for name in (
            "max_samples",
            "max_steps",
            "benchmark_samples",
            "warmup_steps",
            "num_workers",
            "eval_samples",
            "freerun_samples",
            "weight_decay",
        ):
            if getattr(self, name) < 0:
                raise UserError(f"--{name} must be 0 or more (got {getattr(self, name)})")
        if not 0.0 <= self.val_fraction < 0.5:
            raise UserError(f"--val_fraction must be in [0, 0.5) (got {self.val_fraction})")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise UserError(f"--min_lr_ratio must be in [0, 1] (got {self.min_lr_ratio})")
        if self.best_metric == "val_mel_dtw" and self.freerun_samples == 0:
            raise UserError("--best_metric val_mel_dtw needs --freerun_samples of 1 or more")
        self.speakers_wanted()
        if self.compile == "on" and self.gradient_checkpointing and not resumed:
            raise UserError(
                "--compile on and --gradient_checkpointing cannot be combined (the checkpointed decoder is "
                "recomputed outside the compiled graph): choose one"
            )
        if self.max_ram_gb < 0:
            raise UserError(f"--max_ram_gb must be 0 or more (got {self.max_ram_gb})")
        self.forced_micro_batch(check_divides=final)
        for name in ("hub_public", "push_best"):
            if getattr(self, name) and not self.push_to_hub:
                raise UserError(f"--{name} needs --push_to_hub USER/NAME")

    def may_restore(self) -> bool:
        """Whether a checkpoint's settings may replace these (--resume, or a checkpoint folder with one)."""
        if self.resume == "none":
            return False
        return self.resume != "auto" or bool(list_checkpoints(Path(self.checkpoint_dir).expanduser()))

    def buckets_on(self, device_type: str) -> bool:
        """--length_buckets resolved for a device ("cuda", "cpu", ...)."""
        return self.length_buckets == "on" or (self.length_buckets == "auto" and device_type == "cuda")

    def speakers_wanted(self) -> int | str | None:
        """--num_speakers parsed: None (the model's own), "auto", or a positive count."""
        value = str(self.num_speakers).strip()
        if value in ("", "auto"):
            return value or None
        if value.isdigit() and int(value) >= 1:
            return int(value)
        raise UserError(f"--num_speakers must be auto or a positive integer (got {value!r})")

    def forced_micro_batch(self, check_divides: bool = True) -> int | None:
        """--micro_batch_size N as an int (None for auto); it must divide the clips of an optimiser step
        per process (a size that does not would change the effective batch: an error, not a rounding)."""
        value = str(self.micro_batch_size).strip().lower()
        if value == "auto":
            return None
        try:
            size = int(value)
        except ValueError:
            raise UserError(
                f"--micro_batch_size must be auto or a number of clips (got {self.micro_batch_size})"
            ) from None
        batch = self.step_clips
        if size < 1 or (check_divides and (size > batch or batch % size)):
            found = divisors(batch)
            divisors_text = ", ".join(map(str, found[:12])) + (f" ... {found[-1]}" if len(found) > 12 else "")
            raise UserError(
                f"--micro_batch_size {size} must divide the {batch} clips of an optimiser step per process "
                f"(--batch_size {self.batch_size} x --gradient_accumulation_steps "
                f"{self.gradient_accumulation_steps}): one of {divisors_text}, or auto"
            )
        return size


def divisors(n: int) -> list[int]:
    """The divisors of `n`, ascending (pairs up to its square root: a step of 10^10 clips is instant)."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return small + [n // d for d in reversed(small) if d * d != n]


def add_arguments(parser: argparse.ArgumentParser, cls=TrainConfig, skip: tuple[str, ...] = ()) -> None:
    """One flag per field (snake_case, as in the config), with its default in --help. A subclass's own
    fields (e.g. the feedback script's --base_model, --feedback_dir) come first; the inherited ones
    follow under a heading of their own, so a user sees the flags that matter to this script first."""
    own = list(cls.__dict__.get("__annotations__", ())) if cls is not TrainConfig else []
    shared = parser.add_argument_group("training settings (as in train_vits.py)") if own else parser
    # own fields in the order the subclass declares them, then the rest in TrainConfig's order
    ordered = sorted(fields(cls), key=lambda f: own.index(f.name) if f.name in own else len(own))
    for f in ordered:
        if f.name in skip or not f.metadata.get("cli", True):
            continue
        _add_field(parser if f.name in own else shared, f)


def _add_field(parser, f) -> None:
    """The flag of one config field (a --mixed_precision field also gets its --fp16/--bf16/... aliases)."""
    help_text = f.metadata.get("help", "")
    default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
    flag = f"--{f.name}"
    if f.type in ("bool", bool):
        parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=default, help=help_text)
        return
    if f.name == "mixed_precision":
        group = parser.add_mutually_exclusive_group()
        group.add_argument(flag, default=default, choices=f.metadata["choices"], help=help_text)
        group.add_argument(
            "--fp16", dest=f.name, action="store_const", const="fp16", help="= --mixed_precision fp16"
        )
        group.add_argument(
            "--bf16", dest=f.name, action="store_const", const="bf16", help="= --mixed_precision bf16"
        )
        group.add_argument(
            "--no_mixed_precision",
            dest=f.name,
            action="store_const",
            const="no",
            help="= --mixed_precision no",
        )
        return
    kind = {"int": int, "float": float, "str": str, "float | None": float}.get(str(f.type), str)
    extra = {}
    if f.metadata.get("nonempty"):  # a flag given an empty value (an unset shell variable) is refused
        extra["action"] = _non_empty(f.metadata["nonempty"])
    parser.add_argument(
        flag,
        type=kind,
        default=default,
        choices=f.metadata.get("choices"),
        metavar=f.metadata.get("metavar"),
        help=help_text,
        **extra,
    )


def _non_empty(needs: str) -> type[argparse.Action]:
    """A store action that refuses an empty value with `needs` (what the flag takes). An action, not a
    type: argparse converts a string default with the type too, and the default is the empty string."""

    class NonEmpty(argparse.Action):
        def __call__(self, parser, namespace, values, option_string=None):
            if not str(values).strip():
                raise argparse.ArgumentError(self, f"needs {needs}")
            setattr(namespace, self.dest, values)

    return NonEmpty


def config_from_args(args: argparse.Namespace, cls=TrainConfig):
    values = {f.name: getattr(args, f.name) for f in fields(cls) if hasattr(args, f.name)}
    return cls(**values)


_UNSET = object()


def parse_config(parser: argparse.ArgumentParser, argv: list[str] | None, cls=TrainConfig):
    """The config of a command line, with `explicit` = the flags given (even when equal to their
    default): a second parse into a namespace pre-filled with a marker, which argparse leaves alone
    wherever no flag was given."""
    args = parser.parse_args(argv)
    marked = argparse.Namespace(**{name: _UNSET for name in vars(args)})
    given = {k for k, v in vars(parser.parse_args(argv, namespace=marked)).items() if v is not _UNSET}
    cfg = config_from_args(args, cls)
    cfg.explicit = frozenset(given)
    return cfg


# ---- the folders the flags name, checked without torch ------------------------------------------
# train_vits.py calls check_given_paths and check_train_paths before its heavy imports (a mistyped
# path costs a fraction of a second, not the seconds of importing torch); the session calls the same
# folder checks once a resumed run's settings are known.


def check_data_dir(value: str) -> Path:
    """--data_dir: a prepared folder with its metadata.csv."""
    data_dir = Path(value)
    # the data folder's metadata.csv or wavs/ given for the folder itself (a wavs/ that is a data folder
    # of its own, with its metadata.csv, is taken as given)
    above = data_dir.parent
    inside = data_dir.name in (METADATA_NAME, WAVS_DIR) and not (data_dir / METADATA_NAME).is_file()
    if inside and (above / METADATA_NAME).is_file() and (above / WAVS_DIR).is_dir():
        what = "a file" if data_dir.is_file() else "the clips' folder"
        raise UserError(f"--data_dir {data_dir}: is {what} of a data folder, not the folder: pass {above}")
    if data_dir.is_file():
        raise UserError(
            f"--data_dir {data_dir}: is a file, not a folder: pass the folder prepare_data.py wrote (its --data_dir)"
        )
    if not data_dir.is_dir():
        raise UserError(f"--data_dir {data_dir}: no such folder (run prepare_data.py first)")
    refuse_if_being_written(data_dir, "--data_dir")  # its metadata.csv may not be written yet
    meta = data_dir / METADATA_NAME
    if meta.is_dir():
        raise UserError(
            f"{meta}: is a folder, not the file prepare_data.py writes; move it out of the way and make the "
            f"data folder again: python prepare_data.py --source YOUR_CORPUS --data_dir {data_dir}"
        )
    if not meta.is_file():
        raise UserError(f"{meta}: no such file; {_how_to_prepare(data_dir)}")
    return data_dir


def _how_to_prepare(data_dir: Path) -> str:
    """The prepare_data.py command that makes a training set of `data_dir`: a folder holding audio is
    likely the corpus itself, to be read as --source into a folder of its own; one prepare_data.py began
    (its state beside the WAVs, written even when it is stopped) is to be finished by running it again."""
    from ..data.prepare_state import load_state, made_by_prepare  # only on this error

    if made_by_prepare(data_dir):
        source = load_state(data_dir).get("source")
        source = source if isinstance(source, str) and source else "YOUR_CORPUS"
        return (
            f"{data_dir} was begun by prepare_data.py but not finished (stopped, or its run failed); run it "
            f"again, python prepare_data.py --source {source} --data_dir {data_dir} (the WAVs it made are "
            "reused)"
        )
    audio = _some_audio_file(data_dir)
    if audio is None:
        return (
            "--data_dir takes a folder made by prepare_data.py; make it first: "
            f"python prepare_data.py --source YOUR_CORPUS --data_dir {data_dir}"
        )
    target = data_dir.resolve()
    target = target.parent / f"{target.name or 'corpus'}_prepared"
    return (
        f"{data_dir} holds audio files ({audio.relative_to(data_dir)}) but was not made by prepare_data.py: it may be the "
        f"corpus itself; prepare it into a folder of its own, python prepare_data.py --source {data_dir} "
        f"--data_dir {target}, then pass --data_dir {target}"
    )


def _some_audio_file(folder: Path, depth: int = 2, budget: int = 2000) -> Path | None:
    """An audio file in `folder` or up to `depth` folders below it, looking at `budget` entries at most."""
    from ..data.audio import AUDIO_EXTENSIONS  # only on this error: it imports numpy and soundfile

    level = [folder]
    for _ in range(depth + 1):
        below = []
        for current in level:
            try:
                entries = sorted(current.iterdir())
            except OSError:
                continue
            for entry in entries:
                budget -= 1
                if budget < 0:
                    return None
                if entry.name.startswith("."):
                    continue
                if entry.suffix.lower() in AUDIO_EXTENSIONS and entry.is_file():
                    return entry
                if entry.is_dir():
                    below.append(entry)
        level = below
    return None


def check_resume_path(value: str) -> Path:
    """--resume PATH (not auto/none): an existing folder; whether it is a usable checkpoint is read later."""
    path = Path(value).expanduser()
    if not path.is_dir():
        raise UserError(f"--resume {value}: no such checkpoint folder")
    return path


def check_discriminator_dir(value: str) -> Path:
    """--discriminator: an existing folder (its weights are looked for when it is loaded)."""
    folder = Path(value)
    if not folder.is_dir():
        raise UserError(f"--discriminator {folder}: no such folder")
    return folder


def check_given_paths(cfg: TrainConfig) -> None:
    """The folder flags given on the command line. Only those: a resumed run takes the others from its
    checkpoint, and the session checks them once it is read."""
    given = cfg.explicit or frozenset()
    if "data_dir" in given:
        check_data_dir(cfg.data_dir)
    if "model_name" in given and looks_like_path(cfg.model_name):
        resolve_model_dir(cfg.model_name)  # a folder: checked on the spot (a hub id waits for the session)
    if "discriminator" in given and cfg.discriminator:
        check_discriminator_dir(cfg.discriminator)
    if "resume" in given and cfg.resume not in ("auto", "none"):
        check_resume_path(cfg.resume)


def check_train_paths(cfg: TrainConfig, settings_known: bool = False) -> None:
    """train_vits.py: --data_dir is read; --checkpoint_dir and --output_dir are written and replaced.
    Called before torch loads, and again by the session once a resumed run's own folders are known
    (`settings_known`): before, a resume that takes its --output_dir from its checkpoint is not checked
    (the default folder may hold another run's model; the run's own is what matters)."""
    if (
        not settings_known
        and cfg.may_restore()
        and cfg.explicit is not None
        and "output_dir" not in cfg.explicit
    ):
        return
    check_output_vs_data("--checkpoint_dir", cfg.checkpoint_dir, "--data_dir", cfg.data_dir)
    check_output_vs_data("--output_dir", cfg.output_dir, "--data_dir", cfg.data_dir)
    check_disjoint(
        "--output_dir",
        cfg.output_dir,
        "--checkpoint_dir",
        cfg.checkpoint_dir,
        "the export replaces --output_dir, and checkpoints must survive it",
    )
    check_output_dir(cfg.output_dir, cfg.checkpoint_dir, cfg.overwrite_output_dir, cfg.resume)


def check_output_dir(output_dir, checkpoint_dir, overwrite: bool, resume: str) -> None:
    """Up front, before any training: may this run replace --output_dir at its end?

    Missing or empty: yes. A folder without our marker, or with a file the marker does not list: never.
    An earlier export: with --overwrite_output_dir; or without it when it is this run's own export
    being redone on resume (the marker records the checkpoint dir that wrote it, also where it is from
    the folder, for a project moved or copied whole; and that dir holds a checkpoint to resume from).
    """
    out = Path(output_dir).expanduser()
    check_replaceable(out, "--output_dir")
    if not out.is_dir() or not any(out.iterdir()) or overwrite:
        return
    marker = read_marker(out) or {}
    same_run = made_by(marker, out, checkpoint_dir)
    resuming = resume != "none" and bool(list_checkpoints(Path(checkpoint_dir).expanduser()))
    if same_run and resuming:
        return
    by = (
        f" (by the run of --checkpoint_dir {marker['checkpoint_dir']})"
        if marker.get("checkpoint_dir")
        else ""
    )
    raise UserError(
        f"--output_dir {output_dir}: holds a model exported by an earlier run{by}; pass "
        f"--overwrite_output_dir to replace it, or choose another --output_dir"
    )
