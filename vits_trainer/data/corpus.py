"""Source readers for prepare_data.py: turn a corpus on disk into candidate rows (a `datasets` dataset: corpus_hf.py).

Every reader returns a `Source` whose rows are `Candidate`s (an id, the raw text, a speaker, and where
the audio is) or `Problem`s (a row that could not even be parsed), defined in corpus_rows.py. Nothing
here decodes audio or judges the text: prepare_checks.py does the checks, so every format gets exactly
the same rules. Problems in the *source as a whole* (missing file, missing column, unknown layout)
raise UserError.
"""

from __future__ import annotations

import csv
import itertools
import json
import os
import re
import unicodedata
from collections import Counter
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path

from ..errors import UserError, cannot_read
from ..hub import looks_like_path
from .audio import AUDIO_EXTENSIONS
from .corpus_rows import (
    AUDIO_COLUMNS,
    TEXT_COLUMNS,
    Candidate,
    Problem,
    Row,
    Source,
    pick_column,
    resolve_in,
    speaker_column_of,
)
from .metadata import read_file_bytes, text_encoding
from .prepare_state import CLAIMS_NAME, made_by_prepare

FORMATS = ("auto", "ljspeech", "commonvoice", "csv", "hf", "audiofolder", "pairs")
AUDIOFOLDER_METADATA = ("metadata.csv", "metadata.jsonl", "metadata.parquet")
HF_DATA_SUFFIXES = (".parquet", ".arrow")
ARCHIVE_SUFFIXES = (".zip", ".tar.gz", ".tgz", ".tar.bz2", ".tar.xz", ".tar", ".7z", ".rar")
BOM = "\ufeff"  # a byte-order mark, as text
TRANSCRIPT_SUFFIXES = (".txt", ".lab")  # pairs: x.wav + x.txt, or x.lab (Montreal Forced Aligner corpora)


_COLUMNS = ("--audio_column", "--text_column", "--speaker_column", "--id_column")
FLAGS_READ = {  # the source flags each layout reads
    "ljspeech": (),
    "commonvoice": ("--split",),
    "csv": _COLUMNS,
    "hf": (*_COLUMNS, "--split"),
    "audiofolder": (*_COLUMNS, "--split"),
    "pairs": (),
}


def open_source(
    source: str,
    fmt: str = "auto",
    split: str | None = None,
    audio_column: str | None = None,
    text_column: str | None = None,
    speaker_column: str | None = None,
    id_column: str | None = None,
    exclude: Path | None = None,
) -> Source:
    """Read `source` in format `fmt` ("auto" detects). `exclude` is a folder never scanned (the output)."""
    if fmt not in FORMATS:
        raise UserError(f"--format {fmt}: unknown format (choose from {', '.join(FORMATS)})")
    path = Path(source).expanduser()
    table_note = None
    if fmt == "auto":
        fmt, path = detect_format(source)
        if fmt == "csv" and Path(source).expanduser().is_dir():
            table_note = (
                f"{source} has no x.txt/x.lab transcripts beside its audio, so it is read through its only "
                f"table, {path.name}; pass another table as --source to read that one, or --format to read "
                "the folder as another layout"
            )
    columns = dict(audio_column=audio_column, text_column=text_column, speaker_column=speaker_column)
    given = {
        f"--{name}": value for name, value in {**columns, "id_column": id_column, "split": split}.items()
    }
    unused = [flag for flag, value in given.items() if value is not None and flag not in FLAGS_READ[fmt]]
    if unused:  # a flag that would change nothing: the user expects it to
        reads = ", ".join(FLAGS_READ[fmt]) or "none of these flags"
        raise UserError(
            f"{', '.join(unused)}: not used by the {fmt} layout of --source {source} (it reads {reads}); "
            "drop it, or pass --format csv to read a table's columns"
        )
    if fmt == "hf":
        from .corpus_hf import read_hf  # imports `datasets` only when it is needed

        return read_hf(source, split, id_column=id_column, **columns)
    if not path.exists():
        raise UserError(f"--source {source}: no such file or folder")
    if fmt == "ljspeech":
        return read_ljspeech(path)
    if fmt == "commonvoice":
        return read_commonvoice(path, split)
    if fmt == "csv":
        if path.is_dir():  # --format csv and a folder: its one table, as auto-detection reads it
            path = _only_table(source, path)
            table_note = f"--format csv: {source} is a folder; read through its only table, {path.name}"
        table = read_table(path, id_column=id_column, **columns)
        table.notes[:0] = [table_note] if table_note else []
        return table
    if fmt == "audiofolder":
        return read_audiofolder(path, split, id_column=id_column, **columns)
    return read_pairs(path, exclude)


