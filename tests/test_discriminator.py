"""The VITS discriminator: shapes, size, persistence and conversion from original checkpoints."""

from __future__ import annotations

import json

import pytest
import torch

from vits_trainer.errors import UserError
from vits_trainer.model.discriminator import (
    CONFIG_NAME,
    WEIGHTS_NAME,
    DiscriminatorConfig,
    VitsDiscriminator,
    _main,
    convert_original_discriminator,
    count_parameters,
    discriminator_from_state_dict,
    load_discriminator,
    save_discriminator,
)

TINY = DiscriminatorConfig(width=0.125)
# 8192 samples: scale disc 8192 -> /4 four times -> 32 frames; a period disc folds to ceil(8192 / p) rows,
# then four stride-3 convs (k5, pad 2: L -> ceil(L / 3)) and keeps p columns.
EXPECTED_LOGITS = {0: 32, 2: 51 * 2, 3: 34 * 3, 5: 21 * 5, 7: 15 * 7, 11: 10 * 11}


def _period_frames(length: int, period: int) -> int:
    rows = -(-length // period)
    for _ in range(4):
        rows = -(-rows // 3)
    return rows


def _original_format(disc: VitsDiscriminator) -> dict[str, torch.Tensor]:
    """Our state dict renamed to the old weight-norm naming of VITS's `net_d` checkpoints."""
    out = {}
    for key, value in disc.state_dict().items():
        key = key.replace("parametrizations.weight.original0", "weight_g")
        key = key.replace("parametrizations.weight.original1", "weight_v")
        out[key] = value.clone()
    return out


@pytest.mark.parametrize("width", [1.0, 0.125])
def test_output_shapes(width: float) -> None:
    torch.manual_seed(0)
    disc = VitsDiscriminator(DiscriminatorConfig(width=width)).eval()
    with torch.no_grad():
        logits, fmaps = disc(torch.randn(2, 1, 8192))
    assert len(logits) == len(fmaps) == 6
    for p in (2, 3, 5, 7, 11):
        assert EXPECTED_LOGITS[p] == _period_frames(8192, p) * p
    expected = [EXPECTED_LOGITS[0]] + [EXPECTED_LOGITS[p] for p in (2, 3, 5, 7, 11)]
    assert [tuple(t.shape) for t in logits] == [(2, n) for n in expected]
    # 6 convs + conv_post for the scale disc, 5 convs + conv_post for each period disc.
    assert [len(f) for f in fmaps] == [7, 6, 6, 6, 6, 6]
    top = round(1024 * width)
    assert fmaps[0][-2].shape[1] == top and fmaps[0][-1].shape[1] == 1
    for fmap, p in zip(fmaps[1:], (2, 3, 5, 7, 11), strict=True):
        assert fmap[0].shape[1] == round(32 * width) and fmap[-2].shape[1] == top
        assert fmap[-1].shape[-1] == p  # the period axis survives the whole stack
    assert all(torch.isfinite(t).all() for t in logits)


def test_odd_lengths_and_2d_input() -> None:
    disc = VitsDiscriminator(TINY)
    logits, _ = disc(torch.randn(1, 1001))  # not a multiple of any period: reflect padding
    assert [t.shape[0] for t in logits] == [1] * 6
    logits, _ = disc(torch.randn(1, 1, 5))  # shorter than the largest pad: falls back to replicate
    assert len(logits) == 6
    with pytest.raises(ValueError, match="shape"):
        disc(torch.randn(1, 2, 100))


def test_parameter_count_matches_vits() -> None:
    full = count_parameters(VitsDiscriminator())
    print(f"VITS discriminator at width 1.0: {full:,} parameters")
    # Scale disc 5,641,362 + 5 period discs x 8,221,154 (weight-norm g vectors included) = 46,747,132,
    # the ~46.7 M of VITS's MultiPeriodDiscriminator.
    assert full == 46_747_132
    tiny = count_parameters(VitsDiscriminator(TINY))
    print(f"width 0.125: {tiny:,} parameters")
    assert tiny < full / 50


def test_state_dict_layout_matches_original_keys() -> None:
    keys = set(VitsDiscriminator().state_dict())
    assert "discriminators.0.convs.5.parametrizations.weight.original1" in keys
    assert "discriminators.5.conv_post.bias" in keys
    assert "discriminators.6.conv_post.bias" not in keys
    assert sum(".convs." in k for k in keys) == 3 * (6 + 5 * 5)


def test_grouped_convs_stay_valid_at_odd_widths() -> None:
    for width in (0.3, 0.05, 0.01):
        disc = VitsDiscriminator(DiscriminatorConfig(width=width, periods=(2, 3)))
        logits, _ = disc(torch.randn(1, 1, 512))
        assert len(logits) == 3
    groups = [c.groups for c in VitsDiscriminator(TINY).discriminators[0].convs]
    assert groups == [1, 2, 8, 32, 128, 1]
    assert [c.groups for c in VitsDiscriminator().discriminators[0].convs] == [1, 4, 16, 64, 256, 1]


def test_save_load_round_trip(tmp_path) -> None:
    torch.manual_seed(1)
    disc = VitsDiscriminator(DiscriminatorConfig(width=0.125, periods=(2, 3, 5))).eval()
    assert load_discriminator(tmp_path) is None
    save_discriminator(disc, tmp_path / "ckpt")
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == [WEIGHTS_NAME, CONFIG_NAME]
    assert json.loads((tmp_path / "ckpt" / CONFIG_NAME).read_text())["periods"] == [2, 3, 5]
    loaded = load_discriminator(tmp_path / "ckpt").eval()
    assert loaded.config == disc.config
    x = torch.randn(2, 1, 2048)
    with torch.no_grad():
        (a, fa), (b, fb) = disc(x), loaded(x)
    for t, u in zip(a + [m for ms in fa for m in ms], b + [m for ms in fb for m in ms], strict=True):
        assert torch.equal(t, u)


def test_load_shape_mismatch_is_clear(tmp_path) -> None:
    save_discriminator(VitsDiscriminator(TINY), tmp_path)
    cfg = json.loads((tmp_path / CONFIG_NAME).read_text())
    cfg["width"] = 0.25
    (tmp_path / CONFIG_NAME).write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=r"shape mismatch.*width ~ 0.125"):
        load_discriminator(tmp_path)


def test_convert_original_format_round_trip() -> None:
    torch.manual_seed(2)
    disc = VitsDiscriminator(TINY).eval()
    original = _original_format(disc)
    assert "discriminators.1.convs.0.weight_g" in original
    # The original training checkpoint nests the weights under "model", DataParallel adds "module.".
    wrapped = {"model": {f"module.{k}": v for k, v in original.items()}}
    converted = convert_original_discriminator(wrapped)
    assert converted.keys() == disc.state_dict().keys()
    rebuilt = discriminator_from_state_dict(converted, TINY).eval()
    x = torch.randn(1, 1, 1024)
    with torch.no_grad():
        for t, u in zip(disc(x)[0], rebuilt(x)[0], strict=True):
            assert torch.equal(t, u)


def test_convert_missing_key_errors_clearly() -> None:
    original = _original_format(VitsDiscriminator(TINY))
    del original["discriminators.3.convs.2.weight_v"]
    original["discriminators.9.conv_post.bias"] = torch.zeros(1)
    with pytest.raises(ValueError) as info:
        discriminator_from_state_dict(convert_original_discriminator(original), TINY)
    message = str(info.value)
    assert "1 missing key(s): discriminators.3.convs.2.parametrizations.weight.original1" in message
    assert "1 unexpected key(s): discriminators.9.conv_post.bias" in message


def test_convert_cli(tmp_path) -> None:
    torch.manual_seed(3)
    disc = VitsDiscriminator(TINY)
    pth = tmp_path / "D_100.pth"
    torch.save({"model": _original_format(disc), "iteration": 100, "learning_rate": 2e-4}, pth)
    assert _main(["convert", str(pth), str(tmp_path / "out"), "--width", "0.125"]) == 0
    loaded = load_discriminator(tmp_path / "out")
    for key, value in disc.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value)
    with pytest.raises(UserError, match="shape mismatch"):
        _main(["convert", str(pth), str(tmp_path / "out2")])  # width 1.0 does not fit
    assert not (tmp_path / "out2").exists()


