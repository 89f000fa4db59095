"""Checks of the paths a user typed, made before torch is imported (a mistyped path costs a fraction
of a second, not the ~8 s of the heavy imports). Only flags given on the command line are checked
here: a resumed run takes the others from its checkpoint, which the session checks once it is read.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import UserError
from ..hub import looks_like_path

# flag -> what the folder must hold (None: any folder) and what to say when it is missing
_READ_FOLDERS = {
    "data_dir": ("metadata.csv", "run prepare_data.py first"),
    "feedback_dir": ("metadata.csv", "prepare the feedback clips with prepare_data.py --data_dir FEEDBACK"),
    "base_model": ("config.json", "the model to improve, e.g. training/checkpoints/best_model"),
    "discriminator": ("discriminator.safetensors", "a folder with discriminator.safetensors"),
    "model_name": ("config.json", "a saved VitsModel folder, or a hub id such as facebook/mms-tts-eng"),
}


def check_given_paths(cfg) -> None:
    """Each folder flag the user gave that the run reads exists and holds what it must."""
    given = cfg.explicit or frozenset()
    for name, (needs, hint) in _READ_FOLDERS.items():
        value = getattr(cfg, name, None)
        if name not in given or not value:
            continue
        if name == "model_name" and not looks_like_path(value):
            continue  # a hub id: resolved (cache, then network) by the session
        folder = Path(value).expanduser()
        if not folder.is_dir():
            raise UserError(f"--{name} {value}: no such folder ({hint})")
        if not (folder / needs).is_file():
            raise UserError(f"{folder / needs}: no such file ({hint})")
    resume = getattr(cfg, "resume", "auto")
    if "resume" in given and resume not in ("auto", "none") and not Path(resume).expanduser().is_dir():
        raise UserError(f"--resume {resume}: no such checkpoint folder")
