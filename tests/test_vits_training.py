"""The VITS objective on a tiny model: gradients reach every part, the GAN step keeps D and G apart,
a short fixed-seed run really learns, and the export is a plain transformers model."""

from __future__ import annotations

import json
import math
import re
import time

import numpy as np
import pytest
import torch
from transformers import VitsModel, VitsTokenizer, pipeline

from tests.helpers import tiny_config, train_tiny
from vits_trainer.data.loader import collate_batch
from vits_trainer.data.synthetic import make_corpus
from vits_trainer.model.tiny import make_tiny_model
from vits_trainer.training.loop import Trainer
from vits_trainer.training.session import build_session


def one_batch(session, n=4):
    items = session.data.train
    from vits_trainer.data.loader import ClipDataset

    batch = collate_batch([ClipDataset(items)[i] for i in range(n)])
    batch.pop("indices")
    batch.pop("text_lengths")
    return batch


LEARNING_STEPS = 60  # 12 epochs of the 36 training clips in batches of 8


@pytest.fixture(scope="module")
def trained(tmp_path_factory, tiny_model_dir, tone_corpus):
    """60 optimiser steps with a fixed seed through the real Trainer (in-process)."""
    tmp = tmp_path_factory.mktemp("vits_run")
    session, summary = train_tiny(
        tmp, tone_corpus, tiny_model_dir, max_steps=LEARNING_STEPS, target_hours=0.5
    )
    return tmp, session.cfg, session, summary


def test_short_run_lowers_validation_mel_by_a_clear_margin(trained):
    _, _, session, summary = trained
    history = session.state.val_history
    start, final = history[0], history[-1]
    assert start["tag"] == "start" and final["tag"] == "final"
    assert summary["steps"] == LEARNING_STEPS and summary["stopped_reason"] == "max_steps"
    # measured: val_mel 4.05 -> 0.99 and val_kl 42.5 -> 1.19 on this corpus (90 steps: 0.97 and 0.61); a
    # model that does not learn stays near 4
    assert final["val_mel"] < 0.6 * start["val_mel"], (start, final)
    assert final["val_kl"] < 0.1 * start["val_kl"]
    for record in history:
        assert all(math.isfinite(v) for k, v in record.items() if k.startswith("val_"))
    assert summary["skipped_steps"] == 0


def test_training_metrics_are_finite(trained):
    tmp, _, _, _ = trained
    lines = [json.loads(x) for x in (tmp / "checkpoints" / "metrics.jsonl").read_text().splitlines()]
    steps = [x for x in lines if "loss_g" in x]
    assert len(steps) >= LEARNING_STEPS // 5
    for record in steps:
        for key in ("loss_g", "loss_d", "mel", "kl", "duration", "adversarial", "feature_matching"):
            assert math.isfinite(record[key]), (key, record)


def test_export_loads_with_plain_transformers_and_speaks(trained):
    tmp, _, _, summary = trained
    folder = tmp / "final_model"
    assert {"config.json", "model.safetensors", "vocab.json", "tokenizer_config.json"} <= {
        p.name for p in folder.iterdir()
    }
    model = VitsModel.from_pretrained(folder)
    assert not any("parametrizations" in k for k in model.state_dict() if k.startswith("decoder."))
    tokenizer = VitsTokenizer.from_pretrained(folder)
    inputs = tokenizer("abc def", return_tensors="pt")
    torch.manual_seed(0)
    with torch.no_grad():
        wave = model(**inputs).waveform[0]
    assert torch.isfinite(wave).all()
    # 7 characters of 70-145 ms each plus pauses: a plausible length is well within 0.2-5 s
    assert 0.2 * 16000 < wave.numel() < 5 * 16000
    speech = pipeline("text-to-speech", model=str(folder))("abc def")
    assert np.isfinite(speech["audio"]).all() and speech["sampling_rate"] == 16000
    # the best model (by validation mel) is a loadable folder too, with its discriminator beside it
    best = tmp / "checkpoints" / "best_model"
    VitsModel.from_pretrained(best)
    assert (best / "discriminator.safetensors").is_file()


