"""prepare_data.py's engine: check every source row, convert the audio in parallel, write the training set.

Output: `<data_dir>/wavs/<id>.wav` (mono 16-bit PCM at the target rate), `<data_dir>/metadata.csv`
(`id|text|speaker`), `<data_dir>/prepare_report.json` (every skipped row and why, warnings, counts,
settings) and `<data_dir>/.prepare_state.json` (what each WAV was made from, so a re-run reuses it).

Order of checks for a row: parse (source reader) -> id -> text -> speaker filter -> --max_samples
(that many rows already planned) -> vocabulary -> audio (missing, unreadable, empty, NaN/Inf, silent,
duration). A failing row is
skipped and listed in the report with its reason; the run never stops for a bad row. This module
runs those steps and writes the report; the settings are in prepare_settings.py, the checks in
prepare_checks.py, the conversion (and the audio checks, made on the decoded clip) in prepare_convert.py.
"""

from __future__ import annotations

import os
import statistics
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from ..errors import UserError
from ..jsonfile import write_json_atomic
from ..runlock import RunLock
from .audio import is_temp_wav
from .corpus import open_source, transcript_tables_hint
from .corpus_rows import Problem, Source
from .metadata import METADATA_NAME, WAVS_DIR, MetaRow, read_metadata, write_metadata
from .prepare_checks import (
    Planned,
    Skip,
    Vocabulary,
    check_output_folder,
    check_prepare_files,
    check_prepare_sources,
    check_prepare_wavs,
    check_report_replaceable,
    clean_speaker,
    plan_rows,
    resolve_target,
    validate_settings,
)
from .prepare_convert import CLIP_FRACTION, AudioTarget, Outcome, convert_all
from .prepare_settings import PrepareSettings
from .prepare_state import CLAIMS_NAME, REPORT_NAME, STATE_NAME, load_state, save_state, source_key

SHORT_DECODE = 0.8  # a file decoding to under this share of its header's length is warned about


@dataclass
class PrepareResult:
    data_dir: Path
    rows: list[MetaRow]
    report: dict
    report_path: Path


# --- public entry point ------------------------------------------------------------------------------


def say(message: str) -> None:
    """A line of prepare_data.py's output, sent at once: piped (a notebook cell, `| tee log`), print's
    buffer held the first line and the progress lines until the run ended."""
    print(message, flush=True)


def prepare(settings: PrepareSettings, log: Callable[[str], None] = say) -> PrepareResult:
    """Run the whole preparation; raise UserError for bad input (nothing written) or when no row survives."""
    validate_settings(settings)
    data_dir = Path(settings.data_dir).expanduser()
    check_output_folder(data_dir)
    check_prepare_sources(settings.source, data_dir)  # the source is never an output (before reading it)
    # one writer per training folder: a second prepare_data.py on it would delete the first one's
    # temporary WAVs and interleave two metadata.csv files
    lock = RunLock.acquire(data_dir, "--data_dir", log)
    try:
        return _prepare(settings, data_dir, log)
    finally:
        if lock is not None:
            lock.release()  # also removes the folder if this run created it and wrote nothing into it


