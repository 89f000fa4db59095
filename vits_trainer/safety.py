"""Nothing the user owns is ever destroyed: path checks made before any work, and export markers.

Two rules, checked before anything is written:
- The folders a run reads and the folders it replaces never overlap. Paths are compared after
  resolving symlinks and `..` (for a folder that does not exist yet: its nearest existing parent).
- A folder is replaced only when it is provably an earlier export of this tool: it carries
  `EXPORT_MARKER` (written last into every exported folder) and holds nothing beyond the files that
  marker lists. A user file dropped into an export is named in the refusal, never deleted.

This module holds the mechanisms; a command's own check names its folders and flags and calls them
(training/config.py: check_train_paths; data/prepare_checks.py: check_prepare_sources;
feedback/config.py: check_feedback_paths). It imports no torch: those checks run before the heavy
imports, so a path mistake costs a fraction of a second and writes nothing.

Inventory of destructive operations (file:function -> what -> why it is provably the tool's own)
-----------------------------------------------------------------------------------------------
model/vits.py:export_model
    rmtree `.<name>.tmp-<pid>` -> our pid's temp folder from an earlier crash of this same pid, or the
        one this export made and failed to fill (a full disk)
    os.replace(out_dir -> `.<name>.old-<pid>`) + rmtree(old) -> `check_replaceable(out_dir)` first:
        the folder carries our marker and nothing beyond the files it lists (else UnsafeOverwrite)
    remove_dead_writers_temp(`.<name>.tmp-*`, `.<name>.old-*`) -> temp folders named with a dead pid
training/best_model.py:install_best_model (RunOutputs.copy_final_to_best, and carry_best_model's)
    rmtree `.best_model.tmp` / best_model -> `check_replaceable(best_model)` first (marker, as above);
        the temp folder is named by this tool inside its checkpoint dir
training/run_end.py:RunEnd.finish (train_summary.json)
    writes into the folder just exported and into checkpoint_dir -> `write_export_file` adds it to the
        marker; checkpoint_dir is refused up front when it overlaps a data folder
training/carry.py:carry_history / carry_best_model (a run resumed from another folder's checkpoint)
    metrics.jsonl, samples/<step>, best_model (install_best_model, above) written into the new
        checkpoint dir -> only where none exists yet; the source is only read
training/runtime.py:LogCopy (train.log)
    appended to, never replaced -> a fixed name in this run's checkpoint dir, once set-up found no bad
        input (a refused run writes nothing)
training/report.py:write_report / write_report_archive / write_references
    report.html, report.zip, samples/reference/<clip>.wav, sentences.json -> fixed names in this run's
        checkpoint dir
        (locked by the run, never overlapping a data folder or --output_dir: checked up front)
training/hub_push.py:HubPush (--push_best)
    rmtree `<checkpoint_dir>/.hub_upload.N-<pid>` -> a snapshot (hard links) of best_model this process
        made for its upload, removed once uploaded or superseded; a dead pid's by remove_dead_writers_temp
training/checkpoint.py:write_checkpoint / prune_checkpoints, safety.py:remove_dead_writers_temp
    rmtree `.step_*.tmp-<pid>`, an existing `step_N` of the same step, pruned `step_N` -> names only this
        tool creates (`step_%08d` with a manifest it wrote; pruning only deletes verified ones); the
        checkpoint dir never overlaps a data folder or --output_dir (checked up front)
feedback/versions.py:write_latest
    os.replace of `latest` -> only when `latest` is a symlink (a real folder is left alone);
    latest.json -> refused up front unless it is our pointer (`check_feedback_paths`)
feedback/round.py:FeedbackRun.write_samples / clear_restarted_version / start_session
    rmtree vN/samples/{before,after}, vN/checkpoints, vN -> version folders that choose_version
        numbered under the output root; vN is removed only when this process created it; the output
        root never overlaps a data folder or the base model (checked up front)
data/prepare.py:prepare / finish_wavs, data/prepare_convert.py:convert_all (checks: data/prepare_checks.py)
    wavs/<id>.wav written or (--clean) deleted -> only ids listed in `.prepare_state.json` (WAVs this
        tool wrote into this data_dir); any other WAV in the way is refused up front (`check_prepare_wavs`)
    metadata.csv -> moved to a new `metadata.csv.bak*` name when another source wrote it; replaced only
        when the state says this tool wrote it from the same source
    `.*.tmp` WAVs -> only names `audio.is_temp_wav` recognises (our own temp pattern), while this run
        holds data_dir's lock (runlock.py): no other prepare_data.py is writing there
    no source file may be an output: sources inside data_dir/wavs or equal to an output file are refused
data/clipstore.py:_build_cache / _cache_writable
    cache/audio_int16.bin, cache/index.json, probes, the mark -> fixed names in data_dir/cache, the tool's
        cache: a cache/ folder with other files and without the mark (`_cache_owner`) is never written
speak.py:main (writes through data/audio.py:write_wav)
    --out WAVs -> refused up front when one exists, unless --overwrite (the user names the files)
jsonfile.py / data/metadata.py / data/audio.py / model/discriminator.py
    temp file + os.replace onto a target the caller names -> the callers above own those targets
training/session.py:build_session
    folders it created (checkpoint dir, data_dir/cache, ...) are removed again when an input check
        fails during set-up (`remove_created_on_error`): they did not exist when this process started;
        where another run's lock or checkpoint appeared in them meanwhile, only empty folders go
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
from collections.abc import Iterable, Iterator
from pathlib import Path

from .errors import UserError
from .runlock import pid_alive

EXPORT_MARKER = ".vits_trainer_export.json"
TOOL = "vits_trainer"
# the parts of a prepared data folder a run must never replace or write into as an output
DATA_PARTS = ("wavs", "cache", "metadata.csv", "prepare_report.json", ".prepare_state.json")


class UnsafeOverwrite(UserError):
    """Replacing a folder would destroy something this tool did not write."""


# ---- paths ---------------------------------------------------------------------------------------------


def resolved(path: str | os.PathLike) -> Path:
    """The absolute path with symlinks and `..` resolved; parts that do not exist yet are appended to
    their nearest existing parent's real path."""
    return Path(os.path.realpath(Path(path).expanduser()))


