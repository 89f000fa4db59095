"""report.html: the page a user opens from disk to judge a run (vits_trainer/training/report.py).

- a fake checkpoint folder: every section, the best evaluation marked, the player limit, relative paths
  that exist, escaped text;
- a real headless Chromium (chromium-headless-shell, skipped with how to install it when absent): the
  page from file:// loads every picture and every recording, and logs nothing to the console;
- a real tiny run stopped by SIGTERM and resumed: the page written mid-run, after the stop and after the
  resume, and the browser check on it.
"""

from __future__ import annotations

import html
import json
import re
import shutil
import signal
import struct
import subprocess
import zlib
from pathlib import Path
from urllib.parse import unquote

import numpy as np
import pytest
import soundfile as sf

from vits_trainer.training.report import REFERENCE_FOLDER, SENTENCES_FILE, STOP_WORDS, write_report

NASTY = '<script>alert("x")</script> & more'
CLIP = "clip #1"  # a space and a '#': the src must be URL-quoted to find the file


def tiny_png(path: Path) -> None:
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", 2, 2, 8, 2, 0, 0, 0)  # 2x2, 8-bit RGB
    pixels = zlib.compress(b"\x00" + b"\xff\x80\x00" * 2 + b"\x00" + b"\x00\x80\xff" * 2)
    path.write_bytes(
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", pixels) + chunk(b"IEND", b"")
    )


def tiny_wav(path: Path) -> None:
    sf.write(path, (0.3 * np.sin(np.arange(1600) / 4)).astype(np.float32), 16000, subtype="PCM_16")


EVAL_STEPS = [0, 2, 4, 6, 8, 10, 12]  # step 2 is the best; 5 newest + the best get players, not step 0


def fake_run(folder: Path, ended: bool = True) -> Path:
    t0 = 1_700_000_000.0
    records = [
        {
            "event": "eval",
            "tag": "start",
            "step": 0,
            "epoch": 0,
            "time": t0 + 8,
            "seconds": 3.0,
            "val_mel": 2.0,
        },
        {
            "event": "session",
            "step": 0,
            "time": t0 + 9,
            "process_start": t0,
            "started": t0 + 4,
            "target_seconds": 120.0,
            "preload_seconds": 1.5,
            "resumed_from": None,
        },
        {
            "event": "micro_batch",
            "step": 2,
            "time": t0 + 20,
            "chosen": 4,
            "trial": [
                {
                    "micro_batch_size": 4,
                    "steps": 2,
                    "measured_steps": 1,
                    "seconds_per_sample": 0.5,
                    "samples_per_second": 2.0,
                    "out_of_memory": False,
                },
                {
                    "micro_batch_size": 8,
                    "steps": 1,
                    "measured_steps": 0,
                    "seconds_per_sample": None,
                    "samples_per_second": None,
                    "out_of_memory": True,
                },
            ],
        },
        {
            "event": "plan",
            "step": 2,
            "time": t0 + 20,
            "optimizer_steps": 14,
            "epochs": 3.0,
            "steps_per_epoch": 5,
            "samples_per_second": 2.0,
            "train_end_wall": t0 + 100,
            "run_end_wall": t0 + 115,
        },
        {  # an epoch's re-plan that moved the steps by more than a quarter (loop.py announces it)
            "event": "replan",
            "step": 5,
            "time": t0 + 47,
            "optimizer_steps": 10,
            "epochs": 1.9,
            "steps_per_epoch": 5,
            "samples_per_second": 1.4,
            "train_end_wall": t0 + 94,
            "run_end_wall": t0 + 109,
        },
        {"event": "threads", "step": 3, "time": t0 + 25, "threads": 1, "others_cpus": 1.2},
        {"event": "skipped", "step": 5, "time": t0 + 30, "clips": [CLIP]},
        {"event": "overflow", "step": 7, "time": t0 + 40, "scale": 1024.0, "clips": [CLIP]},
        {
            "event": "recovery",
            "step": 9,
            "time": t0 + 50,
            "source": "the starting weights",
            "lr_scale": 0.5,
            "precision": "no",
        },
    ]
    for step in range(1, 13):
        records.append(
            {
                "step": step,
                "time": t0 + 10 + 7 * step,
                "mel": 3 - step / 10,
                "loss_g": 50 - step,
                "loss_d": 4.0,
                "lr": 1e-4,
                "samples_per_second": 2.0,
            }
        )
    for step in EVAL_STEPS[1:]:
        records.append(
            {
                "event": "eval",
                "tag": f"epoch {step // 2}",
                "step": step,
                "epoch": step // 2,
                "time": t0 + 12 + 7 * step,
                "seconds": 1.0,
                "val_mel": 1.0 if step == 2 else 1.5,
                "val_mel_dtw": 1.2,
                "val_mcd": 9.0,
                "val_duration_ratio": 0.9,
            }
        )
    if ended:
        records.append(
            {
                "event": "end",
                "step": 12,
                "time": t0 + 110,
                "training_end": t0 + 100,
                "stopped_reason": "budget",
                "final_eval_skipped": None,
                "samples_per_second": 1.5,  # the session's, warm-up steps included
            }
        )
        summary = {
            "steps": 12,
            "stopped_reason": "budget",
            "best_step": 2,
            "wall_seconds": 110,
            "target_seconds": 120,
            "threads": {"torch_threads": 2, "adaptive": True},
            "micro_batch_size": 4,
            "micro_batches_per_step": 2,
            "skipped_steps": 1,
            "hub": {
                "repo": "me/voice",
                "pushed": False,
                "error": "ValueError: Invalid metadata <base_model>",
            },
        }
        (folder / "train_summary.json").write_text(json.dumps(summary))
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records) + '{"half')
    reference = folder / "samples" / REFERENCE_FOLDER
    reference.mkdir(parents=True)
    tiny_wav(reference / f"{CLIP}.wav")
    (reference / SENTENCES_FILE).write_text(json.dumps({CLIP: {"text": NASTY, "speaker": 0}}))
    for step in EVAL_STEPS:
        samples = folder / "samples" / f"step_{step:08d}"
        samples.mkdir()
        tiny_wav(samples / f"{CLIP}.wav")
        tiny_png(samples / f"{CLIP}_alignment.png")
        tiny_png(samples / f"{CLIP}_mel.png")
    return write_report(folder, "python train_vits.py --resume auto --checkpoint_dir 'a b' --target_hours H")


def sources(page: str) -> list[str]:
    return [html.unescape(s) for s in re.findall(r'<(?:img|audio)[^>]* src="([^"]+)"', page)]


def test_report_shows_every_section_marks_the_best_and_escapes(tmp_path):
    page = fake_run(tmp_path).read_text(encoding="utf-8")
    for section in (
        "status",
        "resume",
        "timeline",
        "curves",
        "evaluations",
        "samples",
        "microbatch",
        "stability",
        "threads",
        "events",
    ):
        assert f'<section id="{section}">' in page, section
    assert "ended</span>: the time budget" in page
    assert (
        f"<h1>Training report: {tmp_path.parent.name}/{tmp_path.name}</h1>" in page
    )  # not just "checkpoints"
    assert "--resume auto --checkpoint_dir &#x27;a b&#x27;" in page
    assert page.count("<svg") >= 4 and "planned training end" in page and "deadline" in page
    assert "me/voice: <b>not uploaded</b> (ValueError: Invalid metadata &lt;base_model&gt;)" in page
    # plan against what happened: the session's own samples/s (train_summary.json's), epochs done (in
    # steps of the epoch's: the plan's own epochs are of time); the last re-plan between them
    assert "<th>plan</th><th>re-planned (step 5)</th><th>what happened</th>" in page
    assert "<td>samples per second</td><td>2</td><td>1.4</td><td>1.5</td>" in page
    assert "<td>optimizer steps</td><td>14</td><td>10</td><td>12</td>" in page
    assert "<td>epochs</td><td>3</td><td>1.9</td><td>2.4</td>" in page
    assert "re-planned training end (step 5)" in page
    best_row = re.search(r'<tr class="best"><td>(\d+) <span class="best">best', page)
    assert best_row and best_row.group(1) == "2"
    players = re.findall(r'<h3 id="eval-(\d+)">', page)
    assert players == [
        "12",
        "10",
        "8",
        "6",
        "4",
        "2",
    ]  # newest first, then the best; step 0 in the table only
    assert 'href="samples/step_00000000/"' in page
    assert "<script" not in page and html.escape(NASTY) in page  # the clip text, escaped
    found = sources(page)
    assert any("reference" in s for s in found) and any(s.endswith("_mel.png") for s in found)
    for src in found:
        assert not src.startswith(("/", "file:")) and (tmp_path / unquote(src)).is_file(), src
    assert 'controls preload="none"' in page
    assert "out of memory" in page and "the starting weights" in page  # trial and recovery
    assert not list(tmp_path.glob(".report.html.tmp-*"))


