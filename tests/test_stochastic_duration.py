"""model/stochastic_duration.py and the text encoder's ready mask give transformers' values and gradients,
with the duration predictor's noise drawn on the model's device (tests/test_host_reads.py checks that a
whole micro-step neither reads from nor copies to the device)."""

from __future__ import annotations

import pytest
import torch
from transformers import VitsConfig, VitsModel
from transformers.masking_utils import create_bidirectional_mask
from transformers.models.vits.modeling_vits import VitsStochasticDurationPredictor

import vits_trainer.model.vits  # noqa: F401  (installs the training direction)
from vits_trainer.model.stochastic_duration import ORIGINAL, duration_nll
from vits_trainer.model.tiny import tiny_config
from vits_trainer.model.vits import attention_bias


def _predictor(speaker_size: int) -> VitsStochasticDurationPredictor:
    config = VitsConfig(
        hidden_size=32,
        speaker_embedding_size=speaker_size,
        num_speakers=2 if speaker_size else 1,
        duration_predictor_dropout=0.0,
    )
    torch.manual_seed(0)
    dp = VitsStochasticDurationPredictor(config).train()
    with torch.no_grad():  # transformers starts both affine flows as identities: give them work to do
        for flow in (dp.flows[0], dp.post_flows[0]):
            flow.translate.normal_()
            flow.log_scale.normal_(0.0, 0.3)
    return dp


@pytest.mark.parametrize("speaker_size", [0, 8])
def test_the_training_direction_gives_transformers_values_and_gradients(speaker_size):
    dp = _predictor(speaker_size)
    g = torch.Generator().manual_seed(1)
    batch, tokens = 4, 20
    inputs = torch.randn(batch, 32, tokens, generator=g)
    lengths = torch.tensor([20, 17, 9, 20])
    mask = (torch.arange(tokens)[None] < lengths[:, None]).float().unsqueeze(1)
    durations = torch.floor(torch.rand(batch, 1, tokens, generator=g) * 6) * mask
    durations[1, 0, 3] = 0.0  # a token with no frame: log(d - u) at the clamp
    cond = torch.randn(batch, speaker_size, 1, generator=g) if speaker_size else None

    def run(forward):
        dp.zero_grad()
        torch.manual_seed(5)  # the same noise: transformers draws it on the CPU, as this does here
        nll = forward()
        (nll * torch.arange(1.0, batch + 1)).sum().backward()
        return nll.detach(), {n: p.grad.clone() for n, p in dp.named_parameters() if p.grad is not None}

    expected, expected_grads = run(lambda: ORIGINAL(dp, inputs, mask, cond, durations=durations))
    got, grads = run(lambda: dp(inputs, mask, cond, durations=durations))
    assert torch.allclose(got, expected, rtol=1e-5, atol=1e-4), (got, expected)
    assert grads.keys() == expected_grads.keys() and len(grads) > 100
    for name, grad in grads.items():
        scale = expected_grads[name].abs().max().clamp_min(1e-6)
        assert (grad - expected_grads[name]).abs().max() <= 1e-4 * scale, name
    torch.manual_seed(5)
    assert torch.equal(duration_nll(dp, inputs, mask, cond, durations).detach(), got)


def test_speaking_still_runs_transformers_inverse_direction():
    dp = _predictor(0).eval()
    inputs = torch.randn(2, 32, 7)
    mask = torch.ones(2, 1, 7)
    torch.manual_seed(3)
    log_durations = dp(inputs, mask, reverse=True, noise_scale=0.8)
    torch.manual_seed(3)
    assert torch.equal(log_durations, ORIGINAL(dp, inputs, mask, reverse=True, noise_scale=0.8))
    assert log_durations.shape == (2, 1, 7)


def test_the_text_encoder_mask_is_the_one_transformers_makes():
    model = VitsModel(tiny_config(30)).eval()
    attention_mask = torch.tensor([[1] * 7, [1] * 5 + [0] * 2, [1] * 3 + [0] * 4])
    embeds = torch.randn(3, 7, model.config.hidden_size)
    expected = create_bidirectional_mask(
        config=model.config, inputs_embeds=embeds, attention_mask=attention_mask
    )
    assert torch.equal(attention_bias(attention_mask, torch.float32), expected)
    ids = torch.randint(1, 30, (3, 7))
    for mask in (attention_mask, torch.ones_like(attention_mask)):  # without padding transformers adds none
        padding = mask.unsqueeze(-1).float()
        plain = model.text_encoder(input_ids=ids, padding_mask=padding, attention_mask=mask)
        ready = model.text_encoder(
            input_ids=ids, padding_mask=padding, attention_mask=attention_bias(mask, torch.float32)
        )
        assert torch.equal(plain.last_hidden_state, ready.last_hidden_state)
        assert torch.equal(plain.prior_log_variances, ready.prior_log_variances)
