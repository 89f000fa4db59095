"""`.prepare_state.json`: what each WAV in a prepared data_dir was made from.

prepare_convert.py writes it, so a re-run with the same source and settings reuses a WAV instead of
converting it again; prepare_checks.py reads which WAVs this tool wrote (only those may be replaced or
deleted by --clean). The state is saved at the end of a run, interrupted or not; a run killed before
that (SIGKILL, a lost session) leaves `.prepare_claims`, the ids handed to a converter before their
WAVs were written, so the next run still knows those WAVs for its own.

The state (or prepare.py's report) also marks a folder as made by this tool (`made_by_prepare`): the
trainers write their clip cache only into such a folder; a corpus generated here is marked so too
(`mark_as_made`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from ..jsonfile import write_json_atomic
from .corpus_rows import Source

STATE_NAME = ".prepare_state.json"
REPORT_NAME = "prepare_report.json"  # prepare.py's report of the run; with the state: a folder it made
CLAIMS_NAME = ".prepare_claims"  # one clip id per line, appended before a converter writes its WAV


def made_by_prepare(data_dir: Path) -> bool:
    """Whether prepare_data.py (or a generator of corpora: `mark_as_made`) made `data_dir`: only such a
    folder gets files of ours beside its clips (the clip cache)."""
    return (data_dir / STATE_NAME).is_file() or (data_dir / REPORT_NAME).is_file()


def mark_as_made(data_dir: Path, source: str) -> None:
    """A corpus this tool generated (the demo's and the tests' in synthetic.py, the benchmarks'), marked
    as prepare_data.py marks its folders: the trainers keep their clip cache in it."""
    write_json_atomic(data_dir / STATE_NAME, {"version": 1, "source": source, "clips": {}}, indent=None)


def source_key(location: str) -> str:
    """A source as the state records it: a path resolved (the same folder typed two ways, or one
    relative path from two working directories, is told apart), a hub id as given."""
    path = Path(location).expanduser()
    return str(path.resolve()) if path.exists() else location


def load_state(data_dir: Path) -> dict:
    """The saved state (no clips when none; {"damaged": why} when it cannot be read), its "claimed" ids
    joined by those of `.prepare_claims`."""
    try:
        state = json.loads((data_dir / STATE_NAME).read_text(encoding="utf-8"))
    except FileNotFoundError:
        state = {"clips": {}}  # no state: a first run
    except (OSError, ValueError) as err:
        # everything is simply converted again; a refusal of the WAVs it listed says why (check_prepare_wavs)
        state = {"damaged": str(err).splitlines()[0][:80] if str(err) else type(err).__name__}
    if not (isinstance(state, dict) and (isinstance(state.get("clips"), dict) or "damaged" in state)):
        state = {"damaged": "not a state of clips"}
    claimed = set(state.get("claimed") or []) | read_claims(data_dir)
    if claimed:
        state = {"clips": {}, **state, "claimed": sorted(claimed)}
    return state


def owned_ids(state: dict) -> set[str]:
    """The clip ids whose WAVs this tool wrote, or began writing."""
    return set(state.get("clips", {})) | set(state.get("claimed") or [])


def read_claims(data_dir: Path) -> set[str]:
    try:
        text = (data_dir / CLAIMS_NAME).read_text(encoding="utf-8")
    except (OSError, ValueError):
        return set()
    return {line for line in text.split("\n") if line}


def claim(data_dir: Path, ids: list[str]) -> None:
    """Record `ids` as this tool's before their WAVs are written (flushed: a killed run keeps them)."""
    with open(data_dir / CLAIMS_NAME, "a", encoding="utf-8") as f:
        f.write("".join(f"{i}\n" for i in ids))
        f.flush()
        os.fsync(f.fileno())


def save_state(
    data_dir: Path, source: Source, clips: dict[str, dict], claimed: set[str], metadata_source: str | None
) -> None:
    """Write the state, then drop `.prepare_claims`: `claimed` carries the ids whose WAVs may exist
    without being in `clips` (handed to a converter, never collected); `metadata_source`: the source
    metadata.csv was written from (None: none yet)."""
    state = {"version": 1, "source": source_key(source.location), "clips": clips}
    if claimed - set(clips):
        state["claimed"] = sorted(claimed - set(clips))
    if metadata_source is not None:
        state["metadata_source"] = metadata_source
    write_json_atomic(data_dir / STATE_NAME, state, indent=None)
    (data_dir / CLAIMS_NAME).unlink(missing_ok=True)
