"""--push_to_hub: the start-up check of the target repo, and the uploads of a run's model folders.

`check_push_target` runs in train_vits.py before torch is imported, so a push that cannot happen
costs a second, not a training run: the hub in reach (hub.py's probe: offline refuses at once), a
token, who it belongs to and whether that user or one of their organisations may write to the repo.
A missing repo is created there and then (private unless --hub_public): creating it is the one test
of the right to create that cannot be wrong, and it leaves the end of the run only an upload to do.
An existing repo is never changed (visibility included).

`HubPush` does the uploads: final_model at the end of the run (after the local export, which never
depends on it), and with --push_best each new best_model to the repo's `best_model/` folder, in a
background thread, one at a time, a newer one replacing one still waiting. A failed upload is a
warning with the command to push by hand; the model stays where it was exported.

Network calls only here; huggingface_hub is imported inside the functions (a run without the flag
never imports this module).
"""

from __future__ import annotations

import os
import shlex
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import UserError
from ..hub import hub_unreachable, is_repo_id
from ..safety import EXPORT_MARKER, remove_dead_writers_temp

CALL_SECONDS = 10.0  # each start-up call to the hub (whoami, repo info, create) gets at most this
# The upload's share of the final reserve until one is measured: commit round trips plus the folder at a
# modest uplink (a 145 MB MMS model: ~20 s).
UPLOAD_FIXED_SECONDS = 5.0
UPLOAD_BYTES_PER_SECOND = 10e6
# local bookkeeping, not part of the model: the export marker and the run summary name this machine's paths
NOT_UPLOADED = (EXPORT_MARKER, "train_summary.json")
# an upload replaces these in the repo: an earlier push's sample WAVs would sit beside this card's (only
# the names an export gives them, outputs.copy_samples: other files in the repo stay)
STALE_IN_REPO = ("samples/sample_*.wav",)
SNAPSHOT_PREFIX = ".hub_upload"  # <checkpoint_dir>/.hub_upload.N-<pid>: a best_model being uploaded
TOKEN_HELP = "run `hf auth login` or set HF_TOKEN to a token with write access (https://huggingface.co/settings/tokens)"


@dataclass
class PushTarget:
    """A checked repo: who pushes, and whether this run created it."""

    repo_id: str
    user: str
    private: bool  # what --hub_public asked for (an existing repo keeps its own visibility)
    created: bool
    token: str = field(repr=False)


def target_of(repo_id: str, public: bool) -> PushTarget:
    """The target as the run uses it (checked at start-up; no network here): this machine's token."""
    return PushTarget(repo_id=repo_id, user="", private=not public, created=False, token=_token())


def _token() -> str:
    """This machine's hub token (HF_TOKEN, else the one `hf auth login` saved), or ""."""
    from huggingface_hub import get_token

    try:
        return get_token() or ""
    except Exception:  # an OIDC exchange or a token refresh that failed: as good as none
        return ""


# ---- the start-up check ---------------------------------------------------------------------------------


def check_push_target(
    repo_id: str, public: bool = False, folder="training/final_model", call_seconds: float = CALL_SECONDS
) -> PushTarget:
    """The repo --push_to_hub names can be written with this machine's token, or one `UserError` line
    saying what to do (`folder`: the model folder that line tells to upload later). Creates the repo
    (private unless `public`) when it does not exist."""
    where = f"--push_to_hub {repo_id}"
    _check_name(repo_id, where)
    why = hub_unreachable()  # HF_HUB_OFFLINE, or no connection within 3 s: no hub client is asked
    if why:
        fix = "unset HF_HUB_OFFLINE" if "HF_HUB_OFFLINE" in why else "check the network"
        raise UserError(
            f"{where}: the Hugging Face hub cannot be reached ({why}): {fix}, or train without "
            f"--push_to_hub and upload later with: {manual_command(repo_id, folder, not public)}"
        )
    from huggingface_hub import HfApi

    token = _token()
    if not token:
        raise UserError(f"{where}: no Hugging Face token on this machine: {TOKEN_HELP}")
    api = HfApi()
    try:
        me = _within(call_seconds, lambda: api.whoami(token=token))
    except Exception as err:
        if _status(err) == 401:
            raise UserError(
                f"{where}: the hub refused the token (expired or revoked): {TOKEN_HELP}"
            ) from None
        raise UserError(f"{where}: {_network_words(err, call_seconds)}") from None
    user = str(me.get("name") or "")
    namespace, _ = repo_id.split("/", 1)
    _check_writer(me, user, namespace, repo_id, where)
    created = _ensure_repo(api, token, repo_id, not public, where, call_seconds)
    return PushTarget(repo_id=repo_id, user=user, private=not public, created=created, token=token)


