"""The VITS training forward, composed from the parts of transformers' `VitsModel`, and export.

transformers ships the modules (text encoder, posterior encoder, flow, duration predictor, HiFi-GAN
decoder, speaker embedding) but its `forward` refuses labels. `VitsGenerator.forward` is the training
path of Kim et al. (2021): posterior encoder -> z; flow(z) -> z_p; monotonic alignment search on the
log-likelihood of z_p under the text prior; duration loss; prior expanded by the path (KL); a random
segment of z decoded to a waveform (mel reconstruction; the adversarial terms live in step.py).
"""

from __future__ import annotations

import errno
import json
import math
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError
from torch import nn
from transformers import VitsModel

from ..profiling import NO_TIMER
from ..safety import check_replaceable, remove_dead_writers_temp, replace_export, write_marker
from .alignment import maximum_path
from .losses import duration_loss_deterministic, kl_loss, mel_reconstruction_loss
from .spectrogram import SpectrogramFrontEnd
from .spline import install as install_spline
from .stochastic_duration import install as install_stochastic_duration
from .text_encoder import install as install_text_encoder
from .wavenet import install as install_wavenet

LOG_2PI = math.log(2 * math.pi)


# the duration predictor's spline without device reads in training, and safe on empty input (spline.py)
install_spline()
# the WaveNet layers of the posterior encoder and flow without a CPU-tensor read and a zeros add each
install_wavenet()
# the stochastic duration predictor's training noise drawn on the device, not copied there (stochastic_duration.py)
install_stochastic_duration()
# the text encoder's LayerDrop drawn on the device, so that torch.compile keeps its layers in one graph
install_text_encoder()


def sequence_mask(lengths: torch.Tensor, max_length: int) -> torch.Tensor:
    return torch.arange(max_length, device=lengths.device).unsqueeze(0) < lengths.unsqueeze(1)


def prior_log_likelihood(z_p: torch.Tensor, m_p: torch.Tensor, logs_p: torch.Tensor) -> torch.Tensor:
    """log N(z_p[:, :, j] | m_p[:, :, i], exp(logs_p[:, :, i])) summed over channels -> [B, T_text, T_frames].

    Expanded into four matrix products so no [B, C, T_text, T_frames] tensor is ever built.
    z_p: [B, C, F]; m_p, logs_p: [B, C, T]. Float32 in, float32 out.
    """
    inv_var = torch.exp(-2.0 * logs_p)  # [B, C, T]
    const = torch.sum(-0.5 * LOG_2PI - logs_p, dim=1).unsqueeze(-1)  # [B, T, 1]
    quad_z = torch.matmul(inv_var.transpose(1, 2), -0.5 * z_p.square())  # [B, T, F]
    cross = torch.matmul((m_p * inv_var).transpose(1, 2), z_p)  # [B, T, F]
    quad_m = torch.sum(-0.5 * m_p.square() * inv_var, dim=1).unsqueeze(-1)  # [B, T, 1]
    return const + quad_z + cross + quad_m


