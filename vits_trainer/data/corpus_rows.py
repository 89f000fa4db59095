"""What every source reader returns: a `Source` whose rows are `Candidate`s (an id, the raw text, a
speaker, and where the audio is) or `Problem`s (a row that could not even be parsed), plus the column
and path helpers the readers share (corpus.py's own formats, corpus_hf.py's `datasets` one).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import UserError

TEXT_COLUMNS = ("sentence", "text", "transcription", "transcript", "normalized_text")
AUDIO_COLUMNS = ("audio", "path", "file_name", "file", "audio_path", "audio_file", "wav", "filename")
# names a speaker column goes by; without --speaker_column only a column named `speaker` is read (a note
# says so), another is only named in a note (speaker_id may number the speakers of a whole dataset)
SPEAKER_COLUMNS = ("speaker", "speaker_id", "speaker_name", "spk", "spk_id", "client_id", "speaker_label")


@dataclass(frozen=True)
class Candidate:
    """One source row. Exactly one of `audio_path` / `audio_key` is set (or neither: missing audio)."""

    source_id: str
    text: str
    speaker: str
    origin: str  # where the row came from, for the report: "metadata.csv:12", "train[7]", a path
    audio_path: Path | None = None
    audio_key: int | None = None  # row index for Source.fetch_audio (audio held as bytes in a dataset)


@dataclass(frozen=True)
class Problem:
    """A row that could not be turned into a Candidate."""

    origin: str
    reason: str
    detail: str
    source_id: str = ""


Row = Candidate | Problem
AudioFetcher = Callable[[list[int]], list[bytes | None]]


@dataclass
class Source:
    format: str
    location: str  # the --source value, resolved when it is a path
    rows: list[Row]
    folder: Path | None = None  # local folder holding the source (None for a hub dataset)
    fetch_audio: AudioFetcher | None = None
    notes: list[str] = field(default_factory=list)


def pick_column(
    path: Path, header: list[str], wanted: str | None, defaults: tuple[str, ...], flag: str
) -> str:
    if wanted is not None:
        if wanted not in header:
            raise UserError(f"{path}: {flag} {wanted} is not a column (columns: {', '.join(header)})")
        return wanted
    for name in defaults:
        if name in header:
            return name
    # a spreadsheet's header is often capitalised ("File", "Transcript"): the column as it is spelled
    for name in defaults:
        spelled = [h for h in header if h.casefold() == name]
        if len(spelled) == 1:
            return spelled[0]
    raise UserError(
        f"{path}: no {flag[2:].replace('_column', '')} column found (tried {', '.join(defaults)}; "
        f"columns: {', '.join(header)}); pass {flag}"
    )


def speaker_column_of(columns: list[str], speaker_column: str | None) -> tuple[str | None, list[str]]:
    """(the speaker column to read, notes): --speaker_column's; else a column named `speaker` (in any
    case: a spreadsheet's "Speaker"), and a note says it is read; else none, every clip is speaker 0."""
    if speaker_column is not None:
        return speaker_column, []
    named = [c for c in columns if c.strip().casefold() == "speaker"]
    if len(named) == 1:
        return named[0], [
            f"column {named[0]!r} is read as each clip's speaker (--speaker_column names another column)"
        ]
    return None, _unused_speaker_note(columns)


def _unused_speaker_note(columns: list[str]) -> list[str]:
    """A note naming a column that looks like speakers when --speaker_column was not given."""
    found = [c for c in columns if c.strip().lower() in SPEAKER_COLUMNS]
    if not found:
        return []
    return [
        f"column {found[0]!r} is not used: every clip is speaker 0 "
        f"(pass --speaker_column {found[0]} to train one voice per speaker)"
    ]


def resolve_in(root: Path | None, rel: str, *more: Path) -> Path:
    """The audio file a table names: an absolute `rel` as it is, else `rel` from `root`, or from the first
    of `more` where it exists (`root / rel` when none has it: the checks report it missing). A table
    written on Windows names folders with backslashes (wavs\\a.wav): where no file has the backslashed
    name, the same path with '/' is taken when it exists."""
    p = Path(rel).expanduser()
    paths = [p] if p.is_absolute() or root is None else [base / p for base in (root, *more)]
    found = next((path for path in paths if path.exists()), None)
    if found is None and "\\" in rel and os.sep == "/":
        posix = resolve_in(root, rel.replace("\\", "/"), *more)
        if posix.exists():
            return posix
    return found or paths[0]