def inside(child: Path, parent: Path) -> bool:
    """`child` is `parent` or lies somewhere below it (both resolved)."""
    return child == parent or parent in child.parents


def _shown(flag: str, given, real: Path) -> str:
    return f"{flag} {given}" + (f" (= {real})" if str(given) != str(real) else "")


def refuse(flag_a: str, a, real_a: Path, how: str, flag_b: str, b, real_b: Path, why: str) -> None:
    """Raise the one-line refusal: `<flag_a> <a> (= real) <how> <flag_b> <b> (= real): <why>`."""
    raise UserError(f"{_shown(flag_a, a, real_a)} {how} {_shown(flag_b, b, real_b)}: {why}")


def check_output_vs_data(out_flag: str, out, data_flag: str, data) -> None:
    """An output folder (replaced or written into) against a data folder (read).

    The output may live inside the data folder (the default layout: training/checkpoints beside
    training/wavs), but never be the data folder, contain it, or be one of its parts (wavs/, cache/, ...).
    """
    o, d = resolved(out), resolved(data)
    if o == d:
        refuse(out_flag, out, o, "is the same folder as", data_flag, data, d, "it would replace the data")
    if inside(d, o):
        refuse(out_flag, out, o, "contains", data_flag, data, d, "it would replace the data")
    for part in DATA_PARTS:
        p = d / part
        if inside(o, p) or inside(p, o):
            refuse(out_flag, out, o, "overlaps", data_flag, data, d, f"{part} of the data would be replaced")


def check_disjoint(flag_a: str, a, flag_b: str, b, why: str) -> None:
    """Two folders that must neither be equal nor nested in either direction."""
    ra, rb = resolved(a), resolved(b)
    if ra == rb:
        refuse(flag_a, a, ra, "is the same folder as", flag_b, b, rb, why)
    if inside(ra, rb):
        refuse(flag_a, a, ra, "is inside", flag_b, b, rb, why)
    if inside(rb, ra):
        refuse(flag_a, a, ra, "contains", flag_b, b, rb, why)


# ---- export markers ----------------------------------------------------------------------------------


