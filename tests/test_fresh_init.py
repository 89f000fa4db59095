"""Fresh models start the VITS way (vits_trainer/model/fresh_init.py): identity flows, a small decoder, and
a first step whose fp16 gradients stay finite. With transformers' own initialisation the tiny model's
KL started at ~2,200 and its fp16 backward overflowed at a loss scale of 64 (bench/probe_fp16.py)."""

from __future__ import annotations

import numpy as np
import torch
from transformers import VitsModel

from vits_trainer.data.synthetic import random_sentence, synth_text
from vits_trainer.data.text import TextEncoder
from vits_trainer.model.discriminator import DiscriminatorConfig, VitsDiscriminator
from vits_trainer.model.losses import (
    LossWeights,
    discriminator_loss,
    feature_matching_loss,
    generator_adversarial_loss,
    generator_total,
)
from vits_trainer.model.tiny import make_tiny_model
from vits_trainer.model.vits import VitsGenerator, apply_decoder_weight_norm


def test_fresh_tiny_model_starts_as_vits_does_and_its_fp16_gradients_are_finite(tmp_path):
    folder = make_tiny_model(tmp_path / "model")
    model = VitsModel.from_pretrained(folder)
    for layer in model.flow.flows:  # the flow starts as the identity
        assert not layer.conv_post.weight.any() and not layer.conv_post.bias.any()
    ups = torch.cat([u.weight.detach().flatten() for u in model.decoder.upsampler])
    assert 0.005 < float(ups.std()) < 0.02  # normal(0, 0.01), not a Kaiming draw (~0.1 here)

    text = TextEncoder.from_pretrained(folder)
    apply_decoder_weight_norm(model)
    generator = VitsGenerator(model, segment_frames=32, mas_backend="auto")
    torch.manual_seed(0)
    discriminator = VitsDiscriminator(DiscriminatorConfig(width=0.125))
    rng = np.random.default_rng(0)
    sentences = [random_sentence(rng, min_words=5, max_words=8) for _ in range(2)]
    ids = [text.encode(s) for s in sentences]
    clips = [torch.from_numpy(synth_text(s, seed=i)).float() for i, s in enumerate(sentences)]
    input_ids = torch.zeros(2, max(map(len, ids)), dtype=torch.long)
    mask = torch.zeros_like(input_ids)
    audio = torch.zeros(2, 1, max(len(c) for c in clips))
    for j in range(2):
        input_ids[j, : len(ids[j])] = torch.tensor(ids[j])
        mask[j, : len(ids[j])] = 1
        audio[j, 0, : len(clips[j])] = clips[j]
    lengths = torch.tensor([len(c) for c in clips])

    scale = 16.0  # well inside what GradScaler reaches after a few halvings from 65536
    with torch.autocast("cpu", dtype=torch.float16):
        out = generator(input_ids, mask, audio, lengths)
        logits, _ = discriminator(torch.cat([out.waveform_real, out.waveform_fake.detach()]))
    (discriminator_loss(logits, 2) * scale).backward()
    with torch.autocast("cpu", dtype=torch.float16):
        logits, features = discriminator(torch.cat([out.waveform_real, out.waveform_fake]))
    losses = {
        "mel": out.mel,
        "kl": out.kl,
        "duration": out.duration,
        "adversarial": generator_adversarial_loss([x[2:] for x in logits]),
        "feature_matching": feature_matching_loss(
            [[m[:2] for m in maps] for maps in features], [[m[2:] for m in maps] for maps in features]
        ),
    }
    kl = float(out.kl.detach())
    assert kl < 200, kl  # transformers' initialisation: ~2,200
    (generator_total(losses, LossWeights()) * scale).backward()
    for name, p in [*model.named_parameters(), *discriminator.named_parameters()]:
        if p.grad is not None:
            assert torch.isfinite(p.grad).all(), name