def _prepare(settings: PrepareSettings, data_dir: Path, log: Callable[[str], None]) -> PrepareResult:
    sample_rate, vocab, model_notes = resolve_target(settings)
    source = open_source(
        settings.source,
        settings.format,
        split=settings.split,
        audio_column=settings.audio_column,
        text_column=settings.text_column,
        speaker_column=settings.speaker_column,
        id_column=settings.id_column,
        exclude=data_dir,
    )
    if source.folder is not None and source.folder.resolve() == data_dir.resolve():
        raise UserError(f"--data_dir {data_dir} is the source folder; write the training set somewhere else")
    # no source file may be written over: none inside data_dir/wavs, none equal to an output file
    check_prepare_files(
        ((c.origin, c.audio_path) for c in source.rows if getattr(c, "audio_path", None) is not None),
        data_dir,
        (METADATA_NAME, REPORT_NAME, STATE_NAME, CLAIMS_NAME),
    )
    for note in source.notes + model_notes + encoding_notes(source):
        log(f"note: {note}")

    planned, skipped, filtered, unknown_chars = plan_rows(source, settings, vocab)
    target = AudioTarget(
        sample_rate,
        settings.trim_top_db if settings.trim_silence else None,
        settings.min_seconds,
        settings.max_seconds,
    )
    wavs_dir = data_dir / WAVS_DIR
    old_state = load_state(data_dir)
    owned = check_prepare_wavs(wavs_dir, [p.clip_id for p in planned], old_state, settings.clean)
    check_report_replaceable(data_dir / REPORT_NAME)
    wavs_dir.mkdir(parents=True, exist_ok=True)
    log(
        f"{source.location} read as {source.format}: {len(source.rows)} source rows; {len(planned)} pass the "
        f"text checks -> {wavs_dir} at {sample_rate} Hz"
    )
    # the source the metadata.csv in place was written from: the state's metadata_source, or, in a state
    # written before that was recorded, the source of the run that wrote the state
    metadata_from = None
    if (data_dir / METADATA_NAME).is_file():
        metadata_from = old_state.get("metadata_source", old_state.get("source"))
    run = convert_all(planned, source, target, wavs_dir, old_state, settings, metadata_from, log)

    rows, audio_skipped, warnings, durations = split_by_outcome(planned, run.outcomes, sample_rate)
    skipped += audio_skipped  # after the rows the text checks skipped, as the report lists them

    kept_ids = {r.id for r in rows}
    unlisted = sorted(p for p in wavs_dir.glob("*.wav") if p.stem not in kept_ids)
    backup = metadata_backup_name(data_dir, metadata_from, source) if rows else None
    report = build_report(
        settings, source, sample_rate, vocab, rows, skipped, filtered, warnings, durations, unknown_chars
    )
    report["counts"].update(
        converted=run.converted,
        reused=run.reused,
        replaced_wavs=run.replaced,
        passed_text_checks=len(planned),
    )
    report["wavs"] = {
        "unlisted": len(unlisted) if not settings.clean else 0,
        "removed": len(unlisted) if settings.clean and rows else 0,
        "metadata_backup": str(backup) if backup else None,
    }
    report_path = data_dir / REPORT_NAME
    write_json_atomic(report_path, report)
    if not rows:
        log(format_summary(report, data_dir))
        raise no_usable_clips(source, report, filtered, planned, report_path)

    if backup is not None:  # another source's metadata.csv: moved to a fresh name, never overwritten
        move_metadata_aside(data_dir, backup, run.written, log)
    # replaced only when the state says this tool wrote it from this same source (else backed up above)
    write_metadata(data_dir / METADATA_NAME, rows)  # last: it lists only WAVs already in place
    save_state(data_dir, source, run.state, run.begun, source_key(source.location))
    finish_wavs(wavs_dir, unlisted, settings.clean, log, owned | set(run.state) | run.begun)
    log(format_summary(report, data_dir))
    return PrepareResult(data_dir, rows, report, report_path)


# --- report, output folder ---------------------------------------------------------------------------


def no_usable_clips(
    source: Source, report: dict, filtered: Counter, planned: list[Planned], report_path: Path
) -> UserError:
    """The error of a run that kept no row (its report written): the reasons counted, and the way on
    where the rows say it (transcripts elsewhere, a --speaker that matched none, --drop_unknown_chars)."""
    if not source.rows:  # a header row alone, an empty metadata.csv: no row to give a reason for
        return UserError(
            f"no usable clips: {source.location} (read as {source.format}) lists no clip; add the clips "
            f"to it, or pass the table that lists them as --source (see {report_path})"
        )
    reasons_by = report["counts"]["skipped_by_reason"]
    reasons = ", ".join(f"{k} {v}" for k, v in {**reasons_by, **filtered}.items()) or "none"
    no_text = "missing_text" in reasons_by and set(reasons_by) <= {"missing_text", "missing_audio"}
    hint = transcript_tables_hint(source) if no_text else ""
    if filtered["filtered_speaker"] and not planned:
        hint += f"; --speaker kept no row: {speakers_hint(source)}"
    if reasons_by.get("unknown_chars"):  # the way on is to keep them, not to look in the report
        hint += (
            f"; --drop_unknown_chars dropped {reasons_by['unknown_chars']} row(s) for characters the model's "
            "vocabulary lacks: leave it out to keep them (train_vits.py --extend_vocab adds the characters)"
        )
    return UserError(f"no usable clips ({reasons}); see {report_path}{hint}")


