"""Everything one training process needs, built from its settings: device, model, data, optimisers,
budget, and the state of a resumed run. Shared by train_vits.py and train_feedback.py.

`build_session` locks the run's folder and finds the checkpoint to resume; `_build_session` then takes
the set-up's steps in order, most of them one call each. The data steps are in datasplit.py, the model
steps in networks.py.
"""

from __future__ import annotations

import functools
import hashlib
import shutil
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from ..data.metadata import METADATA_NAME, read_metadata
from ..data.sampler import BucketBatchSampler
from ..data.shapes import PadLengths
from ..data.text import TextEncoder
from ..errors import UserError
from ..model.discriminator import VitsDiscriminator
from ..model.speakers import read_known_speakers, resolve_speakers
from ..model.vits import VitsGenerator
from ..runlock import RunLock, is_main_process
from ..safety import remove_created_on_error
from .budget import Budget
from .carry import ABANDONED, carry_best_model, carry_history, set_aside_later_checkpoints
from .checkpoint import MANIFEST, find_resumable, list_checkpoints, verify_checkpoint
from .config import TrainConfig, check_data_dir, check_resume_path
from .datasplit import (
    DataSplit,
    check_vocabulary,
    describe_data,
    load_store,
    make_loaders,
    report_unknown_characters,
    split_data,
)
from .lr_schedule import BudgetLR, make_scheduler, set_peak_lr
from .microbatch import whole_step_samples
from .networks import (
    check_segment_size,
    estimate_checkpoint_bytes,
    load_model,
    load_or_create_discriminator,
    make_generator,
)
from .report import is_resume, read_metrics
from .resume_settings import restore_settings
from .runtime import (
    LOG_FILE,
    Logger,
    idle_gpus_note,
    make_accelerator,
    quiet_transformers,
    resolve_precision,
)
from .step import make_optimizer
from .trainstate import LoadedCheckpoint, TrainState, set_rng_state


@dataclass
class Session:
    """One training process's run, as `build_session` made it.

    The networks, each under one name here and in GanStep:
    - `model`: transformers' VitsModel, the weights themselves: what is exported, spoken with, saved;
    - `generator_raw`: the VitsGenerator that trains it (model/vits.py: the training forward; its
      `.model` is `model`); evaluation and alignment pictures call it directly;
    - `generator`: `generator_raw` as accelerate prepared it (a DDP wrapper in a multi-process run):
      what the training step calls, so that gradients are synchronised;
    - `discriminator_raw` and `discriminator`: the VitsDiscriminator, and it prepared by accelerate.
    """

    cfg: TrainConfig
    accelerator: object
    log: Logger
    model: object  # transformers' VitsModel: the weights exported and spoken with
    text: TextEncoder
    generator: object  # generator_raw, prepared by accelerate: what the training step calls
    generator_raw: VitsGenerator  # the training wrapper of `model`
    discriminator: object  # discriminator_raw, prepared by accelerate
    discriminator_raw: VitsDiscriminator
    g_optimizer: torch.optim.Optimizer
    d_optimizer: torch.optim.Optimizer
    g_scheduler: object
    d_scheduler: object
    budget: Budget
    budget_lr: BudgetLR
    speakers: dict[str, int]
    data: DataSplit
    sampler: BucketBatchSampler
    loader: object
    val_loaders: dict[str, object]
    pad: PadLengths | None  # training batches padded to bucket edges (--length_buckets), else None
    state: TrainState
    checkpoint_dir: Path
    output_dir: Path
    resumed_from: Path | None
    preload_seconds: float
    model_source: str
    run_lock: object | None = None  # runlock.RunLock of --checkpoint_dir (main process), released by the loop
    resume_command: str | None = None  # report.html's command to continue (None: train_vits.py's)
    # whether resume_command still continues the run once it ended (a feedback round's is judged then: the
    # command would start a new version)
    resumable_after_end: bool = True

    def lr_pairs(self) -> list[tuple]:
        """(optimizer, its LR scheduler) for the generator and the discriminator."""
        return [(self.g_optimizer, self.g_scheduler), (self.d_optimizer, self.d_scheduler)]

    @property
    def peak_lr(self) -> float:
        """The schedules' peak: always this session's --learning_rate times the recoveries' scale
        (`state.lr_scale`, halved by each)."""
        return self.cfg.learning_rate * self.state.lr_scale

    def apply_peak_lr(self) -> None:
        """Both schedules' peak (`peak_lr`) set, and this step's LR from it, at set-up and after a
        recovery."""
        set_peak_lr(self.lr_pairs(), self.peak_lr, self.budget_lr)

    @property
    def device(self) -> torch.device:
        return self.accelerator.device

    @property
    def is_main(self) -> bool:
        return self.accelerator.is_main_process