def detect_format(source: str) -> tuple[str, Path]:
    """Guess the layout of `source`; return (format, path to read). Raise UserError when unsure."""
    path = Path(source).expanduser()
    if not path.exists():
        if looks_like_path(source) or not re.fullmatch(r"[\w.-]+(/[\w.-]+)?", source):
            raise UserError(f"--source {source}: no such file or folder")
        return "hf", path  # an `owner/name` hub id
    if path.is_file():
        folder = path.parent
        if path.name == "metadata.csv" and _is_ljspeech(folder):
            return "ljspeech", folder
        if path.suffix == ".tsv" and (folder / "clips").is_dir() and "client_id" in _first_line(path):
            return "commonvoice", path  # that TSV (read_commonvoice), not the folder's validated.tsv
        clip = _audio_beside(path) if path.suffix.lower() in TRANSCRIPT_SUFFIXES else None
        if clip is not None:  # x.txt beside x.wav: one clip's transcript, not a table
            raise UserError(
                f"--source {source}: the transcript of one clip ({clip.name} beside it), not a corpus; "
                f"pass the folder that holds the clips and their transcripts, --source {folder}"
            )
        if path.suffix.lower() in (".csv", ".tsv", ".txt"):
            return "csv", path
        if path.suffix.lower() in HF_DATA_SUFFIXES:
            return "hf", path  # one data file of a hub dataset (e.g. data/train-00000-of-00001.parquet)
        archive = next((a for a in ARCHIVE_SUFFIXES if path.name.lower().endswith(a)), None)
        if archive is not None:  # no layout reads inside an archive: --format would not help
            unpacked = path.with_name(path.name[: -len(archive)])
            how = {".zip": f" (unzip {path} -d {unpacked})", ".7z": "", ".rar": ""}.get(
                archive, f" (mkdir {unpacked} && tar -xf {path} -C {unpacked})"
            )
            raise UserError(
                f"--source {source}: an archive ({archive}); unpack it{how} and pass the corpus folder it "
                "holds as --source"
            )
        if path.suffix.lower() in AUDIO_EXTENSIONS:  # one clip: its transcript is beside it or in a table
            raise UserError(
                f"--source {source}: one audio file, not a corpus; pass the folder that holds it and its "
                f"transcript ({path.stem}.txt beside {path.name}), --source {folder}, or a .csv/.tsv table "
                "listing it (columns file_name, text)"
            )
        raise UserError(
            f"--source {source}: a file, but not a .csv/.tsv table or a .parquet/.arrow data file; "
            "pass --format or a folder"
        )
    if (path / "state.json").is_file() or (path / "dataset_dict.json").is_file():
        return "hf", path  # a `save_to_disk` folder
    if _is_ljspeech(path):
        return "ljspeech", path
    if (path / "clips").is_dir() and any((path / n).is_file() for n in ("validated.tsv", "train.tsv")):
        return "commonvoice", path
    if _audiofolder_metadata(path):
        return "audiofolder", path
    prepared: list[Path] = []
    files = set(_walk(path, None, prepared))
    if any(p.suffix in HF_DATA_SUFFIXES for p in files):
        return "hf", path
    audio = [p for p in files if p.suffix.lower() in AUDIO_EXTENSIONS]
    if not any(_transcript_of(p, files) for p in audio):  # clips listed in a table, not x.wav + x.txt
        tables = folder_tables(path)
        listing = [t for t in tables if _lists_audio(t)]
        if len(tables) == 1 and listing:
            return "csv", tables[0]
        if len(tables) > 1 and listing:  # which one lists the clips is the user's to say
            names = ", ".join(t.name for t in tables)
            raise UserError(
                f"--source {source}: several tables ({names}) and no x.txt/x.lab transcripts beside the "
                f"audio; pass the table listing the clips as --source (e.g. --source {listing[0]})"
            )
        # else none names an audio column or file (an id|text list whose ids have no clip): pairs, as before
    if audio:
        return "pairs", path
    if prepared:  # only a data folder of ours inside: that one was meant
        raise UserError(
            f"--source {source}: no corpus here but {prepared[0]}, a data folder prepare_data.py wrote; "
            f"to read that one, pass --source {prepared[0]}"
        )
    raise UserError(
        f"--source {source}: could not detect the format (looked for metadata.csv + wavs/, "
        "validated.tsv + clips/, a datasets folder, audio + .txt/.lab pairs); pass --format"
    )


# --- LJSpeech: metadata.csv (id|text[|normalized_text]) + wavs/ (or the clips beside it) ------------


def read_ljspeech(root: Path) -> Source:
    meta = root / "metadata.csv"
    if not meta.is_file():
        raise UserError(f"--source {root}: no metadata.csv (LJSpeech layout: metadata.csv + wavs/)")
    text = _read_text(meta)
    if "\n" not in text:  # lines ended by a lone CR (classic Mac OS): else the whole file is one row
        text = text.replace("\r", "\n")
    lines = text.split("\n")
    parsed: list[tuple[int, list[str]]] = []
    rows: list[Row] = []
    for number, line in enumerate(lines, start=1):
        # a byte-order mark inside: files saved with one and joined (cat a.csv b.csv); it began an id
        line = line.rstrip("\r").lstrip(BOM)
        if not line.strip():
            continue
        fields = line.split("|")
        origin = f"{meta.name}:{number}"
        if len(fields) not in (2, 3) or not fields[0].strip():
            detail = f"expected id|text or id|text|normalized_text, got {len(fields)} field(s)"
            rows.append(Problem(origin, "malformed_row", detail, fields[0].strip()))
        elif _has_bad_utf8(line):
            clip_id = "" if _has_bad_utf8(fields[0]) else fields[0].strip()
            rows.append(Problem(origin, "malformed_row", "not valid UTF-8", clip_id))
        else:
            parsed.append((number, fields))
    twos = sum(1 for _, fields in parsed if len(fields) == 2)
    if twos > len(parsed) - twos > 0:
        # a few id|x|y rows among id|text ones: a '|' inside the text, and where the text ends a guess
        detail = f"3 fields where {twos} of the file's rows have 2 (id|text): a '|' inside the text?"
        rows += [
            Problem(f"{meta.name}:{number}", "text_has_pipe", detail, fields[0].strip())
            for number, fields in parsed
            if len(fields) == 3
        ]
        parsed = [(number, fields) for number, fields in parsed if len(fields) == 2]
    third_is_speaker = _third_column_is_speaker([f for _, f in parsed])
    clips = _ljspeech_clips(root)
    notes = [] if clips != root else ["no wavs/ folder: the clips are read from beside metadata.csv"]
    if third_is_speaker:
        notes.append("metadata.csv's third column looks like speaker ids (id|text|speaker); used as speaker")
    first_line = next((number for number, line in enumerate(lines, start=1) if line.lstrip(BOM).strip()), 0)
    if parsed and parsed[0][0] == first_line and _is_header_row(parsed[0][1]):
        clip_id, audio = _ljspeech_audio(root, clips, parsed[0][1][0].strip())
        if not audio.is_file():
            notes.append(
                f"metadata.csv's first line ({lines[first_line - 1].strip()}) is a header row: not read as a clip"
            )
            parsed = parsed[1:]
    replaced = 0
    absolute_ids = _AbsolutePathIds()
    for number, fields in parsed:
        first = fields[0].strip()
        clip_id, audio = _ljspeech_audio(root, clips, first)
        text, speaker = fields[1], "0"
        if len(fields) == 3 and third_is_speaker:
            speaker = fields[2].strip() or "0"
        elif len(fields) == 3 and fields[2].strip():
            replaced += fields[2].strip() != fields[1].strip()
            text = fields[2]  # the normalized column, when present
        id_path = first if Path(first).suffix.lower() in AUDIO_EXTENSIONS else None
        candidate = Candidate(clip_id, text, speaker, f"{meta.name}:{number}", audio_path=audio)
        absolute_ids.append(rows, candidate, id_path)
    if replaced:
        notes.append(
            f"metadata.csv's third column is read as normalized text (LJSpeech's id|text|normalized_text): "
            f"it is the text of {replaced} row(s) where it differs from the second"
        )
    return Source("ljspeech", str(root), absolute_ids.apart(rows), folder=root, notes=notes)


