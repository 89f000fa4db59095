"""--push_to_hub: refused at start-up in one line (offline, no token, no write permission), the repo
created private, the final model uploaded at the end, and a failed upload that keeps the local model and
says how to push it by hand. Only the network calls are mocked (the reachability probe and HfApi's
whoami / repo_info / create_repo / upload_folder); no training run."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from huggingface_hub import HfApi, constants

from tests.helpers import PYTHON, ROOT
from vits_trainer.errors import UserError
from vits_trainer.safety import EXPORT_MARKER, write_marker
from vits_trainer.training import hub_push
from vits_trainer.training.budget import Budget
from vits_trainer.training.config import TrainConfig
from vits_trainer.training.hub_push import HubPush, PushTarget, check_push_target
from vits_trainer.training.run_end import RunEnd

REPO = "someone/x"


class HTTPError(Exception):
    """What the hub clients raise: an error carrying the HTTP response."""

    def __init__(self, status: int):
        super().__init__(f"{status} Client Error")
        self.response = SimpleNamespace(status_code=status)


@pytest.fixture
def token(monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_test_token")


@pytest.fixture
def no_token(monkeypatch, tmp_path):
    """No HF_TOKEN and an empty token file location: this machine is not logged in."""
    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_OIDC_RESOURCE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "no_token"))


@pytest.fixture
def online(monkeypatch):
    """The reachability probe (a network call) answers: the hub is in reach."""
    monkeypatch.setattr(hub_push, "hub_unreachable", lambda: None)


def whoami_of(name="me", orgs=(), role="write"):
    return lambda self, token=None, **kw: {
        "name": name,
        "orgs": [{"name": org, "roleInOrg": r} for org, r in orgs],
        "auth": {"accessToken": {"role": role}},
    }


def one_line(err: UserError) -> str:
    text = str(err)
    assert "\n" not in text and text.startswith(f"--push_to_hub {REPO}:"), text
    return text


# ---- (1) offline: the real behaviour of this machine ------------------------------------------------


@pytest.mark.parametrize("offline_flag", [False, True], ids=["this-machine", "HF_HUB_OFFLINE=1"])
@pytest.mark.parametrize("demo", [[], ["--demo"]], ids=["run", "demo"])
def test_an_unreachable_hub_refuses_at_once_in_one_line(tmp_path, offline_flag, demo):
    """Nothing mocked: train_vits.py on this machine (no hub in reach, or HF_HUB_OFFLINE=1) stops before
    any work with one error line, also --demo before it makes its corpus and model. Where the hub is in
    reach, the missing token (none here) stops it."""
    env = {k: v for k, v in os.environ.items() if k not in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")}
    env.pop("HF_HUB_OFFLINE", None)  # conftest's; this test wants the machine's own state
    env["HF_HOME"] = str(tmp_path / "hf_home")
    if offline_flag:
        env["HF_HUB_OFFLINE"] = "1"
    t0 = time.perf_counter()
    proc = subprocess.run(
        [PYTHON, str(ROOT / "train_vits.py"), *demo, "--push_to_hub", REPO],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    seconds = time.perf_counter() - t0
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: --push_to_hub {REPO}: "), proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    if offline_flag:
        assert "HF_HUB_OFFLINE" in lines[0] and "hf upload" in lines[0]
    assert seconds < 30  # ~0.5 s measured (docs/training.md); generous for a loaded machine
    assert not (tmp_path / "training").exists()  # nothing written


# ---- (2) no token ---------------------------------------------------------------------------------------


def test_no_token_is_one_line_saying_how_to_log_in(online, no_token):
    """Mocked: the reachability probe only. No token on this machine: one line, no hub call."""
    with pytest.raises(UserError) as err:
        check_push_target(REPO)
    text = one_line(err.value)
    assert "no Hugging Face token" in text and "hf auth login" in text and "HF_TOKEN" in text


# ---- (3) a token without write permission --------------------------------------------------------------


@pytest.mark.parametrize(
    "repo,whoami,words",
    [
        (REPO, whoami_of("me"), "cannot write to someone"),
        (REPO, whoami_of("someone", role="read"), "read-only"),
        ("myorg/x", whoami_of("me", orgs=[("myorg", "read")]), "read access only"),
    ],
    ids=["another-namespace", "read-token", "org-reader"],
)
def test_no_write_permission_is_one_line(monkeypatch, online, token, repo, whoami, words):
    """Mocked: the probe and HfApi.whoami (network). The token's user may not write there: one line."""
    monkeypatch.setattr(HfApi, "whoami", whoami)
    monkeypatch.setattr(HfApi, "repo_info", lambda *a, **k: pytest.fail("no repo lookup after a refusal"))
    with pytest.raises(UserError) as err:
        check_push_target(repo)
    text = str(err.value)
    assert "\n" not in text and text.startswith(f"--push_to_hub {repo}:") and words in text, text


