"""The networks a run trains: the VITS model from a model folder or a checkpoint, the discriminator
(the checkpoint's, --discriminator, the model folder's, or a fresh one) and the generator wrapper.

Apart from session.py so the set-up reads as its steps; these are the model steps.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch
from safetensors import SafetensorError

from ..data.text import TextEncoder
from ..errors import UserError
from ..hub import resolve_model_dir
from ..model.discriminator import (
    DiscriminatorConfig,
    VitsDiscriminator,
    discriminator_from_state_dict,
    load_discriminator,
)
from ..model.vits import VitsGenerator, apply_decoder_weight_norm, freeze_parts, load_vits_model
from .config import TrainConfig, check_discriminator_dir
from .modelfolder import check_model_folder
from .runtime import resolve_mas_backend
from .trainstate import LoadedCheckpoint


def load_model(
    cfg: TrainConfig, ckpt: LoadedCheckpoint | None, log
) -> tuple[object, TextEncoder, Path | None, str]:
    """(model with decoder weight norm, text encoder, model folder or None, description)."""
    if ckpt is not None:
        model, text = model_from_checkpoint(ckpt)
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


def model_from_checkpoint(ckpt: LoadedCheckpoint) -> tuple[object, TextEncoder]:
    """The checkpoint's VITS model (decoder weight norm on, as it trains) and its text encoder."""
    from transformers import VitsConfig, VitsModel

    with tempfile.TemporaryDirectory() as tmp:
        folder = ckpt.write_tokenizer(Path(tmp))
        text = TextEncoder.from_pretrained(folder)
        config = VitsConfig.from_pretrained(folder)
    model = VitsModel(config)
    apply_decoder_weight_norm(model)
    model.load_state_dict(ckpt.tensors("generator.safetensors"), strict=True)
    return model, text


def load_or_create_discriminator(
    cfg: TrainConfig, ckpt: LoadedCheckpoint | None, model_dir: Path | None, log
) -> VitsDiscriminator:
    if ckpt is not None:
        config = DiscriminatorConfig.from_dict(ckpt.json("discriminator_config.json"))
        return discriminator_from_state_dict(ckpt.tensors("discriminator.safetensors"), config)
    for folder, what in ((cfg.discriminator, "--discriminator"), (model_dir, "the model folder")):
        if not folder:
            continue
        folder = check_discriminator_dir(folder) if what == "--discriminator" else Path(folder)
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


def estimate_checkpoint_bytes(*modules: torch.nn.Module) -> int:
    params = sum(p.numel() for m in modules for p in m.parameters())
    return params * 4 * 3  # weights + two AdamW moments, fp32


def check_segment_size(cfg: TrainConfig, model) -> None:
    """--segment_size, in audio samples, holds at least one window of the spectrogram the mel loss takes
    of each decoded segment (a shorter one failed in the first step, with a traceback)."""
    window = (model.config.spectrogram_bins - 1) * 2  # the n_fft of SpectrogramFrontEnd.from_config
    if cfg.segment_size < window:
        raise UserError(
            f"--segment_size {cfg.segment_size}: at least {window} samples for this model (its spectrogram's "
            f"window; the unit is audio samples, {_hop(model)} per frame); VITS uses 8192"
        )


def make_generator(cfg: TrainConfig, model, log, device: torch.device) -> VitsGenerator:
    """The training wrapper of the model, with --freeze and --gradient_checkpointing applied, its alignment
    search one that runs on `device`."""
    generator = VitsGenerator(
        model,
        segment_frames=max(1, cfg.segment_size // _hop(model)),
        mas_backend=resolve_mas_backend(cfg.mas_backend, device, log),
    )
    # from_pretrained leaves a model in evaluation mode: without this, its dropouts and the text
    # encoder's layer drop stayed off until an evaluation set train mode back, so a resumed run (no
    # start evaluation) and one without a validation set trained in evaluation mode
    generator.train()
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
    return generator


def _hop(model) -> int:
    import math

    return math.prod(model.config.upsample_rates)