def _is_header_row(fields: list[str]) -> bool:
    """Column names (id|text, file|transcript|speaker ...), as a spreadsheet writes above the rows."""
    first, text = fields[0].strip().casefold(), fields[1].strip().casefold()
    return first in ("id", "name", *AUDIO_COLUMNS) and text in TEXT_COLUMNS


def _third_column_is_speaker(rows: list[list[str]]) -> bool:
    """LJSpeech's 3rd column is normalized text; our own output's is a speaker id.

    Normalized text of a multi-word sentence has spaces, so a 3rd column of single short tokens next
    to multi-word texts can only be speakers; one with spaces is normalized text when it shares a word
    with the text in at least half the rows, else speaker names ("Ana Lopez"). A corpus of single
    words (a keyword or digit corpus) is read as speakers too when every row has a 3rd column, none
    equal to its text, with at most half as many distinct values as rows (normalized words are mostly
    the words themselves, and many); otherwise it stays on the LJSpeech reading.
    """
    thirds = [r for r in rows if len(r) == 3]
    if not any(r[2].strip() for r in thirds):  # none, or all empty (id|text|): no speakers in it
        return False
    short = all(len(r[2].strip()) <= 64 for r in thirds)
    if any(len(r[1].split()) > 1 for r in thirds):
        if short and not any(re.search(r"\s", r[2].strip()) for r in thirds):
            return True
        # names with spaces ("Ana Lopez", "The Narrator") share no word with the texts; normalized
        # text shares most
        filled = [r for r in thirds if r[2].strip()]
        return 2 * sum(_shares_a_word(r[1], r[2]) for r in filled) < len(filled)
    few_values = len({r[2].strip() for r in thirds}) <= len(thirds) // 2
    unlike_text = all(r[2].strip() != r[1].strip() for r in thirds)
    return short and len(thirds) == len(rows) >= 4 and few_values and unlike_text


def _shares_a_word(text: str, other: str) -> bool:
    """Whether the two share a word of four letters or more ("the", "a" are in names and texts alike)."""

    def words(x: str) -> set[str]:
        return {w for w in re.findall(r"\w+", unicodedata.normalize("NFC", x).casefold()) if len(w) >= 4}

    return bool(words(text) & words(other))


def _ljspeech_audio(root: Path, clips: Path, first: str) -> tuple[str, Path]:
    """(clip id, audio path) of a metadata.csv row's first field: an id (LJ001-0001, its audio in `clips`)
    or, as home-made corpora often write it, the clip's file name or its path from metadata.csv's folder
    (LJ001-0001.wav, wavs/LJ001-0001.wav). A missing file is returned all the same: the checks report it."""
    if Path(first).suffix.lower() not in AUDIO_EXTENSIONS:
        return first, _find_audio(clips, first)
    path = resolve_in(clips, first, root)
    if Path(first).expanduser().is_absolute() or not path.is_relative_to(root):
        return _path_id(first), path
    inside = clips if path.is_relative_to(clips) else root
    return _path_id(str(path.relative_to(inside))), path


def _find_audio(folder: Path, stem: str) -> Path:
    """`folder/<stem>.wav`, or the same stem with another audio extension when only that exists."""
    wav = folder / f"{stem}.wav"
    if wav.is_file():
        return wav
    # a recorder's or Windows' upper-case extension (ZOOM0001.WAV) too, as the pairs reader finds it
    for ext in (*AUDIO_EXTENSIONS, *(e.upper() for e in AUDIO_EXTENSIONS)):
        other = folder / f"{stem}{ext}"
        if other.is_file():
            return other
    return wav  # missing: the check reports it


# --- Common Voice: validated.tsv / train.tsv + clips/ --------------------------------------------------


def read_commonvoice(root: Path, split: str | None) -> Source:
    if root.is_file():
        root, split = root.parent, split or root.stem
    name = split or ("validated" if (root / "validated.tsv").is_file() else "train")
    tsv = root / f"{name}.tsv"
    if not tsv.is_file():
        found = sorted(p.stem for p in root.glob("*.tsv"))
        raise UserError(
            f"--source {root}: no {tsv.name} (--split picks one of: {', '.join(found) or 'none'})"
        )
    notes = [f"read {tsv.name}"]
    # Common Voice sentences contain quote characters: tab-separated, no quoting at all.
    rows = _table_rows(
        tsv,
        "\t",
        audio_column="path",
        text_column="sentence",
        speaker_column="client_id",
        id_column=None,
        audio_root=root / "clips",
        notes=notes,
        id_from="stem",
    )
    return Source("commonvoice", str(root), rows, folder=root, notes=notes)


# --- Any CSV/TSV table with audio-path and text columns ------------------------------------------------