# ---- pieces -------------------------------------------------------------------------------------


def check_writable(folder: Path, what: str) -> None:
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".write-test-"):
            pass
    except OSError as err:
        raise UserError(f"{what} {folder} is not writable ({err.strerror or err})") from None


def find_checkpoint(cfg: TrainConfig, checkpoint_dir: Path, log) -> LoadedCheckpoint | None:
    """The checkpoint to resume from, per --resume; errors for anything ambiguous or broken."""
    if cfg.resume == "none":
        if list_checkpoints(checkpoint_dir):
            raise UserError(
                f"{checkpoint_dir} already holds checkpoints of an earlier run; pass --resume auto to "
                f"continue it, or choose another --checkpoint_dir (nothing is overwritten)"
            )
        return None
    if cfg.resume == "auto":
        path, manifest = find_resumable(checkpoint_dir, log=log)
        damaged = list_checkpoints(checkpoint_dir) if path is None else []
        if damaged:  # a fresh run here would append to that run's metrics and replace its best_model/
            names = ", ".join(p.name for p in damaged)
            raise UserError(
                f"--checkpoint_dir {checkpoint_dir}: no checkpoint in it is usable ({names}: damaged, see the "
                "warnings above), so there is nothing to continue; copy an intact one back from a backup, "
                "or start a new run with another --checkpoint_dir (nothing here is changed)"
            )
        if path is None and cfg.total_hours is not None:  # session 1, or a new machine without session 1
            log(
                f"note: no checkpoint in {checkpoint_dir}, so the {cfg.total_hours:g} hours of --total_hours "
                "start now; to continue a training saved elsewhere (a new Kaggle session), pass --resume "
                "<its checkpoints>/step_N"
            )
        return LoadedCheckpoint(path, manifest) if path is not None else None
    path = check_resume_path(cfg.resume)
    inside = list_checkpoints(path)
    if inside:  # the folder of a run's checkpoints, not one of them
        complete = [p for p in inside if (p / MANIFEST).is_file()]
        advice = f"pass its newest, --resume {complete[0]}" if complete else "none of its step_* is complete"
        raise UserError(f"--resume {cfg.resume}: holds checkpoints, it is not one; {advice}")
    if not path.name.startswith(("step_", ".step_")) and not (path / MANIFEST).is_file():
        raise UserError(  # a data or model folder, not a half-saved checkpoint
            f"--resume {cfg.resume}: not a checkpoint (a step_NNNNNNNN folder of a run's --checkpoint_dir)"
        )
    try:
        manifest = verify_checkpoint(path)
    except Exception as err:
        raise UserError(f"--resume {cfg.resume}: not a usable checkpoint ({err})") from None
    refuse_other_checkpoints(cfg.resume, path, checkpoint_dir)
    return LoadedCheckpoint(path, manifest)


def refuse_other_checkpoints(given: str, resumed: Path, checkpoint_dir: Path) -> None:
    """A checkpoint from another folder (an earlier session's copy) continues into a --checkpoint_dir that
    holds no checkpoints: saved beside others (another run's, or later steps), the resumed run's steps
    were not the newest, so --resume auto (the command a stopped run prints) continued another one,
    pruning deleted the resumed run's own first, and another run's best_model/ was its best to beat.
    An older checkpoint of this folder (or of its abandoned/) sets the later ones aside instead."""
    own = {checkpoint_dir.resolve(), (checkpoint_dir / ABANDONED).resolve()}
    if resumed.resolve().parent in own:
        return
    existing = list_checkpoints(checkpoint_dir)
    if not existing:
        return
    names = existing[0].name + (f" and {len(existing) - 1} more" if len(existing) > 1 else "")
    raise UserError(
        f"--checkpoint_dir {checkpoint_dir}: holds checkpoints already ({names}); a run resumed from "
        f"{given} would save its own beside them and --resume auto would then continue the newest: "
        f"--resume auto --checkpoint_dir {checkpoint_dir} continues the run there, or give an empty "
        "--checkpoint_dir"
    )


