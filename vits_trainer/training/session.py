"""Everything one training process needs, built from its settings: device, model, data, optimisers,
budget, and the state of a resumed run. Shared by train_vits.py and train_feedback.py.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from safetensors import SafetensorError

from ..data.clipstore import ClipStore, load_clip_store
from ..data.items import TrainingItems, build_items, split_train_val
from ..data.loader import make_loader
from ..data.metadata import METADATA_NAME, read_metadata
from ..data.sampler import BucketBatchSampler
from ..data.text import TextEncoder, extend_vocabulary
from ..errors import UserError
from ..hub import resolve_model_dir
from ..model.discriminator import (
    DiscriminatorConfig,
    VitsDiscriminator,
    discriminator_from_state_dict,
    load_discriminator,
)
from ..model.speakers import resolve_speakers
from ..model.vits import VitsGenerator, apply_decoder_weight_norm, freeze_parts, load_vits_model
from ..runlock import RunLock, is_main_process
from ..safety import remove_created_on_error
from .budget import Budget
from .checkpoint import find_resumable, list_checkpoints, verify_checkpoint
from .config import TrainConfig
from .lr_schedule import BudgetLR, make_scheduler
from .modelfolder import check_model_folder
from .resume_settings import restore_settings
from .runtime import Logger, make_accelerator, quiet_transformers, resolve_precision
from .step import make_optimizer
from .trainstate import LoadedCheckpoint, TrainState, set_rng_state


@dataclass
class DataSplit:
    """The clips a run trains and validates on. `val_sets` maps a name to items; the first is primary."""

    store: ClipStore
    train: TrainingItems
    val_sets: dict[str, TrainingItems]
    val_ids: list[str]
    dropped: list[tuple[str, str]] = field(default_factory=list)
    # a custom batch sampler (e.g. feedback + a fresh replay draw each epoch); None = bucketed over `train`
    sampler: object | None = None
    epoch_samples: int | None = None  # samples one epoch of `sampler` yields; None = len(train)

    @property
    def samples_per_epoch(self) -> int:
        return self.epoch_samples if self.epoch_samples is not None else len(self.train)


@dataclass
class Session:
    cfg: TrainConfig
    accelerator: object
    log: Logger
    model: object  # the plain transformers VitsModel (unwrapped)
    text: TextEncoder
    generator: object  # VitsGenerator, prepared by accelerate
    generator_raw: VitsGenerator
    discriminator: object  # prepared by accelerate
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
    state: TrainState
    checkpoint_dir: Path
    output_dir: Path
    resumed_from: Path | None
    preload_seconds: float
    load_report: dict
    model_source: str
    run_lock: object | None = None  # runlock.RunLock of --checkpoint_dir (main process), released by the loop

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
        return LoadedCheckpoint(path, manifest) if path is not None else None
    path = Path(cfg.resume).expanduser()
    if not path.is_dir():
        raise UserError(f"--resume {cfg.resume}: no such checkpoint folder")
    try:
        manifest = verify_checkpoint(path)
    except Exception as err:
        raise UserError(f"--resume {cfg.resume}: not a usable checkpoint ({err})") from None
    return LoadedCheckpoint(path, manifest)


def load_model(
    cfg: TrainConfig, ckpt: LoadedCheckpoint | None, log
) -> tuple[object, TextEncoder, Path | None, str]:
    """(model with decoder weight norm, text encoder, model folder or None, description)."""
    if ckpt is not None:
        from transformers import VitsConfig, VitsModel

        with tempfile.TemporaryDirectory() as tmp:
            folder = ckpt.write_tokenizer(Path(tmp))
            text = TextEncoder.from_pretrained(folder)
            config = VitsConfig.from_pretrained(folder)
        model = VitsModel(config)
        apply_decoder_weight_norm(model)
        model.load_state_dict(ckpt.tensors("generator.safetensors"), strict=True)
        return model, text, None, f"checkpoint {ckpt.path}"
    model_dir = resolve_model_dir(cfg.model_name)
    check_model_folder(model_dir, "--model_name")  # a checkpoint or a truncated file: one clear line
    try:
        model = load_vits_model(model_dir)
    except (OSError, ValueError, RuntimeError, SafetensorError) as err:
        raise UserError(f"--model_name {cfg.model_name}: cannot load a VitsModel ({err})") from None
    text = TextEncoder.from_pretrained(model_dir)
    apply_decoder_weight_norm(model)
    return model, text, model_dir, str(model_dir)


def load_or_create_discriminator(
    cfg: TrainConfig, ckpt: LoadedCheckpoint | None, model_dir: Path | None, log
) -> VitsDiscriminator:
    if ckpt is not None:
        config = DiscriminatorConfig.from_dict(ckpt.json("discriminator_config.json"))
        return discriminator_from_state_dict(ckpt.tensors("discriminator.safetensors"), config)
    for folder, what in ((cfg.discriminator, "--discriminator"), (model_dir, "the model folder")):
        if not folder:
            continue
        folder = Path(folder)
        if what == "--discriminator" and not folder.is_dir():
            raise UserError(f"--discriminator {folder}: no such folder")
        try:
            disc = load_discriminator(folder)
        except ValueError as err:
            raise UserError(f"{what} {folder}: {err}") from None
        if disc is not None:
            log(f"discriminator: loaded from {folder}")
            return disc
        if what == "--discriminator":
            raise UserError(f"--discriminator {folder}: no discriminator.safetensors in it")
    log(
        "discriminator: none shipped with the model (MMS checkpoints have none); starting a fresh one "
        f"(width {cfg.discriminator_width})"
    )
    return VitsDiscriminator(DiscriminatorConfig(width=cfg.discriminator_width))


def report_unknown_characters(text: TextEncoder, texts: list[str], log) -> list[str]:
    missing = text.unknown_characters(texts)
    if missing:
        shown = ", ".join(f"{ch!r}×{n}" for ch, n in missing.most_common(15))
        more = f" and {len(missing) - 15} more" if len(missing) > 15 else ""
        log(f"characters the model's vocabulary lacks (the tokenizer drops them): {shown}{more}")
    return list(missing)


def load_store(
    cfg: TrainConfig, data_dir: Path, sample_rate: int, accelerator, log
) -> tuple[ClipStore, object]:
    """The clip store, built once: the main process fills the cache, the others then read it."""
    if not data_dir.is_dir():
        raise UserError(f"--data_dir {data_dir}: no such folder (run prepare_data.py first)")
    with accelerator.main_process_first():
        store, report = load_clip_store(
            data_dir,
            sample_rate,
            max_ram_gb=cfg.max_ram_gb,
            log=log,
            progress=accelerator.is_main_process,
        )
    return store, report


def split_data(
    cfg: TrainConfig,
    store: ClipStore,
    text: TextEncoder,
    speakers: dict[str, int],
    hop: int,
    val_ids: list[str] | None,
    log,
) -> DataSplit:
    """Train/validation items. A resumed run passes its stored `val_ids` so the split never moves."""
    positions = np.arange(len(store))
    if cfg.max_samples:
        positions = positions[: cfg.max_samples]
    ids = [store.ids[i] for i in positions]
    if val_ids is None:
        val_pos = split_train_val(ids, cfg.val_fraction, seed=cfg.seed)[1] if cfg.val_fraction > 0 else []
        val_ids = [ids[i] for i in val_pos]
    wanted = set(val_ids)
    val_idx = [int(positions[i]) for i, clip_id in enumerate(ids) if clip_id in wanted]
    train_idx = [int(positions[i]) for i, clip_id in enumerate(ids) if clip_id not in wanted]
    missing = len(wanted) - len(val_idx)
    if missing:
        log(f"warning: {missing} validation clip(s) of the earlier run are no longer in the data")
    train, dropped = build_items(store, train_idx, text.encode, speakers, hop, log=log)
    val, dropped_val = build_items(store, val_idx, text.encode, speakers, hop, log=log)
    if len(train) == 0:
        raise UserError(f"no usable training clips in {cfg.data_dir} (see the warnings above)")
    if len(val) == 0 and cfg.val_fraction > 0:
        log("warning: no usable validation clips: no validation, no best_model")
    return DataSplit(store, train, {"val": val} if len(val) else {}, val_ids, dropped + dropped_val)


def estimate_checkpoint_bytes(*modules: torch.nn.Module) -> int:
    params = sum(p.numel() for m in modules for p in m.parameters())
    return params * 4 * 3  # weights + two AdamW moments, fp32


# ---- the session --------------------------------------------------------------------------------


def check_inputs(cfg: TrainConfig) -> None:
    """Everything that can be checked before anything is written (bad input writes nothing)."""
    data_dir = Path(cfg.data_dir)
    if not data_dir.is_dir():
        raise UserError(f"--data_dir {data_dir}: no such folder (run prepare_data.py first)")
    rows, _ = read_metadata(data_dir / METADATA_NAME)
    if not rows:
        raise UserError(f"{data_dir / METADATA_NAME}: no usable rows (expected id|text|speaker lines)")
    for folder, flag in (
        (Path(cfg.checkpoint_dir), "--checkpoint_dir"),
        (Path(cfg.output_dir), "--output_dir"),
    ):
        if folder.exists() and not folder.is_dir():
            raise UserError(f"{flag} {folder}: exists and is not a folder")
    cfg.forced_micro_batch()  # a resumed run's --micro_batch_size must still divide its step's batch


def check_disk_space(folders: list[Path], needed: int) -> None:
    for folder in folders:
        free = shutil.disk_usage(folder).free
        if free < needed:
            raise UserError(
                f"not enough disk space in {folder}: {free / 2**30:.1f} GB free, about {needed / 2**30:.1f} GB "
                f"needed for two checkpoints and the exported models"
            )


def apply_lr_scale(s: Session) -> None:
    """--learning_rate times the scale left by recoveries, as the peak of both schedules."""
    peak = s.cfg.learning_rate * s.state.lr_scale
    for optimizer, scheduler in ((s.g_optimizer, s.g_scheduler), (s.d_optimizer, s.d_scheduler)):
        scheduler.base_lrs = [peak for _ in optimizer.param_groups]
        for group in optimizer.param_groups:
            group["initial_lr"] = peak
            group["lr"] = peak * s.budget_lr.factor(s.budget.global_step)


def build_session(
    cfg: TrainConfig,
    process_start: float,
    data_fn: Callable | None = None,
) -> Session:
    """Set up a run from `cfg`. `data_fn(cfg, store, text, speakers, hop, val_ids, log) -> DataSplit`
    replaces the default split (train_feedback.py mixes feedback and replay clips there).

    The main process first locks --checkpoint_dir (one run per folder) and keeps the lock in the
    session; a resumed run then takes its settings from its checkpoint (resume_settings.py).
    Bad input leaves nothing behind: the folders set-up creates before its last input check (the
    checkpoint dir, the clip caches) are removed again when a UserError ends it."""
    created_here = [Path(cfg.checkpoint_dir), Path(cfg.output_dir).parent, Path(cfg.data_dir) / "cache"]
    if getattr(cfg, "feedback_dir", None):
        created_here.append(Path(cfg.feedback_dir) / "cache")
    main = is_main_process()
    log = Logger(main)
    checkpoint_dir = Path(cfg.checkpoint_dir)
    with remove_created_on_error(created_here):
        # before anything reads or writes checkpoints: a second run on this folder stops here
        lock = RunLock.acquire(checkpoint_dir, "--checkpoint_dir", log) if main else None
        try:
            ckpt = find_checkpoint(cfg, checkpoint_dir, log)
            if ckpt is not None:
                saved = ckpt.json("trainer_state.json").get("config")
                cfg = restore_settings(cfg, saved, log, source=ckpt.path.name)
            check_inputs(cfg)
            session = _build_session(cfg, process_start, data_fn, ckpt)
        except BaseException:
            if lock is not None:
                lock.release()  # also removes the folder if this run created it and left it empty
            raise
    session.run_lock = lock
    return session


def _build_session(
    cfg: TrainConfig, process_start: float, data_fn: Callable | None, ckpt: LoadedCheckpoint | None
) -> Session:
    main = is_main_process()
    log = Logger(main)
    quiet_transformers()
    checkpoint_dir = Path(cfg.checkpoint_dir)
    output_dir = Path(cfg.output_dir)
    trainer_state = ckpt.json("trainer_state.json") if ckpt is not None else {}
    state = TrainState.from_dict(trainer_state.get("train_state", {})) if ckpt is not None else TrainState()
    precision = resolve_precision(cfg.mixed_precision, cfg.cpu, log=log)
    if state.precision and state.precision != precision and precision != "no":
        log(f"precision: {state.precision} (an earlier recovery left {precision}; kept for this session)")
        precision = state.precision

    torch.manual_seed(cfg.seed)
    model, text, model_dir, model_source = load_model(cfg, ckpt, log)  # a bad model path fails here
    discriminator = load_or_create_discriminator(cfg, ckpt, model_dir, log)
    ckpt_bytes = estimate_checkpoint_bytes(model, discriminator)
    if main:  # from here on files are written
        check_writable(checkpoint_dir, "--checkpoint_dir")
        check_writable(output_dir.parent, "--output_dir's parent folder")
        check_disk_space([checkpoint_dir, output_dir.parent], 2 * ckpt_bytes + ckpt_bytes // 3 * 2)
    accelerator = make_accelerator(
        precision, cfg.cpu, cfg.report_to, checkpoint_dir, find_unused_parameters=model.config.layerdrop > 0
    )
    log = Logger(accelerator.is_main_process)
    device = accelerator.device
    log(
        f"device: {device} ×{accelerator.num_processes}, precision: {precision}"
        + (f", GPU: {torch.cuda.get_device_name(device)}" if device.type == "cuda" else "")
    )
    if device.type == "cuda":
        # off: every batch has its own padded lengths, and benchmark mode re-tunes every conv for each
        # new shape (seconds per step at first; measured in bench/bench_step.py --cudnn_benchmark)
        torch.backends.cudnn.benchmark = False
    log(f"model: {model_source} ({sum(p.numel() for p in model.parameters()) / 1e6:.1f} M parameters)")
    if ckpt is not None:
        log(f"resuming from {ckpt.path.name} (step {ckpt.step}); --model_name is not used on resume")

    store, report = load_store(cfg, Path(cfg.data_dir), model.config.sampling_rate, accelerator, log)
    if ckpt is None:
        unknown = report_unknown_characters(text, store.texts, log)
        if unknown and cfg.extend_vocab:
            added = extend_vocabulary(model, text, unknown, Path(tempfile.mkdtemp(prefix="vocab-")))
            log(f"vocabulary extended by {len(added)} character(s): {''.join(added)!r}")
        elif unknown and "extend_vocab" not in cfg.hidden_flags:
            log("  (pass --extend_vocab to add them to the vocabulary instead)")
    model, speakers = resolve_speakers(cfg, model, store.speakers, trainer_state.get("speakers"), log)

    generator = VitsGenerator(
        model, segment_frames=max(1, cfg.segment_size // _hop(model)), mas_backend=cfg.mas_backend
    )
    if cfg.freeze:
        parts = [p.strip() for p in cfg.freeze.split(",") if p.strip()]
        try:
            freeze_parts(model, parts)
        except ValueError as err:
            raise UserError(f"--freeze: {err}") from None
        if not any(p.requires_grad for p in model.parameters()):
            raise UserError("--freeze: every part of the generator is frozen; nothing would train")
        log(f"frozen (not trained): {', '.join(parts)}")
    if cfg.gradient_checkpointing:
        generator.enable_gradient_checkpointing()
    val_ids = trainer_state.get("val_ids")
    data = (data_fn or split_data)(cfg, store, text, speakers, generator.hop_length, val_ids, log)
    log(
        f"data: {len(data.train)} training clips ({_hours(data.train):.2f} h), "
        + ", ".join(f"{len(v)} {k}" for k, v in data.val_sets.items())
        + f"; loaded in {report.seconds:.1f} s ({'cache' if report.cache_hit else 'built cache'}, "
        f"{'RAM' if report.in_ram else 'memory-mapped'})"
    )
    if report.skipped:
        log(f"warning: {len(report.skipped)} clip(s) could not be read and are skipped")

    sampler = data.sampler or BucketBatchSampler(
        data.train.audio_lengths(),
        cfg.batch_size,
        shuffle=True,
        seed=cfg.seed,
        num_replicas=accelerator.num_processes,
        rank=accelerator.process_index,
    )
    pin = device.type == "cuda"
    loader = make_loader(data.train, sampler, cfg.num_workers, pin)
    val_loaders = {
        name: make_loader(
            items, BucketBatchSampler(items.audio_lengths(), cfg.batch_size, shuffle=False), 0, pin
        )
        for name, items in data.val_sets.items()
    }

    g_opt = make_optimizer(generator.parameters(), cfg.learning_rate, cfg.weight_decay)
    d_opt = make_optimizer(discriminator.parameters(), cfg.learning_rate, cfg.weight_decay)
    budget = Budget(
        cfg.target_seconds,
        process_start,
        total_seconds=cfg.total_hours * 3600 if cfg.total_hours else None,
        benchmark_samples=cfg.benchmark_samples,
    )
    budget.set_estimates(save_seconds=1.0 + ckpt_bytes / 150e6, export_seconds=2.0 + ckpt_bytes / 3 / 150e6)
    if ckpt is not None:
        budget.load_state_dict(trainer_state["budget"])
        g_opt.load_state_dict(ckpt.object("optimizer_g.pt"))
        d_opt.load_state_dict(ckpt.object("optimizer_d.pt"))
    budget_lr = BudgetLR(budget, cfg.warmup_steps, min_lr_ratio=cfg.min_lr_ratio)
    g_sched = make_scheduler(g_opt, budget_lr)
    d_sched = make_scheduler(d_opt, budget_lr)

    generator_prepared, discriminator_prepared = accelerator.prepare(generator, discriminator)
    if ckpt is not None:
        if ckpt.has("scaler.pt") and accelerator.scaler is not None:
            accelerator.scaler.load_state_dict(ckpt.object("scaler.pt"))
        set_rng_state(ckpt.object("rng.pt"))
        state.sessions += 1
    if accelerator.process_index > 0:  # ranks draw their own noise and segments
        torch.manual_seed(cfg.seed + 1_000_003 * (ckpt.step if ckpt else 0) + accelerator.process_index)
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
        state=state,
        checkpoint_dir=checkpoint_dir,
        output_dir=output_dir,
        resumed_from=ckpt.path if ckpt is not None else None,
        preload_seconds=report.seconds,
        load_report=report.to_dict(),
        model_source=model_source,
    )
    apply_lr_scale(session)  # the peak is always this session's --learning_rate (x recoveries' scale)
    if state.split > 1:
        log(f"micro-batch: divided by {state.split} (an earlier out-of-memory retry)")
    return session


def _hop(model) -> int:
    import math

    return math.prod(model.config.upsample_rates)


def _hours(items: TrainingItems) -> float:
    return float(items.audio_lengths().sum()) / items.sample_rate / 3600