def read_table(
    path: Path,
    audio_column: str | None = None,
    text_column: str | None = None,
    speaker_column: str | None = None,
    id_column: str | None = None,
) -> Source:
    if not path.is_file():
        raise UserError(f"--source {path}: --format csv needs a .csv/.tsv file")
    delimiter = sniff_delimiter(path)
    notes: list[str] = []
    rows = _table_rows(
        path,
        delimiter,
        audio_column,
        text_column,
        speaker_column,
        id_column,
        path.parent,
        notes=notes,
        headerless=True,
    )
    return Source("csv", str(path), rows, folder=path.parent, notes=notes)


def sniff_delimiter(path: Path) -> str:
    """Tab for .tsv; in a first line naming an audio file (a table without a header), the character right
    after the name (`wavs/a.wav|Hello, world` is '|'); otherwise whichever of , ; tab | the header line
    splits on most."""
    if path.suffix.lower() == ".tsv":
        return "\t"
    header = _first_line(path)
    extensions = "|".join(re.escape(e.lstrip(".")) for e in sorted(AUDIO_EXTENSIONS))
    after_audio = re.search(rf"\.(?:{extensions})[ \"']*([,;\t|])", header, re.IGNORECASE)
    if after_audio:
        return after_audio.group(1)
    counts = {d: header.count(d) for d in (",", ";", "\t", "|")}
    best = max(counts, key=lambda d: counts[d])
    return best if counts[best] else ","


def _table_rows(
    path: Path,
    delimiter: str,
    audio_column: str | None,
    text_column: str | None,
    speaker_column: str | None,
    id_column: str | None,
    audio_root: Path,
    notes: list[str],
    id_from: str = "relpath",
    headerless: bool = False,
) -> list[Row]:
    """The table's rows, and what is worth saying about its columns added to `notes`; `headerless` (a
    plain CSV/TSV): a table without a header row is read too."""
    # tab- and pipe-separated lists (filelists, LJSpeech-like) never quote: a '"' is part of the text
    quoting = csv.QUOTE_NONE if delimiter in ("\t", "|") else csv.QUOTE_MINIMAL
    with _open_text(path) as f:
        # a byte-order mark starting a line inside: files saved with one and joined (cat a.csv b.csv)
        reader = csv.reader((line.lstrip(BOM) for line in f), delimiter=delimiter, quoting=quoting)
        # blank lines above the header (or the first clip) are skipped, not taken for the header
        first_line = reader.line_num + 1  # where the record read next starts (a quoted one may span lines)
        first = next(reader, None)
        while first is not None and not any(x.strip() for x in first):
            first_line = reader.line_num + 1
            first = next(reader, None)
        first = first or []
        header = [h.strip() for h in first]
        if not header:
            raise UserError(f"{path}: empty file (expected a header row)")
        named = (audio_column, text_column, speaker_column, id_column) != (None,) * 4
        columns = None if not headerless or named else _headerless_columns(header)
        records: Iterable[tuple[list[str], int]] = _numbered(reader)
        if columns is not None:
            records = list(records)
            columns = _most_rows_columns(first, records)
            header = columns
            speaker_column = "speaker" if "speaker" in columns else None
            notes.append(f"no header row: columns read as {', '.join(columns)} (the first row is a clip)")
        pending = [(first, first_line)] if columns is not None else []
        if columns is None and not named:
            _refuse_a_clip_for_a_header(path, header, delimiter, audio_root)
        audio_column = pick_column(path, header, audio_column, AUDIO_COLUMNS, "--audio_column")
        text_column = pick_column(path, header, text_column, TEXT_COLUMNS, "--text_column")
        for name, flag in ((speaker_column, "--speaker_column"), (id_column, "--id_column")):
            if name is not None and name not in header:
                raise UserError(f"{path}: {flag} {name} is not a column (columns: {', '.join(header)})")
        speaker_column, speaker_notes = speaker_column_of(header, speaker_column)
        notes += speaker_notes
        index = {name: i for i, name in enumerate(header)}

        def id_of(fields: list[str]) -> str:
            """The id a row would have had, for the report (not its first field: that may be a speaker)."""
            column = index[id_column] if id_column is not None else index[audio_column]
            value = fields[column].strip() if column < len(fields) else ""
            if not value or id_column is not None:
                return value
            return Path(value).stem if id_from == "stem" else _path_id(value)

        rows: list[Row] = []
        absolute_ids = _AbsolutePathIds()
        for fields, number in itertools.chain(pending, records):
            origin = f"{path.name}:{number}"
            if not any(x.strip() for x in fields):
                continue
            taken = _rows_taken_in(fields, delimiter, index[audio_column])
            if taken:  # each row listed in the report, not lost in one row's text
                detail = (
                    f"a '\"' opened on line {number} is never closed: the {len(taken)} row(s) after it were "
                    'read as its text; close it, or double it ("") for a quote inside a text'
                )
                rows.append(Problem(origin, "malformed_row", detail, id_of(fields)))
                for offset, cells in taken:
                    detail = f"read as the text of line {number}, whose '\"' is never closed"
                    rows.append(
                        Problem(f"{path.name}:{number + offset}", "malformed_row", detail, id_of(cells))
                    )
                continue
            if len(fields) != len(header):
                detail = f"expected {len(header)} fields, got {len(fields)}"
                rows.append(Problem(origin, "malformed_row", detail, id_of(fields)))
                continue
            if any(_has_bad_utf8(x) for x in fields):
                rows.append(Problem(origin, "malformed_row", "not valid UTF-8"))
                continue
            rel = fields[index[audio_column]].strip()
            if not rel:
                rows.append(Problem(origin, "missing_audio", f"empty {audio_column} field"))
                continue
            # else from the current folder: VITS's filelists name clips from the repository's root
            audio = resolve_in(audio_root, rel, Path.cwd())
            id_path = None  # the path the id is made from, when it is
            if id_column is not None:
                clip_id = fields[index[id_column]].strip()
            elif id_from == "stem":
                clip_id = Path(rel).stem
            else:
                clip_id, id_path = _path_id(rel), rel
            if id_from == "stem" and not audio.exists() and not audio.suffix:
                audio = audio.with_suffix(".mp3")  # some Common Voice releases list paths without .mp3
            speaker = fields[index[speaker_column]].strip() if speaker_column else ""
            text = fields[index[text_column]]
            absolute_ids.append(
                rows, Candidate(clip_id, text, speaker or "0", origin, audio_path=audio), id_path
            )
    return absolute_ids.apart(rows)