# a run's own files in its checkpoint folder, besides the checkpoints
RUN_FILES = (
    "best_model",
    "train_summary.json",
    "metrics.jsonl",
    "report.html",
    "report.zip",
    "loss_curve.png",
    "samples",
)


def check_fresh_folder(checkpoint_dir: Path) -> None:
    """A run starting without a checkpoint writes its files into --checkpoint_dir: refused when the folder
    holds the results of a run that had checkpoints (its train_summary.json, written at the end of every
    session that saved one, or a resumed session in its metrics: checkpoints deleted to save space, the
    new run's first evaluation replaced that best model and its metrics were appended to the old ones)
    or files of those names that are not a run's (the user's report.html was overwritten). A run killed
    before its first checkpoint leaves its metrics.jsonl and what it wrote from it, a best_model/ too
    when an evaluation came first: the same command starts again there, as before."""
    found = [name for name in RUN_FILES if (checkpoint_dir / name).exists()]
    if not found:
        return
    metrics = checkpoint_dir / "metrics.jsonl"
    if "train_summary.json" not in found and "metrics.jsonl" in found and _never_saved(metrics):
        return
    raise UserError(
        f"--checkpoint_dir {checkpoint_dir} holds {', '.join(found)} but no checkpoint to continue from (an "
        "earlier run's, or files of yours): a new run would write over them; choose another --checkpoint_dir "
        "(nothing is overwritten)"
    )


def _never_saved(metrics: Path) -> bool:
    """Whether metrics.jsonl is a run's (its first record one of a run's) that never resumed from a
    checkpoint (no session record of a resume)."""
    records = read_metrics(metrics)
    if not records or not ("event" in records[0] or "step" in records[0]):
        return False
    return not any(is_resume(r) for r in records)


# ---- the session --------------------------------------------------------------------------------


def check_inputs(cfg: TrainConfig, resumed: bool = False) -> None:
    """Everything that can be checked before anything is written (bad input writes nothing)."""
    try:
        data_dir = check_data_dir(cfg.data_dir)
    except UserError as err:
        if resumed and _restored(cfg, "data_dir"):  # from the checkpoint
            raise UserError(
                f"{err}; it is the resumed run's own --data_dir, from its checkpoint: on another machine, "
                "pass --data_dir where that data is now"
            ) from None
        raise
    rows, _ = read_metadata(data_dir / METADATA_NAME)
    if not rows:
        raise UserError(f"{data_dir / METADATA_NAME}: no usable rows (expected id|text|speaker lines)")
    for folder, flag in (
        (Path(cfg.checkpoint_dir), "--checkpoint_dir"),
        (Path(cfg.output_dir), "--output_dir"),
    ):
        if folder.exists() and not folder.is_dir():
            raise UserError(f"{flag} {folder}: exists and is not a folder")
    # the settings a resumed run took from its checkpoint, with the flags given: e.g. --best_metric
    # val_mel_dtw on a run of --freerun_samples 0, or a --micro_batch_size its step no longer divides
    cfg.validate(resumed=resumed)


def check_disk_space(folders: list[Path], needed: int) -> None:
    for folder in folders:
        free = shutil.disk_usage(folder).free
        if free < needed:
            raise UserError(
                f"not enough disk space in {folder}: {free / 2**30:.1f} GB free, about {needed / 2**30:.1f} GB "
                f"needed for two checkpoints and the exported models"
            )


