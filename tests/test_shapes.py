"""Bucketed batch widths (data/shapes.py): few shapes, bounded padding, kept when a step's batches are
cut into micro-batches, and no effect on what the losses measure."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from tests.helpers import tiny_config, train_tiny
from vits_trainer.data.loader import ClipDataset, collate_batch
from vits_trainer.data.sampler import BucketBatchSampler
from vits_trainer.data.shapes import PadLengths, bucket_edge, padded_widths
from vits_trainer.training.microbatch import micro_batches, split_batch
from vits_trainer.training.session import build_session


def test_bucket_edges_bound_the_padding_and_the_number_of_shapes():
    edges = sorted({bucket_edge(n) for n in range(1, 4097)})
    for n in range(1, 4097):
        edge = bucket_edge(n)
        assert n <= edge <= n * 1.125 + 1e-9 or n <= 16 and edge == n
        assert bucket_edge(edge) == edge  # an edge pads to itself
    assert edges[:18] == list(range(1, 17)) + [18, 20]
    assert {64, 72, 120, 128, 144, 1024, 1152} <= set(edges)
    # 8 per octave above 16: a 1-15 s corpus (62-940 frames at hop 256, 16 kHz) meets ~33 frame widths
    assert len([e for e in edges if 62 <= e <= 1024]) == 33


def test_pad_lengths_rounds_audio_to_whole_frames_of_a_bucket_width():
    pad = PadLengths(hop=256)
    assert pad.audio(256 * 100) == 256 * 104  # 100 frames -> 104
    assert pad.audio(256 * 100 + 1) == 256 * 104  # 101 frames (rounded up) -> 104
    assert pad.audio(256 * 128) == 256 * 128
    assert pad.text(17) == 18 and pad.text(100) == 104


def test_the_token_width_follows_the_frame_edge():
    # frame edge 104 (97-104 frames) holds clips of up to 61 tokens: its batches pad tokens to 64
    pad = PadLengths.for_items(256, [30, 61, 20, 90], [256 * 100, 256 * 101, 256 * 40, 256 * 200])
    assert padded_widths(pad, 30, 256 * 100) == (64, 256 * 104)
    assert padded_widths(pad, 20, 256 * 40) == (20, 256 * 40)
    # more tokens than its frame edge's widest clip (a cut micro-batch, another corpus): its own edge
    assert padded_widths(pad, 70, 256 * 100) == (72, 256 * 104)
    assert padded_widths(pad, 30, 256 * 300) == (30, 256 * 320)  # a frame edge no clip has
    assert padded_widths(PadLengths(256), 30, 256 * 100) == (30, 256 * 104)  # no table: edges only


def test_a_run_meets_about_one_shape_per_frame_edge():
    """Token and frame widths each on their own edges made most pairs a shape of their own; tied, a run
    meets one per frame edge: under CUDA graphs each shape is a path to warm up and record."""
    rng = np.random.default_rng(0)
    seconds = np.clip(rng.normal(6.6, 2.2, 3000), 1.0, 10.0)
    samples = (seconds * 16000).astype(np.int64)
    tokens = (2 * np.round(seconds * 15 * rng.lognormal(0.0, 0.12, 3000)) + 1).astype(np.int64)
    sampler = BucketBatchSampler(samples, 32, seed=0)

    def shapes(pad):
        met = set()
        for epoch in range(3):
            sampler.set_epoch(epoch)
            met |= {padded_widths(pad, int(tokens[b].max()), int(samples[b].max())) for b in sampler}
        return met

    tied, untied = shapes(PadLengths.for_items(256, tokens, samples)), shapes(PadLengths(256))
    frame_edges = {width for _, width in untied}
    assert {width for _, width in tied} == frame_edges
    assert len(tied) == len(frame_edges) and len(untied) > 2 * len(tied)


def test_a_micro_batch_cut_from_a_batch_has_its_frame_edges_token_width():
    """A part cut to a lower frame edge is only sliced, never widened: its frame edge may not ask for
    more tokens than a higher edge does, or its shape would be one the table does not give."""
    # a clip of 61 tokens at edge 104, one of 30 at edge 208: edge 208's batches hold both kinds
    pad = PadLengths.for_items(256, [61, 30, 20], [256 * 100, 256 * 200, 256 * 100])
    assert pad.token_widths == ((104, 64), (208, 64))
    batch = collate_batch(_items(2, [30, 20], [256 * 200, 256 * 100]), pad)
    for part in split_batch(batch, 2, pad):
        width, audio = part["input_ids"].size(1), part["audio"].size(-1)
        assert width == pad.text(width, audio) == 64


def _items(n: int, text_lengths, audio_lengths):
    rng = np.random.default_rng(0)
    return [
        {
            "token_ids": rng.integers(1, 9, size=t),
            "audio": rng.integers(-3000, 3000, size=s).astype(np.int16),
            "speaker_id": 0,
            "index": i,
        }
        for i, (t, s) in enumerate(zip(text_lengths, audio_lengths, strict=True))
    ]


def test_collate_pads_to_bucket_edges_and_keeps_the_true_lengths():
    items = _items(3, [17, 30, 41], [256 * 90 + 7, 256 * 150, 256 * 131])
    pad = PadLengths(256)
    plain, bucketed = collate_batch(items), collate_batch(items, pad)
    assert plain["input_ids"].shape == (3, 41) and plain["audio"].shape == (3, 1, 256 * 150)
    assert bucketed["input_ids"].shape == (3, 44) and bucketed["audio"].shape == (3, 1, 256 * 160)
    for key in ("text_lengths", "audio_lengths", "speaker_ids", "indices"):
        assert torch.equal(plain[key], bucketed[key])
    assert torch.equal(bucketed["attention_mask"].sum(-1), plain["text_lengths"])
    assert torch.equal(bucketed["input_ids"][:, :41], plain["input_ids"])
    assert torch.equal(bucketed["audio"][..., : 256 * 150], plain["audio"])
    assert not bucketed["audio"][..., 256 * 150 :].any() and not bucketed["input_ids"][:, 41:].any()


def test_micro_batches_keep_bucket_edges_when_a_step_is_cut():
    pad = PadLengths(256)
    a = collate_batch(_items(2, [10, 60], [256 * 40, 256 * 200]), pad)
    b = collate_batch(_items(2, [12, 25], [256 * 45, 256 * 70]), pad)
    parts = micro_batches([a, b], 1, pad)
    widths = [(p["input_ids"].size(1), p["audio"].size(-1) // 256) for p in parts]
    assert widths == [(10, 40), (60, 208), (12, 48), (26, 72)]
    # without buckets a part is trimmed to its own longest item, as before
    assert [
        p["audio"].size(-1) // 256 for p in split_batch(collate_batch(_items(2, [5, 9], [2560, 5120])), 2)
    ] == [
        10,
        20,
    ]


def test_micro_batches_cut_from_a_step_are_contiguous():
    # a trimmed view is strided: its copy to a GPU would go through pageable memory, however pinned
    pad = PadLengths(256)
    a = collate_batch(_items(4, [10, 11, 60, 61], [256 * 40, 256 * 41, 256 * 200, 256 * 201]), pad)
    b = collate_batch(_items(2, [12, 25], [256 * 45, 256 * 70]), pad)
    for parts in (micro_batches([a, b], 2, pad), split_batch(a, 2, pad)):
        assert parts[0]["audio"].size(-1) < a["audio"].size(-1)  # trimmed
        assert all(v.is_contiguous() for part in parts for v in part.values())


@pytest.fixture
def session(tmp_path, tiny_model_dir, tone_corpus):
    cfg = tiny_config(tmp_path, tone_corpus, tiny_model_dir, max_steps=1, length_buckets="on")
    torch.manual_seed(0)
    return build_session(cfg, time.time())


def test_padding_does_not_change_what_the_losses_measure(session, monkeypatch):
    """The same clips padded to two widths give the same mel, KL and duration losses. The noise the
    posterior encoder and the duration predictor draw is one value per padded position, so a wider batch
    draws other samples: it is fixed at zero here, to compare what the losses measure; dropout is off."""
    s = session
    monkeypatch.setattr(torch, "randn_like", lambda x, **k: torch.zeros_like(x, **k))
    monkeypatch.setattr(torch, "randn", lambda *size, **k: torch.zeros(*size, **k))
    dataset = ClipDataset(s.data.train)
    batch = collate_batch([dataset[i] for i in range(4)], s.pad)
    wider = dict(batch)
    wider["input_ids"] = torch.nn.functional.pad(batch["input_ids"], (0, 13))
    wider["attention_mask"] = torch.nn.functional.pad(batch["attention_mask"], (0, 13))
    wider["audio"] = torch.nn.functional.pad(batch["audio"], (0, 256 * 37))
    generator = s.generator_raw.eval()
    losses = []
    for b in (batch, wider):
        torch.manual_seed(5)  # the same segments
        with torch.no_grad():
            out = generator(b["input_ids"], b["attention_mask"], b["audio"], b["audio_lengths"])
        losses.append((float(out.mel), float(out.kl), float(out.duration)))
        durations = out.durations[..., : batch["input_ids"].size(1)]
    assert losses[1] == pytest.approx(losses[0], rel=1e-4)
    assert float(durations.sum()) > 0


def test_a_run_with_length_buckets_trains_on_bucketed_batches(
    tmp_path, tiny_model_dir, tone_corpus, monkeypatch
):
    """--length_buckets on: every micro-batch the step receives has bucket-edge widths, its tokens at
    least as wide as its frame edge asks."""
    from vits_trainer.training.step import GanStep

    seen = []
    real = GanStep.micro_step

    def recording(self, batch, *args, **kwargs):
        seen.append((batch["input_ids"].size(1), batch["audio"].size(-1)))
        return real(self, batch, *args, **kwargs)

    monkeypatch.setattr(GanStep, "micro_step", recording)
    session, summary = train_tiny(
        tmp_path, tone_corpus, tiny_model_dir, max_steps=6, length_buckets="on", gradient_accumulation_steps=2
    )
    assert summary["length_buckets"] is True and summary["steps"] == 6
    pad = session.pad
    assert pad.token_widths  # from the training clips
    assert seen and all(t == pad.text(t, a) and a == pad.audio(a) for t, a in seen), seen
