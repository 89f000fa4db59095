"""The folders a training run reads, checked without torch: train_vits.py calls `check_given_paths`
before its heavy imports (a mistyped path costs a fraction of a second, not the ~8 s of importing
torch), and the session calls the same checks once a resumed run's settings are known.
"""

from __future__ import annotations

from pathlib import Path

from ..data.metadata import METADATA_NAME
from ..errors import UserError
from ..hub import looks_like_path, resolve_model_dir


def check_data_dir(value: str) -> Path:
    """--data_dir: a prepared folder with its metadata.csv."""
    data_dir = Path(value)
    if not data_dir.is_dir():
        raise UserError(f"--data_dir {data_dir}: no such folder (run prepare_data.py first)")
    if not (data_dir / METADATA_NAME).is_file():
        raise UserError(f"{data_dir / METADATA_NAME}: no such file (run prepare_data.py first)")
    return data_dir


def check_resume_path(value: str) -> Path:
    """--resume PATH (not auto/none): an existing folder; whether it is a usable checkpoint is read later."""
    path = Path(value).expanduser()
    if not path.is_dir():
        raise UserError(f"--resume {value}: no such checkpoint folder")
    return path


def check_discriminator_dir(value: str) -> Path:
    """--discriminator: an existing folder (its weights are looked for when it is loaded)."""
    folder = Path(value)
    if not folder.is_dir():
        raise UserError(f"--discriminator {folder}: no such folder")
    return folder


def check_given_paths(cfg) -> None:
    """The folder flags given on the command line, checked before torch is imported. Only those: a
    resumed run takes the others from its checkpoint, and the session checks them once it is read."""
    given = cfg.explicit or frozenset()
    if "data_dir" in given:
        check_data_dir(cfg.data_dir)
    if "model_name" in given and looks_like_path(cfg.model_name):
        resolve_model_dir(cfg.model_name)  # a folder: checked on the spot (a hub id waits for the session)
    if "discriminator" in given and cfg.discriminator:
        check_discriminator_dir(cfg.discriminator)
    if "resume" in given and cfg.resume not in ("auto", "none"):
        check_resume_path(cfg.resume)