def build_session(
    cfg: TrainConfig,
    process_start: float,
    data_fn: Callable | None = None,
    check_paths: Callable[[TrainConfig], None] | None = None,
) -> Session:
    """Set up a run from `cfg`. `data_fn(cfg, store, text, speakers, hop, val_ids, log) -> DataSplit`
    replaces the default split (train_feedback.py mixes feedback and replay clips there).
    `check_paths(cfg)`: the folder checks, again with a resumed run's own settings (train_vits.py).

    In order (steps 1, 5 and 7 write into --checkpoint_dir, 6 the clip caches; the rest only read):
    1. lock --checkpoint_dir (one run per folder; the lock stays in the session);
    2. the checkpoint to resume (--resume), else a folder that holds no earlier run's files;
    3. a resumed run's own settings from its checkpoint (resume_settings.py): `cfg` is rebound here;
    4. the folder and input checks, with those settings;
    5. a checkpoint from another folder brings its history and best model (carry.py);
    6. models, data, optimisers and state (`_build_session`: its own checks of disk, memory, sizes);
    7. a chosen older checkpoint of this folder sets its later ones aside.
    Bad input leaves nothing behind: the folders set-up creates before its last input check (the
    checkpoint dir, the clip caches) are removed again when a UserError ends it."""
    created_here = [Path(cfg.checkpoint_dir), Path(cfg.output_dir).parent, Path(cfg.data_dir) / "cache"]
    if getattr(cfg, "feedback_dir", None):
        created_here.append(Path(cfg.feedback_dir) / "cache")
    main = is_main_process()
    log = Logger(main)
    Logger.copy.to(None)  # an earlier run's log in this process is closed; this one's lines wait
    checkpoint_dir = Path(cfg.checkpoint_dir)
    with remove_created_on_error(created_here):
        # before anything reads or writes checkpoints: a second run on this folder stops here
        hint = functools.partial(_read_only_hint, checkpoint_dir)  # listed only if the lock cannot be made
        lock = RunLock.acquire(checkpoint_dir, "--checkpoint_dir", log, hint) if main else None
        try:
            ckpt = find_checkpoint(cfg, checkpoint_dir, log)
            if ckpt is None:  # every process, as the folder checks (_build_session)
                check_fresh_folder(checkpoint_dir)
            trainer_state = ckpt.json("trainer_state.json") if ckpt is not None else {}
            if ckpt is not None:
                cfg = restore_settings(
                    cfg,
                    trainer_state.get("config"),
                    log,
                    source=ckpt.path.name,
                    working_dir=trainer_state.get("working_dir"),
                )
            if check_paths is not None:
                check_paths(cfg)
            check_inputs(cfg, resumed=ckpt is not None)
            if ckpt is not None and main:  # resumed from another folder's checkpoint: its history too
                carry_history(ckpt.path.parent, checkpoint_dir, ckpt.step, ckpt.manifest["created"], log)
                best_step = trainer_state["train_state"].get("best_model_step")
                carry_best_model(ckpt.path.parent, checkpoint_dir, best_step, log)
            session = _build_session(cfg, process_start, data_fn, ckpt, trainer_state, log)
            if ckpt is not None and main and cfg.resume != "auto":  # once set-up found no bad input:
                # a chosen older checkpoint of this folder leaves the future of its later ones
                set_aside_later_checkpoints(checkpoint_dir, ckpt.path, ckpt.step, log)
        except BaseException:
            if lock is not None:
                lock.release()  # also removes the folder if this run created it and left it empty
            raise
    session.run_lock = lock
    if main:
        Logger.copy.to(checkpoint_dir / LOG_FILE)  # set up without error: the lines so far, then each
    return session


def _read_only_hint(checkpoint_dir: Path) -> str:
    """For a checkpoint folder that cannot be written, e.g. an earlier session's output attached
    read-only (a Kaggle input): how to continue its run from it into a writable folder."""
    newest = list_checkpoints(checkpoint_dir)[:1]
    if not newest:
        return "; a run writes its checkpoints there: choose a writable --checkpoint_dir"
    return f"; to continue its run from this copy: --resume {newest[0]} --checkpoint_dir <a writable folder>"