def test_report_of_a_running_run_says_running(tmp_path):
    page = fake_run(tmp_path, ended=False).read_text(encoding="utf-8")
    assert '<span class="running">running</span>' in page and "ended</span>" not in page


# ---- a real browser --------------------------------------------------------------------------------

HARNESS = """<!doctype html><html><head><meta charset="utf-8"></head><body><pre id="verdict">pending</pre>
<script>
// no timers, and the recordings read by a synchronous request: the media pipeline's reads do not hold
// --virtual-time-budget back (the page could be dumped before they end), a request does
function loaded(img) {
  img.loading = "eager";  // a lazy picture below the fold loads too
  if (img.complete) return Promise.resolve(img.naturalWidth > 0 ? "loaded" : "error");  // or broken
  return new Promise(done => { img.onload = () => done("loaded"); img.onerror = () => done("error"); });
}
function playable(audio) {  // the file its src names exists and is a WAV with samples
  const request = new XMLHttpRequest();
  request.open("GET", new URL(audio.getAttribute("src"), audio.baseURI).href, false);
  request.overrideMimeType("text/plain; charset=x-user-defined");
  try { request.send(); } catch (err) { return Promise.resolve("error"); }
  const bytes = request.responseText || "";
  const wav = bytes.slice(0, 4) === "RIFF" && bytes.slice(8, 12) === "WAVE" && bytes.length > 44;
  return Promise.resolve(wav ? "loaded" : "not a WAV (" + bytes.length + " bytes)");
}
const frame = document.createElement("iframe");
frame.addEventListener("load", async () => {
  const doc = frame.contentDocument;
  const images = [...doc.images], audio = [...doc.querySelectorAll("audio")];
  const seen = await Promise.all([...images.map(loaded), ...audio.map(playable)]);
  const describe = (el, k) => ({src: el.getAttribute("src"), ok: seen[k] === "loaded", state: seen[k]});
  document.getElementById("verdict").textContent = JSON.stringify({
    sections: doc.querySelectorAll("section").length,
    images: images.map((el, k) => describe(el, k)),
    audio: audio.map((el, k) => describe(el, images.length + k)),
  });
});
frame.src = "report.html";
document.body.appendChild(frame);
</script></body></html>
"""


def browser() -> str | None:
    return shutil.which("chromium-headless-shell") or shutil.which("chromium")


