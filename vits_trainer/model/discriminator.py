"""The VITS discriminator: HiFi-GAN's multi-period discriminator plus one scale discriminator.

Layout follows the original VITS `MultiPeriodDiscriminator` (Kim et al. 2021) so that its `net_d`
checkpoints (and MMS's `D_*.pth`) convert key for key: `discriminators.0` is the scale discriminator on
the raw waveform, `discriminators.1..N` the period discriminators, each with `convs` and `conv_post`.

transformers ships only the generator (`VitsModel`), so fine-tuning needs this module alongside it.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils.parametrizations import spectral_norm, weight_norm

WEIGHTS_NAME = "discriminator.safetensors"
CONFIG_NAME = "discriminator_config.json"
LRELU_SLOPE = 0.1


@dataclass
class DiscriminatorConfig:
    periods: tuple[int, ...] = (2, 3, 5, 7, 11)
    # Multiplies every hidden channel count; 1.0 is the VITS / MMS size, small values make test models.
    width: float = 1.0
    # VITS passes one flag to every sub-discriminator; its configs all leave it off.
    use_spectral_norm: bool = False

    def __post_init__(self) -> None:
        self.periods = tuple(int(p) for p in self.periods)
        if not self.periods or any(p < 1 for p in self.periods):
            raise ValueError(f"periods must be positive integers (got {' '.join(map(str, self.periods))})")
        if not (math.isfinite(self.width) and self.width > 0):
            raise ValueError(f"width must be positive (got {self.width}); 1.0 is the VITS / MMS size")

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["periods"] = list(self.periods)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DiscriminatorConfig:
        # Unknown keys are ignored so a config written by a newer version still loads.
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


def _channels(base: int, width: float) -> int:
    return max(1, int(round(base * width)))


def _groups(base_groups: int, in_ch: int, out_ch: int) -> int:
    # Largest divisor of the original group count that still divides both channel counts;
    # unchanged at width 1.0.
    return math.gcd(base_groups, math.gcd(in_ch, out_ch))


class _Norm:
    """Wraps a conv in weight norm (default) or spectral norm, as VITS's `use_spectral_norm` does."""

    def __init__(self, spectral: bool) -> None:
        self.spectral = spectral

    def __call__(self, module: nn.Module) -> nn.Module:
        return spectral_norm(module) if self.spectral else weight_norm(module)


def _conv_stack(convs: nn.ModuleList, conv_post: nn.Module, x: Tensor) -> tuple[Tensor, list[Tensor]]:
    """Leaky-ReLU conv stack; returns (flattened logits, every layer's output as feature maps)."""
    fmap = []
    for conv in convs:
        x = F.leaky_relu(conv(x), LRELU_SLOPE)
        fmap.append(x)
    x = conv_post(x)
    fmap.append(x)
    return torch.flatten(x, 1, -1), fmap


class ScaleDiscriminator(nn.Module):
    """1-D conv stack on the raw waveform (HiFi-GAN's `DiscriminatorS`)."""

    # (in, out, kernel, stride, groups, padding) at width 1.0; in=1 means the waveform itself.
    LAYERS = (
        (1, 16, 15, 1, 1, 7),
        (16, 64, 41, 4, 4, 20),
        (64, 256, 41, 4, 16, 20),
        (256, 1024, 41, 4, 64, 20),
        (1024, 1024, 41, 4, 256, 20),
        (1024, 1024, 5, 1, 1, 2),
    )

    def __init__(self, width: float = 1.0, use_spectral_norm: bool = False) -> None:
        super().__init__()
        norm = _Norm(use_spectral_norm)
        convs = []
        for in_base, out_base, kernel, stride, groups, padding in self.LAYERS:
            in_ch = 1 if in_base == 1 else _channels(in_base, width)
            out_ch = _channels(out_base, width)
            g = _groups(groups, in_ch, out_ch)
            convs.append(norm(nn.Conv1d(in_ch, out_ch, kernel, stride, groups=g, padding=padding)))
        self.convs = nn.ModuleList(convs)
        self.conv_post = norm(nn.Conv1d(_channels(1024, width), 1, 3, 1, padding=1))

    def forward(self, x: Tensor) -> tuple[Tensor, list[Tensor]]:
        return _conv_stack(self.convs, self.conv_post, x)