def split_by_outcome(
    planned: list[Planned], outcomes: dict[str, Outcome], sample_rate: int
) -> tuple[list[MetaRow], list[Skip], list[dict], list[float]]:
    """The planned rows by their conversion's outcome, in their order: (rows kept, rows the audio checks
    skipped, the kept clips' warnings for the report, the kept clips' durations)."""
    rows: list[MetaRow] = []
    skipped: list[Skip] = []
    warnings: list[dict] = []
    durations: list[float] = []
    for item in planned:
        outcome = outcomes[item.clip_id]
        if outcome.reason is not None:
            skipped.append(Skip(item.clip_id, item.row.origin, outcome.reason, outcome.detail))
            continue
        rows.append(MetaRow(item.clip_id, item.text, item.speaker))
        durations.append(outcome.seconds)
        warnings += [
            {"id": item.clip_id, "origin": item.row.origin, "warning": kind, "detail": detail}
            for kind, detail in clip_warnings(outcome, sample_rate)
        ]
    return rows, skipped, warnings, durations


def clip_warnings(outcome: Outcome, sample_rate: int) -> list[tuple[str, str]]:
    """(warning, detail) of a kept clip: cut short, recorded below the target rate, clipped."""
    found = []
    if outcome.decoded_seconds < SHORT_DECODE * outcome.header_seconds - 0.5:
        found.append(
            (
                "shorter_than_header",
                f"decodes to {outcome.decoded_seconds:.2f} s where its header says {outcome.header_seconds:.2f} s: "
                "cut short? (its transcript may say more than the audio)",
            )
        )
    if 0 < outcome.source_rate < sample_rate:  # resampled up: nothing above half the source's rate
        found.append(
            (
                "low_sample_rate",
                f"recorded at {outcome.source_rate} Hz, resampled up to {sample_rate} Hz: it has nothing above "
                f"{outcome.source_rate // 2} Hz, and a voice trained on it sounds muffled",
            )
        )
    if outcome.clipped > CLIP_FRACTION:
        found.append(("clipping", f"{100 * outcome.clipped:.1f}% of samples at full scale"))
    return found


def encoding_notes(source: Source) -> list[str]:
    """Rows skipped as not UTF-8 are most often a whole file saved in another encoding: say so once."""
    bad = [r for r in source.rows if isinstance(r, Problem) and "not valid UTF-8" in r.detail]
    if not bad:
        return []
    return [
        f"{len(bad)} row(s) are not valid UTF-8 (the first at {bad[0].origin}) and are skipped: a file saved "
        "by Excel or an older editor is often Windows-1252 or Latin-1; save it as UTF-8 and run again"
    ]


def speakers_hint(source: Source, shown: int = 10) -> str:
    """The source's speakers, for a --speaker that matched none of them."""
    counts = Counter(clean_speaker(row.speaker) for row in source.rows if not isinstance(row, Problem))
    names = [name for name, _ in counts.most_common(shown)]
    more = f" and {len(counts) - shown} more" if len(counts) > shown else ""
    return f"the source's speakers are {', '.join(names)}{more}" if names else "the source names no speaker"


def metadata_backup_name(data_dir: Path, metadata_from: str | None, source: Source) -> Path | None:
    """Where to move an existing metadata.csv that this tool did not write from this same source
    (`metadata_from`: the source the state says it was written from)."""
    meta = data_dir / METADATA_NAME
    # a state from before paths were resolved recorded --source as typed
    if not meta.is_file() or metadata_from in (source_key(source.location), source.location):
        return None
    for n in range(1, 1000):
        backup = data_dir / f"{METADATA_NAME}.bak{'' if n == 1 else n}"
        if not backup.exists():
            return backup
    return None


