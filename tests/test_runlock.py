"""One run per folder: real processes racing on one checkpoint folder, a stale lock taken over, the
lock released at exit; pruning that never drops the newest verified checkpoint."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.helpers import PYTHON, ROOT, cli_args, cli_settings, tiny_config, train_tiny
from vits_trainer.errors import UserError
from vits_trainer.runlock import LOCK_NAME, RunLock
from vits_trainer.training.checkpoint import list_checkpoints, prune_checkpoints, write_checkpoint
from vits_trainer.training.session import build_session

# a second process that takes the lock, says so, and holds it until its stdin closes
HOLDER = (
    "import sys; from pathlib import Path; from vits_trainer.runlock import RunLock; "
    "lock = RunLock.acquire(Path(sys.argv[1]), '--checkpoint_dir'); print('locked', flush=True); "
    "sys.stdin.read(); lock.release()"
)


def start_holder(folder: Path) -> subprocess.Popen:
    proc = subprocess.Popen(
        [PYTHON, "-c", HOLDER, str(folder)],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout.readline().strip() == "locked"
    return proc


def snapshot(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
        for p in sorted(folder.rglob("*"))
    }


def test_second_run_on_a_locked_folder_is_refused_and_changes_nothing(tmp_path, tiny_model_dir, tone_corpus):
    ckpt = tmp_path / "checkpoints"
    write_checkpoint(ckpt, 3, {"a.bin": b"x" * 10})  # an earlier run's checkpoint the second must not touch
    holder = start_holder(ckpt)
    try:
        before = snapshot(tmp_path)
        settings = cli_settings(tmp_path, tone_corpus, tiny_model_dir, max_steps=2)
        proc = subprocess.run(
            [PYTHON, str(ROOT / "train_vits.py"), *cli_args(settings)],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
        errors = [line for line in proc.stderr.splitlines() if line.strip()]
        assert len(errors) == 1 and errors[0].startswith("error: "), proc.stderr
        assert f"pid {holder.pid}" in errors[0] and "in use by another run" in errors[0]
        assert snapshot(tmp_path) == before  # nothing written, nothing removed
    finally:
        holder.stdin.close()
        assert holder.wait(timeout=60) == 0
    assert not (ckpt / LOCK_NAME).exists()  # released at exit: the lock file is gone
    lock = RunLock.acquire(ckpt, "--checkpoint_dir")  # and the next run may take the folder
    lock.release()


def test_lock_of_a_killed_run_is_taken_over_with_a_warning(tmp_path):
    folder = tmp_path / "checkpoints"
    holder = start_holder(folder)
    holder.send_signal(signal.SIGKILL)  # no release: the lock file stays, the kernel drops the lock
    holder.wait(timeout=60)
    assert json.loads((folder / LOCK_NAME).read_text())["pid"] == holder.pid
    lines = []
    lock = RunLock.acquire(folder, "--checkpoint_dir", log=lines.append)
    try:
        assert len(lines) == 1 and f"pid {holder.pid}" in lines[0] and "no longer running" in lines[0]
        assert json.loads((folder / LOCK_NAME).read_text())["pid"] == os.getpid()
    finally:
        lock.release()
    assert not (folder / LOCK_NAME).exists()


# a run of an older version of this tool: its lock file was `.lock`, with the same record
OLD_HOLDER = (
    "import fcntl, json, os, socket, sys; fd = os.open(os.path.join(sys.argv[1], '.lock'), os.O_RDWR | os.O_CREAT); "
    "fcntl.flock(fd, fcntl.LOCK_EX); "
    "os.write(fd, json.dumps({'pid': os.getpid(), 'host': socket.gethostname(), 'started': '2026-11-01T10:00:00', "
    "'command': 'train_vits.py'}).encode()); "
    "print('locked', flush=True); sys.stdin.read()"
)


@contextlib.contextmanager
def old_version_holding(folder: Path):
    """A run of the older version holding `folder` (its process) until the block ends; then killed, which
    leaves its `.lock` behind as a killed run's would be."""
    old = subprocess.Popen(
        [PYTHON, "-c", OLD_HOLDER, str(folder)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert old.stdout.readline().strip() == "locked"
        yield old
    finally:
        old.kill()  # killed: its .lock stays, the kernel drops the lock
        old.wait(timeout=60)


def test_the_lock_file_is_named_for_the_tool(tmp_path):
    """A `.lock` found in a checkpoint folder said nothing of whose it was."""
    folder = tmp_path / "checkpoints"
    lock = RunLock.acquire(folder, "--checkpoint_dir")
    try:
        assert [p.name for p in folder.iterdir()] == [".vits_trainer.lock"] == [LOCK_NAME]
    finally:
        lock.release()


def test_a_run_of_an_older_version_is_still_detected(tmp_path):
    """An older version locked `<folder>/.lock`: while a run of it holds the folder, a new run is refused
    (and leaves nothing), and a reader is told it is being written; the `.lock` a killed one left is
    taken over with the usual warning and removed; a `.lock` that is no record of ours is left alone."""
    from vits_trainer.runlock import lock_holder

    folder = tmp_path / "checkpoints"
    folder.mkdir()
    with old_version_holding(folder) as old:
        before = snapshot(folder)
        with pytest.raises(UserError, match=f"is in use by another run \\(pid {old.pid} "):
            RunLock.acquire(folder, "--checkpoint_dir")
        assert snapshot(folder) == before
        assert lock_holder(folder)["pid"] == old.pid
    assert lock_holder(folder) is None
    lines = []
    lock = RunLock.acquire(folder, "--checkpoint_dir", log=lines.append)
    try:
        assert len(lines) == 1 and f"pid {old.pid}" in lines[0] and "taking it over" in lines[0], lines
        assert not (folder / ".lock").exists()
    finally:
        lock.release()
    (folder / ".lock").write_text("my own notes", encoding="utf-8")  # not a lock of this tool
    lines.clear()
    lock = RunLock.acquire(folder, "--checkpoint_dir", log=lines.append)
    lock.release()
    assert lines == [] and (folder / ".lock").read_text(encoding="utf-8") == "my own notes"
    # another tool's lock file of that name, with a pid in it but not this tool's record: left alone too
    theirs = json.dumps({"pid": 4242, "host": "elsewhere"})
    (folder / ".lock").write_text(theirs, encoding="utf-8")
    lock = RunLock.acquire(folder, "--checkpoint_dir", log=lines.append)
    lock.release()
    assert lines == [] and (folder / ".lock").read_text(encoding="utf-8") == theirs


def test_a_run_of_an_older_version_is_detected_where_flock_is_a_byte_range_lock(tmp_path, monkeypatch):
    """On NFS, Linux emulates flock with fcntl byte-range locks, and an exclusive one needs a descriptor
    open for writing (else EBADF): the older version's .lock, opened read-only, was never found held, so
    a run of it still going was not refused and both trained into the folder."""
    import fcntl

    from vits_trainer import runlock

    real = fcntl.flock

    def nfs_flock(fd, operation):
        if operation & fcntl.LOCK_EX and fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE == os.O_RDONLY:
            raise OSError(errno.EBADF, os.strerror(errno.EBADF))
        return real(fd, operation)

    monkeypatch.setattr(runlock.fcntl, "flock", nfs_flock)
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    with old_version_holding(folder) as old:
        with pytest.raises(UserError, match=f"is in use by another run \\(pid {old.pid} "):
            RunLock.acquire(folder, "--checkpoint_dir")
    lines = []
    lock = RunLock.acquire(folder, "--checkpoint_dir", log=lines.append)  # its .lock left: taken over
    lock.release()
    assert len(lines) == 1 and "taking it over" in lines[0] and not (folder / ".lock").exists()


def test_a_holder_that_releases_between_our_open_and_our_lock_is_not_mistaken_for_us(tmp_path, monkeypatch):
    # The race the inode check closes: the holder ends (unlinking the lock file) after the second run
    # opened that file and before it locked it. A lock on the unlinked file would leave the folder
    # unlocked for a third run. (The timing is forced by running the holder's release inside flock.)
    import vits_trainer.runlock as runlock

    folder = tmp_path / "checkpoints"
    folder.mkdir()  # not the first run's to remove at its release
    first = RunLock.acquire(folder, "--checkpoint_dir")
    real_flock = runlock.fcntl.flock

    def holder_ends_first(fd, operation):
        if first.fd is not None:
            first.release()
        return real_flock(fd, operation)

    monkeypatch.setattr(runlock.fcntl, "flock", holder_ends_first)
    second = RunLock.acquire(folder, "--checkpoint_dir")
    monkeypatch.undo()
    try:
        path = folder / LOCK_NAME
        assert path.is_file() and os.stat(path).st_ino == os.fstat(second.fd).st_ino
        with pytest.raises(UserError, match="is in use by another run"):
            RunLock.acquire(folder, "--checkpoint_dir")
    finally:
        second.release()


def test_releasing_never_removes_another_runs_lock_file(tmp_path):
    # The lock file was deleted under a live run (a clean-up of the folder) and a second run took a new
    # one: the first run's release must leave the second's file, or a third run could start beside it.
    folder = tmp_path / "checkpoints"
    first = RunLock.acquire(folder, "--checkpoint_dir")
    (folder / LOCK_NAME).unlink()
    second = RunLock.acquire(folder, "--checkpoint_dir")
    try:
        first.release()
        assert json.loads((folder / LOCK_NAME).read_text())["pid"] == os.getpid()
        with pytest.raises(UserError, match="is in use by another run"):
            RunLock.acquire(folder, "--checkpoint_dir")
    finally:
        second.release()


def test_only_dead_writers_temp_folders_are_removed(tmp_path):
    from vits_trainer.safety import remove_dead_writers_temp

    ended = subprocess.Popen([PYTHON, "-c", "pass"])
    ended.wait(timeout=60)
    alive = subprocess.Popen([PYTHON, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        dead_tmp = tmp_path / f".final_model.tmp-{ended.pid}"
        live_tmp = tmp_path / f".final_model.tmp-{alive.pid}"  # another run exporting there right now
        own_tmp = tmp_path / f".final_model.tmp-{os.getpid()}"
        for folder in (dead_tmp, live_tmp, own_tmp):
            folder.mkdir()
        remove_dead_writers_temp(tmp_path, ".final_model.tmp-*")
        assert not dead_tmp.exists() and live_tmp.is_dir() and own_tmp.is_dir()
    finally:
        alive.stdin.close()
        alive.wait(timeout=60)


def test_a_refused_run_leaves_no_folder_behind(tmp_path):
    folder = tmp_path / "new" / "checkpoints"
    lock = RunLock.acquire(folder, "--checkpoint_dir")
    assert (folder / LOCK_NAME).is_file()
    lock.release()  # e.g. an input check failed after the lock was taken
    assert not (tmp_path / "new").exists()  # the parent it created too


def test_training_refuses_a_data_folder_that_prepare_is_writing(tmp_path):
    """A holder of the data folder's lock (prepare_data.py, here a process that takes the same lock)
    keeps training from reading its half-written clips; a lock file left by an ended run does not."""
    from vits_trainer.data.clipstore import load_clip_store
    from vits_trainer.data.synthetic import make_corpus
    from vits_trainer.runlock import lock_holder
    from vits_trainer.training.config import check_data_dir

    data = tmp_path / "training"
    make_corpus(data, num_clips=3, sample_rate=16000, seed=0)
    assert lock_holder(data) is None
    holder = start_holder(data)
    try:
        assert lock_holder(data)["pid"] == holder.pid
        with pytest.raises(UserError, match=f"being written by another process \\(pid {holder.pid} "):
            load_clip_store(data, 16000, progress=False)
        assert not (data / "cache").exists()  # nothing read, nothing cached
        # train_vits.py's check of its flags says so first, before torch loads
        with pytest.raises(UserError, match=f"^--data_dir {data} is being written by another process"):
            check_data_dir(str(data))
    finally:
        holder.stdin.close()
        assert holder.wait(timeout=60) == 0
    (data / LOCK_NAME).write_text(json.dumps({"pid": 1, "host": "gone"}))  # left behind, held by nobody
    assert lock_holder(data) is None
    store, _ = load_clip_store(data, 16000, progress=False)
    assert len(store) == 3


# ---- pruning ---------------------------------------------------------------------------------------------


def damage(checkpoint: Path, name: str = "a.bin") -> None:
    data = bytearray((checkpoint / name).read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped byte, same size: only a checksum finds it
    (checkpoint / name).write_bytes(bytes(data))


def test_prune_counts_only_verified_checkpoints(tmp_path):
    paths = [write_checkpoint(tmp_path, step, {"a.bin": bytes([step]) * 64}) for step in (1, 2, 3)]
    foreign = tmp_path / "step_00000000"  # no manifest: not provably ours, never deleted
    foreign.mkdir()
    damage(paths[2])
    assert prune_checkpoints(tmp_path, keep=2) == []  # 2 and 1 are the two verified ones
    newest = write_checkpoint(tmp_path, 4, {"a.bin": b"\x04" * 64})
    assert prune_checkpoints(tmp_path, keep=2, protect=newest) == [paths[0]]
    assert list_checkpoints(tmp_path) == [newest, paths[2], paths[1], foreign]


def test_damaged_newest_then_resumed_run_keeps_the_good_checkpoint(tmp_path, tiny_model_dir, tone_corpus):
    """The case seen: step_75 damaged, resume fell back to step_72, pruning then deleted step_72."""
    train_tiny(tmp_path, tone_corpus, tiny_model_dir, max_steps=3, save_minutes=0.001, keep_checkpoints=2)
    ckpt = tmp_path / "checkpoints"
    good = list_checkpoints(ckpt)[0]
    assert good.name == "step_00000003"
    damaged = ckpt / "step_00000075"
    damaged.mkdir()
    for f in good.iterdir():
        (damaged / f.name).write_bytes(f.read_bytes())
    damage(damaged, "generator.safetensors")
    session, summary = train_tiny(tmp_path, tone_corpus, tiny_model_dir, max_steps=4, keep_checkpoints=2)
    assert session.resumed_from == good and summary["steps"] == 4
    names = [p.name for p in list_checkpoints(ckpt)]
    assert names == ["step_00000075", "step_00000004", "step_00000003"]  # the good one survived


def test_a_read_only_checkpoint_folder_names_how_to_resume_from_it(
    tmp_path, monkeypatch, tiny_model_dir, tone_corpus
):
    # an earlier session's checkpoints attached read-only (a Kaggle input): simulated, as a test cannot
    # mount a read-only file system, by the lock file's open failing as it fails there
    ckpt = tmp_path / "earlier" / "checkpoints"
    for step in (3, 12):
        write_checkpoint(ckpt, step, {"a.bin": b"x"})
    before = snapshot(tmp_path / "earlier")
    real_open = os.open

    def read_only(path, *args, **kwargs):
        if Path(path).parent == ckpt:
            raise OSError(errno.EROFS, "Read-only file system")
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", read_only)
    cfg = tiny_config(tmp_path, tone_corpus, tiny_model_dir, checkpoint_dir=str(ckpt))
    with pytest.raises(UserError) as refused:
        build_session(cfg, time.time())
    assert str(refused.value) == (
        f"--checkpoint_dir {ckpt}: cannot create its lock file (Read-only file system); to continue its "
        f"run from this copy: --resume {ckpt / 'step_00000012'} --checkpoint_dir <a writable folder>"
    )
    assert snapshot(tmp_path / "earlier") == before


def test_a_checkpoint_from_elsewhere_is_not_resumed_into_a_folder_of_other_checkpoints(
    tmp_path, tiny_model_dir, tone_corpus
):
    """--resume <copy>/step_N --checkpoint_dir X, X holding checkpoints already (another run's, or later
    ones): the resumed run saved its steps beside them, so the next --resume auto (the command a stopped
    run prints) continued the newest of them, another run; pruning kept those and deleted the resumed
    run's own; another run's best_model/ stood as this one's best to beat."""
    train_tiny(tmp_path / "b", tone_corpus, tiny_model_dir, max_steps=1)
    resumed = list_checkpoints(tmp_path / "b" / "checkpoints")[0]
    other = tmp_path / "a" / "checkpoints"
    write_checkpoint(other, 30, {"a.bin": b"x"})
    before = snapshot(tmp_path / "a")
    cfg = tiny_config(tmp_path / "a", tone_corpus, tiny_model_dir, resume=str(resumed), max_steps=2)
    with pytest.raises(UserError) as refused:
        build_session(cfg, time.time())
    assert str(refused.value) == (
        f"--checkpoint_dir {other}: holds checkpoints already (step_00000030); a run resumed from "
        f"{resumed} would save its own beside them and --resume auto would then continue the newest: "
        f"--resume auto --checkpoint_dir {other} continues the run there, or give an empty --checkpoint_dir"
    )
    assert snapshot(tmp_path / "a") == before


def test_a_file_system_without_locks_warns_and_the_run_goes_on(tmp_path, monkeypatch):
    # NFS without its lock daemon answers flock with ENOLCK (simulated: no such mount here); that is no
    # other run holding the folder, so refusing would stop every run on that disk
    import fcntl

    def no_locks(fd, operation):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_locks)
    logs: list[str] = []
    lock = RunLock.acquire(tmp_path / "checkpoints", "--checkpoint_dir", logs.append)
    assert logs == [
        f"warning: {tmp_path / 'checkpoints'}: its file system takes no file locks (No locks available); "
        "nothing stops a second run on it"
    ]
    assert json.loads((tmp_path / "checkpoints" / LOCK_NAME).read_text())["pid"] == os.getpid()
    lock.release()
    assert not (tmp_path / "checkpoints").exists()  # created by it, left empty: removed


def test_a_signal_while_the_lock_is_taken_leaves_no_lock_file(tmp_path, monkeypatch):
    """Ctrl-C or SIGTERM (which stops as Ctrl-C does) between creating the lock file and handing the
    lock to the run left the file behind: the next run warned of a run that never released it."""
    from vits_trainer import runlock

    def interrupted(fd):
        raise KeyboardInterrupt

    monkeypatch.setattr(runlock.os, "fsync", interrupted)
    with pytest.raises(KeyboardInterrupt):
        RunLock.acquire(tmp_path / "ckpt", "--checkpoint_dir", log=print)
    assert not (tmp_path / "ckpt" / LOCK_NAME).exists()
    monkeypatch.undo()
    lock = RunLock.acquire(tmp_path / "ckpt", "--checkpoint_dir", log=print)  # free, and no warning
    lock.release()