def _rows_taken_in(fields: list[str], delimiter: str, audio_index: int) -> list[tuple[int, list[str]]]:
    """The rows a quoted field that is never closed took in: (line after the record's first, cells) of
    each line inside the record that names an audio file in the audio column. A quoted text on two
    lines takes in none (its line break is reported as such)."""
    taken, offset = [], 0
    # the lines inside each field, not of the record joined: a closed quoted text on two lines ends its
    # second line with the record's next fields (`"two\nlines",wavs/a.wav`), which named an audio file
    for field in fields:
        lines = field.split("\n")
        for k, line in enumerate(lines[1:], start=1):
            cells = line.rstrip("\r").split(delimiter)
            if (
                audio_index < len(cells)
                and Path(cells[audio_index].strip().strip('"')).suffix.lower() in AUDIO_EXTENSIONS
            ):
                taken.append((offset + k, cells))
        offset += len(lines) - 1
    return taken


def _numbered(reader) -> Iterable[tuple[list[str], int]]:
    """A csv reader's records, each with the line it starts on (a quoted one may span lines)."""
    line = reader.line_num + 1
    for fields in reader:
        yield fields, line
        line = reader.line_num + 1


def _most_rows_columns(first: list[str], records: list[tuple[list[str], int]]) -> list[str] | None:
    """A headerless table's columns, as most of its rows have them: a first row whose text holds the
    delimiter (`wavs/a.wav,Hello, world`) alone made the list audio,speaker,text, kept that clip with a
    wrong text and speaker and made every other row malformed. Its own columns when as many rows agree.
    Three columns are path|speaker|text (VITS's filelists) unless most rows have spaces in the middle one
    only: path|text|speaker."""
    counts = Counter(len(fields) for fields, _ in records if any(x.strip() for x in fields))
    counts[len(first)] += 1
    most = max(counts, key=lambda n: (counts[n], n == len(first)))
    longer = [f for f, _ in records if len(f) == most] if most > len(first) else []
    # texts split at their unquoted commas ("Well, that is fine"), each cell after one beginning with a
    # space: not more columns. Read as path,speaker,text, their first words were speakers, the rest texts
    if 2 * sum(all(x[:1].isspace() for x in f[len(first) :]) for f in longer) > len(longer):
        most = len(first)
    if most == len(first):
        template = first
    else:
        template = next(
            (f for f, _ in records if len(f) == most and _headerless_columns(f) is not None), first
        )
    columns = _headerless_columns(template) or _headerless_columns(first)
    if columns is not None and len(columns) == 3:
        # path|text|speaker (this tool's id|text|speaker, with paths): texts with spaces in the middle,
        # one-word names last. Read as path|speaker|text, every clip had its speaker's name for a text
        rows = [[x.strip() for x in f] for f in [first, *(f for f, _ in records)] if len(f) == 3]
        spaced = [(bool(re.search(r"\s", f[1])), bool(re.search(r"\s", f[2]))) for f in rows]
        if 2 * sum(middle and not last for middle, last in spaced) > len(spaced):
            return ["audio", "text", "speaker"]
    return columns


class _AbsolutePathIds:
    """A reader's rows whose id `_path_id` made from an absolute audio path: the bare file name. Two
    different files may share one (/data/spk1/000.wav, /data/spk2/000.wav), and the second would be
    dropped as a duplicate of the first: `apart` then gives each of those rows its file's path from the
    folder all of them share (spk1/000, spk2/000), as a relative path's id is; the same file listed twice
    stays a duplicate. The readers of tables, LJSpeech's metadata.csv and audiofolder records share it."""

    def __init__(self) -> None:
        self._audio: dict[int, str] = {}  # row index -> its audio file, normalised

    def append(self, rows: list[Row], candidate: Candidate, id_path: str | None) -> None:
        """Append `candidate` to `rows`; `id_path`: the audio path, as the source writes it, that its id
        was made from (None: the id was not made from a path)."""
        if id_path is not None and Path(id_path).is_absolute():
            self._audio[len(rows)] = os.path.normpath(candidate.audio_path)
        rows.append(candidate)

    def apart(self, rows: list[Row]) -> list[Row]:
        """`rows`, those ids made from different files of one name replaced as above."""
        files_by_id: dict[str, set[str]] = {}
        for i, audio in self._audio.items():
            files_by_id.setdefault(rows[i].source_id, set()).add(audio)
        if all(len(files) == 1 for files in files_by_id.values()):
            return rows
        common = os.path.commonpath(list(self._audio.values()))
        rows = list(rows)
        for i, audio in self._audio.items():
            rows[i] = replace(rows[i], source_id=_path_id(os.path.relpath(audio, common)))
        return rows


def _refuse_a_clip_for_a_header(path: Path, header: list[str], delimiter: str, audio_root: Path) -> None:
    """A first row that names no known column but whose first cell is the id of a clip (its audio beside
    the table or in wavs/) is a clip, not a header: LJSpeech's id|text written with another separator.
    Read as a header, its cells were offered as column names for --audio_column, which dropped that clip."""
    if not header or any(cell.casefold() in AUDIO_COLUMNS + TEXT_COLUMNS for cell in header):
        return
    clip = header[0]
    if not clip or Path(clip).suffix.lower() in AUDIO_EXTENSIONS:
        return
    bases = (audio_root, audio_root / "wavs")
    audio = next(
        (f for base in bases for ext in AUDIO_EXTENSIONS if (f := base / f"{clip}{ext}").is_file()), None
    )
    if audio is None:
        return
    shown = {"\t": "<tab>"}.get(delimiter, delimiter)
    lj = (
        " (or separate id and text with '|', as LJSpeech's metadata.csv does)"
        if path.name == "metadata.csv"
        else ""
    )
    raise UserError(
        f"{path}: its first line is a clip ({audio} is its audio), not a header naming the columns; add a first "
        f"line naming them, file_name{shown}text, and give the audio files' names in file_name{lj}"
    )