def _check_name(repo_id: str, where: str) -> None:
    if not is_repo_id(repo_id):
        raise UserError(
            f"{where}: not a model repo id; give it as USER/NAME or ORG/NAME (letters, digits, '-', '_', '.')"
        )


def _check_writer(me: dict, user: str, namespace: str, repo_id: str, where: str) -> None:
    """The token may write, and `namespace` is its user's or an organisation they can write to."""
    access = (me.get("auth") or {}).get("accessToken") or {}
    if access.get("role") == "read":
        raise UserError(f"{where}: the token is read-only: {TOKEN_HELP}")
    orgs = {o.get("name"): o.get("roleInOrg") for o in me.get("orgs") or [] if isinstance(o, dict)}
    if namespace != user and namespace not in orgs:
        mine = ", ".join([user, *sorted(n for n in orgs if n)])
        raise UserError(
            f"{where}: the token's user {user} cannot write to {namespace} (its namespaces: {mine}); "
            f"check the repo name, e.g. {user}/{repo_id.split('/', 1)[1]}"
        )
    if namespace != user and orgs.get(namespace) == "read":
        raise UserError(
            f"{where}: {user} has read access only to the organisation {namespace}: ask one of its admins "
            f"for write access, or push to {user}/{repo_id.split('/', 1)[1]}"
        )
    scoped = (access.get("fineGrained") or {}).get("scoped")
    if access.get("role") == "fineGrained" and isinstance(scoped, list):
        allowed = {
            (s.get("entity") or {}).get("name")
            for s in scoped
            if isinstance(s, dict) and any("write" in str(p) for p in s.get("permissions") or [])
        }
        if not allowed & {namespace, repo_id}:
            raise UserError(
                f"{where}: the fine-grained token has no write permission on {namespace} or {repo_id}: "
                f"add it at https://huggingface.co/settings/tokens, or {TOKEN_HELP}"
            )


def _ensure_repo(api, token: str, repo_id: str, private: bool, where: str, seconds: float) -> bool:
    """True when this call created the repo; an existing one is left as it is."""
    try:
        _within(seconds, lambda: api.repo_info(repo_id, repo_type="model", token=token))
        return False
    except Exception as err:
        if type(err).__name__ != "RepositoryNotFoundError" and _status(err) != 404:
            if _status(err) in (401, 403):
                raise UserError(
                    f"{where}: the repo exists and this token may not use it: {TOKEN_HELP}"
                ) from None
            raise UserError(f"{where}: {_network_words(err, seconds)}") from None
    try:
        _within(seconds, lambda: api.create_repo(repo_id, token=token, private=private, exist_ok=True))
    except Exception as err:
        if _status(err) in (401, 403):
            raise UserError(
                f"{where}: not allowed to create a repo in {repo_id.split('/', 1)[0]}: check the repo name, "
                f"or create it on https://huggingface.co/new and give the token write access to it"
            ) from None
        if _status(err) == 409:
            raise UserError(
                f"{where}: a repo of that name exists but this token cannot see it: check the repo name"
            ) from None
        raise UserError(f"{where}: creating the repo failed: {_network_words(err, seconds)}") from None
    return True


