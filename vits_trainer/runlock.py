"""One run per folder: an OS-level lock (flock) on `<folder>/.vits_trainer.lock`, held for the whole run.

A second process on the same folder is refused with one line naming the first one's pid and host.
The kernel drops a flock when its process dies, so a lock file left by a killed run is simply taken
over (with a warning naming the dead run). The lock file is removed at release; a waiting process
re-checks after locking that the file it locked is still the one at the path, so removing it is safe.
Multi-process runs (accelerate launch) take it in the main process only (RANK 0).

Older versions of this tool locked `<folder>/.lock`: a run of one that still holds it is refused like
any other, and one left by a killed run of one (a record of ours: pid, host) is removed when taken over.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import json
import os
import socket
import sys
import time
import weakref
from collections.abc import Callable
from pathlib import Path

from .errors import UserError
from .launch import process_rank

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX: no OS lock, said once
    fcntl = None

LOCK_NAME = ".vits_trainer.lock"
OLD_LOCK_NAME = ".lock"  # the name older versions of this tool used; a run of one may still hold it
OLD_RECORD_KEYS = {"pid", "host", "started", "command"}  # what the older version wrote in it


def pid_alive(pid: int) -> bool:
    """Whether a process with this id exists on this machine (a lock or temp folder of a dead one is stale)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def is_main_process() -> bool:
    """The process that holds a run's lock: RANK 0 under accelerate/torchrun, or a plain process."""
    return process_rank() == 0


def describe_holder(holder: dict) -> str:
    if not holder.get("pid"):
        return "another process (its lock file is being written)"
    return f"pid {holder['pid']} on host {holder.get('host', '?')}, started {holder.get('started', '?')}"


_HELD: weakref.WeakSet = weakref.WeakSet()  # this process's locks, for _drop_in_child


def _drop_in_child() -> None:
    """A forked child (a DataLoader or conversion worker) gets a copy of each lock's descriptor, and a
    flock lasts while any copy is open: a worker left running by a parent killed alone (`kill PID`)
    kept the folder locked, and every later run was refused. The child closes its copies; the lock
    stays the parent's."""
    for lock in list(_HELD):
        if lock.fd is not None:
            try:
                os.close(lock.fd)
            except OSError:
                pass
            lock.fd = None  # the child never releases (nor removes) the parent's lock
            atexit.unregister(lock.release)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_drop_in_child)


class RunLock:
    def __init__(self, folder: Path, path: Path, fd: int, created: list[Path]):
        self.folder, self.path, self.fd, self.created = folder, path, fd, created
        atexit.register(self.release)
        _HELD.add(self)

    @classmethod
    def acquire(
        cls, folder: Path, flag: str, log=print, unwritable_hint: Callable[[], str] = lambda: ""
    ) -> RunLock | None:
        """Lock `folder` (created if missing) or raise UserError naming the run that holds it;
        `unwritable_hint()` ends the error when the folder cannot be written (read-only, no permission)."""
        folder = Path(folder)
        if fcntl is None:  # pragma: no cover
            log(f"warning: no OS file locks on this platform: nothing stops a second run on {folder}")
            return None
        # the folders this run creates (the missing ancestors too): removed again if left empty
        created = [p for p in (folder, *folder.parents) if not p.exists()]
        existing = next(p for p in (folder.absolute(), *folder.absolute().parents) if p.exists())
        if not existing.is_dir():  # mkdir would say only "File exists" or "Not a directory"
            where = "exists and is a file" if existing == folder.absolute() else f"{existing} is a file"
            raise UserError(f"{flag} {folder}: {where}, not a folder: choose another {flag}")
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise UserError(
                f"{flag} {folder} cannot be created ({err.strerror or err}){unwritable_hint()}"
            ) from None
        path = folder / LOCK_NAME
        locks = True  # False: the file system takes none (then there is no earlier holder to speak of)
        for _ in range(20):
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as err:
                raise UserError(
                    f"{flag} {folder}: cannot create its lock file ({err.strerror or err}){unwritable_hint()}"
                ) from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as err:
                if err.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                    # a file system without locks (NFS without its lock daemon, some network and FUSE
                    # mounts): the run goes on, as on a platform without them
                    log(
                        f"warning: {folder}: its file system takes no file locks ({err.strerror or err}); "
                        "nothing stops a second run on it"
                    )
                    locks = False
                    break
                # held by a live process: refuse, touching nothing
                holder = _read(fd)
                os.close(fd)
                raise _in_use(flag, folder, holder) from None
            try:
                same = os.stat(path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)  # the holder released (and removed) the file between our open and lock: again
        else:  # pragma: no cover
            raise UserError(f"{flag} {folder}: could not take its lock (it keeps changing)")
        try:
            if locks:
                _take_over_old_lock(folder, flag, log)
            return cls._hold(folder, path, fd, created, locks, log)
        except (
            BaseException
        ):  # refused, or a signal (Ctrl-C, SIGTERM) while taking it: the lock file goes too
            if locks:
                with contextlib.suppress(OSError):
                    os.unlink(path)  # ours: locked by this fd, checked above to be the file at `path`
            os.close(fd)
            raise

    @classmethod
    def _hold(cls, folder: Path, path: Path, fd: int, created: list[Path], locks: bool, log) -> RunLock:
        """The lock just taken: an earlier holder that never released it is named, and this run's record
        written into the file."""
        previous = _read(fd)
        if locks and previous.get("pid") and previous.get("pid") != os.getpid():
            _say_taken_over(folder, previous, log)
        record = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "command": " ".join(sys.argv),
        }
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(record).encode("utf-8"), 0)
        os.fsync(fd)
        return cls(folder, path, fd, created)

    def release(self) -> None:
        """Remove the lock file (ours: checked by inode) and drop the lock; remove the folder only if
        this run created it and left it empty (a run refused by a later input check leaves nothing)."""
        if self.fd is None:
            return
        try:
            if os.stat(self.path).st_ino == os.fstat(self.fd).st_ino:
                os.unlink(self.path)
        except OSError:
            pass
        with contextlib.suppress(OSError):  # closed already by a signal inside acquire
            os.close(self.fd)
        self.fd = None
        atexit.unregister(self.release)
        for folder in self.created:  # deepest first
            try:
                folder.rmdir()  # only when empty
            except OSError:
                break

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()


