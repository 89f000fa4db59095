"""Where one training step makes the host wait for the device (not a test).

    python bench/bench_syncs.py --device cuda --models mms --batch_size 16 --precision bf16
    python bench/bench_syncs.py --models tiny

On a GPU the host queues kernels and runs ahead of them, until something needs a value back: `.item()`,
`if tensor:`, a boolean-mask index (its size depends on the data), `nonzero`. Then it waits for every
kernel queued before, and the GPU waits in turn for the next launches. One steady-state micro-step of
the trainer's `GanStep` (after one untimed step on the same batch), set up as bench/bench_step.py does
it, is run with:
- on CUDA: `torch.cuda.set_sync_debug_mode("warn")`, which warns at every synchronising call; each
  warning is counted at the innermost line of this project or of transformers that made it;
- on a CPU (no synchronisation to see): every `aten::_local_scalar_dense` (a value read into Python),
  `nonzero`, `masked_select` and index or write through a boolean mask, counted the same way (a
  backward operator at the line of the backward call). A read of a CPU tensor is counted too, though
  on a GPU it would not wait (transformers' own WaveNet slices by a CPU tensor of its channel count, 2
  per layer; model/wavenet.py's does not). Then the step runs once more with the default device set
  to "meta": a tensor made on the host without naming its device (to be copied to the GPU, which from
  pageable memory waits like a read) has no data there, and the first such copy is reported.
Prints the total and each place with its count; JSON to bench/results/syncs.json.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import tempfile
import traceback
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from bench.bench_step import (  # noqa: E402
    CORPUS_WORDS,
    batches_of,
    make_model_dir,
    quiet_session,
    train_config,
)
from vits_trainer.data.loader import (  # noqa: E402
    ClipDataset,
    collate_batch,
    move_batch,  # noqa: E402
)
from vits_trainer.data.synthetic import make_corpus  # noqa: E402
from vits_trainer.profiling import DeviceReads  # noqa: E402
from vits_trainer.training.loop import gan_step  # noqa: E402
from vits_trainer.training.runtime import quiet_transformers  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "syncs.json"


def where(stack: list) -> str:
    """The innermost frame in this project or in transformers, as `file.py:line` (the counter's own
    frames in profiling.py left out)."""
    for frame in reversed(stack):
        name = frame.filename.replace("\\", "/")
        if name.endswith("vits_trainer/profiling.py"):
            continue
        if "/transformers/" in name or name.startswith(str(ROOT / "vits_trainer")):
            return f"{Path(name).name}:{frame.lineno}"
    return "?"


class CountReads(DeviceReads):
    """DeviceReads counted by place (the innermost frame of this project or of transformers)."""

    def __init__(self):
        super().__init__()
        self.places = collections.Counter()

    def record(self, name: str) -> None:
        self.places[where(traceback.extract_stack())] += 1


def first_host_copy(step, batch) -> str | None:
    """Where the step first copies a tensor it made on the host (default device "meta"), or None."""
    try:
        with torch.device("meta"):
            step(batch, 0, 1)
    except NotImplementedError as error:
        if "meta" not in str(error):
            raise
        return where(traceback.extract_tb(error.__traceback__))
    return None


def synced_places(step, batch, device: torch.device) -> collections.Counter:
    if device.type != "cuda":
        with CountReads() as mode:
            step(batch, 0, 1)
        copy = first_host_copy(step, batch)
        if copy is not None:
            mode.places[f"copy from the host: {copy}"] += 1
        return mode.places
    places = collections.Counter()

    def note(message, category, filename, lineno, file=None, line=None) -> None:
        # the warning's own place can be a library's (`__init__.py:1270` on an H100): the caller in
        # this project or transformers beside the library's path says which operator synchronised
        if "synchroniz" in str(message).lower():
            library = filename.replace("\\", "/").split("site-packages/")[-1]
            places[f"{where(traceback.extract_stack())} ({library}:{lineno})"] += 1

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = note  # catch_warnings puts the original back
        torch.cuda.set_sync_debug_mode("warn")
        try:
            step(batch, 0, 1)
            torch.cuda.synchronize(device)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return places


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--models", default="tiny", help="comma-separated: tiny, mms")
    parser.add_argument("--batch_size", type=int, default=8)
    parser.add_argument("--precision", default="no", choices=["no", "fp16", "bf16"])
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    quiet_transformers()
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench_syncs-") as tmp_name:
        tmp = Path(tmp_name)
        data_dir = tmp / "data"
        make_corpus(data_dir, num_clips=32, seed=0, min_words=CORPUS_WORDS[0], max_words=CORPUS_WORDS[1])
        for kind in args.models.split(","):
            model_dir = make_model_dir(kind, tmp / f"model-{kind}")
            cfg = train_config(
                tmp / f"run-{kind}", data_dir, model_dir, kind, args.batch_size, args.device, args.precision
            )
            session = quiet_session(cfg)
            step = gan_step(session)
            dataset = ClipDataset(session.data.train)
            batch = collate_batch([dataset[j] for j in batches_of(session)[0]], session.pad)
            batch.pop("indices")
            batch.pop("text_lengths")
            batch = move_batch(batch, session.device)
            torch.manual_seed(1)
            step(batch, 0, 1)  # AdamW's state, numba's and the allocator's first calls: not counted
            torch.manual_seed(2)
            places = synced_places(step, batch, session.device)
            total = sum(places.values())
            print(f"{kind}, batch {args.batch_size}, {args.device} {args.precision}: {total} per micro-step")
            for place, n in places.most_common():
                print(f"  {n:4d}  {place}")
            rows.append(
                {
                    "model": kind,
                    "batch_size": args.batch_size,
                    "device": args.device,
                    "precision": args.precision,
                    "total": total,
                    "places": dict(places.most_common()),
                }
            )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"rows": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
