"""Which module's output or gradient leaves fp16's range on a fresh VITS, forward AND backward (CPU autocast).

    python bench/probe_fp16.py mms fp16 1024 vits  # model size (mms|tiny), dtype (fp16|bf16), loss scale,
                                                   # init: transformers (its _init_weights) | vits (fresh_init)

One GAN step (D pass, G pass) on 2 synthetic clips under torch.autocast("cpu"); hooks on every module
record the max |output| and max |gradient w.r.t. the output|; prints the tensors out of fp16 range
and the parameters whose gradients are non-finite. The MMS size takes ~12 min on 2 CPU cores.
CPU autocast keeps more ops in fp16 than CUDA's (exp, sum, pow stay fp16), so it is a pessimistic
stand-in for the GPU; convolutions are fp16 under both.
"""

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import numpy as np
import torch
from transformers import VitsConfig, VitsModel

from vits_trainer.data.synthetic import random_sentence, synth_text
from vits_trainer.model.discriminator import DiscriminatorConfig, VitsDiscriminator
from vits_trainer.model.fresh_init import init_like_vits
from vits_trainer.model.losses import (
    LossWeights,
    discriminator_loss,
    feature_matching_loss,
    generator_adversarial_loss,
    generator_total,
)
from vits_trainer.model.tiny import make_tokenizer, tiny_config
from vits_trainer.model.vits import VitsGenerator, apply_decoder_weight_norm

size = sys.argv[1] if len(sys.argv) > 1 else "mms"
dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[sys.argv[2] if len(sys.argv) > 2 else "fp16"]
scale = float(sys.argv[3]) if len(sys.argv) > 3 else 1.0
init = sys.argv[4] if len(sys.argv) > 4 else "transformers"
FP16_MAX = 65504.0
tok = make_tokenizer("/tmp/h13c/tok")
torch.manual_seed(0)
if size == "mms":
    model = VitsModel(VitsConfig(vocab_size=len(tok), pad_token_id=0))
    width = 1.0
else:
    model = VitsModel(tiny_config(len(tok)))
    width = 0.125
if init == "vits":
    init_like_vits(model)
apply_decoder_weight_norm(model)
gen = VitsGenerator(model, segment_frames=32, mas_backend="auto")
disc = VitsDiscriminator(DiscriminatorConfig(width=width))
rng = np.random.default_rng(0)
texts = [random_sentence(rng, min_words=5, max_words=8) for _ in range(2)]
ids = [tok(t)["input_ids"] for t in texts]
auds = [synth_text(t, seed=i) for i, t in enumerate(texts)]
T = max(map(len, ids))
S = max(map(len, auds))
input_ids = torch.zeros(2, T, dtype=torch.long)
am = torch.zeros(2, T, dtype=torch.long)
audio = torch.zeros(2, 1, S)
al = torch.tensor([len(a) for a in auds])
for j in range(2):
    input_ids[j, : len(ids[j])] = torch.tensor(ids[j])
    am[j, : len(ids[j])] = 1
    audio[j, 0, : len(auds[j])] = torch.from_numpy(auds[j])

events = []  # (phase, name, dtype, amax, finite)


def stat(t):
    with torch.no_grad():
        f = bool(torch.isfinite(t).all())
        a = float(t.detach().abs().float().nan_to_num(posinf=float("inf")).max()) if t.numel() else 0.0
    return a, f


def tensors(o):
    if isinstance(o, torch.Tensor):
        yield o
    elif isinstance(o, (list, tuple)):
        for x in o:
            yield from tensors(x)
    elif hasattr(o, "__dataclass_fields__"):
        for k in o.__dataclass_fields__:
            yield from tensors(getattr(o, k))
    elif hasattr(o, "to_tuple"):
        yield from tensors(o.to_tuple())


def add_hooks(root, prefix):
    for name, mod in root.named_modules():
        if "parametrizations" in name:
            continue
        full = f"{prefix}.{name}" if name else prefix

        def fwd(m, inp, out, full=full):
            for t in tensors(out):
                if not t.is_floating_point():
                    continue
                a, f = stat(t)
                events.append(("fwd", full, str(t.dtype), a, f))
                if t.requires_grad:
                    t.register_hook(lambda g, full=full: events.append(("bwd", full, str(g.dtype), *stat(g))))

        mod.register_forward_hook(fwd)


add_hooks(model, "G")
add_hooks(disc, "D")

t0 = time.time()
with torch.autocast("cpu", dtype=dtype):
    out = gen(input_ids, am, audio, al)
real, fake = out.waveform_real, out.waveform_fake
events.append(("mark", "--- D pass", "", 0, True))
with torch.autocast("cpu", dtype=dtype):
    logits, _ = disc(torch.cat([real, fake.detach()], 0))
n = 2
loss_d = discriminator_loss(logits, n)
(loss_d * scale).backward()
events.append(("mark", "--- G pass", "", 0, True))
disc.requires_grad_(False)
with torch.autocast("cpu", dtype=dtype):
    logits, feats = disc(torch.cat([real, fake], 0))
disc.requires_grad_(True)
losses = {
    "mel": out.mel,
    "kl": out.kl,
    "duration": out.duration,
    "adversarial": generator_adversarial_loss([x[n:] for x in logits]),
    "feature_matching": feature_matching_loss(
        [[m[:n] for m in maps] for maps in feats], [[m[n:] for m in maps] for maps in feats]
    ),
}
loss_g = generator_total(losses, LossWeights())
print("losses", {k: float(v) for k, v in losses.items()}, "loss_d", float(loss_d))
(loss_g * scale).backward()
print(f"time {time.time() - t0:.1f}s")


def report(phase):
    evs = [e for e in events if e[0] == phase]
    bad = [e for e in evs if not e[4] or e[3] > FP16_MAX]
    print(f"{phase}: {len(evs)} tensors, {len(bad)} out of fp16 range or non-finite")
    for e in bad[:15]:
        print("   ", e)


report("fwd")
report("bwd")
# largest finite forward magnitudes per module (top 15)
top = sorted([e for e in events if e[0] == "fwd" and e[4]], key=lambda e: -e[3])[:15]
print("largest forward outputs:", *top, sep="\n    ")
topb = sorted([e for e in events if e[0] == "bwd" and e[4]], key=lambda e: -e[3])[:10]
print("largest grads:", *topb, sep="\n    ")
for net, mod in (("G", model), ("D", disc)):
    badp = [n_ for n_, p in mod.named_parameters() if p.grad is not None and not torch.isfinite(p.grad).all()]
    big = max(
        (
            float(p.grad.abs().max())
            for p in mod.parameters()
            if p.grad is not None and torch.isfinite(p.grad).all()
        ),
        default=0,
    )
    print(net, "params with non-finite grad:", len(badp), badp[:8], "max finite |grad|", big)