def move_metadata_aside(data_dir: Path, backup: Path, written: set[str], log: Callable[[str], None]) -> None:
    """Move another source's metadata.csv to `backup`, with a warning when this run wrote WAVs (`written`)
    under ids it lists: this tool's WAVs, so replaceable; but the backup no longer matches its audio."""
    os.replace(data_dir / METADATA_NAME, backup)
    old_rows, _ = read_metadata(backup)
    replaced = sorted({r.id for r in old_rows} & written)
    if replaced:
        more = f" and {len(replaced) - 3} more" if len(replaced) > 3 else ""
        log(
            f"warning: {backup.name} lists {len(replaced)} clip(s) whose WAVs now hold this source's audio "
            f"({', '.join(replaced[:3])}{more}): same ids; prepare the other source into its own --data_dir"
        )


def finish_wavs(
    wavs_dir: Path,
    unlisted: list[Path],
    clean: bool,
    log: Callable[[str], None],
    owned: set[str],
) -> None:
    """The last step in wavs/: the temporary WAVs an interrupted run left are removed, and the WAVs that
    metadata.csv does not list (`unlisted`) are removed with --clean (`clean`; only those whose ids are
    in `owned`, this tool's), else counted in a line."""
    for tmp in wavs_dir.glob(".*.tmp"):
        if is_temp_wav(tmp):
            tmp.unlink(missing_ok=True)  # left by an interrupted run: ours, never user data
    if not unlisted:
        return
    if clean:
        for p in unlisted:
            # --clean deletes only WAVs this tool wrote (state); check_prepare_wavs refused any other
            if p.stem in owned:
                p.unlink(missing_ok=True)
        log(f"removed {len(unlisted)} WAV(s) in {wavs_dir} not listed in metadata.csv (--clean)")
    else:
        log(
            f"{len(unlisted)} WAV(s) in {wavs_dir} are not listed in metadata.csv (left alone; --clean removes them)"
        )


def build_report(
    settings: PrepareSettings,
    source: Source,
    sample_rate: int,
    vocab: Vocabulary | None,
    rows: list[MetaRow],
    skipped: list[Skip],
    filtered: Counter,
    warnings: list[dict],
    durations: list[float],
    unknown_chars: Counter | None,
) -> dict:
    by_reason = Counter(s.reason for s in skipped)
    if vocab is not None and not settings.drop_unknown_chars:
        # the rows kept, as the character inventory beside it (counted before the audio checks, a row
        # whose audio was missing or too long added its characters: 'r' 194 beside 'r' 172); plan_rows
        # counts only the rows it drops for them (--drop_unknown_chars)
        unknown_chars = Counter(ch for r in rows for ch in vocab.unknown(r.text))
    settings_dict = {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(settings).items()}
    settings_dict["resolved_sample_rate"] = sample_rate
    total = sum(durations)
    return {
        "source": {"location": source.location, "format": source.format, "notes": source.notes},
        "settings": settings_dict,
        "counts": {
            "source_rows": len(source.rows),
            "kept": len(rows),
            "skipped": len(skipped),
            "filtered": sum(filtered.values()),
            "warnings": len(warnings),
            "skipped_by_reason": dict(by_reason.most_common()),
            "filtered_by_reason": dict(filtered.most_common()),
        },
        "durations": {
            "total_seconds": round(total, 3),
            "total_hours": round(total / 3600, 4),
            "min_seconds": round(min(durations), 3) if durations else None,
            "median_seconds": round(statistics.median(durations), 3) if durations else None,
            "max_seconds": round(max(durations), 3) if durations else None,
        },
        "speakers": dict(Counter(r.speaker for r in rows).most_common()),
        "characters": dict(Counter(ch for r in rows for ch in r.text).most_common()),
        "unknown_characters": dict(unknown_chars.most_common()) if unknown_chars is not None else None,
        "skipped_rows": [asdict(s) for s in skipped],
        "warnings": warnings,
    }