def attention_bias(attention_mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[B, 1, T, T]: 0 where a query may attend a key (any query, a key that is a token), the dtype's
    lowest value where the key is padding; the additive mask transformers' text encoder makes from a
    [B, T] one. Given ready, transformers uses it as it is: built from [B, T] it first asks the device
    whether any token is padding (`padding_mask.all()`, to skip the mask), and the host waits for every
    kernel queued before that answer. A view of a [B, 1, 1, T] tensor, so no T x T memory."""
    batch, length = attention_mask.shape
    bias = torch.zeros((batch, 1, 1, length), dtype=dtype, device=attention_mask.device)
    bias = bias.masked_fill(attention_mask[:, None, None, :] == 0, torch.finfo(dtype).min)
    return bias.expand(batch, 1, length, length)


def random_segment_starts(frame_lengths: torch.Tensor, segment_frames: int) -> torch.Tensor:
    """A random start frame per item so the segment lies inside the clip (0 when the clip is shorter)."""
    highest = (frame_lengths - segment_frames + 1).clamp(min=1)
    return (torch.rand(frame_lengths.shape, device=frame_lengths.device) * highest).long()


def slice_segments(x: torch.Tensor, starts: torch.Tensor, length: int) -> torch.Tensor:
    """x: [B, C, T]; returns [B, C, length] with x[b, :, starts[b]:starts[b]+length] (a gather, no loop)."""
    index = starts.view(-1, 1, 1) + torch.arange(length, device=x.device).view(1, 1, -1)
    return torch.gather(x, 2, index.expand(x.size(0), x.size(1), length))


@dataclass
class GeneratorOutput:
    waveform_fake: torch.Tensor  # [B, 1, segment samples], decoder output
    waveform_real: torch.Tensor  # [B, 1, segment samples], the matching slice of the recording
    mel: torch.Tensor  # L1 between log-mels, fp32
    kl: torch.Tensor
    duration: torch.Tensor
    durations: torch.Tensor  # [B, 1, T_text] frames per token from the alignment search


class VitsGenerator(nn.Module):
    """A `VitsModel` plus the training forward. `self.model` stays a plain transformers model."""

    def __init__(self, model: VitsModel, segment_frames: int = 32, mas_backend: str = "auto"):
        super().__init__()
        self.model = model
        self.frontend = SpectrogramFrontEnd.from_vits_config(model.config)
        self.segment_frames = segment_frames
        self.mas_backend = mas_backend
        self.timer = NO_TIMER  # a SectionTimer in the benchmarks
        self.gradient_checkpointing = False
        # compiled callables of the model's parts for the training forward, by attribute name (the
        # parts of the step's compile scope, compiled.py), set by the step; a dict, so they are not
        # registered as submodules (state dict unchanged)
        self.compiled: dict[str, object] = {}

    def enable_gradient_checkpointing(self) -> None:
        """Trade compute for memory: the text encoder's layers (transformers' own switch) and the posterior
        encoder, flow and decoder as wholes are recomputed in the backward pass (same RNG, same result)."""
        self.gradient_checkpointing = True
        self.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})

    def _run(self, module: nn.Module, *args):
        if self.gradient_checkpointing and self.training and torch.is_grad_enabled():
            return torch.utils.checkpoint.checkpoint(module, *args, use_reentrant=False)
        return module(*args)

    @property
    def hop_length(self) -> int:
        return self.frontend.hop_length

    def speaker_embedding(self, speaker_ids: torch.Tensor | None) -> torch.Tensor | None:
        if self.model.config.num_speakers > 1 and speaker_ids is not None:
            return self.model.embed_speaker(speaker_ids).unsqueeze(-1)
        return None

    def part(self, name: str, compiled: bool = True):
        """The model's part `name`, compiled where the step compiled it and `compiled` allows."""
        part = self.compiled.get(name) if compiled else None
        return getattr(self.model, name) if part is None else part

    def encode_text(self, input_ids, attention_mask, compiled: bool = False):
        dtype = self.model.text_encoder.embed_tokens.weight.dtype
        mask = attention_mask.unsqueeze(-1).to(dtype)
        encoder = self.part("text_encoder", compiled)
        out = encoder(
            input_ids=input_ids, padding_mask=mask, attention_mask=attention_bias(attention_mask, dtype)
        )
        hidden = out.last_hidden_state.transpose(1, 2)  # [B, H, T]
        # transformers calls it a log-variance; it is used as a log standard deviation (exp(.) * noise)
        return hidden, out.prior_means.transpose(1, 2), out.prior_log_variances.transpose(1, 2)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        audio: torch.Tensor,
        audio_lengths: torch.Tensor,
        speaker_ids: torch.Tensor | None = None,
        full_length: bool = False,
        spectrogram: torch.Tensor | None = None,
    ) -> GeneratorOutput:
        """`spectrogram`: a precomputed linear spectrogram [B, bins, >= S // hop frames] to use instead of
        computing it from `audio` (the benchmarks' naive baseline does that on the CPU)."""
        hop, seg, timer = self.hop_length, self.segment_frames, self.timer
        if audio.size(-1) < seg * hop:  # a batch of clips shorter than one segment
            audio = nn.functional.pad(audio, (0, seg * hop - audio.size(-1)))
        with timer("spectrogram"):
            if spectrogram is None:
                spec = self.frontend.linear(audio)  # fp32 [B, bins, F]
            else:
                frames = audio.size(-1) // hop
                spec = spectrogram.float()[..., :frames]
                spec = nn.functional.pad(spec, (0, frames - spec.size(-1)))
        frame_lengths = audio_lengths // hop
        text_lengths = attention_mask.sum(-1)
        y_mask = sequence_mask(frame_lengths, spec.size(-1)).unsqueeze(1).to(spec.dtype)
        x_mask = attention_mask.unsqueeze(1).to(spec.dtype)
        compiled = not full_length  # evaluation runs eager: other shapes, no gradients
        with timer("generator"):
            g = self.speaker_embedding(speaker_ids)
            hidden, m_p, logs_p = self.encode_text(input_ids, attention_mask, compiled)
            z, _, logs_q = self._run(self.part("posterior_encoder", compiled), spec, y_mask, g)
            z_p = self._run(self.part("flow", compiled), z, y_mask, g)

        with timer("mas"), torch.no_grad(), torch.autocast(device_type=spec.device.type, enabled=False):
            log_lik = prior_log_likelihood(z_p.float(), m_p.float(), logs_p.float())
            path = maximum_path(log_lik, text_lengths, frame_lengths, backend=self.mas_backend)  # [B, T, F]
        durations = path.sum(-1).unsqueeze(1)  # [B, 1, T]

        with timer("generator"):
            if self.model.config.use_stochastic_duration_prediction:
                nll = self.part("duration_predictor", compiled)(hidden, x_mask, g, durations=durations)
                duration = nll.float().sum() / x_mask.sum()
            else:
                log_pred = self.part("duration_predictor", compiled)(hidden, x_mask, g)
                duration = duration_loss_deterministic(log_pred, durations, x_mask)

            # the prior of each frame is that of the token the path assigns it to
            m_p_frames = torch.matmul(m_p.float(), path)
            logs_p_frames = torch.matmul(logs_p.float(), path)
            kl = kl_loss(z_p, logs_q, m_p_frames, logs_p_frames, y_mask)

            if full_length:  # evaluation: decode every frame, compare only the frames inside each clip
                fake = self.model.decoder(z * y_mask, g)
                real = audio[..., : spec.size(-1) * hop]
                mel_mask = y_mask
            else:
                starts = random_segment_starts(frame_lengths, seg)
                fake = self._run(self.part("decoder"), slice_segments(z, starts, seg), g)
                real = slice_segments(audio, starts * hop, seg * hop)
                mel_mask = None
        # both mels from the segments' waveforms, alike at their edges (the original slices the target
        # from the whole clip's mel: its first and last frames also see the audio around the segment)
        with timer("spectrogram"):
            mel = mel_reconstruction_loss(self.frontend.mel(fake), self.frontend.mel(real), mel_mask)
        return GeneratorOutput(fake, real, mel, kl, duration, durations)


