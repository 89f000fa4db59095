"""`python train_vits.py --demo`, as a newcomer runs it: what it leaves is what a user looks at, listens
to and shares: report.html (opened in a real headless browser where one is installed), the model card
of final_model, and a model the speak command turns into audio.

One real run of the demo (tiny model from scratch, generated corpus), shortened to ~50 s of budget.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from urllib.parse import unquote

import pytest

from tests.helpers import PYTHON, ROOT
from tests.test_model_card import front_matter
from tests.test_report import assert_loads_in_a_browser, browser, sources
from tests.test_speak import check_wav
from vits_trainer.speak import main as speak


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> Path:
    """The demo's folder (training/demo under a fresh working directory) after one run."""
    cwd = tmp_path_factory.mktemp("demo")
    done = subprocess.run(
        [PYTHON, str(ROOT / "train_vits.py"), "--demo", "--target_hours", str(50 / 3600)],
        cwd=cwd,
        env=dict(os.environ, HF_HUB_OFFLINE="1"),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return cwd / "training" / "demo"


@pytest.mark.slow
def test_the_demo_leaves_a_report_whose_every_file_is_there(demo):
    report = demo / "checkpoints" / "report.html"
    page = report.read_text(encoding="utf-8")
    srcs = sources(page)
    assert any(s.endswith(".wav") for s in srcs) and any(s.endswith(".png") for s in srcs)
    missing = [s for s in srcs if not (report.parent / unquote(s)).is_file()]
    assert not missing, missing
    if browser() is None:
        pytest.skip("no headless Chromium on PATH: apt-get install chromium-headless-shell (Debian/Ubuntu)")
    assert_loads_in_a_browser(report)


@pytest.mark.slow
def test_the_demo_model_carries_a_model_card(demo):
    meta = front_matter((demo / "final_model" / "README.md").read_text(encoding="utf-8"))
    assert meta["pipeline_tag"] == "text-to-speech" and meta["library_name"] == "transformers"
    assert meta["license"] == "other"  # a model trained from scratch: no license to inherit
    assert "text-to-speech" in meta["tags"]
    # the hub page plays what the final weights spoke, each file in the folder as the card names it; a
    # final evaluation skipped for time (a loaded machine) spoke nothing, and then there is no widget
    summary = json.loads((demo / "final_model" / "train_summary.json").read_text(encoding="utf-8"))
    urls = [w["output"]["url"] for w in meta.get("widget", [])]
    assert bool(urls) == (summary["final_eval_tag"] is not None), (urls, summary["final_eval_skipped"])
    assert all((demo / "final_model" / url).is_file() for url in urls), urls


@pytest.mark.slow
def test_the_demo_model_speaks(demo, tmp_path, capsys):
    out = tmp_path / "demo.wav"
    assert speak(["--model", str(demo / "final_model"), "--text", "ba da ka", "--out", str(out)]) == 0
    check_wav(out)
    assert "RTF" in capsys.readouterr().out


def test_a_demo_given_a_model_uses_it_and_makes_none_in_its_place(tmp_path):
    """--demo with --model_name: the user's model, used as given. A hub id not in reach is refused
    before the demo writes anything; it was taken for a folder, and a random tiny model was made (and
    trained) at ./facebook/mms-tts-eng, its card saying "trained from scratch"."""
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf_home"), "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(
        [PYTHON, str(ROOT / "train_vits.py"), "--demo", "--model_name", "facebook/mms-tts-eng"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and proc.stderr.startswith("error: --model_name facebook/mms-tts-eng:"), (
        proc.stderr
    )
    assert not (tmp_path / "facebook").exists() and not (tmp_path / "training").exists()  # nothing written