@pytest.fixture
def fresh_session(tmp_path, tiny_model_dir, tone_corpus):
    cfg = tiny_config(tmp_path, tone_corpus, tiny_model_dir, max_steps=1)
    torch.manual_seed(0)
    return build_session(cfg, time.time())


def test_every_generator_and_discriminator_parameter_gets_a_gradient(fresh_session):
    s = fresh_session
    from vits_trainer.training.step import GanStep

    step = GanStep(s.accelerator, s.generator, s.discriminator, s.g_optimizer, s.d_optimizer)
    # micro-batch 0 of a 2-cycle: gradients are accumulated, not yet applied or cleared
    result = step(one_batch(s), micro_index=0, cycle_length=2)
    assert not result.synced
    for name, p in list(s.generator_raw.named_parameters()) + list(s.discriminator_raw.named_parameters()):
        assert p.grad is not None, f"{name} got no gradient"
        assert torch.isfinite(p.grad).all(), name
    no_signal = [n for n, p in s.generator_raw.named_parameters() if p.grad.abs().sum() == 0]
    # a fresh model starts its flows as identities (fresh_init.py: zero output convolutions), so on the
    # first step the layers whose only way to the loss is through such an output see no gradient (the
    # coupling layers' networks, the duration predictor's conditioning); the zero outputs themselves do
    behind_zero_output = re.compile(
        r"model\.(flow\.flows\.\d+\.(?!conv_post)|duration_predictor\.(?!(post_)?flows\.\d+\.conv_proj))"
    )
    unexpected = [n for n in no_signal if not behind_zero_output.match(n)]
    assert not unexpected, "\n".join(unexpected)


def test_generator_step_leaves_no_gradient_in_the_discriminator(fresh_session):
    s = fresh_session
    from vits_trainer.model.losses import discriminator_loss
    from vits_trainer.training.step import GanStep

    batch = one_batch(s)
    torch.manual_seed(1)
    step = GanStep(s.accelerator, s.generator, s.discriminator, s.g_optimizer, s.d_optimizer)
    step(batch, micro_index=0, cycle_length=2)
    after_full_step = {n: p.grad.clone() for n, p in s.discriminator_raw.named_parameters()}

    # the same micro-step's discriminator loss alone must give exactly those gradients
    s.d_optimizer.zero_grad(set_to_none=True)
    s.g_optimizer.zero_grad(set_to_none=True)
    torch.manual_seed(1)
    out = s.generator(**batch)
    n = out.waveform_real.size(0)
    logits, _ = s.discriminator(torch.cat([out.waveform_real, out.waveform_fake.detach()]))
    loss_d = discriminator_loss(logits, n)
    (loss_d / 2).backward()
    for name, p in s.discriminator_raw.named_parameters():
        torch.testing.assert_close(p.grad, after_full_step[name], msg=name)
    assert all(p.requires_grad for p in s.discriminator_raw.parameters())


