"""Snapshots of a folder tree (relative paths, sizes, sha256), to prove a CLI call changed nothing it
does not own: every user file is byte-identical after, and new files appear only where allowed."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path


def snapshot(root: Path) -> dict[str, tuple]:
    """{relative path: ("dir",) | ("link", target) | ("file", size, sha256)} of everything under `root`
    (symlinks are recorded, not followed)."""
    found: dict[str, tuple] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            rel = path.relative_to(root).as_posix()
            if path.is_symlink():
                found[rel] = ("link", os.readlink(path))
            elif path.is_dir():
                found[rel] = ("dir",)
            else:
                data = path.read_bytes()
                found[rel] = ("file", len(data), hashlib.sha256(data).hexdigest())
    return found


def changes(before: dict, after: dict, allowed: tuple[str, ...] = ()) -> list[str]:
    """What changed between two snapshots, beyond new entries under the `allowed` prefixes (the tool's
    own output locations). Changed or deleted entries are always reported."""
    problems = [f"deleted: {p}" for p in sorted(set(before) - set(after))]
    problems += [f"changed: {p}" for p in sorted(set(before) & set(after)) if before[p] != after[p]]
    for p in sorted(set(after) - set(before)):
        if not any(p == a or p.startswith(a.rstrip("/") + "/") for a in allowed):
            problems.append(f"added: {p}")
    return problems


def assert_unchanged(root: Path, before: dict, allowed: tuple[str, ...] = ()) -> None:
    problems = changes(before, snapshot(root), allowed)
    assert not problems, problems
