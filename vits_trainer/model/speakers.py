"""Multi-speaker fine-tuning from a single-speaker checkpoint (--num_speakers auto | N).

A `VitsConfig` with num_speakers > 1 and speaker_embedding_size > 0 gives the model a speaker
embedding and a conditioning projection in each part that reads it: the posterior encoder's and the
flow's WaveNets (`cond_layer`), the duration predictor and the HiFi-GAN decoder (`cond`); the text
encoder takes no speaker. The single-speaker weights are copied into such a model and every new
projection starts at zero, so at step 0 each speaker id speaks exactly as the checkpoint did; the
projections (and with them the voices) separate as training reads the speaker column.

speak.py reads the speaker names before torch is imported, so torch and transformers are imported by
the functions that build models, not by this module.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import TYPE_CHECKING

from ..data.items import speaker_map
from ..errors import UserError

if TYPE_CHECKING:
    from transformers import VitsModel

SPEAKER_EMBEDDING_SIZE = 256  # VITS's multi-speaker size (gin_channels); MMS single-speaker has none


def _zero_conditioning(model: VitsModel) -> list[str]:
    """Zero every speaker projection; returns their names. Weight-normed layers get g = 0 (weight 0,
    and g still receives a gradient, so the layer can grow out of zero)."""
    import torch

    names = []
    for name, module in model.named_modules():
        if name.rsplit(".", 1)[-1] not in ("cond", "cond_layer"):
            continue
        with torch.no_grad():
            if torch.nn.utils.parametrize.is_parametrized(module, "weight"):
                module.parametrizations.weight.original0.zero_()
            else:
                module.weight.zero_()
            if module.bias is not None:
                module.bias.zero_()
        names.append(name)
    return names


def add_speakers(model: VitsModel, num_speakers: int) -> VitsModel:
    """A copy of single-speaker `model` with `num_speakers` voices that all start as the original one."""
    from transformers import VitsModel

    from .vits import apply_decoder_weight_norm, decoder_has_weight_norm

    config = copy.deepcopy(model.config)
    config.num_speakers = num_speakers
    config.speaker_embedding_size = config.speaker_embedding_size or SPEAKER_EMBEDDING_SIZE
    wide = VitsModel(config)
    if decoder_has_weight_norm(model):
        apply_decoder_weight_norm(wide)
    missing, unexpected = wide.load_state_dict(model.state_dict(), strict=False)
    new_parts = set(missing) - {"embed_speaker.weight"}
    if unexpected or any(".cond" not in name for name in new_parts):  # transformers changed its layout
        raise RuntimeError(f"unexpected layout adding speakers: missing {missing}, unexpected {unexpected}")
    _zero_conditioning(wide)
    return wide.train(model.training)


def resolve_speakers(
    wanted: int | str | None,
    model: VitsModel,
    names: list[str],
    stored: dict | None,
    log,
    known: dict | None = None,
):
    """(model, speaker name -> id) for this run. A resumed run keeps the checkpoint's map (its model is
    already built with that many speakers); `wanted` (--num_speakers: None = the model's own, "auto" or
    a count) widens a single-speaker model. A resumed single-voice model trains that voice on every
    speaker of the data, those its map has not seen too (a table's speaker column read since). `known`:
    the speakers.json of the model folder a new run starts from (its voices keep their ids)."""
    if stored and model.config.num_speakers <= 1:
        return model, {**stored, **dict.fromkeys(sorted(set(names) - set(stored)), 0)}
    if stored:
        return model, stored
    distinct = len(set(names))
    if wanted is None or model.config.num_speakers > 1 or (wanted == "auto" and distinct <= 1):
        if wanted is not None and model.config.num_speakers > 1:
            log(f"--num_speakers: the model already has {model.config.num_speakers} speakers; kept")
        mapping = speaker_map(names, model.config.num_speakers, log=log, known=known)
        if model.config.num_speakers > 1:
            log(f"speakers: {describe_map(mapping)} (speakers.json beside the exported model)")
        return model, mapping
    count = distinct if wanted == "auto" else wanted
    if count < distinct:
        raise UserError(
            f"--num_speakers {count}: the data has {distinct} distinct speakers; use --num_speakers auto"
        )
    if count == 1:
        return model, speaker_map(names, 1, log=log)
    model = add_speakers(model, count)
    mapping = speaker_map(names, count, log=log)
    log(
        f"speakers: the single-speaker model now has {count} speaker embeddings (all starting as its voice): "
        f"{describe_map(mapping)}; the map is saved as speakers.json beside the exported model"
    )
    return model, mapping


def read_known_speakers(model_dir: Path | None, log) -> dict | None:
    """The speaker name -> id map exported beside a model of several voices (speakers.json), or None."""
    path = None if model_dir is None else Path(model_dir) / "speakers.json"
    if path is None or not path.is_file():
        return None
    try:
        names = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        log(f"warning: {path} is not readable JSON ({err}); the speakers are numbered from the data")
        return None
    return names if isinstance(names, dict) else None


def is_bare_id(name: object, speaker_id: object) -> bool:
    """Whether a speaker's name is just its id (a speaker column of 0, 1, ...): naming it beside the id
    says nothing more."""
    return str(name) == str(speaker_id)


def describe_map(mapping: dict[str, int], limit: int = 8) -> str:
    """`azad = 0, narin = 1`: the ids speak.py --speaker_id and the pipeline take, by id; a long map is
    cut short (speakers.json has it all)."""
    ids = sorted(mapping.values())
    if ids and all(is_bare_id(name, sid) for name, sid in mapping.items()):  # "0 = 0, 1 = 1" says nothing
        if len(ids) > 2 and ids == list(range(ids[0], ids[-1] + 1)):
            return f"ids {ids[0]} to {ids[-1]}, as the data names them"
        shown = ", ".join(map(str, ids[:-1])) + f" and {ids[-1]}" if len(ids) > 1 else str(ids[0])
        return f"id{'s' if len(ids) > 1 else ''} {shown}, as the data names them"
    pairs = [f"{name} = {sid}" for name, sid in sorted(mapping.items(), key=lambda kv: (kv[1], kv[0]))]
    more = f" and {len(pairs) - limit} more" if len(pairs) > limit else ""
    return ", ".join(pairs[:limit]) + more