def _within(seconds: float, call: Callable):
    """`call()`, or TimeoutError after `seconds` (the hub clients' own timeouts are longer and retry); a
    call still running is left to its daemon thread."""
    result: dict = {}

    def run() -> None:
        try:
            result["value"] = call()
        except BaseException as err:  # handed to the caller's thread
            result["error"] = err

    worker = threading.Thread(target=run, daemon=True, name="hub-check")
    worker.start()
    worker.join(seconds)
    if worker.is_alive():
        raise TimeoutError(f"no answer within {seconds:.0f} s")
    if "error" in result:
        raise result["error"]
    return result["value"]


def _status(err: BaseException) -> int | None:
    """The HTTP status of a hub client error (requests or httpx), else None."""
    return getattr(getattr(err, "response", None), "status_code", None)


def _network_words(err: BaseException, seconds: float) -> str:
    if isinstance(err, TimeoutError):
        return f"the Hugging Face hub did not answer within {seconds:.0f} s: check the network"
    status = _status(err)
    kind = f"HTTP {status}" if status else type(err).__name__
    return f"the Hugging Face hub call failed ({kind}): check the network and the repo name"


def manual_command(repo_id: str, folder, private: bool) -> str:
    """The command that uploads `folder` by hand, as the run would have (hf comes with huggingface_hub)."""
    excludes = " ".join(f"--exclude {shlex.quote(name)}" for name in NOT_UPLOADED)
    deletes = "".join(f" --delete {shlex.quote(pattern)}" for pattern in STALE_IN_REPO)
    visibility = " --private" if private else ""
    return f"hf upload {shlex.quote(repo_id)} {shlex.quote(str(folder))} . {excludes}{deletes}{visibility}"


# ---- the uploads -----------------------------------------------------------------------------------------


def upload_folder(target: PushTarget, folder: Path, path_in_repo: str | None, message: str) -> dict:
    """One upload of `folder`; the summary's record of it (`pushed`, and `url` or `error`). Never raises."""
    record: dict = {"repo": target.repo_id, "pushed": False}
    try:
        from huggingface_hub import HfApi

        info = HfApi().upload_folder(
            repo_id=target.repo_id,
            folder_path=str(folder),
            path_in_repo=path_in_repo,
            commit_message=message,
            token=target.token or None,
            ignore_patterns=list(NOT_UPLOADED),
            delete_patterns=list(STALE_IN_REPO),  # relative to path_in_repo: best_model/samples/ there
        )
    except Exception as err:  # the network, the token, the hub: a warning, never the run
        # every line, joined: the hub's reason is often on the second ("Invalid metadata in README.md."
        # then which field)
        lines = [line.strip() for line in f"{type(err).__name__}: {err}".splitlines() if line.strip()]
        record["error"] = " ".join(lines)[:600]
        return record
    record["pushed"] = True
    record["url"] = str(getattr(info, "commit_url", None) or getattr(info, "oid", None) or info)
    return record


def upload_estimate(folder_bytes: int) -> float:
    return UPLOAD_FIXED_SECONDS + folder_bytes / UPLOAD_BYTES_PER_SECOND