def test_a_refused_token_and_an_unusable_repo_are_one_line(monkeypatch, online, token):
    """Mocked: the probe, HfApi.whoami and HfApi.repo_info (network)."""

    def refused(self, token=None, **kw):
        raise HTTPError(401)

    monkeypatch.setattr(HfApi, "whoami", refused)
    with pytest.raises(UserError) as err:
        check_push_target(REPO)
    assert "refused the token" in one_line(err.value)

    def forbidden(self, *a, **k):
        raise HTTPError(403)

    monkeypatch.setattr(HfApi, "whoami", whoami_of("someone"))
    monkeypatch.setattr(HfApi, "repo_info", forbidden)
    with pytest.raises(UserError) as err:
        check_push_target(REPO)
    assert "may not use it" in one_line(err.value)


def test_a_hub_that_does_not_answer_is_one_line_within_the_call_limit(monkeypatch, online, token):
    """Mocked: the probe and a HfApi.whoami that hangs (network)."""
    release = threading.Event()
    monkeypatch.setattr(HfApi, "whoami", lambda self, token=None, **kw: release.wait(30))
    t0 = time.perf_counter()
    with pytest.raises(UserError) as err:
        check_push_target(REPO, call_seconds=0.2)
    release.set()
    assert "did not answer" in one_line(err.value) and time.perf_counter() - t0 < 10


@pytest.mark.parametrize("public", [False, True])
def test_a_missing_repo_is_created_private_unless_public(monkeypatch, online, token, public):
    """Mocked: the probe, whoami, repo_info (404) and create_repo (network)."""
    created = []

    def not_found(self, *a, **k):
        raise HTTPError(404)

    monkeypatch.setattr(HfApi, "whoami", whoami_of("someone"))
    monkeypatch.setattr(HfApi, "repo_info", not_found)
    monkeypatch.setattr(HfApi, "create_repo", lambda self, repo_id, **kw: created.append((repo_id, kw)))
    target = check_push_target(REPO, public=public)
    assert target.created and target.private is (not public) and target.user == "someone"
    assert created == [(REPO, {"token": "hf_test_token", "private": not public, "exist_ok": True})]


def test_an_existing_repo_is_left_as_it_is(monkeypatch, online, token):
    """Mocked: the probe, whoami, repo_info (found) and create_repo (network): an org the user writes to."""
    monkeypatch.setattr(HfApi, "whoami", whoami_of("me", orgs=[("someone", "write")]))
    monkeypatch.setattr(HfApi, "repo_info", lambda self, *a, **k: SimpleNamespace(private=False))
    monkeypatch.setattr(HfApi, "create_repo", lambda *a, **k: pytest.fail("an existing repo is not changed"))
    target = check_push_target(REPO, public=False)
    assert not target.created and target.user == "me"


# ---- (4) and (5) the upload at the end -------------------------------------------------------------------


@pytest.fixture
def exported(tmp_path, tiny_model_dir) -> Path:
    """A tiny model folder as the export leaves it: weights, card, marker."""
    folder = tmp_path / "final_model"
    shutil.copytree(tiny_model_dir, folder)
    (folder / "README.md").write_text("---\nlicense: other\n---\n# tiny\n", encoding="utf-8")
    write_marker(folder, "final_model", tmp_path / "checkpoints")
    return folder


def digest(folder: Path) -> dict:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def run_end_push(tmp_path: Path, exported: Path, lines: list, push_best=False):
    """RunEnd.push as the end of a run calls it, on a session holding only what it reads."""
    (tmp_path / "checkpoints").mkdir(exist_ok=True)
    cfg = TrainConfig(push_to_hub=REPO, push_best=push_best)
    budget = Budget(600.0, time.time())
    target = PushTarget(REPO, "someone", private=True, created=True, token="hf_test_token")
    hub = HubPush(target, tmp_path / "checkpoints", lines.append, folder_bytes=10_000_000)
    session = SimpleNamespace(
        cfg=cfg, budget=budget, log=lines.append, checkpoint_dir=tmp_path / "checkpoints"
    )
    return RunEnd(session, SimpleNamespace(hub=hub), agreement=None).push("budget", exported, False), budget