def format_summary(report: dict, data_dir: Path) -> str:
    counts, d = report["counts"], report["durations"]
    # a count of nothing is left out, in a line as a line of nothing is (filtered, warnings)
    made = {"converted": counts.get("converted", 0), "reused from an earlier run": counts.get("reused", 0)}
    how = ", ".join(f"{n} {what}" for what, n in made.items() if n)
    kept = f"kept {counts['kept']} of {counts['source_rows']} rows in {data_dir}"
    lines = [f"{kept} ({how})" if how else kept]
    if counts["kept"]:
        lines.append(
            f"  audio: {d['total_hours']:.3f} h; clip duration min {d['min_seconds']:.2f} s, "
            f"median {d['median_seconds']:.2f} s, max {d['max_seconds']:.2f} s"
        )
    if counts["skipped"]:
        lines.append(f"  skipped {counts['skipped']}: {_counts(counts['skipped_by_reason'])}")
    if counts["filtered"]:
        lines.append(f"  filtered {counts['filtered']}: {_counts(counts['filtered_by_reason'])}")
    if report["warnings"]:
        kinds = Counter(w["warning"] for w in report["warnings"])
        lines.append(f"  warnings (kept) {len(report['warnings'])}: {_counts(dict(kinds))}")
    if counts.get("replaced_wavs"):
        lines.append(
            f"  replaced {counts['replaced_wavs']} WAV(s) an interrupted run had begun in wavs/ (converted again)"
        )
    speakers, chars = report["speakers"], report["characters"]
    if speakers:  # of the kept rows: none kept, no line (as audio:)
        lines.append(f"  speakers ({len(speakers)}): {_counts(speakers, limit=20)}")
    if chars:
        lines.append(
            f"  characters ({len(chars)}): {_counts({repr(k): v for k, v in chars.items()}, limit=80)}"
        )
    unknown = report["unknown_characters"]
    dropping = report["settings"]["drop_unknown_chars"]
    if unknown == {} and not counts["kept"] and not dropping:
        # kept rows are what is counted here: with none, nothing was checked
        lines.append("  no row kept: no character checked against the model's vocabulary")
    elif unknown == {} and dropping and not counts.get("passed_text_checks", 1):
        # with --drop_unknown_chars the rows that passed the text checks are checked: none did
        lines.append(f"  no row left to check against the model's vocabulary ({_left_out(counts)})")
    elif unknown == {}:
        lines.append("  every character is in the model's vocabulary")
    elif unknown:
        action = (
            "rows dropped"
            if report["settings"]["drop_unknown_chars"]
            else "rows kept; --drop_unknown_chars drops them, train_vits.py --extend_vocab adds them"
        )
        shown = _counts({repr(k): v for k, v in unknown.items()}, limit=80)
        lines.append(f"  not in the model's vocabulary ({action}; the tokenizer would drop them): {shown}")
    if report["wavs"].get("metadata_backup"):
        lines.append(
            f"  the previous metadata.csv (another source) was moved to {report['wavs']['metadata_backup']}"
        )
    lines.append(f"  report: {data_dir / REPORT_NAME}")
    return "\n".join(lines)


def _left_out(counts: dict) -> str:
    """Why no row reached the vocabulary check: the rows skipped or left out before it."""
    why = []
    if counts["filtered_by_reason"].get("filtered_speaker"):
        why.append(f"--speaker left out {counts['filtered_by_reason']['filtered_speaker']}")
    if counts["skipped"]:
        why.append(f"skipped {counts['skipped']}: {_counts(counts['skipped_by_reason'])}")
    return "; ".join(why) or "the source has no row"


def _counts(counter: dict, limit: int = 0) -> str:
    items = list(counter.items())
    text = ", ".join(f"{k} {v}" for k, v in (items[:limit] if limit else items))
    return text + (f", ... ({len(items) - limit} more)" if limit and len(items) > limit else "")