def _build_session(
    cfg: TrainConfig,
    process_start: float,
    data_fn: Callable | None,
    ckpt: LoadedCheckpoint | None,
    trainer_state: dict,
    log: Logger,
) -> Session:
    """The steps of a set-up, in order (the order matters: seeds, then what is written). `trainer_state`:
    the checkpoint's trainer_state.json ({} without one); `log`: build_session's, by RANK until the
    accelerator is made."""
    quiet_transformers()
    state, precision = _resumed_state(cfg, ckpt, trainer_state, log)
    torch.manual_seed(cfg.seed)
    model, text, model_dir, model_source = load_model(cfg, ckpt, log)  # a bad model path fails here
    check_segment_size(cfg, model)
    discriminator = load_or_create_discriminator(cfg, ckpt, model_dir, log)
    ckpt_bytes = estimate_checkpoint_bytes(model, discriminator)
    # on every process, though only the main one writes: one that passed would wait in make_accelerator
    # for a main process that has exited, until the launcher kills it (30 s later)
    _check_output_folders(cfg, ckpt_bytes, restored_output=ckpt is not None and _restored(cfg, "output_dir"))
    accelerator = make_accelerator(precision, cfg.cpu, cfg.report_to, Path(cfg.checkpoint_dir))
    # from here the main process is the accelerator's (Session.is_main), which the Session's log then
    # follows; under torchrun and accelerate launch it is RANK 0's, as before
    log = Logger(accelerator.is_main_process)
    _cudnn_benchmark_off(accelerator.device)
    _describe_start(accelerator, precision, model, model_source, ckpt, log)
    store, report = load_store(cfg, Path(cfg.data_dir), model.config.sampling_rate, accelerator, log)
    # the model as loaded, before --extend_vocab (check_vocabulary) and --num_speakers (resolve_speakers)
    # grow it: _describe_growth says what they added
    loaded = (_parameters(model), model.config.vocab_size, model.config.num_speakers)
    if ckpt is None:
        check_vocabulary(cfg, model, text, store, log)
    else:  # the vocabulary is the checkpoint's; data given anew may say what it lacks
        report_unknown_characters(text, store.texts, log)
    model, speakers = resolve_speakers(
        cfg.speakers_wanted(),
        model,
        store.speakers,
        trainer_state.get("speakers"),
        log,
        known=read_known_speakers(model_dir, log),  # an export's voices keep their ids
    )
    _describe_growth(model, *loaded, log)
    generator = make_generator(cfg, model, log, accelerator.device)
    data = (data_fn or split_data)(
        cfg, store, text, speakers, generator.hop_length, trainer_state.get("val_ids"), log
    )
    describe_data(data, report, log)
    # every clip left out, unreadable ones included, for train_summary.json: the log names three of a kind
    data.dropped = [*report.skipped, *data.dropped]
    saved_batch = (trainer_state.get("config") or {}).get("batch_size") if ckpt is not None else None
    key = epoch_clips_key(data.train, data.epoch_samples)
    note_earlier_clips(state, key, resumed=ckpt is not None)
    restart_epoch_if_regrouped(state, key, log, cfg.batch_size, saved_batch)
    rescale_epoch_position(state, accelerator.num_processes, log)  # a position kept: in this process count
    pad = None
    if cfg.buckets_on(accelerator.device.type):
        pad = PadLengths.for_items(
            generator.hop_length, [len(t) for t in data.train.token_ids], data.train.audio_lengths()
        )
    sampler, loader, val_loaders = make_loaders(cfg, data, accelerator, pad)
    g_opt, d_opt = _make_optimizers(cfg, generator, discriminator, ckpt)
    saved_budget = trainer_state["budget"] if ckpt is not None else None
    full_step = whole_step_samples(cfg.step_clips, accelerator.num_processes, data.samples_per_epoch)
    budget = _make_budget(cfg, process_start, ckpt_bytes, saved_budget, full_step)
    budget_lr = _make_lr_schedule(cfg, budget, trainer_state if ckpt is not None else None)
    g_sched = make_scheduler(g_opt, budget_lr)
    d_sched = make_scheduler(d_opt, budget_lr)
    generator_prepared, discriminator_prepared = _prepare(cfg, accelerator, generator, discriminator, ckpt)
    session = Session(
        cfg=cfg,
        accelerator=accelerator,
        log=log,
        model=model,
        text=text,
        generator=generator_prepared,
        generator_raw=generator,
        discriminator=discriminator_prepared,
        discriminator_raw=discriminator,
        g_optimizer=g_opt,
        d_optimizer=d_opt,
        g_scheduler=g_sched,
        d_scheduler=d_sched,
        budget=budget,
        budget_lr=budget_lr,
        speakers=speakers,
        data=data,
        sampler=sampler,
        loader=loader,
        val_loaders=val_loaders,
        pad=pad,
        state=state,
        checkpoint_dir=Path(cfg.checkpoint_dir),
        output_dir=Path(cfg.output_dir),
        resumed_from=ckpt.path if ckpt is not None else None,
        preload_seconds=report.seconds,
        model_source=model_source,
    )
    session.apply_peak_lr()
    return session