def _headerless_columns(first: list[str]) -> list[str] | None:
    """Column names for a table whose first row is already a clip, as in VITS's filelists (path|text,
    path|speaker|text): one cell names an audio file and no cell is a known column name. The text is
    the last column; a middle one without spaces is the speaker. None: the first row is a header."""
    if any(cell.casefold() in AUDIO_COLUMNS + TEXT_COLUMNS for cell in first):
        return None
    audio = [i for i, cell in enumerate(first) if Path(cell).suffix.lower() in AUDIO_EXTENSIONS]
    if len(first) not in (2, 3) or audio != [0]:
        return None
    if len(first) == 2:
        return ["audio", "text"]
    middle = first[1].strip()
    return ["audio", "speaker" if middle and not re.search(r"\s", middle) else "(unused)", "text"]


# --- audiofolder: metadata.csv/.jsonl/.parquet with a file_name column, read without `datasets` ---------


def read_audiofolder(
    root: Path,
    split: str | None,
    audio_column: str | None = None,
    text_column: str | None = None,
    speaker_column: str | None = None,
    id_column: str | None = None,
) -> Source:
    """The `audiofolder` layout, read directly: `datasets` needs torchcodec just to index such a folder."""
    if split is not None:
        base = root / split
        if not base.is_dir():
            raise UserError(f"--source {root}: no {split}/ folder for --split {split}")
    else:
        base = root / "train" if _audiofolder_metadata(root / "train") else root
    metas = _audiofolder_metadata(base)
    if not metas:
        raise UserError(f"--source {root}: no metadata.csv/.jsonl/.parquet with a file_name column")
    audio_column = audio_column or "file_name"
    rows: list[Row] = []
    notes = [f"read {len(metas)} metadata file(s)"]
    for meta in metas:
        if meta.suffix == ".csv":
            delimiter = sniff_delimiter(meta)
            rows += _table_rows(
                meta,
                delimiter,
                audio_column,
                text_column,
                speaker_column,
                id_column,
                meta.parent,
                notes=notes,
            )
        else:
            records = _read_records(meta)
            keys = sorted({k for r in records if r for k in r})
            speakers, speaker_notes = speaker_column_of(keys, speaker_column)
            notes += speaker_notes
            rows += _record_rows(meta, records, audio_column, text_column, speakers, id_column)
    return Source("audiofolder", str(root), rows, folder=root, notes=list(dict.fromkeys(notes)))


def _read_records(meta: Path) -> list[dict | None]:
    if meta.suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.read_table(meta).to_pylist()
    records: list[dict | None] = []
    for line in _read_text(meta).split("\n"):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError:
            value = None
        records.append(value if isinstance(value, dict) else None)
    return records


def _record_rows(
    meta: Path,
    records: list[dict | None],
    audio_column: str,
    text_column: str | None,
    speaker_column: str | None,
    id_column: str | None,
) -> list[Row]:
    keys = sorted({k for r in records if r for k in r})
    text_column = pick_column(meta, keys, text_column, TEXT_COLUMNS, "--text_column")
    rows: list[Row] = []
    absolute_ids = _AbsolutePathIds()
    for number, record in enumerate(records, start=1):
        origin = f"{meta.name}:{number}"
        if record is None:
            rows.append(Problem(origin, "malformed_row", "not a JSON object"))
            continue
        rel, text = record.get(audio_column), record.get(text_column)
        if not isinstance(rel, str) or not rel.strip():
            rows.append(Problem(origin, "missing_audio", f"no {audio_column} value"))
            continue
        id_path = None if id_column else rel  # the path the id is made from, when it is
        clip_id = str(record.get(id_column, "")) if id_column else _path_id(rel)
        speaker = str(record.get(speaker_column) or "0") if speaker_column else "0"
        text = "" if text is None else str(text)
        audio = resolve_in(meta.parent, rel)
        absolute_ids.append(rows, Candidate(clip_id, text, speaker, origin, audio_path=audio), id_path)
    return absolute_ids.apart(rows)


def _audiofolder_metadata(folder: Path) -> list[Path]:
    """Metadata files of an audiofolder under `folder` (those naming a `file_name` column)."""
    if not folder.is_dir():
        return []
    found = []
    for p in sorted(_walk(folder, None)):
        if p.name not in AUDIOFOLDER_METADATA:
            continue
        if p.suffix == ".parquet" or "file_name" in _first_line(p):
            found.append(p)
    return found


# --- A folder of audio files with same-name .txt (or .lab, aligner corpora's) transcripts ---------------