TRAINABLE_PARTS = (
    "text_encoder",
    "duration_predictor",
    "flow",
    "posterior_encoder",
    "decoder",
    "embed_speaker",
)


def freeze_parts(model: VitsModel, names: list[str]) -> None:
    """Stop training whole parts of the model (they still run; their weights stay as loaded)."""
    for name in names:
        part = getattr(model, name, None)
        if name not in TRAINABLE_PARTS or part is None:
            raise ValueError(f"cannot freeze {name!r}: choose from {', '.join(TRAINABLE_PARTS)}")
        part.requires_grad_(False)


# --- weight norm on the decoder ------------------------------------------------------------------


def decoder_has_weight_norm(model: VitsModel) -> bool:
    return any(
        torch.nn.utils.parametrize.is_parametrized(m, "weight")
        for m in model.decoder.modules()
        if isinstance(m, nn.Conv1d | nn.ConvTranspose1d)
    )


def apply_decoder_weight_norm(model: VitsModel) -> None:
    """VITS trains its HiFi-GAN decoder with weight norm; MMS checkpoints ship it folded into the weights.

    Re-parametrising keeps the function unchanged (g = ||v||) and restores the original training dynamics.
    """
    if not decoder_has_weight_norm(model):
        model.decoder.apply_weight_norm()