# ---- the steps of _build_session ------------------------------------------------------------------


def rescale_epoch_position(state: TrainState, processes: int, log) -> None:
    """A run resumed mid-epoch with another process count: each rank counts its own batches, dealt out
    in turn from the epoch's order (sampler.py), so the position is converted, rounded down (a batch
    or two again rather than some never; the first step may be short). Without it 2 -> 1 processes
    trained the epoch's first batches twice, and 1 -> 2 never trained half of those after them. The
    epoch's order is the same on every process count: a position restart_epoch_if_regrouped kept maps."""
    old, state.processes = state.processes, processes
    if old is None or old == processes or state.batch_in_epoch == 0:
        return
    taken = state.batch_in_epoch * old  # the epoch's batches trained, by every rank together
    state.batch_in_epoch = taken // processes
    log(
        f"resume: {old} process(es) had trained {taken} batches of epoch {state.epoch + 1}; with {processes}, "
        f"each starts at its batch {state.batch_in_epoch}"
    )


def epoch_clips_key(train, epoch_samples: int | None = None) -> str:
    """A digest of what the sampler orders an epoch by: the training clips' ids and lengths, in order,
    and the clips an epoch holds when that is not all of them (`epoch_samples`: a feedback round's
    replay draw, which --replay_ratio sizes; None keeps a plain run's key as it was)."""
    h = hashlib.blake2b(digest_size=16)
    for clip_id in train.ids():
        h.update(clip_id.encode() + b"\0")
    h.update(train.audio_lengths().astype("<i8").tobytes())
    if epoch_samples is not None:
        h.update(f"epoch:{int(epoch_samples)}".encode())
    return h.hexdigest()


def note_earlier_clips(state: TrainState, key: str, resumed: bool) -> None:
    """`state.other_clips_before`, before `key` (this session's epoch_clips_key) replaces the saved one:
    whether any session before this one trained on other clips (or another replay share), so that the
    model card, which counts this session's data, does not pass it off as all the run trained on. It
    stays True once set. Unknown (None) after a checkpoint from before it was kept, unless that
    checkpoint's key says its clips differ, or it was the first session's (its key says all)."""
    if not resumed:
        state.other_clips_before = False
    elif state.epoch_clips is not None and state.epoch_clips != key:
        state.other_clips_before = True
    elif state.other_clips_before is None and state.epoch_clips is not None and state.sessions == 1:
        state.other_clips_before = False