class PeriodDiscriminator(nn.Module):
    """2-D conv stack over the waveform folded into rows of `period` samples (HiFi-GAN's `DiscriminatorP`)."""

    CHANNELS = (32, 128, 512, 1024, 1024)
    KERNEL = 5
    STRIDE = 3

    def __init__(self, period: int, width: float = 1.0, use_spectral_norm: bool = False) -> None:
        super().__init__()
        self.period = period
        norm = _Norm(use_spectral_norm)
        pad = (self.KERNEL - 1) // 2
        convs = []
        in_ch = 1
        for i, base in enumerate(self.CHANNELS):
            out_ch = _channels(base, width)
            # The last layer keeps the time resolution (stride 1), as in HiFi-GAN.
            stride = 1 if i == len(self.CHANNELS) - 1 else self.STRIDE
            convs.append(norm(nn.Conv2d(in_ch, out_ch, (self.KERNEL, 1), (stride, 1), padding=(pad, 0))))
            in_ch = out_ch
        self.convs = nn.ModuleList(convs)
        self.conv_post = norm(nn.Conv2d(in_ch, 1, (3, 1), 1, padding=(1, 0)))

    def forward(self, x: Tensor) -> tuple[Tensor, list[Tensor]]:
        batch, channels, length = x.shape
        if length % self.period:
            # Reflect padding needs fewer pad samples than the signal length; fall back for tiny inputs.
            n_pad = self.period - length % self.period
            x = F.pad(x, (0, n_pad), "reflect" if n_pad < length else "replicate")
            length += n_pad
        x = x.view(batch, channels, length // self.period, self.period)
        return _conv_stack(self.convs, self.conv_post, x)


class VitsDiscriminator(nn.Module):
    """One scale discriminator followed by one period discriminator per configured period."""

    def __init__(self, config: DiscriminatorConfig | None = None) -> None:
        super().__init__()
        self.config = config or DiscriminatorConfig()
        cfg = self.config
        discs: list[nn.Module] = [ScaleDiscriminator(cfg.width, cfg.use_spectral_norm)]
        discs += [PeriodDiscriminator(p, cfg.width, cfg.use_spectral_norm) for p in cfg.periods]
        self.discriminators = nn.ModuleList(discs)

    def forward(self, waveform: Tensor) -> tuple[list[Tensor], list[list[Tensor]]]:
        """waveform [B, 1, T] (or [B, T]) -> (logits [B, -1] per sub-discriminator, their feature maps)."""
        if waveform.dim() == 2:
            waveform = waveform.unsqueeze(1)
        if waveform.dim() != 3 or waveform.shape[1] != 1:
            raise ValueError(f"expected a waveform of shape [B, 1, T], got {tuple(waveform.shape)}")
        logits, fmaps = [], []
        for disc in self.discriminators:
            out, fmap = disc(waveform)
            logits.append(out)
            fmaps.append(fmap)
        return logits, fmaps


def count_parameters(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


# --- persistence --------------------------------------------------------------------------------------


def _atomic_write_bytes(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_bytes(data)
    os.replace(tmp, path)  # into an export's temp folder (vits.export_model extras)


def save_discriminator(disc: VitsDiscriminator, folder: str | os.PathLike) -> Path:
    """Write `discriminator.safetensors` + `discriminator_config.json` into `folder`; return the folder.

    Each file is written under a temporary name and moved into place, so an interrupted save never leaves
    a truncated file where a checkpoint is expected.
    """
    from safetensors.torch import save

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().cpu().contiguous() for k, v in disc.state_dict().items()}
    _atomic_write_bytes(folder / WEIGHTS_NAME, save(tensors, metadata={"format": "pt"}))
    config_text = json.dumps(disc.config.to_dict(), indent=2) + "\n"
    _atomic_write_bytes(folder / CONFIG_NAME, config_text.encode("utf-8"))
    return folder


def _width_hint(state_dict: dict[str, Tensor]) -> str:
    # The first scale conv has 16 * width output channels; saying so turns a wall of shape errors
    # into an actionable "use --width".
    for key in (
        "discriminators.0.convs.0.parametrizations.weight.original1",
        "discriminators.0.convs.0.bias",
    ):
        if key in state_dict:
            channels = state_dict[key].shape[0]
            return f" (the checkpoint's first scale conv has {channels} channels: width ~ {channels / 16:g})"
    return ""


def discriminator_from_state_dict(
    state_dict: dict[str, Tensor], config: DiscriminatorConfig | None = None
) -> VitsDiscriminator:
    """Build a discriminator for `config` and load `state_dict` into it; every key must match exactly.

    Raises ValueError naming missing keys, unexpected keys and shape mismatches.
    """
    disc = VitsDiscriminator(config)
    expected = disc.state_dict()
    missing = sorted(set(expected) - set(state_dict))
    unexpected = sorted(set(state_dict) - set(expected))
    mismatched = [
        f"{k}: checkpoint {tuple(state_dict[k].shape)} vs model {tuple(expected[k].shape)}"
        for k in sorted(set(expected) & set(state_dict))
        if tuple(state_dict[k].shape) != tuple(expected[k].shape)
    ]
    problems = []
    if missing:
        problems.append(f"{len(missing)} missing key(s): {_preview(missing)}")
    if unexpected:
        problems.append(f"{len(unexpected)} unexpected key(s): {_preview(unexpected)}")
    if mismatched:
        problems.append(f"{len(mismatched)} shape mismatch(es): {_preview(mismatched)}")
    if problems:
        cfg = disc.config
        raise ValueError(
            f"discriminator weights do not fit periods={list(cfg.periods)} width={cfg.width:g}: "
            + "; ".join(problems)
            + _width_hint(state_dict)
        )
    disc.load_state_dict(state_dict, strict=True)
    return disc


def _preview(items: list[str], limit: int = 8) -> str:
    shown = ", ".join(items[:limit])
    return shown + (f", ... (+{len(items) - limit} more)" if len(items) > limit else "")


def load_discriminator(
    folder: str | os.PathLike, map_location: str | torch.device = "cpu"
) -> VitsDiscriminator | None:
    """Load a discriminator saved by `save_discriminator`; None when `folder` has no weights file.

    A missing config file means the default (VITS-size) configuration.
    """
    from safetensors.torch import load_file

    folder = Path(folder)
    weights = folder / WEIGHTS_NAME
    if not weights.is_file():
        return None
    config_path = folder / CONFIG_NAME
    config = (
        DiscriminatorConfig.from_dict(json.loads(config_path.read_text(encoding="utf-8")))
        if config_path.is_file()
        else DiscriminatorConfig()
    )
    state_dict = load_file(str(weights), device="cpu")
    try:
        disc = discriminator_from_state_dict(state_dict, config)
    except ValueError as err:
        raise ValueError(f"{weights}: {err}") from None
    return disc.to(map_location)


# --- conversion from the original VITS / MMS checkpoints ---------------------------------------------

_WEIGHT_NORM = {
    "weight_g": "parametrizations.weight.original0",
    "weight_v": "parametrizations.weight.original1",
}
_SPECTRAL_NORM = {
    "weight_orig": "parametrizations.weight.original",
    "weight_u": "parametrizations.weight.0._u",
    "weight_v": "parametrizations.weight.0._v",
}
_SUFFIX = re.compile(r"^(.*)\.(weight_g|weight_v|weight_orig|weight_u)$")


def convert_original_discriminator(
    state_dict: dict[str, Any], use_spectral_norm: bool = False
) -> dict[str, Tensor]:
    """Rename an original VITS / MMS `net_d` state dict (old-style `weight_g` / `weight_v`) to our keys.

    Accepts the whole training checkpoint (weights nested under "model") and DataParallel's "module."
    prefix. Keys already in our naming pass through unchanged. Matching against a model is left to
    `discriminator_from_state_dict`, which lists anything that does not fit.
    """
    if isinstance(state_dict.get("model"), dict):
        state_dict = state_dict["model"]
    renames = _SPECTRAL_NORM if use_spectral_norm else _WEIGHT_NORM
    out: dict[str, Tensor] = {}
    for key, value in state_dict.items():
        if not isinstance(value, Tensor):
            raise ValueError(f"checkpoint entry {key!r} is a {type(value).__name__}, not a tensor")
        if key.startswith("module."):
            key = key[len("module.") :]
        match = _SUFFIX.match(key)
        if match and match.group(2) in renames:
            key = f"{match.group(1)}.{renames[match.group(2)]}"
        if key in out:
            raise ValueError(f"checkpoint has two entries for {key!r} after conversion")
        out[key] = value
    return out


def _main(argv: list[str] | None = None) -> int:
    from ..errors import UserError

    parser = argparse.ArgumentParser(
        prog="python -m vits_trainer.model.discriminator",
        description="Convert an original VITS / MMS discriminator checkpoint (D_*.pth) "
        "to this package's format.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    conv = sub.add_parser("convert", help="D_xxx.pth -> OUT_FOLDER/discriminator.safetensors")
    conv.add_argument("checkpoint", type=Path, help="original discriminator checkpoint (.pth)")
    conv.add_argument("out_folder", type=Path, help="folder to write discriminator.safetensors into")
    conv.add_argument("--width", type=float, default=1.0, help="channel multiplier (1.0 = VITS / MMS)")
    conv.add_argument(
        "--periods", type=int, nargs="+", default=[2, 3, 5, 7, 11], help="period discriminators' periods"
    )
    conv.add_argument(
        "--spectral_norm", action="store_true", help="checkpoint was trained with spectral norm"
    )
    args = parser.parse_args(argv)

    # a width or period the config refuses, an out_folder that is a file: tracebacks, once
    try:
        config = DiscriminatorConfig(
            periods=tuple(args.periods), width=args.width, use_spectral_norm=args.spectral_norm
        )
    except ValueError as err:
        raise UserError(f"--{err}") from None
    if args.out_folder.exists() and not args.out_folder.is_dir():
        raise UserError(f"{args.out_folder}: exists and is a file, not a folder: choose another out_folder")
    if not args.checkpoint.is_file():
        raise UserError(f"{args.checkpoint}: no such file")
    try:
        # weights_only: a checkpoint is data, never code to unpickle.
        raw = torch.load(args.checkpoint, map_location="cpu", weights_only=True)
    except Exception as err:
        # torch's own message runs over many lines (a text file's contents, advice on weights_only)
        reason = (str(err).strip().splitlines() or [type(err).__name__])[0].split(". ")[0][:200]
        raise UserError(
            f"{args.checkpoint}: cannot read as a weights-only torch checkpoint ({reason})"
        ) from None
    if not isinstance(raw, dict):
        raise UserError(f"{args.checkpoint}: expected a state dict, found a {type(raw).__name__}")
    try:
        disc = discriminator_from_state_dict(convert_original_discriminator(raw, args.spectral_norm), config)
    except ValueError as err:
        raise UserError(f"{args.checkpoint}: {err}") from None
    try:
        save_discriminator(disc, args.out_folder)
    except OSError as err:
        raise UserError(f"{args.out_folder}: cannot write into it ({err.strerror or err})") from None
    print(
        f"wrote {args.out_folder / WEIGHTS_NAME} ({count_parameters(disc) / 1e6:.2f} M parameters, "
        f"periods {list(config.periods)}, width {config.width:g})"
    )
    return 0


if __name__ == "__main__":
    import sys

    from ..errors import run_cli

    sys.exit(run_cli(_main, one_process=True))  # never one of a launch's processes