def read_pairs(root: Path, exclude: Path | None = None) -> Source:
    if not root.is_dir():
        raise UserError(f"--source {root}: --format pairs needs a folder of audio + .txt/.lab files")
    prepared: list[Path] = []
    files = sorted(_walk(root, exclude, prepared))
    audio = [p for p in files if p.suffix.lower() in AUDIO_EXTENSIONS]
    if not audio:
        raise UserError(f"--source {root}: no audio files ({', '.join(AUDIO_EXTENSIONS)}) found")
    stems_with_audio = {p.with_suffix("") for p in audio}
    rows: list[Row] = []
    for wav in audio:
        # x.wav and x.flac both give id "x": the duplicate check reports the second one.
        clip_id = _path_id(str(wav.relative_to(root)))
        txt = _transcript_of(wav)
        if txt is None:
            rows.append(Problem(str(wav), "missing_text", "audio has no .txt or .lab transcript", clip_id))
            continue
        text = _read_text(txt).strip()
        if _has_bad_utf8(text):
            rows.append(Problem(str(txt), "malformed_row", "transcript is not valid UTF-8", clip_id))
            continue
        rows.append(Candidate(clip_id, text, "0", str(wav), audio_path=wav))
    others = {
        p.with_suffix(""): p
        for p in files
        if p.suffix.lower() not in (*AUDIO_EXTENSIONS, *TRANSCRIPT_SUFFIXES)
    }
    for txt in files:
        if txt.suffix.lower() in TRANSCRIPT_SUFFIXES and txt.with_suffix("") not in stems_with_audio:
            clip_id = _path_id(str(txt.relative_to(root)))
            beside = others.get(txt.with_suffix(""))  # x.m4a, x.aac, x.wma: audio of a format not read
            if beside is not None:
                detail = (
                    f"{beside.name} is not a format read here ({', '.join(AUDIO_EXTENSIONS)}): convert it, "
                    "e.g. ffmpeg -i x.m4a x.wav"
                )
                rows.append(Problem(str(beside), "unsupported_audio", detail, clip_id))
                continue
            rows.append(Problem(str(txt), "missing_audio", "transcript has no audio file", clip_id))
    tables = folder_tables(root)
    notes = []
    if tables and any(isinstance(r, Candidate) for r in rows):  # the transcripts won: say what was left
        names = ", ".join(t.name for t in tables)
        notes.append(
            f"{root} is read as audio + .txt/.lab transcript pairs; {names} beside them "
            f"{'is' if len(tables) == 1 else 'are'} not read "
            f"(pass {'it' if len(tables) == 1 else 'one'} as --source to read the clips it lists instead)"
        )
    if prepared:  # said, not silently left out
        one = len(prepared) == 1
        names = ", ".join(map(str, sorted(prepared)[:3])) + ("" if len(prepared) <= 3 else ", ...")
        notes.append(
            f"{names} {'is' if one else 'are'} not read: {'a data folder' if one else 'data folders'} "
            f"prepare_data.py wrote inside --source ({'its' if one else 'their'} clips are prepared copies, "
            f"not more of the corpus); pass {'it' if one else 'one'} as --source to read it instead"
        )
    return Source("pairs", str(root), rows, folder=root, notes=notes)


def _transcript_of(wav: Path, files: set[Path] | None = None) -> Path | None:
    """x.txt or x.lab beside audio x.wav (A.TXT beside A.WAV too): among `files`, else on disk."""
    suffixes = [x for suffix in TRANSCRIPT_SUFFIXES for x in (suffix, suffix.upper())]
    found = (t for t in map(wav.with_suffix, suffixes) if (t in files if files is not None else t.is_file()))
    return next(found, None)


def _audio_beside(transcript: Path) -> Path | None:
    """Audio x.wav (or X.WAV, x.flac, ...) beside transcript x.txt; None when there is none."""
    suffixes = [x for suffix in AUDIO_EXTENSIONS for x in (suffix, suffix.upper())]
    return next((a for a in map(transcript.with_suffix, suffixes) if a.is_file()), None)


def folder_tables(folder: Path) -> list[Path]:
    """The .csv/.tsv files at the top of `folder` (a folder of clips may list them in one); hidden files
    (macOS's ._x.csv) are none."""
    try:
        entries = list(folder.iterdir())
    except OSError:  # a parent folder that may not be listed (transcript_tables_hint looks there too)
        return []
    return sorted(
        p
        for p in entries
        if p.suffix.lower() in (".csv", ".tsv") and not p.name.startswith(".") and p.is_file()
    )


def _only_table(source: str, folder: Path) -> Path:
    """The one .csv/.tsv table at the top of `folder`, for --format csv given a folder; else UserError."""
    tables = folder_tables(folder)
    if len(tables) == 1:
        return tables[0]
    if not tables:
        raise UserError(
            f"--source {source}: a folder with no .csv/.tsv table; --format csv reads a table file"
        )
    names = ", ".join(t.name for t in tables)
    raise UserError(
        f"--source {source}: --format csv reads one table and this folder holds {names}; "
        f"pass the one listing the clips as --source (e.g. --source {tables[0]})"
    )


def _lists_audio(table: Path) -> bool:
    """Whether the table's first row names an audio column (file, path, ...) or, without a header row, an
    audio file."""
    delimiter = sniff_delimiter(table)
    cells = [cell.strip().strip("\"'") for cell in _first_line(table).rstrip("\r\n").split(delimiter)]
    return any(c.casefold() in AUDIO_COLUMNS for c in cells) or _headerless_columns(cells) is not None