def restart_epoch_if_regrouped(
    state: TrainState, key: str, log, batch_size: int | None = None, saved_batch_size: int | None = None
) -> None:
    """The one rule for where a resumed epoch goes on. Its saved position counts batches of the epoch's
    order, which the sampler draws from the training clips (`key`, epoch_clips_key: their ids and
    lengths, how many an epoch draws) and cuts by --batch_size. When either differs from the
    checkpoint's run (data added or removed, --max_samples, a WAV replaced, a feedback round's
    --replay_ratio; another --batch_size), the position maps to other batches, and some clips would be
    skipped in the epoch and others trained twice (batch 4 -> 8 skipped 20 of 36): the epoch starts
    again instead. A checkpoint from before keys were kept (epoch_clips None) is taken as the same
    clips; the line says which of the two changed."""
    if state.batch_in_epoch and saved_batch_size not in (None, batch_size):
        log(
            f"resume: --batch_size {batch_size} (the checkpoint's run used {saved_batch_size}) groups epoch "
            f"{state.epoch + 1}'s clips anew: it starts again from its beginning"
        )
        state.batch_in_epoch = 0
    elif state.batch_in_epoch and state.epoch_clips not in (None, key):
        log(
            "resume: the training clips (or how many an epoch draws) differ from the checkpoint's run; "
            f"epoch {state.epoch + 1} is ordered anew and starts again from its beginning"
        )
        state.batch_in_epoch = 0
    state.epoch_clips = key


def _resumed_state(
    cfg: TrainConfig, ckpt: LoadedCheckpoint | None, trainer_state: dict, log
) -> tuple[TrainState, str]:
    """(the run's state, the precision to train in): a resumed run's state counts this session, and
    keeps a recovery's precision."""
    state = TrainState()
    if ckpt is not None:
        state = TrainState.from_dict(trainer_state.get("train_state", {}))
        state.sessions += 1
    precision = resolve_precision(cfg.mixed_precision, cfg.cpu, log=log)
    kept = state.precision
    if kept == "bf16" and precision == "fp16":  # this GPU has no native bf16 (the recovery's GPU had):
        kept = "no"  # the rung after fp16 here is fp32 (recovery.next_precision)
    if kept and kept != precision and precision != "no":
        log(
            f"precision: {kept}, not {precision}: an earlier session's recovery moved the run "
            f"off {precision} after repeated non-finite steps (kept for this session)"
        )
        precision = kept
    return state, precision


def _restored(cfg: TrainConfig, name: str) -> bool:
    """Whether a resumed run's `name` setting came from its checkpoint, not this command line."""
    return cfg.explicit is not None and name not in cfg.explicit