def test_the_final_model_is_uploaded_with_its_card(monkeypatch, tmp_path, exported):
    """Mocked: HfApi.upload_folder (network). The final model folder goes to the repo's root, the
    marker (this machine's paths) left out; the summary's record has the commit url."""
    calls = []

    def upload(self, **kw):
        calls.append(kw)
        return SimpleNamespace(commit_url=f"https://huggingface.co/{REPO}/commit/abc")

    monkeypatch.setattr(HfApi, "upload_folder", upload)
    lines = []
    record, budget = run_end_push(tmp_path, exported, lines)
    assert record == {"repo": REPO, "pushed": True, "url": f"https://huggingface.co/{REPO}/commit/abc"}
    [call] = calls
    assert call["repo_id"] == REPO and call["folder_path"] == str(exported) and call["path_in_repo"] is None
    assert EXPORT_MARKER in call["ignore_patterns"] and call["token"] == "hf_test_token"
    assert call["delete_patterns"] == ["samples/sample_*.wav"]  # an earlier push's samples go with its card
    assert (exported / "README.md").is_file()  # the card is in the uploaded folder
    assert any("final model uploaded" in line for line in lines), lines
    assert budget.final_reserve() >= hub_push.upload_estimate(10_000_000)  # the upload is in the reserve


def test_a_failed_upload_keeps_the_model_and_says_how_to_push_it(monkeypatch, tmp_path, exported):
    """Mocked: HfApi.upload_folder failing (network). The local model is untouched, the warning names
    the folder and the command to push it by hand, the record says why; nothing raises (exit 0)."""
    before = digest(exported)

    def upload(self, **kw):
        raise ConnectionError("connection reset by peer\nwhile sending README.md")  # the why on line 2

    monkeypatch.setattr(HfApi, "upload_folder", upload)
    lines = []
    record, _ = run_end_push(tmp_path, exported, lines)
    assert record["pushed"] is False
    assert record["error"] == "ConnectionError: connection reset by peer while sending README.md"
    assert digest(exported) == before
    [warning] = [line for line in lines if line.startswith("warning:")]
    assert str(exported) in warning
    assert f"hf upload {REPO} {exported} . --exclude {EXPORT_MARKER}" in warning and "--private" in warning


def test_best_model_uploads_run_in_the_background_newest_replacing_a_waiting_one(
    monkeypatch, tmp_path, exported
):
    """Mocked: HfApi.upload_folder (network), held until released. Three best models while the first
    uploads: the first and the newest are uploaded, the middle one is dropped; snapshots are removed."""
    release, started, calls = threading.Event(), threading.Event(), []

    def upload(self, **kw):
        calls.append((kw["path_in_repo"], kw["commit_message"], sorted(os.listdir(kw["folder_path"]))))
        started.set()
        release.wait(30)
        return SimpleNamespace(commit_url="u")

    monkeypatch.setattr(HfApi, "upload_folder", upload)
    checkpoints = tmp_path / "checkpoints"
    checkpoints.mkdir()
    target = PushTarget(REPO, "someone", private=True, created=False, token="t")
    lines = []
    hub = HubPush(target, checkpoints, lines.append)
    t0 = time.perf_counter()
    hub.best(exported, 10)
    started.wait(30)
    hub.best(exported, 20)
    hub.best(exported, 30)
    assert time.perf_counter() - t0 < 10  # never waited for the network
    release.set()
    assert hub.wait(30)
    assert [c[:2] for c in calls] == [
        ("best_model", "best model at step 10"),
        ("best_model", "best model at step 30"),
    ]
    assert calls[0][2] == sorted(os.listdir(exported))
    assert hub.best_record == {"repo": REPO, "pushed": True, "url": "u", "step": 30}
    assert not list(checkpoints.glob(".hub_upload*"))
    assert digest(exported)  # the best_model folder itself is untouched


def test_push_flags_are_this_invocations_and_need_a_repo():
    """No network: --push_best / --hub_public alone are refused; a resume does not take them from the
    checkpoint, and the printed resume command repeats them."""
    from vits_trainer.training.resume_settings import NOT_RESTORED, resume_command

    for name in ("push_best", "hub_public"):
        with pytest.raises(UserError, match=f"--{name} needs --push_to_hub"):
            TrainConfig(**{name: True}).validate()
    assert {"push_to_hub", "hub_public", "push_best"} <= NOT_RESTORED
    command = resume_command(
        "train_vits.py", TrainConfig(push_to_hub=REPO, push_best=True), "--checkpoint_dir", "c"
    )
    assert f"--push_to_hub {REPO} --push_best" in command
