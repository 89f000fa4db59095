"""The training set's `metadata.csv`: `id|text|speaker`, UTF-8 (read back from UTF-16 too), no header, one
clip per line.

Written by prepare_data.py, read by the trainers. Text never contains `|` or a newline (prepare
rejects such rows), so a plain split is exact and needs no quoting rules.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ..errors import UserError, cannot_read

METADATA_NAME = "metadata.csv"
WAVS_DIR = "wavs"
# beside an exported model: the ids of the clips its run held out (a feedback run keeps them held out)
SPLIT_FILE = "training_split.json"


@dataclass(frozen=True)
class MetaRow:
    id: str
    text: str
    speaker: str = "0"


def write_metadata(path: str | Path, rows: list[MetaRow]) -> None:
    """Write atomically (temp file + rename): an interrupted run never leaves half a file."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8", newline="\n") as f:
        for row in rows:
            if "|" in row.text or "\n" in row.text or "|" in row.id:
                raise ValueError(f"row {row.id!r}: '|' or newline in id/text")
            f.write(f"{row.id}|{row.text}|{row.speaker}\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)  # prepare: only after backing up another source's file (prepare.py)


def text_encoding(head: bytes) -> str:
    """The encoding of a text file starting with `head`: UTF-16 when it starts with UTF-16's byte-order
    mark (Windows Notepad's "Unicode", Excel's "Unicode Text" export), else UTF-8 (a byte-order mark
    dropped: "utf-8-sig")."""
    return "utf-16" if head[:2] in (b"\xff\xfe", b"\xfe\xff") else "utf-8-sig"


def read_file_bytes(path: Path, name: str) -> bytes:
    """A file of the user's, read whole: one error line naming it (`name`) when it cannot be read."""
    try:
        return path.read_bytes()
    except OSError as err:
        raise cannot_read(name, err) from None


def decode_text(data: bytes, name: str) -> str:
    """A text file's bytes as text (UTF-8, or UTF-16 with its byte-order mark: Notepad's "Unicode");
    one error line starting with `name` when they are neither."""
    encoding = text_encoding(data)
    try:
        return data.decode(encoding)
    except UnicodeDecodeError as err:
        if encoding == "utf-16":
            raise UserError(f"{name}: not UTF-16 text ({err.reason} at byte {err.start})") from None
        # a file saved by Excel or an older editor is often Windows-1252 or Latin-1
        line = data[: err.start].count(b"\n") + 1
        raise UserError(
            f"{name}: line {line} is not UTF-8 text ({err.reason} at byte {err.start}); a file saved by Excel "
            "or an older editor is often Windows-1252 or Latin-1: save it as UTF-8 and run again"
        ) from None


def read_metadata(path: str | Path) -> tuple[list[MetaRow], list[tuple[int, str]]]:
    """Return (rows, problems); problems are (line number, reason) for lines that cannot be used.

    A line with two fields (`id|text`) gets speaker "0". Blank lines are ignored.
    """
    path = Path(path)
    if path.is_dir():
        raise UserError(f"{path}: is a folder, not the file prepare_data.py writes; move it out of the way")
    if not path.is_file():
        raise UserError(f"{path}: no such file (run prepare_data.py first)")
    rows: list[MetaRow] = []
    problems: list[tuple[int, str]] = []
    seen: set[str] = set()
    # utf-8-sig: a metadata.csv edited in Notepad or Excel (a transcript fixed by hand) starts with a
    # byte-order mark, which became part of the first id: its clip was then reported missing
    lines = decode_text(read_file_bytes(path, str(path)), str(path)).splitlines()
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        fields = line.split("|")
        if len(fields) not in (2, 3):
            problems.append((number, f"expected id|text|speaker, got {len(fields)} fields"))
            continue
        clip_id, text = fields[0].strip(), fields[1].strip()
        speaker = fields[2].strip() if len(fields) == 3 and fields[2].strip() else "0"
        if not clip_id or not text:
            problems.append((number, "empty id or text"))
            continue
        if clip_id in seen:
            problems.append((number, f"duplicate id {clip_id}"))
            continue
        seen.add(clip_id)
        rows.append(MetaRow(clip_id, text, speaker))
    return rows, problems