def transcript_tables_hint(source: Source) -> str:
    """For a pairs folder where no clip had a transcript beside it: the tables near it that may hold
    them (a wavs/ folder given instead of the corpus folder above it, say); "" when there are none."""
    if source.format != "pairs" or source.folder is None:
        return ""
    folder = source.folder.resolve()
    tables = [t for base in (folder, folder.parent) for t in folder_tables(base)]
    # an empty one holds no transcripts: passed as --source it would only be refused as empty
    empty = [t for t in tables if _is_empty_text(t)]
    tables = [t for t in tables if t not in empty]
    if not tables:
        if empty:
            return f"; no clip has an x.txt or x.lab beside it, and {empty[0]} is empty"
        missing = [
            Path(r.origin) for r in source.rows if isinstance(r, Problem) and r.reason == "missing_text"
        ]
        lacking = next(iter(missing), None)
        # transcripts in a folder of their own (VCTK's txt/p225/ beside wav48/p225/): the same names
        alone = {
            Path(r.origin).stem: Path(r.origin)
            for r in source.rows
            if isinstance(r, Problem)
            and r.reason == "missing_audio"
            and Path(r.origin).suffix.lower() in TRANSCRIPT_SUFFIXES
        }
        apart = next(((clip, alone[clip.stem]) for clip in missing if clip.stem in alone), None)
        # LibriTTS's x.normalized.txt and x.original.txt beside x.wav: there, but named otherwise
        beside = {(t.parent, Path(t.stem).stem): t for t in reversed(alone.values()) if Path(t.stem).suffix}
        named = next(((c, beside[c.parent, c.stem]) for c in missing if (c.parent, c.stem) in beside), None)
        if named is not None:
            return (
                f"; {named[1].name} is beside {named[0].name} but a transcript is read from "
                f"{named[0].with_suffix('.txt').name}: copy or rename each (LibriTTS: x.normalized.txt to "
                "x.txt), or list the clips and their texts in a table (columns file_name, text) and pass it "
                "as --source"
            )
        if apart is not None:
            return (
                f"; the transcripts are in folders of their own: {apart[1]} is not beside {apart[0]}; put "
                "each x.txt beside its x.wav, or list the clips and their texts in a table (columns "
                "file_name, text) and pass it as --source"
            )
        example = f" ({lacking.with_suffix('.txt').name} for {lacking.name})" if lacking else ""
        return (
            f"; no clip has an x.txt or x.lab transcript beside it{example}: write them, or list the clips "
            "and their texts in a table (columns file_name, text) and pass it as --source"
        )
    names = ", ".join(map(str, tables[:3]))
    return f"; no clip has an x.txt or x.lab beside it. Are the transcripts in {names}? Pass it as --source"


def _is_empty_text(path: Path) -> bool:
    """A text file with nothing but blank lines (and a byte-order mark); read in chunks up to the first
    character that is not blank, so a large table is never read whole."""
    try:
        with open(path, encoding=_encoding(path)[0], errors="replace") as f:
            while chunk := f.read(65536):
                if chunk.strip("\ufeff \t\r\n"):
                    return False
            return True
    except OSError:
        return False


# --- helpers ---------------------------------------------------------------------------------------------


def _walk(root: Path, exclude: Path | None, prepared: list[Path] | None = None) -> Iterable[Path]:
    """Files under `root`, skipping hidden folders, `exclude` (the output folder) and the data folders
    prepare_data.py made below `root` (their clips are copies, with no transcripts beside them): those
    are added to `prepared`, for a note."""
    skip = exclude.resolve() if exclude is not None else None
    stack = [root]
    while stack:
        folder = stack.pop()
        try:
            entries = list(folder.iterdir())
        except OSError:
            continue
        for p in entries:
            if p.name.startswith("."):
                continue
            if p.is_dir():
                if skip is not None and p.resolve() == skip:
                    continue
                if made_by_prepare(p) or (p / CLAIMS_NAME).is_file():
                    if prepared is not None:
                        prepared.append(p)
                    continue
                stack.append(p)
            elif p.is_file():
                yield p


def _is_ljspeech(folder: Path) -> bool:
    """metadata.csv of id|text rows, with its clips in wavs/ or beside it (a listed id's audio there)."""
    meta = folder / "metadata.csv"
    if not meta.is_file():
        return False
    _open_text(meta).close()  # one that cannot be read is said, not taken for another layout's
    first = _first_line(meta)
    if "|" not in first or "file_name" in first:
        return False
    clips = _ljspeech_clips(folder)
    if clips != folder:  # a wavs/ folder
        return True
    firsts = [line.split("|", 1)[0].strip() for line in _first_lines(meta, 5) if "|" in line]
    return any(first and _ljspeech_audio(folder, clips, first)[1].is_file() for first in firsts)


def _ljspeech_clips(folder: Path) -> Path:
    """The folder an LJSpeech-style corpus keeps its clips in: wavs/, else the one holding metadata.csv."""
    return folder / "wavs" if (folder / "wavs").is_dir() else folder


def _first_line(path: Path) -> str:
    return (_first_lines(path, 1) or [""])[0]


def _first_lines(path: Path, count: int) -> list[str]:
    """The first `count` lines that are not blank: a table may start with blank lines above its header."""
    lines: list[str] = []
    try:
        with open(path, encoding=_encoding(path)[0], errors="replace") as f:
            while len(lines) < count and (line := f.readline(65536)):
                if line.strip():
                    lines.append(line)
    except OSError:
        return []
    return lines


def _encoding(path: Path) -> tuple[str, str]:
    """(encoding, errors) to read a text file with (metadata.text_encoding: UTF-16 by its byte-order mark,
    else UTF-8); surrogateescape for UTF-8, so a stray non-UTF-8 byte spoils one row (reported), not the
    whole file."""
    try:
        with open(path, "rb") as f:
            head = f.read(2)
    except OSError:
        head = b""
    encoding = text_encoding(head)
    return (encoding, "replace") if encoding == "utf-16" else (encoding, "surrogateescape")


def _read_text(path: Path) -> str:
    encoding, errors = _encoding(path)
    # permission denied, a folder named like the file: one error line
    return read_file_bytes(path, str(path)).decode(encoding, errors=errors)


def _open_text(path: Path):
    """`path` opened as text for the csv reader; one error line when it cannot be."""
    encoding, errors = _encoding(path)
    try:
        return open(path, encoding=encoding, errors=errors, newline="")
    except OSError as err:
        raise cannot_read(str(path), err) from None


def _has_bad_utf8(text: str) -> bool:
    # a NUL too: UTF-16 text without its byte-order mark, read as UTF-8 (a NUL cannot be in a path)
    return any("\udc80" <= ch <= "\udcff" or ch == "\x00" for ch in text)


def _path_id(rel: str) -> str:
    """An id from an audio path: a relative path without its extension (folders kept, made safe later);
    an absolute path gives just its stem."""
    p = Path(rel)
    if p.is_absolute():
        return p.stem
    return str(p.with_suffix("")) if p.suffix else str(p)
