"""What a checkpoint holds and how it is turned back into a running session.

A checkpoint carries the complete training state: generator and discriminator weights (safetensors),
the model's config and tokenizer files (so an extended vocabulary survives), both optimisers, the
fp16 scaler, every RNG, and a JSON `trainer_state.json` (position in the data, budget spent, best
validation loss, the validation ids, the speaker map, the resolved settings, the LR schedule's own
state). No torch LR scheduler state: the learning rate follows from the budget's state and that of
lr_schedule.BudgetLR (where the cosine started).
"""

from __future__ import annotations

import json
import random
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from .checkpoint import (
    CheckpointError,
    bytes_to_object,
    bytes_to_tensors,
    json_bytes,
    object_to_bytes,
    read_file,
    tensors_to_bytes,
)

TOKENIZER_FILES = ("vocab.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json")


@dataclass
class TrainState:
    """Where the run is. Saved as JSON in every checkpoint.

    One object, shared by the session and the Trainer's parts; each field has one writer:
    - session.py, at set-up only: `sessions` (a resume), `processes`, `epoch_clips`,
      `other_clips_before` and a resumed `batch_in_epoch` (note_earlier_clips, restart_epoch_if_regrouped,
      rescale_epoch_position);
    - loop.Trainer: `epoch`, `batch_in_epoch`, `samples_seen`;
    - recovery.Recovery: `skipped_steps`, `consecutive_skips`, `last_finite_step`,
      `recoveries`, `lr_scale`, `precision`;
    - microbatch_choice.MicroBatchPolicy: `split`, `micro_batch_size`, `micro_batch_hardware`,
      `micro_batch_trial`;
    - outputs.RunOutputs: `val_history`, `best_val`, `best_step`, `best_model_step` (also for the final
      weights, when RunEnd.finish finds them best: named before the final checkpoint, put back when the
      final copy is not made).
    """

    epoch: int = 0  # epochs completed: the 0-based index of the epoch being trained
    # batches of the current epoch already trained, per rank (a cycle boundary, unless converted for a
    # resume with another process count: session.rescale_epoch_position)
    batch_in_epoch: int = 0
    processes: int | None = None  # the processes it counts per rank (None: a checkpoint from before)
    # what the epoch's batch order is drawn from (session.epoch_clips_key); None: a checkpoint from before
    epoch_clips: str | None = None
    # whether an earlier session trained on other clips than this one (session.note_earlier_clips; the
    # model card says so); None: not known (resumed from a checkpoint from before it was kept)
    other_clips_before: bool | None = None
    samples_seen: int = 0
    best_val: float | None = None  # lowest --best_metric value (on the first validation set) so far
    best_step: int | None = None
    skipped_steps: int = 0  # non-finite steps skipped (neither network updated)
    consecutive_skips: int = 0
    # the last step that was not skipped: a recovery reloads only a checkpoint saved before it (recovery.py)
    last_finite_step: int = 0
    recoveries: int = 0  # reloads after too many consecutive skipped steps
    lr_scale: float = 1.0  # halved by each recovery
    # set when a recovery moved the run off fp16/bf16; a resumed session keeps it
    precision: str | None = None
    split: int = 1  # the micro-batch is divided by this (doubled by each out-of-memory retry)
    # clips per micro-batch (microbatch_choice.py): chosen by the trial or --micro_batch_size, before any
    # out-of-memory split; None until chosen. A resumed run on the same hardware keeps it.
    micro_batch_size: int | None = None
    micro_batch_hardware: str | None = None  # microbatch_choice.hardware_id of the machine that chose it
    micro_batch_trial: list[dict] | None = None  # the trial's table (microbatch_choice.MicroBatchTrial.table)
    sessions: int = 0  # resumes of the run so far (its sessions less one)
    val_history: list[dict] = field(default_factory=list)
    best_model_step: int | None = None  # the step whose weights <checkpoint_dir>/best_model/ holds

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> TrainState:
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        return cls(**known)


def rng_state() -> dict:
    numpy_state = np.random.get_state()
    state = {
        "torch": torch.get_rng_state(),
        "numpy_keys": torch.from_numpy(numpy_state[1].astype(np.int64)),
        "numpy_meta": [numpy_state[2], numpy_state[3], numpy_state[4]],
        "python": json.dumps(random.getstate()),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    pos, has_gauss, cached = state["numpy_meta"]
    np.random.set_state(("MT19937", state["numpy_keys"].numpy().astype(np.uint32), pos, has_gauss, cached))
    version, internal, gauss = json.loads(state["python"])
    random.setstate((version, tuple(internal), gauss))
    if "cuda" in state and torch.cuda.is_available() and len(state["cuda"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(state["cuda"])


def tokenizer_files(tokenizer) -> dict[str, bytes]:
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer.save_pretrained(tmp)
        return {
            name: (Path(tmp) / name).read_bytes() for name in TOKENIZER_FILES if (Path(tmp) / name).exists()
        }


def checkpoint_files(
    model,
    tokenizer,
    discriminator,
    g_optimizer,
    d_optimizer,
    scaler,
    trainer_state: dict,
) -> dict[str, bytes]:
    files = {
        "generator.safetensors": tensors_to_bytes(model.state_dict()),
        "config.json": json_bytes(model.config.to_dict()),
        "discriminator.safetensors": tensors_to_bytes(discriminator.state_dict()),
        "discriminator_config.json": json_bytes(discriminator.config.to_dict()),
        "optimizer_g.pt": object_to_bytes(g_optimizer.state_dict()),
        "optimizer_d.pt": object_to_bytes(d_optimizer.state_dict()),
        "rng.pt": object_to_bytes(rng_state()),
        "trainer_state.json": json_bytes(trainer_state),
    }
    if scaler is not None:
        files["scaler.pt"] = object_to_bytes(scaler.state_dict())
    files.update({f"tokenizer.{name}": data for name, data in tokenizer_files(tokenizer).items()})
    return files


class LoadedCheckpoint:
    """Lazy, verified access to one checkpoint's parts (each file checked against the manifest)."""

    def __init__(self, path: Path, manifest: dict):
        self.path = path
        self.manifest = manifest

    def has(self, name: str) -> bool:
        return name in self.manifest["files"]

    def bytes(self, name: str) -> bytes:
        try:
            return read_file(self.path, name, self.manifest)
        except (CheckpointError, OSError) as err:
            detail = str(err) if isinstance(err, CheckpointError) else f"{name}: {err.strerror or err}"
            raise CheckpointError(
                f"checkpoint {self.path} is damaged ({detail}); resume from an earlier one: --resume auto "
                f"skips damaged checkpoints, or pass --resume with another step_* folder"
            ) from None

    def json(self, name: str):
        return json.loads(self.bytes(name).decode("utf-8"))

    def tensors(self, name: str) -> dict[str, torch.Tensor]:
        return bytes_to_tensors(self.bytes(name))

    def object(self, name: str):
        return bytes_to_object(self.bytes(name))

    def write_tokenizer(self, folder: Path) -> Path:
        """Materialise the checkpoint's tokenizer files (and config.json) into `folder`."""
        folder.mkdir(parents=True, exist_ok=True)  # callers pass a fresh temp folder
        for name in self.manifest["files"]:
            if name.startswith("tokenizer."):
                (folder / name[len("tokenizer.") :]).write_bytes(self.bytes(name))
        (folder / "config.json").write_bytes(self.bytes("config.json"))
        return folder

    @property
    def step(self) -> int:
        return int(self.manifest["step"])
