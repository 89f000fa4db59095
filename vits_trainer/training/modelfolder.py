"""Model folders named on the command line (--model_name, --base_model), checked before anything is
written: a training checkpoint is told apart from a model folder, and every weights file must open.

A checkpoint folder (`step_NNNNNNNN/` with `manifest.json`) holds `config.json` too, so it passes for
a model folder until something reads its (differently named) weights or tokenizer files; a truncated
`model.safetensors` fails deep inside transformers. Both become one line saying what to pass instead.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import UserError
from ..hub import json_kind, read_model_config
from .checkpoint import MANIFEST


def is_training_checkpoint(folder: Path) -> bool:
    """A `step_*` folder written by the trainer (its manifest is written last, so it is complete or absent),
    or one that has lost its manifest: only a checkpoint holds `generator.safetensors` (a model folder's
    weights are `model.safetensors`), and reading it as a model would fail on a missing tokenizer."""
    if (folder / "generator.safetensors").is_file():
        return True
    return (folder / MANIFEST).is_file() and folder.name.startswith("step_")


def check_model_folder(folder: Path, flag: str) -> None:
    """Raise a UserError naming `flag` unless `folder` looks like a loadable VitsModel folder.

    Only the safetensors headers are read (cheap): a truncated or overwritten file fails there, as
    transformers would fail later. Damage inside the tensor data is not detectable without checksums.
    """
    folder = Path(folder)
    if is_training_checkpoint(folder):
        hint = {
            "--model_name": f"; to continue that run, pass --resume {folder}",
            "--base_model": "; a feedback round starts from an exported model",
        }.get(flag, "")
        raise UserError(
            f"{flag} {folder}: is a training checkpoint, not a model folder: use {folder.parent / 'best_model'} "
            f"or the final model folder (train_vits.py --output_dir){hint}"
        )
    from safetensors import SafetensorError, safe_open

    for weights in sorted(folder.glob("*.safetensors")):
        try:
            with safe_open(str(weights), framework="pt"):
                pass
        except (SafetensorError, OSError) as err:
            raise UserError(
                f"{flag} {folder}: {weights.name} is damaged or incomplete ({err}); copy the model folder "
                f"again (or export it again)"
            ) from None
    # another architecture's folder, or a broken config, failed inside transformers' tokenizer
    kind = read_model_config(folder, flag).get("model_type")
    if kind != "vits":
        raise UserError(f"{flag} {folder}: not a VITS model (its config.json says model_type {kind!r})")
    if not (folder / "vocab.json").is_file():
        raise UserError(f"{flag} {folder}: no vocab.json (the tokenizer every VITS model folder carries)")
    # transformers' tokenizer fails deep inside (a traceback) on a vocab.json that is not {character: id}
    # or a tokenizer_config.json that is not an object
    vocab = _read_json(folder, "vocab.json", flag)
    if not isinstance(vocab, dict) or not all(type(i) is int for i in vocab.values()):
        raise UserError(
            f"{flag} {folder}: its vocab.json is not a mapping of characters to token ids; copy the model "
            "folder again (or export it again)"
        )
    if (folder / "tokenizer_config.json").is_file():
        settings = _read_json(folder, "tokenizer_config.json", flag)
        if not isinstance(settings, dict):
            raise UserError(
                f"{flag} {folder}: its tokenizer_config.json holds a JSON {json_kind(settings)}, not an "
                "object of settings; copy the model folder again (or export it again)"
            )


def _read_json(folder: Path, name: str, flag: str):
    try:
        return json.loads((folder / name).read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise UserError(f"{flag} {folder}: its {name} cannot be read ({err})") from None