class HubPush:
    """The uploads of one run (main process). `final(folder, step)` at the end, synchronously;
    `best(folder, step)` queues best_model for the background thread; `wait(seconds)` lets it finish.
    Owns the upload time it measured (`seconds`: for the budget's final reserve)."""

    def __init__(
        self,
        target: PushTarget,
        checkpoint_dir: Path,
        log,
        folder_bytes: int = 0,
        reserve: Callable[[float], None] | None = None,
    ) -> None:
        self.target = target
        self.checkpoint_dir = Path(checkpoint_dir)
        self.log = log
        self.reserve = reserve or (lambda seconds: None)  # told each upload time (the final reserve's)
        self.seconds = upload_estimate(folder_bytes)
        self.reserve(self.seconds)
        self.best_record: dict | None = None  # the last best_model upload (or why there was none)
        self._lock = threading.Lock()
        self._pending: tuple[Path, int] | None = None
        self._thread: threading.Thread | None = None
        self._count = 0
        remove_dead_writers_temp(self.checkpoint_dir, f"{SNAPSHOT_PREFIX}.*-*")  # an earlier crash's

    # -- best_model, in the background

    def best(self, folder: Path, step: int) -> None:
        """Upload `folder` (a best_model) soon; it is linked aside first, so a newer export can replace
        the folder while it uploads. Replaces an upload still waiting; never blocks on the network."""
        try:
            snapshot = self._snapshot(folder)
        except OSError as err:
            self.log(f"warning: best_model of step {step} not queued for the hub ({err.strerror or err})")
            return
        with self._lock:
            dropped, self._pending = self._pending, (snapshot, step)
            if self._thread is None:
                self._thread = threading.Thread(target=self._work, daemon=True, name="hub-push")
                self._thread.start()
        if dropped is not None:
            shutil.rmtree(dropped[0], ignore_errors=True)  # our snapshot, superseded before its upload

    def _snapshot(self, folder: Path) -> Path:
        self._count += 1
        snapshot = self.checkpoint_dir / f"{SNAPSHOT_PREFIX}.{self._count}-{os.getpid()}"
        shutil.rmtree(snapshot, ignore_errors=True)  # this pid's own snapshot name
        shutil.copytree(folder, snapshot, copy_function=_link_or_copy)
        return snapshot

    def _work(self) -> None:
        while True:
            with self._lock:
                job, self._pending = self._pending, None
                if job is None:
                    self._thread = None
                    return
            snapshot, step = job
            t0 = time.perf_counter()
            record = upload_folder(self.target, snapshot, "best_model", f"best model at step {step}")
            shutil.rmtree(snapshot, ignore_errors=True)  # our snapshot, uploaded (or failed)
            record["step"] = step
            self.best_record = record
            if record["pushed"]:
                self.seconds = max(self.seconds, time.perf_counter() - t0)  # the estimate, or slower
                self.reserve(self.seconds)
                self.log(f"hub: best_model of step {step} uploaded to {self.target.repo_id}/best_model")
            else:
                self.log(
                    f"warning: best_model of step {step} not uploaded to {self.target.repo_id} "
                    f"({record['error']}); training goes on, the final model is uploaded at the end"
                )

    def wait(self, seconds: float) -> bool:
        """Let the background uploads finish, for at most `seconds`; False (and an upload still waiting
        dropped) when one was still running."""
        with self._lock:
            thread = self._thread
        if thread is not None:
            thread.join(max(0.0, seconds))
        with self._lock:
            running = self._thread is not None
            dropped, self._pending = (self._pending, None) if running else (None, self._pending)
        if dropped is not None:
            shutil.rmtree(dropped[0], ignore_errors=True)  # our snapshot, never started
        if running:
            self.best_record = {
                "repo": self.target.repo_id,
                "pushed": False,
                "error": "still uploading when the run's time was up",
            }
            self.log("warning: a best_model upload was still running when the run's time was up")
        return not running

    # -- final_model, at the end

    def final(self, folder: Path | None, step: int) -> dict:
        """Upload the exported final model; its record for train_summary.json ("hub")."""
        if folder is None:
            return {"repo": self.target.repo_id, "pushed": False, "error": "the final model was not exported"}
        self.log(f"hub: uploading {folder} to {self.target.repo_id} ...")
        t0 = time.perf_counter()
        record = upload_folder(self.target, folder, None, f"final model at step {step}")
        if record["pushed"]:
            self.seconds = time.perf_counter() - t0
            self.log(
                f"hub: final model uploaded to https://huggingface.co/{self.target.repo_id} ({record['url']})"
            )
        else:
            self.log(
                f"warning: the final model was not uploaded to {self.target.repo_id} ({record['error']}); "
                f"it is at {folder}; push it by hand with: "
                f"{manual_command(self.target.repo_id, folder, self.target.private)}"
            )
        return record

    def drop_waiting(self) -> None:
        """Forget an upload that has not started (a run stopped by a signal)."""
        with self._lock:
            dropped, self._pending = self._pending, None
        if dropped is not None:
            shutil.rmtree(dropped[0], ignore_errors=True)  # our snapshot, never started


def _link_or_copy(src, dst) -> None:
    """A hard link (instant; the export's later replacement makes new files, the link keeps these), or a
    copy where links are not possible."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)