def _check_output_folders(cfg: TrainConfig, ckpt_bytes: int, restored_output: bool = False) -> None:
    """The checkpoint and output folders are writable and have room (main process, before writing).
    `restored_output`: --output_dir is the resumed run's own, which another machine may not have."""
    checkpoint_dir, output_dir = Path(cfg.checkpoint_dir), Path(cfg.output_dir)
    check_writable(checkpoint_dir, "--checkpoint_dir")
    try:
        check_writable(output_dir.parent, "--output_dir's parent folder")
    except UserError as err:
        if not restored_output:
            raise
        raise UserError(
            f"{err}; it is the resumed run's own --output_dir, from its checkpoint: on another machine, "
            "pass --output_dir where the final model should go"
        ) from None
    check_disk_space([checkpoint_dir, output_dir.parent], 2 * ckpt_bytes + ckpt_bytes // 3 * 2)


def _cudnn_benchmark_off(device: torch.device) -> None:
    """cuDNN's benchmark mode off on CUDA, for the whole process."""
    if device.type == "cuda":
        # benchmark mode tunes every conv again for each new shape (3.25 s against 1.00 s per step with a
        # new shape each step, bench/bench_step.py --cudnn_benchmark); length buckets still give ~100 shapes
        # over a few epochs (bench/bench_shapes.py), and whether tuning those pays back is not measured yet
        torch.backends.cudnn.benchmark = False


def _describe_start(accelerator, precision: str, model, model_source: str, ckpt, log) -> None:
    """The device, precision and model lines (and how to use idle GPUs); it changes no setting."""
    device = accelerator.device
    log(
        f"device: {device} ×{accelerator.num_processes}, precision: {precision}"
        + (f", GPU: {torch.cuda.get_device_name(device)}" if device.type == "cuda" else "")
    )
    if device.type == "cuda":
        note = idle_gpus_note(accelerator.num_processes, torch.cuda.device_count(), sys.argv)
        if note:
            log(note)
    log(f"model: {model_source} ({_parameters(model) / 1e6:.1f} M parameters)")
    if ckpt is not None:
        log(f"resuming from {ckpt.path.name} (step {ckpt.step}): the weights are the checkpoint's")


def _parameters(model) -> int:
    return sum(p.numel() for p in model.parameters())


def _describe_growth(model, parameters: int, vocab_size: int, num_speakers: int, log) -> None:
    """The parameters trained, when added letters (--extend_vocab) or speakers (--num_speakers) made
    them more than the start line's count of the model loaded (0.8 M said, 1.1 M trained, and a
    resumed session then said 1.1 M)."""
    before, after = f"{parameters / 1e6:.1f}", f"{_parameters(model) / 1e6:.1f}"
    if before == after:  # a few letters of a large model: the figure said holds
        return
    added = []
    if model.config.vocab_size > vocab_size:
        added.append(f"{model.config.vocab_size - vocab_size} letter(s)")
    if model.config.num_speakers > num_speakers:
        added.append(f"{model.config.num_speakers} speakers")
    log(f"model: {after} M parameters trained ({before} M loaded, the rest for {' and '.join(added)})")


def _make_optimizers(
    cfg: TrainConfig, generator, discriminator, ckpt: LoadedCheckpoint | None
) -> tuple[torch.optim.Optimizer, torch.optim.Optimizer]:
    """(generator's, discriminator's) optimiser; a resumed run's states restored."""
    g_opt = make_optimizer(generator.parameters(), cfg.learning_rate, cfg.weight_decay)
    d_opt = make_optimizer(discriminator.parameters(), cfg.learning_rate, cfg.weight_decay)
    if ckpt is not None:
        g_opt.load_state_dict(ckpt.object("optimizer_g.pt"))
        d_opt.load_state_dict(ckpt.object("optimizer_d.pt"))
    return g_opt, d_opt


def _make_budget(
    cfg: TrainConfig, process_start: float, ckpt_bytes: int, saved: dict | None, full_step: int = 0
) -> Budget:
    """This process's budget, with save/export estimates from the model's size until they are
    measured; a resumed run's `saved` budget state carries the time spent and the measured costs."""
    budget = Budget(
        cfg.target_seconds,
        process_start,
        total_seconds=cfg.total_hours * 3600 if cfg.total_hours else None,
        benchmark_samples=cfg.benchmark_samples,
        max_steps=cfg.max_steps,
        full_step_samples=full_step,
    )
    budget.set_estimates(save_seconds=1.0 + ckpt_bytes / 150e6, export_seconds=2.0 + ckpt_bytes / 3 / 150e6)
    if saved is not None:
        budget.load_state_dict(saved)
    return budget


def _make_lr_schedule(cfg: TrainConfig, budget: Budget, saved: dict | None) -> BudgetLR:
    """The learning-rate schedule that follows `budget`; from a resumed run's `saved` trainer_state,
    where its decay started (a checkpoint from before the schedule had its own state kept that in the
    budget's)."""
    budget_lr = BudgetLR(budget, cfg.warmup_steps, min_lr_ratio=cfg.min_lr_ratio, max_steps=cfg.max_steps)
    if saved is not None:
        budget_lr.load_state_dict(
            saved.get("lr_schedule") or {"decay_start": saved["budget"].get("lr_decay_start")}
        )
    return budget_lr


def _prepare(cfg: TrainConfig, accelerator, generator, discriminator, ckpt: LoadedCheckpoint | None):
    """The networks prepared by accelerate (not the optimisers: step.py steps both through one scaler);
    a resumed run's scaler and RNG restored; per-rank seeds."""
    generator_prepared, discriminator_prepared = accelerator.prepare(generator, discriminator)
    if ckpt is not None:
        if ckpt.has("scaler.pt") and accelerator.scaler is not None:
            accelerator.scaler.load_state_dict(ckpt.object("scaler.pt"))
        set_rng_state(ckpt.object("rng.pt"))
    if accelerator.process_index > 0:  # ranks draw their own noise and segments
        torch.manual_seed(cfg.seed + 1_000_003 * (ckpt.step if ckpt else 0) + accelerator.process_index)
    return generator_prepared, discriminator_prepared