def _files(folder: Path) -> list[str]:
    """Every file under `folder` (posix relative paths), the marker excluded."""
    found = []
    for path in folder.rglob("*"):
        if path.is_dir() and not path.is_symlink():
            continue
        rel = path.relative_to(folder).as_posix()
        if rel != EXPORT_MARKER:
            found.append(rel)
    return sorted(found)


def write_marker(folder: Path, kind: str, run: str | os.PathLike | None, step: int | None = None) -> None:
    """Mark `folder` as an export of this tool: what it is, which run made it, and the files it holds
    (call last, once every file is in place). `run` is the checkpoint dir of the run that wrote it;
    `step`, the training step of the weights (the folder itself says which weights it holds, whatever a
    checkpoint saved before or after it recorded)."""
    data = {
        "tool": TOOL,
        "kind": kind,
        "checkpoint_dir": str(resolved(run)) if run is not None else None,
        # where that is from the folder: a project moved or copied whole still finds its own exports
        "checkpoint_dir_from_here": _relative(resolved(run), resolved(folder)) if run is not None else None,
        "files": _files(folder),
    }
    if step is not None:
        data["step"] = step
    (folder / EXPORT_MARKER).write_text(json.dumps(data, indent=1, ensure_ascii=False), encoding="utf-8")


def _relative(path: Path, start: Path) -> str | None:
    try:
        return os.path.relpath(path, start)
    except ValueError:  # another drive (Windows)
        return None


def made_by(marker: dict | None, folder: Path, run: str | os.PathLike) -> bool:
    """Whether the export in `folder` with `marker` was written by the run of checkpoint dir `run`: the
    one it names, or the one at the same place beside the folder (both moved or copied together)."""
    if not marker:
        return False
    if marker.get("checkpoint_dir") == str(resolved(run)):
        return True
    here = marker.get("checkpoint_dir_from_here")
    return isinstance(here, str) and resolved(Path(folder) / here) == resolved(run)