def _in_use(flag: str, folder: Path, holder: dict) -> UserError:
    return UserError(
        f"{flag} {folder} is in use by another run ({describe_holder(holder)}); wait for it to end, "
        f"or choose another {flag}"
    )


def _say_taken_over(folder: Path, previous: dict, log) -> None:
    gone = (
        "which is no longer running"
        if previous.get("host") == socket.gethostname() and not pid_alive(int(previous["pid"]))
        else "which no longer holds it"
    )
    log(
        f"warning: {folder} was locked by a run that ended without releasing it "
        f"({describe_holder(previous)}), {gone}; taking it over"
    )


def _take_over_old_lock(folder: Path, flag: str, log) -> None:
    """`<folder>/.lock`, an older version's lock file: UserError while a run of it holds the folder; left
    by a killed one (a record of ours), removed under our lock as its release would have; anything else
    of that name (not ours) is left as it is."""
    path = folder / OLD_LOCK_NAME
    try:
        # for writing, as the older version opened it: where flock is a byte-range lock (NFS), an
        # exclusive one needs that, and a read-only descriptor never found a live run's lock
        fd = os.open(path, os.O_RDWR)
    except OSError:
        try:
            fd = os.open(path, os.O_RDONLY)  # not writable (or a folder): a local flock still tells
        except OSError:
            return  # none: nothing to honour
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            if err.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise _in_use(flag, folder, _read(fd)) from None
            return
        previous = _read(fd)
        # the older version's record has all four: another tool's `.lock` with a pid in it is not ours
        ours = OLD_RECORD_KEYS <= previous.keys() and previous.get("pid")
        if ours and os.stat(path).st_ino == os.fstat(fd).st_ino:
            _say_taken_over(folder, previous, log)
            os.unlink(path)  # while locked: an older run that opened it meanwhile is refused its lock
    except FileNotFoundError:
        pass  # its run ended and removed it meanwhile
    finally:
        os.close(fd)


def lock_holder(folder: Path) -> dict | None:
    """The record of the live process that holds `folder`'s lock (pid, host, started, command; an older
    version's `.lock` too), or None when nobody does; takes no lock and creates nothing. A reader asks
    before reading a folder that another tool may be writing (prepare_data.py on a training folder)."""
    if fcntl is None:  # pragma: no cover
        return None
    holder = _holder_of(Path(folder) / LOCK_NAME)
    return holder if holder is not None else _holder_of(Path(folder) / OLD_LOCK_NAME)


def _holder_of(path: Path) -> dict | None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None  # no lock file: nobody holds it
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError as err:
        held = err.errno in (errno.EWOULDBLOCK, errno.EAGAIN)
        record = _read(fd) if held else None
        os.close(fd)
        return record
    fcntl.flock(fd, fcntl.LOCK_UN)  # a lock file left by a run that ended: nobody holds it
    os.close(fd)
    return None


def refuse_if_being_written(folder: Path, flag: str = "") -> None:
    """UserError when a live process holds `folder`'s lock: prepare_data.py is writing it, and its
    metadata.csv and WAVs are half done. `flag` names the folder's flag in the message."""
    writer = lock_holder(folder)
    if writer is not None:
        raise UserError(
            f"{flag + ' ' if flag else ''}{folder} is being written by another process "
            f"({describe_holder(writer)}); wait for it to end, then start again"
        )


def _read(fd: int) -> dict:
    try:
        data = os.pread(fd, 4096, 0)
        holder = json.loads(data.decode("utf-8")) if data else {}
    except (OSError, ValueError):
        return {}
    return holder if isinstance(holder, dict) else {}