def test_generator_gradients_are_those_of_a_second_pass_over_real_and_fake(fresh_session):
    """The step's generator pass runs D on the fakes alone and takes feature matching's real targets
    from the discriminator's pass. VITS runs D again over [real; fake]; with D's weights unchanged
    between the two passes both give the same losses and generator gradients. The reference here is
    that second pass with the losses written per map, as VITS defines them."""
    s = fresh_session
    from vits_trainer.model.losses import LossWeights
    from vits_trainer.training.step import GanStep

    batch = one_batch(s)
    torch.manual_seed(1)
    step = GanStep(s.accelerator, s.generator, s.discriminator, s.g_optimizer, s.d_optimizer)
    metrics = step(batch, micro_index=0, cycle_length=2).metrics
    got = {n: p.grad.clone() for n, p in s.generator_raw.named_parameters()}

    s.g_optimizer.zero_grad(set_to_none=True)
    torch.manual_seed(1)  # the same segments and noise
    out = s.generator(**batch)
    n = out.waveform_real.size(0)
    s.discriminator_raw.requires_grad_(False)
    logits, features = s.discriminator_raw(torch.cat([out.waveform_real, out.waveform_fake]))
    s.discriminator_raw.requires_grad_(True)
    adversarial = sum(torch.mean((1 - x[n:].float()) ** 2) for x in logits)
    matching = sum(torch.mean(torch.abs(m[:n].detach() - m[n:])) for maps in features for m in maps)
    w = LossWeights()
    total = w.mel * out.mel + w.kl * out.kl + w.duration * out.duration
    total = total + w.adversarial * adversarial + w.feature_matching * matching
    (total / 2).backward()
    torch.testing.assert_close(metrics["adversarial"], adversarial.detach())
    torch.testing.assert_close(metrics["feature_matching"], matching.detach())
    for name, p in s.generator_raw.named_parameters():
        torch.testing.assert_close(p.grad, got[name], msg=name)


def test_optimiser_step_updates_both_networks_and_clears_gradients(fresh_session):
    s = fresh_session
    from vits_trainer.training.step import GanStep

    g0 = {n: p.detach().clone() for n, p in s.generator_raw.named_parameters()}
    d0 = {n: p.detach().clone() for n, p in s.discriminator_raw.named_parameters()}
    step = GanStep(s.accelerator, s.generator, s.discriminator, s.g_optimizer, s.d_optimizer)
    result = step(one_batch(s), 0, 1)
    assert result.synced and not result.skipped
    assert sum(not torch.equal(p, g0[n]) for n, p in s.generator_raw.named_parameters()) > 0.9 * len(g0)
    assert all(not torch.equal(p, d0[n]) for n, p in s.discriminator_raw.named_parameters())
    assert all(p.grad is None for p in s.generator_raw.parameters())
    assert all(p.grad is None for p in s.discriminator_raw.parameters())
    for k in ("grad_norm_g", "grad_norm_d", "mel", "kl", "duration", "adversarial", "feature_matching"):
        assert math.isfinite(float(result.metrics[k]))


def test_with_cuda_graphs_gradients_live_in_buffers_kept_from_step_to_step(fresh_session):
    """With CUDA graphs (`stable_grads`, step.py's docstring) gradients are cleared to zero, never to
    None, in the same tensors from cycle to cycle, and a cycle of two micro-batches accumulates what the
    eager clearing does. No GPU here: `stable_grads` is switched on by hand (use_compiled switches it on
    with CUDA graphs; tests/test_gpu.py compares a compiled cycle of two with the eager one there)."""
    s = fresh_session
    from vits_trainer.training.step import GanStep

    step = GanStep(s.accelerator, s.generator, s.discriminator, s.g_optimizer, s.d_optimizer)
    step.use_compiled(True, backend="aot_eager")
    assert not step.stable_grads  # no CUDA graphs on a CPU
    step.use_compiled(False)
    batch = one_batch(s)
    params = [*s.generator_raw.parameters(), *s.discriminator_raw.parameters()]

    def two_micro_batches():  # a cycle of 3, not ended: nothing steps
        for i in (0, 1):
            torch.manual_seed(10 + i)
            step(batch, micro_index=i, cycle_length=3)
        return [p.grad.clone() for p in params]

    eager = two_micro_batches()
    step.abandon_cycle()
    assert all(p.grad is None for p in params)
    step.stable_grads = True
    stable = two_micro_batches()
    for got, want in zip(stable, eager, strict=True):
        torch.testing.assert_close(got, want)
    buffers = [p.grad for p in params]
    step.abandon_cycle()  # the buffers stay; the next cycle's first micro-batch zeroes them
    assert all(p.grad is b for p, b in zip(params, buffers, strict=True))
    again = two_micro_batches()
    assert all(p.grad is b for p, b in zip(params, buffers, strict=True))
    for got, want in zip(again, eager, strict=True):
        torch.testing.assert_close(got, want)