def test_every_parameter_gets_a_gradient() -> None:
    torch.manual_seed(4)
    disc = VitsDiscriminator(TINY)
    logits, _ = disc(torch.randn(2, 1, 4096))
    sum(t.sum() for t in logits).backward()
    for name, param in disc.named_parameters():
        assert param.grad is not None, name
        assert torch.isfinite(param.grad).all() and param.grad.abs().sum() > 0, name


def test_spectral_norm_variant_converts() -> None:
    cfg = DiscriminatorConfig(width=0.125, periods=(2,), use_spectral_norm=True)
    disc = VitsDiscriminator(cfg)
    original = {}
    for key, value in disc.state_dict().items():
        key = key.replace("parametrizations.weight.original", "weight_orig")
        key = key.replace("parametrizations.weight.0._u", "weight_u").replace(
            "parametrizations.weight.0._v", "weight_v"
        )
        original[key] = value
    rebuilt = discriminator_from_state_dict(convert_original_discriminator(original, True), cfg)
    for key, value in disc.state_dict().items():
        assert torch.equal(rebuilt.state_dict()[key], value)


def _original_forward(weights: dict[str, torch.Tensor], x: torch.Tensor) -> tuple[list, list]:
    """VITS's MultiPeriodDiscriminator (models.py: DiscriminatorS, then DiscriminatorP for periods 2, 3, 5,
    7, 11) written out as plain functional ops on an original-format state dict: the weight-normed
    weight g * v / |v|, leaky ReLU 0.1 after every conv but the last, reflect padding to a whole period."""
    import torch.nn.functional as F

    def weight(prefix: str) -> torch.Tensor:
        g, v = weights[f"{prefix}.weight_g"], weights[f"{prefix}.weight_v"]
        return g * v / v.flatten(1).norm(dim=1).view(-1, *[1] * (v.dim() - 1))

    scale = [(1, 7, 1), (4, 20, 4), (4, 20, 16), (4, 20, 64), (4, 20, 256), (1, 2, 1)]  # stride, pad, groups
    logits, fmaps = [], []
    for d in range(6):
        h, fmap = x, []
        if d > 0:
            period = (2, 3, 5, 7, 11)[d - 1]
            if h.shape[-1] % period:
                h = F.pad(h, (0, period - h.shape[-1] % period), "reflect")
            h = h.view(h.shape[0], 1, h.shape[-1] // period, period)
        for k in range(6 if d == 0 else 5):
            name, bias = f"discriminators.{d}.convs.{k}", weights[f"discriminators.{d}.convs.{k}.bias"]
            if d == 0:
                stride, pad, groups = scale[k]
                h = F.conv1d(h, weight(name), bias, stride, pad, groups=groups)
            else:
                h = F.conv2d(h, weight(name), bias, (3 if k < 4 else 1, 1), (2, 0))
            h = F.leaky_relu(h, 0.1)
            fmap.append(h)
        post = f"discriminators.{d}.conv_post"
        conv = F.conv1d if d == 0 else F.conv2d
        h = conv(h, weight(post), weights[f"{post}.bias"], 1, 1 if d == 0 else (1, 0))
        fmap.append(h)
        logits.append(torch.flatten(h, 1, -1))
        fmaps.append(fmap)
    return logits, fmaps


def test_a_converted_discriminator_computes_what_the_original_vits_one_computes() -> None:
    # A converted net_d must stay the function it was trained as: the round trip above only compares this
    # module with itself, so a changed slope or padding in the forward would pass it.
    torch.manual_seed(5)
    disc = VitsDiscriminator().eval()  # width 1.0: the original layout
    with torch.no_grad():
        for p in disc.parameters():  # away from the init, so every weight's role shows in the outputs
            p.add_(0.05 * torch.randn_like(p))
    original = _original_format(disc)
    converted = discriminator_from_state_dict(convert_original_discriminator(original), DiscriminatorConfig())
    x = torch.randn(2, 1, 1001)  # no period divides it: every period discriminator pads
    with torch.no_grad():
        want_logits, want_fmaps = _original_forward(original, x)
        for module in (disc, converted.eval()):
            logits, fmaps = module(x)
            for got, want in zip(logits, want_logits, strict=True):
                torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
            for got_maps, maps in zip(fmaps, want_fmaps, strict=True):
                for got, want in zip(got_maps, maps, strict=True):
                    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_convert_cli_bad_flags_and_outputs_are_one_error_line(tmp_path) -> None:
    """--width 0, --periods 0 and an out_folder that is a file were tracebacks (ValueError from the
    config, FileExistsError from mkdir); a text file given as the checkpoint was a dozen lines of torch's
    advice on weights_only."""
    pth = tmp_path / "D_100.pth"
    torch.save(_original_format(VitsDiscriminator(TINY)), pth)
    a_file = tmp_path / "a_file"
    a_file.write_text("mine", encoding="utf-8")
    out = str(tmp_path / "out")
    cases = [
        (["convert", str(pth), out, "--width", "0"], "--width must be positive (got 0.0)"),
        (["convert", str(pth), out, "--width", "nan"], "--width must be positive (got nan)"),
        (
            ["convert", str(pth), out, "--width", "0.125", "--periods", "0", "-1"],
            "--periods must be positive",
        ),
        (["convert", str(pth), str(a_file), "--width", "0.125"], "exists and is a file, not a folder"),
        (["convert", str(a_file), out], "cannot read as a weights-only torch checkpoint"),
    ]
    for argv, expected in cases:
        with pytest.raises(UserError) as caught:
            _main(argv)
        message = str(caught.value)
        assert expected in message and "\n" not in message, (argv, message)
    assert a_file.read_text(encoding="utf-8") == "mine" and not (tmp_path / "out").exists()