def browser_verdict(report: Path) -> tuple[dict, list[str]]:
    """Load report.html from file:// in an iframe of a harness page beside it; (what the harness saw,
    the console lines of the report)."""
    harness = report.with_name("harness.html")
    harness.write_text(HARNESS, encoding="utf-8")
    out = subprocess.run(
        [
            browser(),
            "--headless",
            "--disable-gpu",
            "--no-sandbox",
            "--allow-file-access-from-files",
            "--enable-logging=stderr",
            "--v=0",
            "--virtual-time-budget=10000",
            "--dump-dom",
            harness.resolve().as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    harness.unlink()
    verdict = re.search(r'<pre id="verdict">(.*?)</pre>', out.stdout, flags=re.S)
    assert verdict and verdict.group(1) != "pending", (out.stdout[-2000:], out.stderr[-2000:])
    console = [line for line in out.stderr.splitlines() if "CONSOLE" in line]
    return json.loads(html.unescape(verdict.group(1))), console


def assert_loads_in_a_browser(report: Path) -> None:
    result, console = browser_verdict(report)
    assert result["sections"] >= 8, result
    assert result["images"] and all(i["ok"] for i in result["images"]), result["images"]
    assert result["audio"] and all(a["ok"] for a in result["audio"]), result["audio"]
    assert not console, console  # the page writes nothing to the console: no error, no warning


needs_browser = pytest.mark.skipif(
    browser() is None,
    reason="no headless Chromium on PATH: apt-get install chromium-headless-shell (Debian/Ubuntu)",
)


@needs_browser
def test_report_loads_in_a_headless_browser_from_disk(tmp_path):
    assert_loads_in_a_browser(fake_run(tmp_path))


# ---- a real run: stopped by SIGTERM, resumed --------------------------------------------------------


@pytest.fixture(scope="module")
def stopped_and_resumed(tmp_path_factory, tiny_model_dir, tone_corpus):
    """Session 1 gets SIGTERM at its 2nd batch; session 2 resumes it for 1 more step. Keeps the page
    as the start evaluation wrote it (mid-run) and as each session's end wrote it."""

    import vits_trainer.training.loop as loop_module
    import vits_trainer.training.outputs as outputs_module
    from tests.helpers import sigterm_at_batch, train_tiny

    tmp = tmp_path_factory.mktemp("report_run")
    pages = []
    real_write = outputs_module.write_report

    def keep_page(*args, **kwargs):
        path = real_write(*args, **kwargs)
        pages.append(path.read_text(encoding="utf-8"))
        return path

    settings = dict(eval_samples=2, log_every=1, save_minutes=60)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(outputs_module, "write_report", keep_page)
        real_move = sigterm_at_batch(mp, 2)
        _, first = train_tiny(tmp, tone_corpus, tiny_model_dir, max_steps=50, **settings)
        stopped_page = (tmp / "checkpoints" / "report.html").read_text(encoding="utf-8")
        mp.setattr(loop_module, "move_batch", real_move)
        _, second = train_tiny(
            tmp, tone_corpus, tiny_model_dir, max_steps=first["steps"] + 1, resume="auto", **settings
        )
    return tmp / "checkpoints", pages, stopped_page, first, second


@pytest.mark.slow
def test_the_runs_log_is_kept_beside_its_report(stopped_and_resumed):
    """train.log holds each session's lines, set-up first, appended one by one (a closed terminal or a
    lost notebook output keeps them), and the page links it."""
    from vits_trainer.training.runtime import LOG_FILE

    folder = stopped_and_resumed[0]
    text = (folder / LOG_FILE).read_text(encoding="utf-8")
    first, second = re.split(r"^---- .* pid \d+$", text, flags=re.M)[1:]  # one header per session
    assert first.index("device: ") < first.index("SIGTERM received") and "resuming" not in first
    assert "resuming from step_" in second and "eval (final)" in second
    assert f'<a href="{LOG_FILE}">' in (folder / "report.html").read_text(encoding="utf-8")


@pytest.mark.slow
def test_report_of_a_real_run_mid_run_after_a_signal_and_after_resume(stopped_and_resumed):
    folder, pages, stopped_page, first, second = stopped_and_resumed
    assert first["stopped_reason"] == "signal" and second["stopped_reason"] == "max_steps"
    mid_run = pages[0]  # written by the start evaluation, before any step
    assert '<span class="running">running</span>' in mid_run and 'id="eval-0"' in mid_run
    assert f"samples/{REFERENCE_FOLDER}/" in mid_run  # the recordings beside the model's samples
    assert "stopped by a signal" in stopped_page and "--resume auto" in stopped_page
    final = (folder / "report.html").read_text(encoding="utf-8")
    assert "ended</span>: --max_steps reached" in final
    assert (
        "Session 1" in final
        and "Session 2: started" in final
        and f"resumed at step {first['steps']}" in final
    )
    assert f'id="eval-{second["steps"]}"' in final and 'id="eval-0"' in final  # both sessions' evaluations
    assert f"<tr><th>steps</th><td>{second['steps']}</td></tr>" in final
    for src in sources(final):
        assert (folder / unquote(src)).is_file(), src


@pytest.mark.slow
def test_a_run_resumed_from_another_folders_checkpoint_carries_its_history(
    stopped_and_resumed, tmp_path, tiny_model_dir, tone_corpus
):
    # an earlier session's folder attached read-only to a new one (Kaggle): --resume its checkpoint into a
    # new --checkpoint_dir; the report there shows the whole run, and the earlier folder is only read
    from tests.helpers import train_tiny

    folder, _, _, first, _ = stopped_and_resumed
    before = {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()}
    resumed = folder / f"step_{first['steps']:08d}"
    _, third = train_tiny(
        tmp_path,
        tone_corpus,
        tiny_model_dir,
        max_steps=first["steps"] + 1,
        resume=str(resumed),
        eval_samples=2,
        log_every=1,
        save_minutes=60,
    )
    assert third["resumed_from_step"] == first["steps"] and third["stopped_reason"] == "max_steps"
    records = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    carried = [
        json.loads(line) for line in (tmp_path / "checkpoints" / "metrics.jsonl").read_text().splitlines()
    ]
    end = next(i for i, r in enumerate(records) if r.get("event") == "end")  # the first session's end
    assert carried[: end + 1] == records[: end + 1] and carried[end + 1]["event"] == "session"
    assert sum(r.get("event") == "session" for r in carried) == 2
    page = (tmp_path / "checkpoints" / "report.html").read_text(encoding="utf-8")
    assert 'id="eval-0"' in page and "Session 2: started" in page
    for src in sources(page):
        assert (tmp_path / "checkpoints" / unquote(src)).is_file(), src
    assert {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()} == before


@pytest.mark.slow
@needs_browser
def test_report_of_a_real_run_loads_in_a_headless_browser(stopped_and_resumed):
    assert_loads_in_a_browser(stopped_and_resumed[0] / "report.html")


def test_a_long_run_curve_is_averaged_down_keeping_its_ends():
    from vits_trainer.training.report_svg import MAX_POINTS, series

    xs = list(range(40_000))
    s = series("loss", xs, [float(x % 10) for x in xs])
    assert len(s.points) <= MAX_POINTS
    assert s.points[0] == (0.0, 0.0) and s.points[-1] == (39_999.0, 9.0)
    assert all(4.0 <= y <= 5.0 for _, y in s.points[1:-1])  # runs of 67 points average to ~4.5


def test_a_resume_from_another_folder_takes_its_best_model_only_when_it_holds_the_checkpoints_best(tmp_path):
    from vits_trainer.safety import read_marker, write_marker
    from vits_trainer.training.best_model import existing_best_model
    from vits_trainer.training.carry import carry_best_model

    source = tmp_path / "copy" / "checkpoints"
    (source / "best_model").mkdir(parents=True)
    for name in ("config.json", "model.safetensors"):
        (source / "best_model" / name).write_text(name)
    write_marker(source / "best_model", "best_model", source)
    (source / "train_summary.json").write_text(json.dumps({"best_model_step": 12}))
    logs = []
    carry_best_model(source, tmp_path / "a", 9, logs.append)  # resumed from before that best: another model
    carry_best_model(source, tmp_path / "b", 12, logs.append)
    assert not (tmp_path / "a" / "best_model").exists()
    assert existing_best_model(tmp_path / "b", 12) == (tmp_path / "b" / "best_model", 12)
    assert (tmp_path / "b" / "best_model" / "model.safetensors").read_text() == "model.safetensors"
    assert read_marker(tmp_path / "b" / "best_model")["checkpoint_dir"] == str((tmp_path / "b").resolve())
    assert logs == [f"history: best_model (step 12) carried over from {source / 'best_model'}"]
    (tmp_path / "c" / "best_model").mkdir(parents=True)  # one already there is never replaced
    carry_best_model(source, tmp_path / "c", 12, logs.append)
    assert list((tmp_path / "c" / "best_model").iterdir()) == [] and len(logs) == 1


def test_best_model_is_labelled_by_its_own_step_and_carried_by_it_without_a_summary(tmp_path):
    """The marker's step is what best_model/ holds, whatever a checkpoint recorded: a copy that failed
    after the final checkpoint named it, or an export after the last checkpoint of a killed session."""
    from vits_trainer.safety import read_marker, write_marker
    from vits_trainer.training.best_model import existing_best_model
    from vits_trainer.training.carry import carry_best_model

    source = tmp_path / "copy" / "checkpoints"
    (source / "best_model").mkdir(parents=True)
    for name in ("config.json", "model.safetensors"):
        (source / "best_model" / name).write_text(name)
    write_marker(source / "best_model", "best_model", source, step=7)
    assert existing_best_model(source, 12) == (source / "best_model", 7)  # the checkpoint said 12
    assert existing_best_model(source, None) is None  # this run never exported one: an older run's
    logs = []
    carry_best_model(source, tmp_path / "a", 12, logs.append)  # holds step 7, not the checkpoint's best
    carry_best_model(source, tmp_path / "b", 7, logs.append)  # no train_summary.json: a killed session
    assert not (tmp_path / "a" / "best_model").exists()
    assert read_marker(tmp_path / "b" / "best_model")["step"] == 7
    assert logs == [f"history: best_model (step 7) carried over from {source / 'best_model'}"]


def test_after_going_back_to_an_older_checkpoint_the_report_shows_the_weights_history(tmp_path):
    """A session resumed from step 4 continues that checkpoint's weights: what the first session
    recorded after step 4 (another future, or steps trained past the last checkpoint before a kill) is
    left out of the page and the loss curve; both sessions' time stays in the timeline."""
    from vits_trainer.safety import write_marker
    from vits_trainer.training.report import current_history, read_run

    t0 = 1_700_000_000.0
    start = {"event": "session", "process_start": t0, "started": t0 + 1, "target_seconds": 60.0}
    first = [{**start, "step": 0, "time": t0, "resumed_from": None}]
    first += [{"step": s, "time": t0 + s, "mel": 3.0 - s / 10, "loss_g": 9.0} for s in (2, 4, 6, 8)]
    first += [{"event": "eval", "step": s, "time": t0 + s, "val_mel": v} for s, v in ((4, 2.0), (8, 0.5))]
    first += [{"event": "end", "step": 8, "time": t0 + 9, "stopped_reason": "budget"}]
    resumed = {"process_start": t0 + 19, "started": t0 + 20, "resumed_from": "checkpoints/step_00000004"}
    second = [{**start, **resumed, "step": 4, "time": t0 + 20}]
    second += [{"step": 6, "time": t0 + 26, "mel": 2.5, "loss_g": 8.0}]
    second += [{"event": "eval", "step": 6, "time": t0 + 26, "val_mel": 1.5}]
    second += [{"event": "end", "step": 6, "time": t0 + 27, "stopped_reason": "max_steps"}]
    kept = current_history(first + second)
    assert [(r.get("event"), r["step"]) for r in kept] == [
        ("session", 0),
        (None, 2),
        (None, 4),
        ("eval", 4),
        ("end", 8),
        ("session", 4),
        (None, 6),
        ("eval", 6),
        ("end", 6),
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in first + second))
    assert read_run(tmp_path).records == kept
    page = write_report(tmp_path).read_text(encoding="utf-8")
    assert "<th>steps</th><td>6</td>" in page and '<a href="#eval-6">step 6</a>' in page
    assert "<h3>Session 2: started" in page and ", resumed at step 4" in page
    assert 'id="eval-8"' not in page and "0.5" not in re.search(
        r'<section id="evaluations">.*?</section>', page, re.S
    ).group(0)
    # best_model/ kept the left future's best (it scored better): its evaluation stays on the page
    best = tmp_path / "best_model"
    best.mkdir()
    (best / "config.json").write_text("{}", encoding="utf-8")
    write_marker(best, "best_model", tmp_path, 8)
    page = write_report(tmp_path).read_text(encoding="utf-8")
    assert '<a href="#eval-8">step 8</a> (val_mel 0.5)' in page and "<th>steps</th><td>6</td>" in page


def test_while_a_resumed_session_runs_the_best_is_the_best_model_folders(tmp_path):
    """The last session's train_summary.json names its best step; a resumed session that has since
    exported a better best_model/ (its marker names the step) is what the page marks as best while it
    runs, and after a kill (the summary is not rewritten then)."""
    from vits_trainer.safety import write_marker

    fake_run(tmp_path)  # ended: best step 2 (val_mel 1.0) by its summary
    t0 = 1_800_000_000.0
    resumed = {"event": "session", "step": 12, "time": t0, "process_start": t0, "started": t0 + 1}
    resumed.update(target_seconds=60.0, resumed_from="step_00000012")
    better = {"event": "eval", "step": 14, "epoch": 4, "time": t0 + 5, "seconds": 1.0, "val_mel": 0.5}
    with (tmp_path / "metrics.jsonl").open("a", encoding="utf-8") as f:
        f.write("\n" + json.dumps(resumed) + "\n" + json.dumps(better) + "\n")
    best = tmp_path / "best_model"
    best.mkdir()
    (best / "config.json").write_text("{}", encoding="utf-8")
    write_marker(best, "best_model", tmp_path, 14)
    page = write_report(tmp_path).read_text(encoding="utf-8")
    assert '<span class="running">running</span>' in page
    assert '<a href="#eval-14">step 14</a>' in page
    best_row = re.search(r'<tr class="best"><td>(\d+) <span class="best">best', page)
    assert best_row and best_row.group(1) == "14"


def test_a_session_past_its_deadline_keeps_its_stop_on_the_timeline():
    """A 14.4 s budget that ended at 14.9 s: the axis ended at the deadline (+2 %), so the stop mark was
    left off and the last bar ran past the chart's edge."""
    from vits_trainer.training.report_svg import Timeline, timeline_svg

    tl = Timeline("session 1", 14.4, phases=[(0.0, 3.0, "load", "loading"), (3.0, 14.9, "train", "training")])
    tl.instants += [(14.4, "deadline", "deadline"), (14.9, "stopped: budget", "stop")]
    svg = timeline_svg(tl, width=900)
    assert "stopped: budget" in svg
    ends = [float(a) + float(b) for a, b in re.findall(r'<rect[^>]* x="([\d.]+)"[^>]* width="([\d.]+)"', svg)]
    assert ends and max(ends) <= 900


def test_a_feedback_rounds_best_is_judged_on_its_feedback_set():
    """A feedback round picks its best by feedback_val_mel, its first validation set; its evaluations
    also hold the original set's plain val_mel, which the page took instead (step 5 marked best for an
    original set's 0.45, while the round's own best was the start)."""
    from vits_trainer.training.report import best_eval, metric_of

    start = {
        "event": "eval",
        "step": 0,
        "best_key": "feedback_val_mel",
        "feedback_val_mel": 1.0,
        "val_mel": 0.5,
    }
    later = {
        "event": "eval",
        "step": 5,
        "best_key": "feedback_val_mel",
        "feedback_val_mel": 1.1,
        "val_mel": 0.45,
    }
    assert metric_of(later, "val_mel") == 1.1
    assert best_eval([start, later], "val_mel", None)["step"] == 0
    old = {"event": "eval", "step": 3, "val_mel": 0.7}  # a record from before best_key: as it was read
    assert metric_of(old, "val_mel") == 0.7
    # the curves follow the same set: its free-running scores exist for it alone (feedback_val_mcd)
    from vits_trainer.training.report import primary

    scored = {**later, "feedback_val_mcd": 9.0}
    assert primary(scored, "val_mcd") == 9.0 and primary(scored, "val_mel") == 1.1
    assert primary(old, "val_mel") == 0.7


def test_a_multi_speaker_runs_samples_name_their_speaker(tmp_path):
    """Each sample's row says whose voice it is (the model card did; the report did not)."""
    from vits_trainer.training.report import read_run, sample_table, write_references

    class Items:  # the two validation clips write_references reads
        sample_rate, speaker_ids = 16000, np.array([1, 0])

        def __len__(self):
            return 2

        def clip_id(self, k):
            return f"c{k}"

        def text(self, k):
            return f"sentence {k}"

        def audio(self, k):
            return np.zeros(160, dtype=np.float32)

    write_references(tmp_path / "samples", Items(), 2, {"alice": 0, "bob": 1})
    step = tmp_path / "samples" / "step_00000004"
    step.mkdir()
    for k in range(2):
        tiny_wav(step / f"c{k}.wav")
    table = sample_table(read_run(tmp_path), step)
    assert '<b>c0</b> (speaker bob, speaker_id 1)<br><span class="said" dir="auto">sentence 0</span>' in table
    assert (
        '<b>c1</b> (speaker alice, speaker_id 0)<br><span class="said" dir="auto">sentence 1</span>' in table
    )
    write_references(tmp_path / "single" / "samples", Items(), 2)  # a single-speaker run: no names
    assert (
        "speaker_name"
        not in (tmp_path / "single" / "samples" / REFERENCE_FOLDER / SENTENCES_FILE).read_text()
    )


def test_every_reason_a_run_may_stop_for_has_its_words_in_the_report():
    """The loop's stop reasons and the report's words for them are two lists: a reason added to one and
    not the other would print its raw key on the page."""
    from vits_trainer.training.loop import STOP_REASONS

    assert set(STOP_WORDS) == {*STOP_REASONS[1:], "end"} and STOP_REASONS[0] is None


def test_a_constant_learning_rate_averaged_down_still_draws_its_chart():
    """A constant LR (--min_lr_ratio 1 --warmup_steps 0) over 3,601 log lines: averaging it down leaves
    values one rounding error apart, whose tick step was below their float resolution, and the tick loop
    never ended: the run hung in write_report at its next evaluation."""
    from vits_trainer.training.report_svg import line_chart, series

    def hung(*_):
        raise TimeoutError("the chart's ticks never ended")

    lr = series("learning rate", list(range(3601)), [1e-4] * 3601)
    assert len({y for _, y in lr.points}) > 1  # the averaging's rounding, as in a real run
    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(5)
    try:
        svg = line_chart("learning rate", [lr], "lr")
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    assert ">0.0001<" in svg  # the value is on the axis


def test_a_short_runs_step_axis_has_whole_steps_from_zero():
    """A run stopped before its first step has one evaluation, at step 0: its axis read -1, -0.5, 0, 0.5,
    1; a 3-step run's had a step 1.5."""
    from vits_trainer.training.report_svg import line_chart, series

    def step_ticks(xs):
        svg = line_chart("mel", [series("val", xs, [1.0] * len(xs), markers=True)], "mel")
        return re.findall(r'<text class="tick" x="[\d.]+" y="239"[^>]*>([^<]*)<', svg)

    assert step_ticks([0]) == ["0", "1"]
    assert step_ticks([1, 2, 3]) == ["1", "2", "3"]
    assert step_ticks([0, 84]) == ["0", "20", "40", "60", "80"]


def test_a_killed_sessions_steps_are_those_the_next_session_resumed_from(tmp_path):
    """Killed at step 40 after a checkpoint at 36, resumed from it: its step lines past 36 are off the
    page, and 'what happened' read 35 steps (its last log line left), neither trained nor kept."""
    from vits_trainer.training.report import read_run, timeline_section

    t0 = 1_700_000_000.0
    records = [{"event": "session", "step": 0, "time": t0 + 5, "process_start": t0, "started": t0 + 2}]
    records += [{"step": k, "time": t0 + 5 + k, "mel": 1.0} for k in range(5, 45, 5)]
    records.append({"event": "session", "step": 36, "time": t0 + 105, "process_start": t0 + 100})
    records[-1].update(started=t0 + 102, resumed_from="step_00000036")
    records += [{"step": 40, "time": t0 + 110, "mel": 1.0}, {"event": "end", "step": 40, "time": t0 + 120}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    page = timeline_section(read_run(tmp_path))
    killed = page.split("Session 2")[0]
    assert "<td>optimizer steps</td><td>–</td><td>36</td>" in killed


def test_the_timeline_accounts_for_the_set_up_between_loading_and_training(tmp_path):
    """Between the loop's start and training, the evaluation libraries' first calls (11 s of the first
    2-minute demo) were in no bar: the timeline showed that time as spent on nothing."""
    from vits_trainer.training.report import read_run, sitting_timeline

    t0 = 1_700_000_000.0
    records = [
        {"event": "eval", "tag": "start", "step": 0, "time": t0 + 24, "seconds": 5.0, "val_mel": 4.0},
        {"event": "session", "step": 0, "time": t0 + 25, "process_start": t0, "started": t0 + 8},
        {"step": 5, "time": t0 + 40, "mel": 1.0},
        {"event": "end", "step": 5, "time": t0 + 50, "training_end": t0 + 45},
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    timeline, _ = sitting_timeline(read_run(tmp_path).sittings()[0], 1, ended=True)
    bars = sorted((start, end) for start, end, kind, _ in timeline.phases if kind != "eval")
    reached = 0.0
    for start, end in bars:  # loading, set-up, training, the end: one after the other, no gap
        assert start == pytest.approx(reached)
        reached = end
    assert reached == pytest.approx(50.0)


def test_a_killed_session_gone_back_past_keeps_no_steps_not_a_negative_count(tmp_path):
    """Session 2 (resumed at 100) killed at 130; session 3 went back to step 50 (--resume step_00000050):
    none of session 2's steps were kept, and its budget table read -50 optimizer steps."""
    from vits_trainer.training.report import read_run, timeline_section

    t0 = 1_700_000_000.0
    records = [{"event": "session", "step": 0, "time": t0 + 5, "process_start": t0, "started": t0 + 2}]
    records += [{"step": k, "time": t0 + 5 + k, "mel": 1.0} for k in range(10, 110, 10)]
    records.append({"event": "end", "step": 100, "time": t0 + 120})
    for at, when in ((100, 200), (50, 300)):
        records.append({"event": "session", "step": at, "time": t0 + when + 5, "process_start": t0 + when})
        records[-1].update(started=t0 + when + 2, resumed_from=f"step_{at:08d}")
        if at == 100:  # killed: no end record
            records += [{"step": k, "time": t0 + 105 + k, "mel": 1.0} for k in range(110, 140, 10)]
    records += [{"step": 60, "time": t0 + 310, "mel": 1.0}, {"event": "end", "step": 60, "time": t0 + 320}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    page = timeline_section(read_run(tmp_path))
    killed = page.split("Session 2")[1].split("Session 3")[0]
    assert "<td>optimizer steps</td><td>–</td><td>0</td>" in killed


def test_a_start_evaluation_that_stays_best_is_named_as_the_starting_weights(tmp_path):
    # the base model often speaks best at first by val_mel_dtw: "best evaluation: step 0" beside
    # "best model: –" left the reader to guess that step 0 is the untouched model and was never exported
    t0 = 1_700_000_000.0
    evals = [(0, "start", 1.0), (4, "epoch 1", 1.5), (8, "final", 1.4)]
    records = [
        {
            "event": "eval",
            "tag": tag,
            "step": step,
            "epoch": 0,
            "time": t0 + step,
            "val_mel": 2.0,
            "val_mel_dtw": dtw,
        }
        for step, tag, dtw in evals
    ]
    records.append({"event": "end", "step": 8, "time": t0 + 20, "stopped_reason": "budget"})
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    summary = {"steps": 8, "stopped_reason": "budget", "best_step": 0, "best_model": None}
    (tmp_path / "train_summary.json").write_text(json.dumps(summary))
    page = write_report(tmp_path, None, "val_mel_dtw").read_text(encoding="utf-8")
    status = page[page.index('<section id="status">') : page.index("</section>")]
    assert "the weights the run started from" in status and "no trained weights scored better" in status
    # a trained best says nothing of the kind
    records[0]["val_mel_dtw"] = 3.0
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (tmp_path / "train_summary.json").write_text(json.dumps({**summary, "best_step": 8}))
    page = write_report(tmp_path, None, "val_mel_dtw").read_text(encoding="utf-8")
    assert "started from" not in page[page.index('<section id="status">') : page.index("</section>")]


def _y_ticks(svg: str) -> list[float]:
    return [float(t.replace(",", "")) for t in re.findall(r'<text class="tick" x="56"[^>]*>([^<]*)<', svg)]


def test_a_curve_that_starts_far_above_the_rest_is_cut_so_the_rest_shows():
    """val_mel 4.2 at step 0 and 1.08-1.2 after: the axis went to 4.5 and a resumed session's progress
    was a flat line at its bottom. The axis now fits what comes after the start, and says what it cut."""
    from vits_trainer.training.report_svg import line_chart, series

    xs = [0, 19, 57, 95, 190, 300, 400, 500, 600, 690]
    ys = [4.21, 2.25, 1.43, 1.29, 1.18, 1.15, 1.14, 1.11, 1.09, 1.10]
    svg = line_chart("mel", [series("validation mel L1", xs, ys, markers=True)], "mel")
    assert max(_y_ticks(svg)) < 2.0, _y_ticks(svg)
    assert "cut" in svg and "4.21" in svg  # the page says the axis is cut, and the value is hoverable
    # a curve without such a start keeps its whole range, and says nothing of cutting
    flat = line_chart(
        "mel", [series("val", xs, [1.4, 1.3, 1.25, 1.2, 1.18, 1.15, 1.14, 1.11, 1.09, 1.1])], "mel"
    )
    assert max(_y_ticks(flat)) >= 1.4 and "cut" not in flat
    # a rise late in the run is not cut: it is what the curve is for
    late = line_chart("lr", [series("lr", xs, [0.1, 1, 1, 0.9, 0.5, 0.2, 4.0, 3.0, 2.0, 1.0])], "lr")
    assert max(_y_ticks(late)) >= 4.0 and "cut" not in late


def test_the_best_evaluation_is_the_best_model_folders_else_the_first_lowest_finite_one():
    from vits_trainer.training.report import best_eval

    evals = [
        {"step": 0, "val_mel": float("nan")},  # a diverged evaluation is never the best
        {"step": 10, "val_mel": 3.0},
        {"step": 20, "val_mel": 2.0},
        {"step": 30, "val_mel": 2.0},  # a tie: the run keeps the first (strictly lower wins)
        {"step": 40, "val_mel": 2.5},
    ]
    assert best_eval(evals, "val_mel", None)["step"] == 20
    # the weights best_model/ holds win over the summary's best_step (a resume went back past it)
    assert best_eval(evals, "val_mel", {"best_step": 30}, best_model_step=10)["step"] == 10
    assert best_eval(evals, "val_mel", {"best_step": 30})["step"] == 30
    assert best_eval(evals, "val_mel", {"best_step": 99}, best_model_step=98)["step"] == 20  # neither found


def test_a_true_or_false_score_is_no_metric_as_it_is_no_point_of_a_chart():
    # metric_of took `true` for 1.0 where the charts' is_finite_number skips it: best at step 5
    from vits_trainer.training.report import best_eval, metric_of

    evals = [{"step": 5, "val_mel": True}, {"step": 10, "val_mel": 2.0}]
    assert metric_of(evals[0], "val_mel") is None and metric_of(evals[1], "val_mel") == 2.0
    assert best_eval(evals, "val_mel", None)["step"] == 10


def test_durations_read_hours_minutes_seconds():
    from vits_trainer.training.report import _duration

    assert [_duration(s) for s in (None, 0, 59.6, 125, 3725, 36000)] == [
        "–",
        "0:00",
        "1:00",
        "2:05",
        "1:02:05",
        "10:00:00",
    ]


def test_the_final_model_is_a_link_and_the_wait_policy_is_in_words(tmp_path, monkeypatch):
    # the final model's path was plain text beside the files' links, and the Threads table read
    # "omp_wait_policy –" where the log said "OpenMP wait policy spin 10000 then sleep"
    run = tmp_path / "run" / "checkpoints"
    run.mkdir(parents=True)
    fake_run(run)
    (tmp_path / "run" / "final_model").mkdir()
    summary = json.loads((run / "train_summary.json").read_text())
    summary["final_model"] = "run/final_model"  # as given on the command line: relative to its folder
    summary["threads"] = {"torch_threads": 2, "omp_wait_policy": None, "gomp_spincount": "10000"}
    (run / "train_summary.json").write_text(json.dumps(summary))
    monkeypatch.chdir(tmp_path)
    page = write_report(run, "python train_vits.py").read_text(encoding="utf-8")
    assert '<th>final model</th><td><a href="../final_model/">run/final_model</a>' in page
    assert "<th>omp_wait_policy</th><td>unset: spin 10000 then sleep</td>" in page


def test_a_gpu_runs_report_says_whether_the_gpu_or_the_host_limited_its_steps(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    fake_run(run)
    summary = json.loads((run / "train_summary.json").read_text())
    page = write_report(run, "python train_vits.py").read_text(encoding="utf-8")
    assert "the host waited for the GPU" not in page  # a CPU run's summary has no GPU figure
    for wait, limit in (
        (0.72, ": the GPU's own work limited the steps)"),
        (0.03, ": the host's kernel launches limited the steps, and the GPU waited for them)"),
        (0.3, " of the steps' time)"),  # both in turn: no verdict
    ):
        summary["device_wait_fraction"] = wait
        (run / "train_summary.json").write_text(json.dumps(summary))
        page = write_report(run, "python train_vits.py").read_text(encoding="utf-8")
        assert f"the host waited for the GPU's work {100 * wait:.0f} % of the steps' time" in page
        assert limit in page


def write_voice_evals(folder: Path, second: str) -> list[dict]:
    """Three evaluations of a three-voice run into `folder`'s metrics.jsonl: ali (2 clips), `second`
    (1 clip) and rojda (no clip, so no score); the records written."""

    def voices(ali: float, other: float) -> dict:
        return {
            "ali": {"speaker_id": 0, "clips": 2, "val_mel": ali},
            second: {"speaker_id": 1, "clips": 1, "val_mel": other},
            "rojda": {"speaker_id": 2, "clips": 0},
        }

    records = [
        {"event": "eval", "tag": "start", "step": 0, "val_mel": 4.0, "by_speaker": voices(4.1, 3.8)},
        {"event": "eval", "tag": "epoch 1", "step": 10, "val_mel": 1.5, "by_speaker": voices(1.25, 2.0)},
        {"event": "eval", "tag": "final", "step": 20, "val_mel": 1.6, "by_speaker": voices(1.3, 2.2)},
    ]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return records


def test_a_multi_speaker_runs_report_scores_each_voice_and_says_which_are_heard(tmp_path):
    """A mean over every voice hides one that lags: the page gives each voice's val_mel at the start,
    best and newest evaluations, and says which voices the samples let you hear."""

    records = write_voice_evals(tmp_path, "zin")
    reference = tmp_path / "samples" / REFERENCE_FOLDER
    reference.mkdir(parents=True)
    sentences = {"a1": {"text": "silav", "speaker": 0, "speaker_name": "ali"}}
    (reference / SENTENCES_FILE).write_text(json.dumps(sentences))
    page = write_report(tmp_path, None, "val_mel").read_text(encoding="utf-8")
    section = page[page.index('<section id="speakers">') :]
    section = section[: section.index("</section>")]
    header = re.findall(r"<th>(.*?)</th>", section)
    assert header == [
        "speaker",
        "speaker_id",
        "validation clips",
        "val_mel, start (step 0)",
        "val_mel, best (step 10)",
        "val_mel, newest (step 20)",
        "in the samples",
    ]
    rows = [re.findall(r"<td>(.*?)</td>", row) for row in re.findall(r"<tr>(.*?)</tr>", section)[1:]]
    assert rows == [
        ["ali", "0", "2", "4.1", "1.25", "1.3", "a1"],
        ["zin", "1", "1", "3.8", "2", "2.2", "none"],
        ["rojda", "2", "0", "–", "–", "–", "none"],
    ]
    # a feedback round scores the voices on its feedback clips: named so, not as the original validation's
    fb = tmp_path / "feedback"
    fb.mkdir()
    renamed = [{("feedback_" + k if k == "by_speaker" else k): v for k, v in r.items()} for r in records]
    (fb / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in renamed))
    page = write_report(fb, None, "val_mel").read_text(encoding="utf-8")
    assert "<th>feedback_val_mel, start (step 0)</th>" in page and "<th>val_mel, start" not in page
    # a single-voice run's evaluations have no scores by voice, and its page no such section
    single = tmp_path / "single"
    single.mkdir()
    plain = [{k: v for k, v in r.items() if k != "by_speaker"} for r in records]
    (single / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in plain))
    assert 'id="speakers"' not in write_report(single, None, "val_mel").read_text(encoding="utf-8")


def _voice_chart(page: str) -> str:
    section = page[page.index('<section id="speakers">') :]
    section = section[: section.index("</section>")]
    charts = re.findall(r'<svg class="chart".*?</svg>', section)
    assert len(charts) == 1, charts
    return charts[0]


def test_a_multi_speaker_runs_report_draws_each_voices_val_mel_over_the_steps(tmp_path):
    """A voice that lags or gets worse shows as a line of its own, named in the legend; a voice with no
    validation clip has no line (nothing measured it); a single-voice run's page has no such chart."""

    records = write_voice_evals(tmp_path, "zin <b>")
    svg = _voice_chart(write_report(tmp_path, None, "val_mel").read_text(encoding="utf-8"))
    assert svg.count("<polyline") == 2
    legend = re.findall(r"<tspan>([^<]+)</tspan>", svg)
    assert [name for name in legend if name.strip()] == ["ali", "zin &lt;b&gt;"]
    # each point names its voice, step and value
    assert "<title>zin &lt;b&gt;: step 20, 2.2</title>" in svg and "<title>ali: step 10, 1.25</title>" in svg
    assert "rojda" not in svg
    # a single-voice run: no chart by voice, the curves as before
    single = tmp_path / "single"
    single.mkdir()
    plain = [{k: v for k, v in r.items() if k != "by_speaker"} for r in records]
    (single / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in plain))
    page = write_report(single, None, "val_mel").read_text(encoding="utf-8")
    assert "by voice" not in page


def test_with_many_voices_the_chart_draws_the_worst_and_the_best_and_counts_the_rest(tmp_path):
    """Twelve lines cannot be told apart: the chart draws the voices that score worst at the newest
    evaluation and the best one for comparison, eight in all, and says how many more the table holds."""
    names = [f"voice{k:02d}" for k in range(12)]
    records = []
    for step in (0, 10, 20):
        scores = {
            n: {"speaker_id": k, "clips": 1, "val_mel": 1.0 + k / 10 + step / 100}
            for k, n in enumerate(names)
        }
        records.append({"event": "eval", "tag": "x", "step": step, "val_mel": 1.5, "by_speaker": scores})
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    page = write_report(tmp_path, None, "val_mel").read_text(encoding="utf-8")
    svg = _voice_chart(page)
    assert svg.count("<polyline") == 8
    legend = [n for n in re.findall(r"<tspan>([^<]+)</tspan>", svg) if n.strip()]
    # worst first (voice11 scores highest), then the best (voice00)
    assert legend == [f"voice{k:02d}" for k in (11, 10, 9, 8, 7, 6, 5, 0)]
    assert "4 more voices in the table below" in page


def test_a_legend_too_long_for_one_row_wraps_and_the_plot_starts_below_it():
    """Eight voice names ran off the chart's right edge in one row of text."""
    from vits_trainer.training.report_svg import line_chart, series

    names = [f"a rather long speaker name {k}" for k in range(8)]
    svg = line_chart("by voice", [series(n, [0, 10], [1.0, 2.0]) for n in names], "mel")
    rows = re.findall(r'<text class="legend" x="60" y="(\d+)">(.*?)</text>', svg)
    assert len(rows) > 1 and [int(y) for y, _ in rows] == [14 + 14 * k for k in range(len(rows))]
    for _, row in rows:  # about 6.5 px a character: each row fits the 720 px chart
        text = "".join(re.findall(r"<tspan[^>]*>([^<]*)</tspan>", row)).replace("&#9632;", "#")
        assert 60 + 6.5 * len(text.rstrip()) <= 720, text
    assert sum(row.count("speaker name") for _, row in rows) == 8
    # the plot area is as tall as a one-row chart's: the chart grows by the extra rows
    assert f'viewBox="0 0 720 {260 + 14 * (len(rows) - 1)}"' in svg


def test_the_speakers_section_says_the_mean_above_weighs_each_voice_by_its_clips(tmp_path):
    """val_mel is the mean over clips: ali's 3 clips at 1.0 and zin's 1 at 3.0 give 1.5, not the 2.0 of a
    mean over voices. The page said the evaluations "average over every voice"."""
    voices = {
        "ali": {"speaker_id": 0, "clips": 3, "val_mel": 1.0},
        "zin": {"speaker_id": 1, "clips": 1, "val_mel": 3.0},
    }
    record = {"event": "eval", "tag": "start", "step": 0, "val_mel": 1.5, "by_speaker": voices}
    (tmp_path / "metrics.jsonl").write_text(json.dumps(record) + "\n")
    page = write_report(tmp_path, None, "val_mel").read_text(encoding="utf-8")
    section = html.unescape(re.sub(r"<[^>]+>", "", page[page.index('<section id="speakers">') :]))
    assert "average over every voice" not in section
    assert "the mean over every clip: a voice counts as much as its clips do" in section


def _along_the_run_rows(page: str) -> list[str]:
    """The row labels of "listen along the run", top down."""
    section = re.search(r'<section id="along-the-run">(.*?)</section>', page, re.S)
    assert section, "no along-the-run section"
    return [
        re.sub(r"<[^>]+>", "", label).strip() for label in re.findall(r"<tr[^>]*><td>(.*?)</td>", section[1])
    ]


def test_listen_along_the_run_plays_each_sentence_at_every_evaluation_oldest_first(tmp_path):
    page = fake_run(tmp_path).read_text(encoding="utf-8")
    labels = ["start" if s == 0 else f"epoch {s // 2}" for s in EVAL_STEPS]
    expected = [
        f"step {s} ({label})" + (" best" if s == 2 else "")
        for s, label in zip(EVAL_STEPS, labels, strict=True)
    ]
    assert _along_the_run_rows(page) == ["recording"] + expected  # oldest first, the best marked
    section = re.search(r'<section id="along-the-run">(.*?)</section>', page, re.S)[1]
    assert "every evaluation with samples" in section
    assert '<tr class="best"><td>step 2 (epoch 1) <span class="best">best</span>' in section
    played = [unquote(html.unescape(s)) for s in re.findall(r'<audio[^>]* src="([^"]+)"', section)]
    assert played == [f"samples/{REFERENCE_FOLDER}/{CLIP}.wav"] + [
        f"samples/step_{s:08d}/{CLIP}.wav" for s in EVAL_STEPS
    ]
    assert "<script" not in section and html.escape(NASTY) in section


def test_listen_along_a_long_run_plays_the_first_newest_best_and_evaluations_spread_between(tmp_path):
    from vits_trainer.training.report import ALONG_THE_RUN, along_the_run_steps, read_run

    folder = tmp_path
    steps = list(range(0, 200, 10))  # 20 evaluations, each with its samples; the best at step 30
    for step in steps:
        (folder / "samples" / f"step_{step:08d}").mkdir(parents=True)
    evals = [
        {"event": "eval", "step": s, "tag": "start" if s == 0 else "epoch", "val_mel": 1.0} for s in steps
    ]
    chosen, with_samples = along_the_run_steps(read_run(folder), evals, {"step": 30})
    assert with_samples == 20 and len(chosen) == ALONG_THE_RUN == 8
    assert chosen == sorted(chosen) and {0, 30, 190} <= set(chosen)
    gaps = [b - a for a, b in zip(chosen, chosen[1:], strict=False)]
    assert max(gaps) <= 50  # spread over the run, not bunched at one end
    # an evaluation without samples is never a row; one evaluation alone makes no section
    (folder / "samples" / "step_00000190").rmdir()
    chosen, with_samples = along_the_run_steps(read_run(folder), evals, {"step": 30})
    assert 190 not in chosen and 180 in chosen and with_samples == 19
    assert along_the_run_steps(read_run(folder), evals[:1], None) == ([0], 1)


def test_report_zip_holds_the_page_and_every_file_it_plays_shows_and_links(tmp_path):
    """Kaggle's and Colab's file browsers download a folder file by file: report.zip is the page with
    its files in one, and the page opened from the unpacked archive finds every one of them."""
    import zipfile

    from vits_trainer.training.report import ARCHIVE_FILE, write_report_archive

    folder = tmp_path / "run" / "checkpoints"
    folder.mkdir(parents=True)
    page = fake_run(folder).read_text(encoding="utf-8")
    (folder / "step_00000099").mkdir()  # a checkpoint: the page does not refer to it
    (folder / "step_00000099" / "model.safetensors").write_bytes(b"weights")
    archive = write_report_archive(folder)
    assert archive == folder / ARCHIVE_FILE and not list(folder.glob(f".{ARCHIVE_FILE}.tmp-*"))
    unpacked = tmp_path / "unpacked"
    with zipfile.ZipFile(archive) as z:
        names = z.namelist()
        z.extractall(unpacked)
    assert all(name.startswith("run-checkpoints/") for name in names), names
    copy = unpacked / "run-checkpoints"
    assert (copy / "report.html").read_text(encoding="utf-8") == page
    played = sources(page)  # every audio and picture the page shows, a clip name with '#' and ' ' too
    assert played and any(CLIP in unquote(src) for src in played)
    for src in played:
        assert (copy / unquote(src)).read_bytes() == (folder / unquote(src)).read_bytes(), src
    assert (copy / "metrics.jsonl").is_file() and (copy / "train_summary.json").is_file()  # linked files
    assert not any("step_00000099" in name for name in names)  # nothing the page does not refer to
    assert len(names) == len(set(names))


def test_report_zip_takes_a_file_dated_before_1980(tmp_path):
    # zipfile refuses such a date ("ZIP does not support timestamps before 1980"): one sample carried over
    # with copy2 from a folder unpacked without dates cost the whole archive
    import os
    import zipfile

    from vits_trainer.training.report import write_report_archive

    folder = tmp_path / "checkpoints"
    wav = folder / "samples" / "step_00000010" / "a.wav"
    wav.parent.mkdir(parents=True)
    tiny_wav(wav)
    os.utime(wav, (0, 0))
    (folder / "report.html").write_text('<audio src="samples/step_00000010/a.wav"></audio>', encoding="utf-8")
    with zipfile.ZipFile(write_report_archive(folder)) as z:
        assert z.read(f"{tmp_path.name}-checkpoints/samples/step_00000010/a.wav") == wav.read_bytes()


def test_a_feedback_rounds_best_is_named_by_the_score_it_was_picked_by(tmp_path):
    """A feedback round's best is its feedback set's val_mel: the status said "val_mel 1.613" beside an
    evaluations table whose val_mel column (the original set's) read 1.331 at that step."""
    t0 = 1_700_000_000.0
    records = [
        {
            "event": "eval",
            "tag": tag,
            "step": step,
            "epoch": 0,
            "time": t0 + step,
            "best_key": "feedback_val_mel",
            "feedback_val_mel": fb,
            "val_mel": orig,
        }
        for step, tag, fb, orig in [(0, "start", 1.791, 1.483), (8, "final", 1.613, 1.331)]
    ]
    records.append({"event": "end", "step": 8, "time": t0 + 20, "stopped_reason": "budget"})
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    page = write_report(tmp_path, None, "val_mel").read_text(encoding="utf-8")
    status = page[page.index('<section id="status">') : page.index("</section>")]
    assert "(feedback_val_mel 1.613)" in status and "(val_mel 1.613)" not in status
    evaluations = page[page.index('<section id="evaluations">') :]
    assert "the lowest <code>feedback_val_mel</code>" in evaluations[: evaluations.index("</p>")]
    # a plain run's status names its own score
    for r in records[:2]:
        del r["best_key"], r["feedback_val_mel"]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    page = write_report(tmp_path, None, "val_mel").read_text(encoding="utf-8")
    assert "(val_mel 1.331)" in page[page.index('<section id="status">') : page.index("</section>")]


@pytest.mark.parametrize("why, offered", [("budget", False), ("max_steps", False), ("signal", True)])
def test_a_judged_feedback_round_offers_no_command_to_continue_it(tmp_path, why, offered):
    """Once a feedback round ends (but by a signal) it is judged and finished: its page offered
    `train_feedback.py --resume auto` as the command that "continues" it, which starts a new version."""
    fake_run(tmp_path)
    command = "python train_feedback.py --resume auto --output_dir out --target_hours 0.5"
    from vits_trainer.training.report import read_metrics

    records = read_metrics(tmp_path / "metrics.jsonl")
    ends = [r for r in records if r.get("event") == "end"]
    ends[-1]["stopped_reason"] = why
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    page = write_report(tmp_path, command, resumable_after_end=False).read_text(encoding="utf-8")
    assert (html.escape(command) in page) is offered
    # a train_vits.py run goes on from where it ended, whatever ended it
    assert html.escape(command) in write_report(tmp_path, command).read_text(encoding="utf-8")


def test_a_run_stopped_before_any_evaluation_of_trained_weights_does_not_say_none_scored_better(tmp_path):
    """Stopped by a signal after one step: only the start evaluation exists. The page said "no trained
    weights scored better" (none were evaluated), where the model card says they were not evaluated."""
    t0 = 1_700_000_000.0
    records = [
        {"event": "eval", "tag": "start", "step": 0, "epoch": 0, "time": t0, "val_mel": 4.1},
        {"step": 1, "epoch": 0, "time": t0 + 5, "loss_g": 200.0, "loss_mel": 3.8},
        {"event": "end", "step": 1, "time": t0 + 9, "stopped_reason": "signal"},
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    summary = {"steps": 1, "stopped_reason": "signal", "best_step": 0, "best_model": None}
    (tmp_path / "train_summary.json").write_text(json.dumps(summary))
    page = write_report(tmp_path).read_text(encoding="utf-8")
    status = page[page.index('<section id="status">') : page.index("</section>")]
    assert "the weights the run started from" in status and "no trained weights were evaluated" in status
    assert "scored better" not in status


def test_a_right_to_left_sentence_is_laid_out_right_to_left(tmp_path):
    """An Arabic-script sentence in the page's left-to-right flow had its final full stop (a neutral
    character, which takes the paragraph's direction) drawn where it reads first; its cell now takes its
    direction from its own first letter."""
    from vits_trainer.training.report import read_run, sample_table

    reference = tmp_path / "samples" / REFERENCE_FOLDER
    reference.mkdir(parents=True)
    said = {"c0": "سڵاو، چۆنی.", "c1": "silav, tu çawa yî?"}
    listing = {clip: {"text": text, "speaker": 0} for clip, text in said.items()}
    (reference / SENTENCES_FILE).write_text(json.dumps(listing), encoding="utf-8")
    step = tmp_path / "samples" / "step_00000004"
    step.mkdir()
    for clip in said:
        tiny_wav(step / f"{clip}.wav")
    table = sample_table(read_run(tmp_path), step)
    for text in said.values():
        assert f'<span class="said" dir="auto">{html.escape(text)}</span>' in table


def test_a_resumed_runs_status_says_its_speed_is_the_last_sessions(tmp_path):
    """train_summary.json's samples_per_second is the last session's: after a resume the status gave a
    2.58 of the second session as the run's, beside a first session's 4.57 in the timeline."""
    t0 = 1_700_000_000.0
    start = {"event": "session", "process_start": t0, "started": t0 + 1, "target_seconds": 60.0}
    records = [{**start, "step": 0, "time": t0, "resumed_from": None}]
    records += [{"event": "end", "step": 4, "time": t0 + 9, "stopped_reason": "signal"}]
    records += [{**start, "process_start": t0 + 20, "step": 4, "time": t0 + 21, "resumed_from": 4}]
    records += [{"event": "end", "step": 8, "time": t0 + 30, "stopped_reason": "budget"}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    summary = {"steps": 8, "stopped_reason": "budget", "samples_per_second": 2.58, "wall_seconds": 10.0}
    (tmp_path / "train_summary.json").write_text(json.dumps(summary))
    page = write_report(tmp_path).read_text(encoding="utf-8")
    assert "<th>samples per second (last session)</th><td>2.58</td>" in page
    assert "<th>wall time / budget (last session)</th>" in page
    one = [records[0], records[-1]]  # one session: nothing to tell apart
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in one))
    page = write_report(tmp_path).read_text(encoding="utf-8")
    assert "<th>samples per second</th><td>2.58</td>" in page


def test_a_run_ended_without_any_evaluation_does_not_say_one_is_yet_to_come(tmp_path):
    """--val_fraction 0: the ended run's page said "None yet." under Evaluations, as if one would come."""
    t0 = 1_700_000_000.0
    records = [
        {
            "event": "session",
            "step": 0,
            "time": t0,
            "process_start": t0,
            "started": t0 + 1,
            "resumed_from": None,
        },
        {"step": 6, "epoch": 0, "time": t0 + 5, "loss_g": 200.0, "mel": 3.9},
        {"event": "end", "step": 6, "time": t0 + 9, "stopped_reason": "max_steps"},
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    why = "no validation clips to evaluate on"
    summary = {"steps": 6, "stopped_reason": "max_steps", "final_val": None, "final_eval_skipped": why}
    (tmp_path / "train_summary.json").write_text(json.dumps(summary))
    page = write_report(tmp_path).read_text(encoding="utf-8")
    section = page[page.index('<section id="evaluations">') :]
    assert f"<p>None: {why}.</p>" in section[: section.index("</section>")]
    records.pop()  # still running: one may come
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    assert "<p>None yet.</p>" in write_report(tmp_path).read_text(encoding="utf-8")