def test_with_cuda_graphs_each_cycle_zeroes_the_gradients_once(fresh_session, monkeypatch):
    """Zeroing kept buffers is a pass over every gradient: it ran after each optimiser step and again
    before the next cycle's first backward. Once per cycle, before its first backward, is enough."""
    s = fresh_session
    from vits_trainer.training.step import GanStep

    step = GanStep(s.accelerator, s.generator, s.discriminator, s.g_optimizer, s.d_optimizer)
    step.stable_grads = True  # as use_compiled sets it with CUDA graphs (none on a CPU)
    zeroed = []
    for name, optimizer in (("g", s.g_optimizer), ("d", s.d_optimizer)):
        real = optimizer.zero_grad
        monkeypatch.setattr(
            optimizer,
            "zero_grad",
            lambda set_to_none=True, n=name, f=real: (zeroed.append(n), f(set_to_none))[1],
        )
    batch = one_batch(s)
    for _ in range(3):  # three cycles of one micro-batch, each ending in an optimiser step
        assert step(batch, 0, 1).synced
    assert sorted(zeroed) == ["d"] * 3 + ["g"] * 3


def test_multi_speaker_and_deterministic_duration_predictor_train(tmp_path):
    """A 2-speaker checkpoint trains with speaker ids; the deterministic duration predictor too."""
    data = tmp_path / "data"
    make_corpus(data, num_clips=16, num_speakers=2, seed=3)
    model_dir = make_tiny_model(tmp_path / "model", num_speakers=2, use_stochastic_duration_prediction=False)
    cfg = tiny_config(tmp_path, data, model_dir, max_steps=3, val_fraction=0.25)
    s = build_session(cfg, time.time())
    assert s.speakers == {"0": 0, "1": 1}
    assert set(s.data.train.speaker_ids.tolist()) == {0, 1}
    summary = Trainer(s).train()
    assert summary["steps"] == 3 and math.isfinite(summary["final_val"]["val_duration"])
    model = VitsModel.from_pretrained(tmp_path / "final_model")
    tok = VitsTokenizer.from_pretrained(tmp_path / "final_model")
    with torch.no_grad():
        out = model(**tok("abc", return_tensors="pt"), speaker_id=1)
    assert torch.isfinite(out.waveform).all()
    assert json.loads((tmp_path / "final_model" / "speakers.json").read_text()) == {"0": 0, "1": 1}


def test_every_step_trains_in_train_mode_with_no_evaluation_before_it(
    tmp_path, tiny_model_dir, tone_corpus, monkeypatch
):
    """from_pretrained returns a model in evaluation mode (dropouts and layer drop off). A run without
    validation clips, like a resumed run, has no start evaluation whose `train(was_training)` would
    set training mode back: the session sets it itself."""
    from vits_trainer.training.step import GanStep

    modes = []
    micro_step = GanStep.micro_step

    def recording(self, *args, **kwargs):
        generator = self.accelerator.unwrap_model(self.generator)
        modes.append(all(m.training for m in generator.modules()))
        return micro_step(self, *args, **kwargs)

    monkeypatch.setattr(GanStep, "micro_step", recording)
    _, summary = train_tiny(tmp_path, tone_corpus, tiny_model_dir, max_steps=2, val_fraction=0.0)
    assert summary["steps"] == 2 and modes and all(modes), modes


def test_duration_spline_passes_values_beyond_its_bound_unchanged():
    # a diverged model puts every value outside the spline's tail bound; transformers' spline then got
    # an empty tensor and raised, crashing the evaluation that should have judged the model
    from transformers.models.vits import modeling_vits

    import vits_trainer.model.vits  # noqa: F401  (installs the guard)

    inputs = torch.tensor([[[-7.0, 9.0, float("nan")]]])
    bins = 10
    out, logdet = modeling_vits._unconstrained_rational_quadratic_spline(
        inputs,
        torch.zeros(1, 1, 3, bins),
        torch.zeros(1, 1, 3, bins),
        torch.zeros(1, 1, 3, bins - 1),
        tail_bound=5.0,
    )
    torch.testing.assert_close(out, inputs, equal_nan=True)
    assert torch.equal(logdet, torch.zeros_like(inputs))