def plain_copy(model: VitsModel) -> VitsModel:
    """A copy of `model` whose decoder weights have the weight norm folded in (the published layout).

    Built from the state dict on the meta device, not by deepcopy + remove_parametrizations: that
    removal edits the parametrised class, which the copy shares with the original (the training
    model would lose its `weight`).
    """
    state = {
        name: tensor
        for name, tensor in model.state_dict().items()
        if not (name.startswith("decoder.") and ".parametrizations.weight." in name)
    }
    for name, module in model.decoder.named_modules():
        if torch.nn.utils.parametrize.is_parametrized(module, "weight"):
            state[f"decoder.{name}.weight"] = module.weight.detach()
    with torch.device("meta"):
        plain = VitsModel(model.config)
    plain.load_state_dict({k: v.detach().clone().cpu() for k, v in state.items()}, strict=True, assign=True)
    return plain.eval()


# --- loading and export --------------------------------------------------------------------------


def load_vits_model(model_dir: str | Path) -> VitsModel:
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # the load report is noise here; real problems raise
    try:
        return VitsModel.from_pretrained(str(model_dir))
    finally:
        hf_logging.set_verbosity(verbosity)


def readable_as_umask(folder: Path) -> None:
    """Give the files in `folder` the mode any new file gets here (0644 under the usual umask 022).
    safetensors writes the weights through a private temp file (mode 0600): an export shared on a
    multi-user machine, or copied to a web folder, was unreadable to everyone but its owner."""
    mask = os.umask(0o022)
    os.umask(mask)  # umask can only be read by setting it
    for path in folder.rglob("*"):
        if path.is_file() and not path.is_symlink():
            path.chmod(0o666 & ~mask)


def export_model(
    model: VitsModel,
    tokenizer,
    out_dir: str | Path,
    speakers: dict[str, int] | None = None,
    extras=None,
    kind: str = "model",
    run: str | Path | None = None,
    step: int | None = None,
) -> Path:
    """Save the generator as a plain `VitsModel` folder that transformers loads with no project code.

    Written into a temporary sibling folder and renamed into place, so `out_dir` is never half-written.
    Decoder weight norm is folded back into the weights (on a copy: training continues unaffected).
    `extras(folder)` may add files before the folder is moved into place. The folder gets this tool's
    export marker (`kind`, the run's checkpoint dir `run`, the training `step`, the files written); an
    existing `out_dir` is replaced only when it is an earlier export holding nothing else (else
    safety.UnsafeOverwrite).
    """
    out_dir = Path(out_dir)
    check_replaceable(out_dir)  # before any work: a user's folder is never replaced
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    # exports killed midway: our temp/old names, with the pid of a dead writer
    remove_dead_writers_temp(out_dir.parent, f".{out_dir.name}.tmp-*")
    remove_dead_writers_temp(out_dir.parent, f".{out_dir.name}.old-*")
    tmp = out_dir.with_name(f".{out_dir.name}.tmp-{os.getpid()}")
    if tmp.exists():
        shutil.rmtree(tmp)  # this pid's own temp folder, from an earlier export in this process
    try:
        plain = plain_copy(model)
        plain.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        if speakers:
            (tmp / "speakers.json").write_text(
                json.dumps(speakers, ensure_ascii=False, indent=1), encoding="utf-8"
            )
        if extras is not None:  # e.g. the discriminator, saved beside the generator
            extras(tmp)
        write_marker(tmp, kind, run, step)  # last: lists every file this export wrote
        readable_as_umask(tmp)
    except BaseException as err:
        # a half-written export left on a full disk takes the space the next save needs
        shutil.rmtree(tmp, ignore_errors=True)  # this pid's temp folder, made above: no user file in it
        if isinstance(err, SafetensorError):
            # safetensors reports a full disk (or any write error) as its own error, not an OSError: as
            # an OSError, the callers' handling of a failed export applies (a warning, or the final
            # export's error line naming the last good checkpoint), where it ended the run with a traceback
            raise _as_os_error(err) from err
        raise
    replace_export(tmp, out_dir)  # checks the marker of what it replaces
    return out_dir


def _as_os_error(err: Exception) -> OSError:
    """safetensors' "... I/O error: No space left on device (os error 28)" as OSError(28, its strerror)."""
    found = re.search(r"os error (\d+)", str(err))
    if found:
        code = int(found.group(1))
        return OSError(code, os.strerror(code))
    return OSError(errno.EIO, str(err))