def read_marker(folder: Path) -> dict | None:
    try:
        data = json.loads((folder / EXPORT_MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    ok = isinstance(data, dict) and data.get("tool") == TOOL and isinstance(data.get("files"), list)
    return data if ok else None


def write_export_file(folder: Path, name: str, text: str) -> None:
    """Add a file to an exported folder and to its marker (e.g. train_summary.json, written after)."""
    (folder / name).write_text(text, encoding="utf-8")
    marker = read_marker(folder)
    if marker is not None:
        write_marker(folder, marker["kind"], marker.get("checkpoint_dir"), marker_step(marker))


def marker_step(marker: dict | None) -> int | None:
    """The training step an export's marker records, None for an export made before markers had it."""
    step = marker.get("step") if marker else None
    return step if isinstance(step, int) and not isinstance(step, bool) else None


def foreign_entries(folder: Path) -> list[str] | None:
    """None when `folder` is not an export of this tool (no marker); else what it holds beyond the
    marker's list (empty: it can be replaced)."""
    marker = read_marker(folder)
    if marker is None:
        return None
    listed = set(marker["files"])
    dirs = {p for name in listed for p in Path(name).parents}
    extra = []
    for path in folder.rglob("*"):
        rel = path.relative_to(folder).as_posix()
        if rel == EXPORT_MARKER or rel in listed:
            continue
        if path.is_dir() and not path.is_symlink() and Path(rel) in dirs:
            continue
        extra.append(rel)
    return sorted(extra)


def check_replaceable(folder: Path, flag: str = "") -> None:
    """Raise UnsafeOverwrite unless `folder` is missing, empty, or an export of this tool holding
    nothing beyond what its marker lists."""
    if not folder.exists() and not folder.is_symlink():
        return
    what = f"{flag} {folder}" if flag else str(folder)
    if folder.is_file():  # a file is not taken for a folder: a plain word on what to do
        raise UnsafeOverwrite(
            f"{what}: exists and is a file, not a folder (it is left as it is): choose another "
            f"{flag or 'folder'}"
        )
    if not folder.is_dir() or folder.is_symlink():
        raise UnsafeOverwrite(f"{what}: exists and is not a folder of this tool; it is left as it is")
    entries = sorted(p.name for p in folder.iterdir())
    if not entries:
        return
    extra = foreign_entries(folder)
    if extra is None:
        raise UnsafeOverwrite(
            f"{what}: not empty and not a model exported by this tool (it holds {entries[0]!r}"
            f"{f' and {len(entries) - 1} more' if len(entries) > 1 else ''}); choose a new or empty folder"
        )
    if extra:
        raise UnsafeOverwrite(
            f"{what}: holds {extra[0]!r}{f' and {len(extra) - 1} more' if len(extra) > 1 else ''}, which "
            f"this tool did not write; move it away first (the folder would be replaced)"
        )


def check_own_export(folder: Path, run: str | os.PathLike, flag: str) -> None:
    """Raise UnsafeOverwrite when `folder` holds an export made by another run (another checkpoint dir):
    one that appeared while this run trained (two runs given one --output_dir). A run replaces its own
    export; another's only with --overwrite_output_dir, which the caller checks."""
    marker = read_marker(folder)
    if marker is None or made_by(marker, folder, run):
        return  # not an export (check_replaceable decides), or this run's own
    by = (
        f"the run of --checkpoint_dir {marker['checkpoint_dir']}"
        if marker.get("checkpoint_dir")
        else "another run"
    )
    raise UnsafeOverwrite(
        f"{flag} {folder}: now holds a model exported by {by}, which is kept (--overwrite_output_dir "
        "replaces it)"
    )


def replace_export(tmp: Path, out_dir: Path) -> None:
    """Move the finished export `tmp` to `out_dir`, replacing an earlier export there (checked first)."""
    check_replaceable(out_dir)
    old = out_dir.with_name(f".{out_dir.name}.old-{os.getpid()}")
    if old.exists():  # our name and pid: left by a crashed process that had this pid (a container's)
        shutil.rmtree(old, ignore_errors=True)
    if out_dir.exists():
        os.replace(out_dir, old)  # our checked export, renamed aside until the new one is in place
    os.replace(tmp, out_dir)
    if old.exists():
        shutil.rmtree(old, ignore_errors=True)  # the checked export renamed above


# ---- nothing left behind by a failed set-up ----------------------------------------------------------


def _first_missing(path: Path) -> Path | None:
    """The top-most folder of `path` that does not exist yet (what mkdir(parents=True) would create)."""
    path = Path(os.path.abspath(path))
    top = None
    while not path.exists() and not path.is_symlink():
        top, path = path, path.parent
    return top


# what only another run puts in a folder while this one sets up (a failed set-up writes neither: its
# own lock is released before the error gets here, and it saves no checkpoint)
_OTHER_RUNS = re.compile(r"^(\.vits_trainer\.lock|\.lock|step_\d{8})$")  # .lock: an older version's lock


@contextlib.contextmanager
def remove_created_on_error(folders: Iterable[Path], error=UserError) -> Iterator[None]:
    """On `error`, remove the folders among `folders` (and their new parents) that did not exist when the
    block began: a run that fails its input checks leaves nothing behind. A folder that already existed
    is never touched. Another run may have created folders in a new one meanwhile (two runs started
    under one new parent): a tree holding another run's lock or checkpoint keeps everything but the
    empty folders."""
    created = {top for f in folders if (top := _first_missing(Path(f))) is not None}
    try:
        yield
    except error:
        for top in created:
            if not any(_OTHER_RUNS.match(p.name) for p in top.rglob("*")):
                shutil.rmtree(top, ignore_errors=True)  # did not exist when this process began the block
                continue
            for folder in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
                with contextlib.suppress(OSError):
                    folder.rmdir()  # only when empty
            with contextlib.suppress(OSError):
                top.rmdir()
        raise


def remove_dead_writers_temp(folder: Path, pattern: str) -> None:
    """Remove the temp folders matching `pattern` (named `...-<pid>`) whose writing process has died."""
    for tmp in folder.glob(pattern):
        pid = tmp.name.rsplit("-", 1)[-1]
        if pid.isdigit() and int(pid) != os.getpid() and not pid_alive(int(pid)):
            shutil.rmtree(tmp, ignore_errors=True)  # our temp-name pattern, its writer's pid is dead