def test_slow_steps_still_get_a_metric_line_a_minute(tmp_path, tiny_model_dir, tone_corpus, monkeypatch):
    """A run whose steps take minutes (a CPU, a first compiled step) would say nothing for `log_every`
    of them: a metric line also comes once LOG_SECONDS have passed since the last one. Set to 0 here,
    every step is that slow."""
    import json

    from vits_trainer.training import loop

    monkeypatch.setattr(loop, "LOG_SECONDS", 0.0)
    session, summary = train_tiny(
        tmp_path, tone_corpus, tiny_model_dir, max_steps=3, val_fraction=0.0, log_every=100
    )
    records = [json.loads(line) for line in (session.checkpoint_dir / "metrics.jsonl").open()]
    assert [r["step"] for r in records if "event" not in r] == [1, 2, 3]
    assert summary["steps"] == 3


def test_the_steps_after_the_last_metric_line_get_one_at_the_end(tmp_path, tiny_model_dir, tone_corpus):
    """A run ends between two --log_every lines: its last steps were in no line, so the report's train
    curves stopped short of the final evaluation (the demo's at step 80 of 84), and a run stopped before
    its first line (a signal after one step) had no training curve at all."""
    import json

    session, summary = train_tiny(
        tmp_path, tone_corpus, tiny_model_dir, max_steps=3, val_fraction=0.0, log_every=100
    )
    records = [json.loads(line) for line in (session.checkpoint_dir / "metrics.jsonl").open()]
    assert [r["step"] for r in records if "event" not in r] == [3]
    assert summary["steps"] == 3


def test_clips_left_out_are_named_by_set_in_the_log_and_listed_in_the_summary(
    tmp_path, tiny_model_dir, capsys
):
    """A clip whose text has no character of the vocabulary, one in the training clips and one in the
    validation clips, and a WAV that no longer reads: each warning says which set its count is of (it
    said '1 of 2 clip(s) dropped' of a corpus of 12), and train_summary.json lists every clip left out
    and why (the log names only the first three of each kind)."""
    from vits_trainer.data.items import held_out_positions

    data = tmp_path / "data"
    make_corpus(data, num_clips=12, sample_rate=16000, seed=2)
    lines = (data / "metadata.csv").read_text(encoding="utf-8").splitlines()
    ids = [line.split("|")[0] for line in lines]
    (data / "wavs" / f"{ids[-1]}.wav").write_bytes(b"not a wav")  # left out before the split
    val = held_out_positions(ids[:-1], 0.1, 0)
    train = [i for i in range(len(ids) - 1) if i not in val]
    for i in (val[0], train[0]):
        clip_id, _, *rest = lines[i].split("|")
        lines[i] = "|".join([clip_id, "xyz qrs", *rest])
    (data / "metadata.csv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    _, summary = train_tiny(tmp_path, data, tiny_model_dir, max_steps=1, val_fraction=0.1)
    out = capsys.readouterr().out
    assert f"warning: 1 of {len(train)} training clip(s) dropped ({ids[train[0]]}: no tokens" in out, out
    assert f"warning: 1 of {len(val)} validation clip(s) dropped ({ids[val[0]]}: no tokens" in out, out
    left_out = {clip_id: why for clip_id, why in summary["dropped_clips"]}
    assert set(left_out) == {ids[train[0]], ids[val[0]], ids[-1]}, left_out
    assert "no tokens" in left_out[ids[val[0]]] and "unreadable" in left_out[ids[-1]]
    saved = json.loads((tmp_path / "final_model" / "train_summary.json").read_text())
    assert saved["dropped_clips"] == summary["dropped_clips"]
