"""A busy machine: thread settings, the budget with a CPU-bound competitor, short runs that still train.

The fake-clock rules (slow first steps, outliers, a first step that cannot finish) are in test_budget.py;
here the real CLI and the real Trainer on the tiny model and the tone-language corpus.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from tests.helpers import PYTHON, ROOT, cli_args, cli_settings, train_tiny


def test_configure_threads_sets_a_short_spin_and_keeps_the_users(monkeypatch):
    from vits_trainer.training import runtime

    for name in (
        "OMP_WAIT_POLICY",
        "GOMP_SPINCOUNT",
        "OMP_NUM_THREADS",
        "NUMBA_NUM_THREADS",
        "LOCAL_WORLD_SIZE",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", "3")  # the user's choice wins
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setattr(runtime, "available_cpus", lambda: 8)
    settings = runtime.configure_threads()
    assert os.environ["GOMP_SPINCOUNT"] == runtime.SPIN_COUNT and "OMP_WAIT_POLICY" not in os.environ
    assert os.environ["OMP_NUM_THREADS"] == "3"
    assert os.environ["NUMBA_NUM_THREADS"] == "4"  # 8 CPUs shared by 2 local processes
    assert settings["set_by_user"] == "OMP_NUM_THREADS"
    line = runtime.describe_threads(runtime.thread_report())
    assert f"spin {runtime.SPIN_COUNT} then sleep" in line and "from the environment: OMP_NUM_THREADS" in line


def test_a_local_world_size_that_is_no_count_is_one_process_and_said(monkeypatch, capsys):
    # LOCAL_WORLD_SIZE=auto stopped train_vits.py with a ValueError traceback before it parsed a flag,
    # while the data's RAM share counted it as one process: one reading now, and a line saying so
    from vits_trainer.data import clipstore
    from vits_trainer.training import runtime

    for name in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OMP_NUM_THREADS", "NUMBA_NUM_THREADS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(runtime, "available_cpus", lambda: 8)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "auto")
    runtime.configure_threads()
    assert os.environ["NUMBA_NUM_THREADS"] == "8"
    assert clipstore._ram_limit_bytes(8.0) == 8 * 2**30
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "warning: LOCAL_WORLD_SIZE='auto'" in err and "1 process" in err
    for value, count in (("3", 3), (" 2 ", 2), ("0", 1), ("", 1)):
        monkeypatch.setenv("LOCAL_WORLD_SIZE", value)
        monkeypatch.delenv("NUMBA_NUM_THREADS")
        runtime.configure_threads()
        assert os.environ["NUMBA_NUM_THREADS"] == str(8 // count)
        assert clipstore._ram_limit_bytes(6.0) == 6 * 2**30 // count


def test_a_run_of_warmup_steps_only_reports_its_throughput_and_threads(tmp_path, tiny_model_dir, tone_corpus):
    # 3 steps, all of them benchmark warm-up steps: the budget's own throughput is still unmeasured
    session, summary = train_tiny(
        tmp_path, tone_corpus, tiny_model_dir, max_steps=3, benchmark_samples=10_000, warmup_steps=500
    )
    assert summary["steps"] == 3
    assert summary["samples_per_second"] > 0  # was 0.0
    threads = summary["threads"]
    assert threads["torch_threads"] >= 1 and threads["available_cpus"] >= 1
    state = json.loads((tmp_path / "checkpoints" / "step_00000003" / "trainer_state.json").read_text())
    assert state["threads"] == threads
    # no plan was made (the benchmark never ended): a line still says what the run was allowed and why
    # there is no plan, where before the log had no plan line at all
    log = (tmp_path / "checkpoints" / "train.log").read_text()
    assert summary["plan"] is None and "plan:" in log
    line = next(x for x in log.splitlines() if "plan:" in x)
    assert (
        "no plan" in line and "3 steps" in line and "--max_steps 3" in line and "--benchmark_samples" in line
    )


@pytest.mark.slow
def test_budget_holds_beside_a_cpu_bound_process_and_a_short_run_leaves_warmup(
    tmp_path, tiny_model_dir, tone_corpus
):
    """train_vits.py with 40 s, another process spinning on a core the whole time, a benchmark longer
    than the run and a 500-step warmup. Nothing here depends on how fast a step is: the wall time, the
    final evaluation (done, or skipped with its line) and the learning rate are checked against the rules."""
    target = 40.0
    settings = cli_settings(
        tmp_path,
        tone_corpus,
        tiny_model_dir,
        target_hours=target / 3600,
        benchmark_samples=100_000,
        warmup_steps=500,
        log_every=1,
        save_minutes=1000,
    )
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OMP_NUM_THREADS")
    }
    competitor = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        start, started = time.monotonic(), time.time()
        proc = subprocess.run(
            [PYTHON, str(ROOT / "train_vits.py"), *cli_args(settings)],
            capture_output=True,
            text=True,
            timeout=300,
            env=env,
        )
        wall = time.monotonic() - start
        assert competitor.poll() is None  # it competed for the whole run
    finally:
        competitor.kill()
        competitor.wait()
    assert proc.returncode == 0, proc.stderr[-3000:]
    overrun = max(0.01 * target, 10.0)
    summary = json.loads((tmp_path / "final_model" / "train_summary.json").read_text())
    metrics = [
        json.loads(line) for line in (tmp_path / "checkpoints" / "metrics.jsonl").read_text().splitlines()
    ]
    steps = [m for m in metrics if "loss_g" in m]
    # No step was started that could not end by the deadline plus the allowed overrun ...
    assert all(m["time"] <= started + target + overrun for m in steps), proc.stdout[-3000:]
    if summary["steps"] == 0:
        # ... and when start-up alone (model load, the start evaluation) used the budget on a machine this
        # busy, not even the first: the one line says so
        assert "no time for a training step" in proc.stdout, proc.stdout[-3000:]
    else:
        # ... and the whole process, start-up to exit, ends within the allowed overrun
        assert wall <= target + overrun, (wall, proc.stdout[-3000:])
    assert summary["stopped_reason"] == "budget"
    assert summary["threads"]["gomp_spincount"] == "10000" and summary["threads"]["omp_wait_policy"] is None
    assert "threads: torch" in proc.stdout and "OpenMP wait policy spin 10000 then sleep" in proc.stdout
    evals = [m for m in metrics if m.get("event") == "eval"]
    assert evals[-1]["tag"] == "final" or "final evaluation skipped" in proc.stdout, proc.stdout[-2000:]
    # No plan (the benchmark never ended), yet the warmup was capped from the first measured step on.
    assert summary["plan"] is None
    peak = settings["learning_rate"]
    assert all(0 < m["lr"] <= peak * (1 + 1e-6) for m in steps)
    if summary["steps"] >= 3:  # two warm-up steps, then measured ones: the cap is known from the third
        assert "warmup: " in proc.stdout
        assert summary["samples_per_second"] > 0
        lrs = [m["lr"] for m in steps]
        top = lrs.index(max(lrs))
        assert max(lrs) == pytest.approx(peak, rel=1e-3)  # warmup ended inside the run ...
        if summary["steps"] >= 4:  # ... and the decay began (on a machine this busy the third step,
            # the first to know the cap, can already reach the peak and be the last)
            assert lrs[-1] < max(lrs) and top < len(lrs) - 1
