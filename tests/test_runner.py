"""train_vits.py end to end, as a user runs it: a 60 s budget, SIGTERM and --resume auto.

These run the real CLI in a subprocess on the tiny model and the tone-language corpus (CPU).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
import zipfile
from pathlib import Path

import pytest
from transformers import VitsModel

from tests.helpers import PYTHON, ROOT, TINY_SETTINGS, cli_args, cli_settings, ended_near_the_budget
from vits_trainer.runlock import LOCK_NAME

pytestmark = pytest.mark.slow


def train_cmd(tmp: Path, data: Path, model: Path, **overrides) -> list[str]:
    settings = cli_settings(tmp, data, model, **{"save_minutes": 0.25, **overrides})
    return [PYTHON, str(ROOT / "train_vits.py"), *cli_args(settings)]


def read_metrics(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def budget_run(tmp_path_factory, tiny_model_dir, tone_corpus):
    tmp = tmp_path_factory.mktemp("budget60")
    target = 60.0
    start = time.monotonic()
    proc = subprocess.run(
        train_cmd(tmp, tone_corpus, tiny_model_dir, target_hours=target / 3600),
        capture_output=True,
        text=True,
        timeout=300,
    )
    wall = time.monotonic() - start
    return tmp, target, wall, proc


def test_budget_run_ends_inside_the_budget(budget_run):
    tmp, target, wall, proc = budget_run
    assert proc.returncode == 0, proc.stderr[-3000:]
    # the whole process, interpreter start-up to exit: within +max(1 %, 10 s), and after 97 % unless the
    # machine was so loaded that the stop rule kept a slow step's time back (it says so in the summary)
    assert wall <= target + max(0.01 * target, 10.0), (wall, proc.stdout[-2000:])
    summary = json.loads((tmp / "final_model" / "train_summary.json").read_text())
    assert wall >= 0.97 * target or ended_near_the_budget(summary, target, 0.97), (wall, summary)
    assert summary["stopped_reason"] == "budget"
    assert summary["target_seconds"] == pytest.approx(target)
    assert summary["wall_seconds"] <= target
    for key in (
        "steps",
        "epochs_planned",
        "epochs_completed",
        "samples_per_second",
        "best_val_loss",
        "best_metric",
        "resumed_from_step",
        "data_wait_fraction",
        "preload_seconds",
    ):
        assert key in summary
    # how many steps fit depends on the machine's load (53 on a quiet 2-core machine, 7 beside a second
    # test session), so only that it trained and planned: the budget checks above say the time was used
    assert summary["steps"] >= 1 and summary["epochs_planned"] > 0
    assert summary["resumed_from_step"] is None
    assert summary["best_metric"] == "val_mel"  # best_val_loss is its value, not val_loss's
    assert 0.0 <= summary["data_wait_fraction"] < 0.5
    assert summary["device_wait_fraction"] is None  # a CPU computes as the host goes: nothing queues
    assert "plan:" in proc.stdout


def test_budget_run_writes_models_metrics_and_curve(budget_run):
    tmp, _, _, proc = budget_run
    ckpt = tmp / "checkpoints"
    VitsModel.from_pretrained(tmp / "final_model")
    VitsModel.from_pretrained(ckpt / "best_model")
    metrics = read_metrics(ckpt / "metrics.jsonl")
    steps = [m for m in metrics if "loss_g" in m]
    evals = [m for m in metrics if m.get("event") == "eval"]
    assert steps and evals and evals[0]["tag"] == "start"
    # The final eval runs when it fits. On a busy machine an overrunning last step can still squeeze it
    # out, by design and with a log line (the fake-clock tests in test_budget.py pin the headroom that
    # makes this rare; test_vits_training.py pins the final eval itself).
    assert evals[-1]["tag"] == "final" or "final evaluation skipped" in proc.stdout, proc.stdout[-2000:]
    assert all(m["lr"] > 0 for m in steps)
    assert not any("device_wait_fraction" in m for m in steps)  # a GPU's figure
    seen = [m["samples_seen"] for m in steps]  # over `time`: the loop's rate on the wall clock
    assert seen[0] > 0 and seen == sorted(set(seen)), seen
    assert (ckpt / "loss_curve.png").stat().st_size > 1000
    checkpoints = sorted(p.name for p in ckpt.glob("step_*"))
    assert 1 <= len(checkpoints) <= TINY_SETTINGS.get("keep_checkpoints", 2)
    assert not list(ckpt.glob(".step_*"))  # no temp folders left behind
    # the page is named once it exists (after the start evaluation), and again in the last line
    report = ckpt / "report.html"
    assert report.stat().st_size > 1000
    assert proc.stdout.count(f"report: {report} (open it in a browser") == 1, proc.stdout[-2000:]
    # with its files in one archive for a platform whose browser downloads a folder file by file
    assert "report.zip holds it with its samples, to download as one file" in proc.stdout
    with zipfile.ZipFile(ckpt / "report.zip") as archive:
        packed = set(archive.namelist())
    top = f"{ckpt.parent.name}-{ckpt.name}"
    assert f"{top}/report.html" in packed and f"{top}/metrics.jsonl" in packed, packed  # (no samples here)
    assert proc.stdout.rstrip().splitlines()[-1].endswith(f"; report: {report}"), proc.stdout[-500:]


def test_sigterm_during_set_up_stops_as_ctrl_c_does(tmp_path, tiny_model_dir, tone_corpus):
    """SIGTERM before the training loop (loading the data, the start evaluation) ended the process with
    no word (exit -15), its run lock left behind; it now says "interrupted" and releases the lock."""
    cmd = train_cmd(tmp_path, tone_corpus, tiny_model_dir, target_hours=120 / 3600)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lock = tmp_path / "checkpoints" / LOCK_NAME
    deadline = time.monotonic() + 120
    # the lock taken and its record written: set-up has begun (a signal while it is taken is the runlock
    # test's)
    while proc.poll() is None and time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            if lock.stat().st_size > 0:
                break
        time.sleep(0.01)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode in (130, 0), (proc.returncode, err[-2000:])  # 0: the loop had begun, and saved
    if proc.returncode == 130:
        assert err.strip().splitlines()[-1] == "interrupted" and "Traceback" not in err, err[-2000:]
    assert not lock.exists()


def test_sigterm_saves_and_resume_continues(tmp_path, tiny_model_dir, tone_corpus):
    """The signal goes to the whole process group, as a terminal's Ctrl-C or a job scheduler sends it:
    the DataLoader workers (two, the default) leave it to the main process, which saves once."""
    cmd = train_cmd(
        tmp_path, tone_corpus, tiny_model_dir, target_hours=120 / 3600, log_every=1, num_workers=2
    )
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    metrics = tmp_path / "checkpoints" / "metrics.jsonl"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if metrics.exists() and any(m.get("step", 0) >= 12 for m in read_metrics(metrics) if "loss_g" in m):
            break
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGTERM)  # the main process and its workers
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err[-3000:]
    assert out.count("SIGTERM received") == 1 and "--resume auto" in out, out[-3000:]
    assert "Traceback" not in err, err[-3000:]
    first = json.loads((tmp_path / "final_model" / "train_summary.json").read_text())
    assert first["stopped_reason"] == "signal"
    stopped_at = first["steps"]
    assert stopped_at >= 12
    state = json.loads(
        (tmp_path / "checkpoints" / f"step_{stopped_at:08d}" / "trainer_state.json").read_text()
    )
    assert state["global_step"] == stopped_at

    # the resume ends by a step count (the budget's stop is test_budget_run_ends_inside_the_budget's), with
    # a budget that leaves a loaded machine time for those steps
    resumed = subprocess.run(
        train_cmd(
            tmp_path,
            tone_corpus,
            tiny_model_dir,
            target_hours=120 / 3600,
            log_every=1,
            max_steps=stopped_at + 3,
        ),
        capture_output=True,
        text=True,
        timeout=200,
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resuming from step_{stopped_at:08d}" in resumed.stdout
    second = json.loads((tmp_path / "final_model" / "train_summary.json").read_text())
    assert second["resumed_from_step"] == stopped_at
    assert second["steps"] == stopped_at + 3 and second["stopped_reason"] == "max_steps"
    records = read_metrics(metrics)
    steps_after = [
        m["step"] for m in records if "loss_g" in m and m["time"] > first_end_time(records, stopped_at)
    ]
    assert steps_after and steps_after[0] == stopped_at + 1  # same step count, no restart
    last = json.loads(
        (tmp_path / "checkpoints" / f"step_{second['steps']:08d}" / "trainer_state.json").read_text()
    )
    assert last["val_ids"] == state["val_ids"]  # the held-out split never moves
    # the best-val history of the first session is kept
    assert len(last["train_state"]["val_history"]) > len(state["train_state"]["val_history"])
    assert last["train_state"]["val_history"][0] == state["train_state"]["val_history"][0]
    # no warmup restart: the LR right after resuming is not a warmup fraction of the peak
    first_lr_after = next(m["lr"] for m in records if m.get("step") == stopped_at + 1 and "lr" in m)
    assert first_lr_after > 0.5 * TINY_SETTINGS["learning_rate"]


def first_end_time(records: list[dict], step: int) -> float:
    return max(m["time"] for m in records if m.get("step") == step and "loss_g" in m)
