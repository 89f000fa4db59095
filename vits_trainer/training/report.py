"""report.html in the checkpoint folder: one page that answers "is the voice any good, and what did the
run do with its time", opened from disk (file://) with no server, no network and no script.

`write_report(checkpoint_dir, ...)` reads only what the run left in the folder (metrics.jsonl,
train_summary.json, samples/) and writes the page atomically; the main process calls it after each
evaluation (outputs.RunOutputs.run_eval) and at the end of the run (run_end.RunEnd.finish), so it is
there after a budget stop, --max_steps, a signal, and it covers every session of a resumed run
(metrics.jsonl is appended to). Audio and pictures are referenced by relative paths: the folder can be
zipped and moved. Charts are inline SVG (report_svg.py). Every text from the run (clip ids, sentences,
paths, reasons) is escaped.

The sections, in order: status, resume command, the budget's timeline per session (plan against what
happened), curves, the sampled sentences at evaluations along the run, evaluations (best marked), a multi-speaker run's val_mel of each voice, samples of the newest evaluations and the best one (the
model beside the recording, alignment and mel pictures), micro-batch trial, precision / skipped steps /
recoveries, threads, every other event.
"""

from __future__ import annotations

import json
import math
import os
import re
import statistics
import time
import zipfile
from dataclasses import dataclass, field
from html import escape, unescape
from pathlib import Path
from urllib.parse import quote, unquote

from ..jsonfile import write_json_atomic, write_text_atomic
from ..safety import marker_step, read_marker
from ..terminal import clock_text
from .report_svg import PHASE_COLORS, Timeline, is_finite_number, line_chart, series, timeline_svg
from .runtime import LOG_FILE, wait_policy_words

REPORT_FILE = "report.html"
# the page and every file of the folder it refers to, in one file: Kaggle's and Colab's file browsers
# download a folder file by file, and the page without its samples/ plays nothing
ARCHIVE_FILE = "report.zip"
REFERENCE_FOLDER = "reference"  # samples/reference/: the validation recordings, written once per run
SENTENCES_FILE = "sentences.json"  # samples/reference/sentences.json: clip id -> text, speaker
# an evaluation record's val_mel of each voice of a multi-speaker model (outputs.speaker_scores), on its
# first validation set, whose prefix it has like the set's other keys ("feedback_by_speaker"):
# {speaker name: {"speaker_id": ..., "val_mel": ..., "clips": ...}}, no val_mel for a voice with no clip
BY_SPEAKER = "by_speaker"
VOICE_LINES = 8  # the most voices the chart by voice draws (one colour each); the table has them all
RECENT_WITH_PLAYERS = 5  # evaluations whose samples get players (plus the best one)
# a GPU run's share of the steps' time the host waited for the GPU's work (device_wait_fraction): below
# the first the GPU mostly waited for the host's launches, from the second on the GPU limited the steps
LAUNCH_BOUND_WAIT, GPU_BOUND_WAIT = 0.1, 0.5
ALONG_THE_RUN = 8  # evaluations the "listen along the run" table plays, spread from the start to the newest
STOP_WORDS = {  # loop.STOP_REASONS in words, and "end"
    "budget": "the time budget: the next step and the final reserve no longer fitted before the deadline",
    "max_steps": "--max_steps reached",
    "signal": "stopped by a signal (SIGINT/SIGTERM); it can be resumed",
    "end": "the loop ended",
}


# ---- reading the folder ---------------------------------------------------------------------------


def events_of(records: list[dict], event: str) -> list[dict]:
    """The metrics records of one event ("eval", "session", "micro_batch", ...), in order."""
    return [r for r in records if r.get("event") == event]


def step_records(records: list[dict]) -> list[dict]:
    """The training step lines among metrics records (no "event" key: step, losses, lr, speed), in order."""
    return [r for r in records if "event" not in r and "step" in r]


@dataclass
class Sitting:
    """One process's part of the run (a resumed run has several): its `session` record (None for
    metrics written before such records existed), its other records, and its `end` record."""

    start: dict | None = None
    records: list[dict] = field(default_factory=list)
    end: dict | None = None

    def of(self, event: str) -> list[dict]:
        return events_of(self.records, event)

    def steps(self) -> list[dict]:
        return step_records(self.records)


@dataclass
class RunFiles:
    folder: Path
    records: list[dict]
    summary: dict | None
    sentences: dict  # clip id -> {"text": ..., "speaker": ...} (samples/reference/sentences.json)
    best_model_step: int | None = None  # the step of the weights in best_model/ (its marker's)

    def events(self, name: str) -> list[dict]:
        return events_of(self.records, name)

    def steps(self) -> list[dict]:
        return step_records(self.records)

    def sittings(self) -> list[Sitting]:
        found = [Sitting()]
        for record in self.records:
            event = record.get("event")
            if event == "session":  # (the start evaluation comes before it, in the same sitting)
                if found[-1].start is not None or found[-1].end is not None:
                    found.append(Sitting())
                found[-1].start = record
            elif event == "end":
                found[-1].end = record
            else:
                found[-1].records.append(record)
        return found


def _read_json(path: Path):
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def read_metrics(path: Path) -> list[dict]:
    """metrics.jsonl's records, in order; none when it is missing."""
    records = []
    if path.is_file():
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                record = json.loads(line)
            except ValueError:  # a half line of a killed process
                continue
            if isinstance(record, dict):
                records.append(record)
    return records


def is_resume(record: dict) -> bool:
    """Whether a metrics record is the start of a session that resumed from a checkpoint."""
    return record.get("event") == "session" and record.get("resumed_from") is not None


def current_history(records: list[dict]) -> list[dict]:
    """The records of the weights the run holds now. A session resumed from step S continues from
    that checkpoint: what earlier sessions recorded after step S (the steps a killed process trained
    past its last checkpoint, or a future left by going back to an older checkpoint) happened to
    other weights, and is left out. Session starts and ends stay: that time was spent."""
    kept: list[dict] = []
    for record in records:
        if is_resume(record):
            at = record.get("step")
            if isinstance(at, int):
                kept = [r for r in kept if r.get("event") in ("session", "end") or not _after(r, at)]
        kept.append(record)
    return kept


def _after(record: dict, step: int) -> bool:
    return isinstance(record.get("step"), int) and record["step"] > step


def read_run(folder: Path) -> RunFiles:
    everything = read_metrics(folder / "metrics.jsonl")
    records = current_history(everything)
    # best_model/ may hold weights of a future left by going back (kept: they scored better): their
    # evaluation stays on the page, with their samples
    kept = marker_step(read_marker(folder / "best_model"))
    if kept is not None and not any(r.get("event") == "eval" and r.get("step") == kept for r in records):
        records += [r for r in everything if r.get("event") == "eval" and r.get("step") == kept][-1:]
    summary = _read_json(folder / "train_summary.json")
    sentences = _read_json(folder / "samples" / REFERENCE_FOLDER / SENTENCES_FILE)
    summary = summary if isinstance(summary, dict) else None
    return RunFiles(folder, records, summary, sentences or {}, best_model_step=kept)


def write_references(samples_dir: Path, items, count: int, speakers: dict[str, int] | None = None) -> None:
    """The first `count` validation clips' recordings as samples/reference/<clip>.wav, and their texts
    in sentences.json, once per run (a clip already written is kept); `speakers` (name -> id, a
    multi-speaker run's) adds each clip's speaker name."""
    import soundfile as sf

    folder = samples_dir / REFERENCE_FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    listing = _read_json(folder / SENTENCES_FILE) or {}
    changed = False
    for k in range(min(count, len(items))):
        clip = items.clip_id(k)
        wav = folder / f"{clip}.wav"
        if clip in listing and wav.is_file():
            continue
        sf.write(wav, items.audio(k), items.sample_rate, subtype="PCM_16")
        listing[clip] = {"text": items.text(k), "speaker": int(items.speaker_ids[k])}
        names = [name for name, sid in (speakers or {}).items() if sid == int(items.speaker_ids[k])]
        if names:
            listing[clip]["speaker_name"] = names[0]
        changed = True
    if changed:
        write_json_atomic(folder / SENTENCES_FILE, listing)


# ---- the page -------------------------------------------------------------------------------------


def write_report(
    checkpoint_dir: Path | str,
    resume_command: str | None = None,
    best_metric: str = "val_mel",
    now: float | None = None,
    resumable_after_end: bool = True,
) -> Path:
    """Write <checkpoint_dir>/report.html from the folder's files (temp file, then rename).
    `resumable_after_end` False: `resume_command` continues the run only until it ends, but by a signal
    (a feedback round is judged when it ends, and the same command then starts a new version)."""
    folder = Path(checkpoint_dir)
    run = read_run(folder)
    ended, why = run_state(run)
    if ended and why != "signal" and not resumable_after_end:
        resume_command = None
    page = render(run, resume_command, best_metric, time.time() if now is None else now)
    out = folder / REPORT_FILE
    write_text_atomic(out, page)
    return out


def referenced_files(folder: Path, page: str) -> list[str]:
    """The files of `folder` the page refers to (its src and href paths), in page order, each once;
    folders (best_model/, an older evaluation's samples), addresses and anchors are not files."""
    root, found = folder.resolve(), []
    for ref in re.findall(r'(?:src|href)="([^"]+)"', page):
        rel = unquote(unescape(ref))
        if rel in found or rel.startswith(("#", "/")) or re.match(r"[a-zA-Z][a-zA-Z0-9+.-]*:", rel):
            continue
        path = (folder / rel).resolve()
        if path.is_file() and path.is_relative_to(root):
            found.append(rel)
    return found


def write_report_archive(checkpoint_dir: Path | str) -> Path:
    """<checkpoint_dir>/report.zip: report.html and every file it refers to, under one folder named for
    the run, so that the page opened from the unpacked archive plays and shows what it does in place
    (temp file, then rename)."""
    folder = Path(checkpoint_dir)
    page = (folder / REPORT_FILE).read_text(encoding="utf-8")
    resolved = folder.resolve()
    top = "-".join(part for part in (resolved.parent.name, resolved.name) if part) or "report"
    out = folder / ARCHIVE_FILE
    tmp = out.with_name(f".{ARCHIVE_FILE}.tmp-{os.getpid()}")
    try:
        # strict_timestamps=False: a file dated before 1980 (copied with its date from a folder unpacked
        # without dates) is stored as of 1980, where zipfile refused the whole archive
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED, strict_timestamps=False) as archive:
            archive.writestr(f"{top}/{REPORT_FILE}", page)
            for rel in referenced_files(folder, page):
                # audio and pictures gain little from deflate, which would take most of the time
                packed = zipfile.ZIP_STORED if rel.endswith((".wav", ".png")) else zipfile.ZIP_DEFLATED
                archive.write(folder / rel, f"{top}/{rel}", compress_type=packed)
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return out


def render(run: RunFiles, resume_command: str | None, best_metric: str, now: float) -> str:
    evals = run.events("eval")
    ended, _ = run_state(run)
    # best_model/'s own step first: while a resumed session runs, train_summary.json is the last one's
    best = best_eval(evals, best_metric, run.summary if ended else None, run.best_model_step)
    sections = [
        status_section(run, best, best_metric, now),
        resume_section(resume_command),
        timeline_section(run),
        curves_section(run),
        along_the_run_section(run, evals, best),
        evals_section(run, evals, best, best_metric),
        speakers_section(run, evals, best),
        samples_section(run, evals, best),
        microbatch_section(run),
        stability_section(run),
        threads_section(run),
        events_section(run),
    ]
    folder = run.folder.resolve()  # with its parent: the default folder of every run is "checkpoints"
    title = f"Training report: {folder.parent.name + '/' if folder.parent.name else ''}{folder.name}"
    body = "\n".join(s for s in sections if s)
    return (
        '<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{escape(title)}</title><style>{CSS}</style></head>\n<body>\n"
        f"<h1>{escape(title)}</h1>\n{body}\n</body></html>\n"
    )


def _fmt(value, digits: int = 4) -> str:
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if not math.isfinite(value):
            return "non-finite"
        return f"{value:,.0f}" if abs(value) >= 10**digits else f"{value:.{digits}g}"
    return escape(str(value))


def _clock(wall: float | None) -> str:
    return "–" if wall is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(wall))


def _duration(seconds: float | None) -> str:
    return "–" if seconds is None else clock_text(round(seconds))


def _table(header: list[str], rows: list[list[str]], css: list[str] | None = None) -> str:
    """An HTML table; cells are HTML already (escape what is text before)."""
    head = "".join(f"<th>{h}</th>" for h in header)
    body = []
    for k, row in enumerate(rows):
        cls = f' class="{css[k]}"' if css and css[k] else ""
        body.append(f"<tr{cls}>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def _src(path: str) -> str:
    """A relative path as an attribute value: URL-quoted (a clip id may hold # or %), then escaped."""
    return escape(quote(path, safe="/"), quote=True)


def best_eval(
    evals: list[dict], metric: str, summary: dict | None, best_model_step: int | None = None
) -> dict | None:
    """The evaluation the run counts as best: that of the weights in best_model/ (`best_model_step`,
    its marker's), else train_summary.json's best_step, else the first evaluation with the lowest
    `metric` (how the run picks it: strictly lower wins)."""
    for step in (best_model_step, summary.get("best_step") if summary else None):
        at = [e for e in evals if step is not None and e.get("step") == step]
        if at:
            return at[0]
    best = None
    for e in evals:
        value = metric_of(e, metric)
        if value is not None and (best is None or value < metric_of(best, metric)):
            best = e
    return best


def first_set_prefix(record: dict) -> str:
    """The prefix of an evaluation record's keys of its first validation set, the one that picks the
    best model, read from the record's `best_key`: "" in a plain run's ("val_mel"), "feedback_" in a
    feedback round's ("feedback_val_mel", beside the original set's plain "val_mel"); "" in a record
    from before best_key."""
    best = record.get("best_key")
    return best[: best.index("val_")] if isinstance(best, str) and "val_" in best else ""


def primary(record: dict, key: str):
    """`key` (val_mel, val_mcd, ...) of an evaluation's first validation set (`first_set_prefix`; the
    free-running scores exist for it alone), falling back to `key` itself; as recorded: None when
    missing, and not checked to be a finite number (metric_of is)."""
    return record.get(first_set_prefix(record) + key, record.get(key))


def metric_name(record: dict, metric: str) -> str:
    """The key metric_of reads `metric` from: "feedback_val_mel" in a feedback round's evaluation, whose
    plain val_mel (the original set's) is another column of the page."""
    prefix = first_set_prefix(record)
    for key in (prefix + metric, metric):
        if key in record:
            return key
    return next((k for k in record if k.endswith("_" + metric)), metric)


def metric_of(record: dict, metric: str) -> float | None:
    """`metric` of an evaluation's first validation set (`primary`), as a finite number or None."""
    value = primary(record, metric)
    if value is None:  # a record from before best_key, of a run whose first set is not "val"
        value = next((v for k, v in record.items() if k.endswith("_" + metric)), None)
    return value if is_finite_number(value) else None  # as the charts take it: a bool is no score


# ---- status and resume ----------------------------------------------------------------------------


def run_state(run: RunFiles) -> tuple[bool, str]:
    """(ended, why): the last session's end record, else (older metrics) train_summary.json."""
    sittings = run.sittings()
    last = sittings[-1]
    if last.end is not None:
        return True, last.end.get("stopped_reason") or "end"
    if last.start is None and run.summary:
        return True, run.summary.get("stopped_reason") or "end"
    return False, "running"


def status_section(run: RunFiles, best: dict | None, best_metric: str, now: float) -> str:
    ended, why = run_state(run)
    summary = run.summary if ended else None
    # the latest record's: after going back to an older checkpoint, earlier sessions' ends name more
    # (and a kept best_model's evaluation from that future is added last)
    latest = (r for r in reversed(run.records) if r.get("event") != "eval" and isinstance(r.get("step"), int))
    steps = next((r["step"] for r in latest), 0)
    if ended:
        status = f'<span class="ok">ended</span>: {escape(STOP_WORDS.get(why, why))}'
    else:
        status = (
            '<span class="running">running</span> (or stopped without reaching its end: a crash or a '
            "kill; train.log says which). This page is rewritten at each evaluation and at the end."
        )
    sessions = len([s for s in run.sittings() if s.start or s.records])
    facts = [
        ("status", status),
        ("updated", _clock(now)),
        ("steps", _fmt(steps)),
        ("sessions", _fmt(sessions)),
    ]
    if best is not None:
        facts.append(("best evaluation", _best_evaluation(run, best, best_metric, ended)))
    if summary:
        facts += _summary_facts(run, summary, sessions)
    links = [
        name
        for name in ("metrics.jsonl", "train_summary.json", "loss_curve.png", LOG_FILE)
        if (run.folder / name).is_file()
    ]
    if (run.folder / "best_model").is_dir():
        links.append("best_model/")
    if links:
        facts.append(("files", " · ".join(f'<a href="{_src(n)}">{escape(n)}</a>' for n in links)))
    rows = "".join(f"<tr><th>{k}</th><td>{v}</td></tr>" for k, v in facts)
    return f'<section id="status"><h2>Status</h2><table class="facts">{rows}</table></section>'


def _best_evaluation(run: RunFiles, best: dict, best_metric: str, ended: bool) -> str:
    """The status's link to the best evaluation with its score; for the start evaluation, never
    exported, why best_model/ is empty."""
    start = ""
    if best.get("tag") == "start":
        # (a run stopped before its first evaluation after the start has no trained weights scored)
        later = any(_after(e, best.get("step", 0)) for e in run.events("eval"))
        start = (
            ": the weights the run started from, never exported as best_model; no trained weights "
            f"{'scored better' if later else 'were evaluated'}{'' if ended else ' yet'}"
        )
    return (
        f'<a href="#eval-{best.get("step")}">step {_fmt(best.get("step"))}</a> '
        f"({escape(metric_name(best, best_metric))} {_fmt(metric_of(best, best_metric))}){start}"
    )


def _summary_facts(run: RunFiles, summary: dict, sessions: int) -> list[tuple[str, str]]:
    """The status's rows from train_summary.json, once the run ended: its time, speed, models, final
    evaluation and hub upload; the time and speed are the last session's."""
    facts = [
        (
            "wall time / budget" + (" (last session)" if sessions > 1 else ""),
            f"{_duration(summary.get('wall_seconds'))} / {_duration(summary.get('target_seconds'))}",
        ),
        ("epochs trained", _fmt(summary.get("epochs_trained"), 3)),
        (
            "samples per second" + (" (last session)" if sessions > 1 else ""),
            _fmt(summary.get("samples_per_second"), 3) + _gpu_limit(summary),
        ),
        ("final model", _folder_link(summary.get("final_model"), run.folder)),
        (
            "best model",
            _folder_link(summary.get("best_model"), run.folder)
            + (f" (step {_fmt(summary.get('best_model_step'))})" if summary.get("best_model") else ""),
        ),
        ("final evaluation", _final_evaluation(summary)),
    ]
    hub = summary.get("hub")
    if isinstance(hub, dict):  # --push_to_hub: where the model went, or why it did not
        repo = escape(str(hub.get("repo")))
        if hub.get("pushed"):
            facts.append(("hub", f'<a href="https://huggingface.co/{repo}">{repo}</a>: uploaded'))
        else:
            facts.append(("hub", f"{repo}: <b>not uploaded</b> ({escape(str(hub.get('error')))})"))
    return facts


def _gpu_limit(summary: dict) -> str:
    """On a GPU, what the host's waits for the GPU's work at each step's read (device_wait_fraction)
    say of the steps: the GPU computed all that while; nothing on a CPU."""
    wait = summary.get("device_wait_fraction")
    if not isinstance(wait, int | float):
        return ""
    text = f" (the host waited for the GPU's work {100 * wait:.0f} % of the steps' time"
    if wait < LAUNCH_BOUND_WAIT:
        text += ": the host's kernel launches limited the steps, and the GPU waited for them"
    elif wait >= GPU_BOUND_WAIT:
        text += ": the GPU's own work limited the steps"
    return text + ")"


def _folder_link(path: str | None, folder: Path) -> str:
    """A model folder the summary names, as a link relative to the report (the files beside it are
    links too); plain text where it is gone. The path is as the run was given it: relative to the
    working folder of the process writing the report, which is the run's own."""
    if not path or not Path(path).is_dir():
        return _fmt(path)
    relative = os.path.relpath(Path(path).resolve(), folder.resolve())
    return f'<a href="{_src(Path(relative).as_posix())}/">{escape(path)}</a>'


def _final_evaluation(summary: dict) -> str:
    if not summary.get("final_val"):
        return _fmt(summary.get("final_eval_skipped"))
    tag = summary.get("final_eval_tag") or "final"
    return "ran" if tag == "final" else f"the {escape(tag)} evaluation's (no training step since)"


def resume_section(command: str | None) -> str:
    if not command:
        return ""
    return (
        '<section id="resume"><h2>Resume</h2><p>Continues from the newest checkpoint with every setting '
        "of the run; <code>--target_hours</code> is this session's, set the next one's:</p>"
        f"<pre><code>{escape(command)}</code></pre></section>"
    )


# ---- the budget's timeline ------------------------------------------------------------------------


def sitting_timeline(
    sitting: Sitting, number: int, ended: bool, resumed_at: int | None = None
) -> tuple[Timeline, list[list[str]]] | None:
    """The session's phases on its clock and the plan-against-outcome rows; None without its start
    record (metrics of an older version). `resumed_at`: the step the next session resumed from."""
    start = sitting.start
    if start is None:
        return None
    t0 = start["process_start"]
    tl = Timeline(f"session {number}", start.get("target_seconds"))
    tl.phases.append(
        (0.0, start["started"] - t0, "load", f"loading (preload {start.get('preload_seconds') or 0:.1f} s)")
    )
    training_from = start["time"] - t0
    # the set-up between loading and training: the evaluation libraries' first calls (numba's
    # compilation: 11 s of the first 2-minute demo) and the start evaluation, drawn over it; left
    # blank, that time went nowhere on the page
    tl.phases.append((start["started"] - t0, training_from, "load", "set-up (warm-up, start evaluation)"))
    trial = sitting.of("micro_batch")
    if trial and "time" in trial[0]:
        tl.phases.append((training_from, trial[0]["time"] - t0, "trial", "micro-batch trial"))
        training_from = trial[0]["time"] - t0
    times = [r["time"] for r in sitting.records if isinstance(r.get("time"), int | float)]
    end = sitting.end
    training_end = (end.get("training_end") if end else None) or (max(times) if times else start["time"])
    tl.phases.append((training_from, training_end - t0, "train", "training"))
    if end is not None:
        done = (
            "checkpoint, export" if end.get("final_eval_skipped") else "final evaluation, checkpoint, export"
        )
        tl.phases.append((training_end - t0, end["time"] - t0, "end", done))
    for e in sitting.of("eval"):
        tl.phases.append(
            (
                e["time"] - e.get("seconds", 0.0) - t0,
                e["time"] - t0,
                "eval",
                f"evaluation ({e.get('tag')}) at step {e.get('step')}",
            )
        )
    tl.instants.append((start.get("target_seconds", 0.0), "deadline", "deadline"))
    plan = (sitting.of("plan") or [None])[0]
    replan = (sitting.of("replan") or [None])[-1]  # the last plan the log announced, if it moved
    if plan:
        tl.instants.append((plan["train_end_wall"] - t0, "planned training end", "plan"))
        tl.instants.append((plan["run_end_wall"] - t0, "planned run end", "plan"))
    if replan:
        tl.instants.append(
            (replan["train_end_wall"] - t0, f"re-planned training end (step {replan.get('step')})", "plan")
        )
    for r in sitting.records:
        if r.get("event") in ("skipped", "overflow", "recovery", "oom", "threads") and "time" in r:
            tl.instants.append((r["time"] - t0, f"{r['event']} at step {r.get('step')}", "event"))
    if end is not None:
        why = end.get("stopped_reason") or "end"
        tl.instants.append((end["time"] - t0, f"stopped: {why}", "stop"))
    # the plan as last re-planned, between the first plan and what happened
    rows = plan_rows(sitting, [plan, replan] if replan else [plan], t0, ended, resumed_at)
    return tl, rows


def plan_rows(
    sitting: Sitting, plans: list[dict | None], t0: float, ended: bool, resumed_at: int | None = None
) -> list[list[str]]:
    """Rows of (what, each plan's figure, what happened); the epochs done count the first plan's steps."""
    start, end = sitting.start, sitting.end
    steps = sitting.steps()
    last_step = (end or {}).get("step", steps[-1]["step"] if steps else start.get("step"))
    if end is None and resumed_at is not None:
        # killed: its step lines past its last checkpoint are off the page, and the last one left is a
        # log line before that checkpoint; the next session went on from the checkpoint's step (one from
        # before this session's start, when the user went back further: none of its steps were kept)
        last_step = max(resumed_at, start.get("step") or 0)
    done = (last_step or 0) - (start.get("step") or 0)
    rate = [r["samples_per_second"] for r in steps if isinstance(r.get("samples_per_second"), int | float)]
    # the session's own figure (train_summary.json's) once it ended; while it runs, the median step
    # line (a mean took in the slow warm-up lines)
    measured = (end or {}).get("samples_per_second") or (statistics.median(rate) if rate else None)
    ps = [p or {} for p in plans]
    per_epoch = ps[0].get("steps_per_epoch")  # the plan's epochs are of time; these are of steps taken
    finished = (end["time"] - t0) if end else None
    unknown = "no end record (killed?)" if ended else "running"
    budget = f"{start.get('target_seconds', 0):.0f} s"
    return [
        ["optimizer steps", *(_fmt(p.get("optimizer_steps")) for p in ps), _fmt(done)],
        ["epochs", *(_fmt(p.get("epochs"), 3) for p in ps), _fmt(done / per_epoch, 3) if per_epoch else "–"],
        ["samples per second", *(_fmt(p.get("samples_per_second"), 3) for p in ps), _fmt(measured, 3)],
        [
            "training ends",
            *(_offset(p.get("train_end_wall"), t0) for p in ps),
            _offset((end or {}).get("training_end"), t0) if end else unknown,
        ],
        [
            "run ends",
            *(_offset(p.get("run_end_wall"), t0) for p in ps),
            f"+{finished:.0f} s" if finished is not None else unknown,
        ],
        ["budget", *(budget for _ in ps), escape(STOP_WORDS.get((end or {}).get("stopped_reason"), "–"))],
    ]


def _offset(wall: float | None, t0: float) -> str:
    return "–" if wall is None else f"+{wall - t0:.0f} s"


def timeline_section(run: RunFiles) -> str:
    sittings = [s for s in run.sittings() if s.start is not None]
    if not sittings:
        return ""
    ended, _ = run_state(run)
    parts = ['<section id="timeline"><h2>Budget: plan against what happened</h2>', _phase_legend()]
    for number, sitting in enumerate(sittings, 1):
        following = sittings[number].start if number < len(sittings) else None
        resumed_at = following.get("step") if following and is_resume(following) else None
        made = sitting_timeline(sitting, number, ended or sitting is not sittings[-1], resumed_at)
        if made is None:
            continue
        tl, rows = made
        start = sitting.start
        resumed = f", resumed at step {start['step']}" if is_resume(start) else ""
        parts.append(f"<h3>Session {number}: started {_clock(start['process_start'])}{escape(resumed)}</h3>")
        parts.append(timeline_svg(tl))
        replans = sitting.of("replan")
        header = ["", "plan"] + ([f"re-planned (step {replans[-1].get('step')})"] if replans else [])
        parts.append(_table([*header, "what happened"], rows))
    parts.append("</section>")
    return "\n".join(parts)


def _phase_legend() -> str:
    names = {
        "load": "loading, set-up",
        "eval": "evaluation",
        "trial": "micro-batch trial",
        "train": "training",
        "end": "final evaluation, save, export",
    }
    items = "".join(
        f'<span class="swatch" style="background:{PHASE_COLORS[k]}"></span>{v} ' for k, v in names.items()
    )
    return (
        f'<p class="legend">{items}<span class="swatch deadline"></span>deadline '
        '<span class="swatch plan"></span>plan <span class="swatch stop"></span>stop '
        "(hover a bar or line for its times)</p>"
    )


# ---- curves and evaluations -----------------------------------------------------------------------


def curves_section(run: RunFiles) -> str:
    steps = run.steps()
    evals = run.events("eval")
    resumed = [(s["step"], "resumed") for s in run.events("session") if is_resume(s)]

    def line(records, key, label, **kw):
        return series(label, [r.get("step") for r in records], [primary(r, key) for r in records], **kw)

    charts = [
        line_chart(
            "mel L1",
            [
                line(steps, "mel", "train mel L1"),
                line(evals, "val_mel", "validation mel L1", markers=True),
                line(
                    evals,
                    "val_mel_dtw",
                    "validation mel L1 after DTW (spoken from text)",
                    markers=True,
                    dashed=True,
                ),
            ],
            "mel L1 (log-mel)",
            vlines=resumed,
        ),
        line_chart(
            "GAN losses",
            [line(steps, "loss_g", "generator total"), line(steps, "loss_d", "discriminator")],
            "loss",
            vlines=resumed,
        ),
        line_chart(
            "validation losses",
            [line(evals, k, k, markers=True) for k in ("val_loss", "val_kl", "val_duration")],
            "loss",
            vlines=resumed,
        ),
        line_chart(
            "mel-cepstral distortion",
            [line(evals, "val_mcd", "val MCD (spoken from text)", markers=True)],
            "dB",
            vlines=resumed,
        ),
        line_chart(
            "duration ratio",
            [line(evals, "val_duration_ratio", "spoken / recorded length (1 = same rate)", markers=True)],
            "ratio",
            vlines=resumed,
        ),
        line_chart("learning rate", [line(steps, "lr", "learning rate")], "lr", vlines=resumed),
    ]
    charts = [c for c in charts if c]
    if not charts:
        return '<section id="curves"><h2>Curves</h2><p>No steps logged yet.</p></section>'
    note = "<p>Dashed vertical lines: where a session resumed.</p>" if resumed else ""
    return (
        '<section id="curves"><h2>Curves</h2>'
        + note
        + '<div class="charts">'
        + "".join(f"<figure>{c}</figure>" for c in charts)
        + "</div></section>"
    )


def _eval_columns(evals: list[dict]) -> list[str]:
    first = ["val_mel", "val_loss", "val_kl", "val_duration", "val_mel_dtw", "val_mcd", "val_duration_ratio"]
    seen = [k for k in first if any(k in e for e in evals)]
    skip = {"event", "tag", "step", "epoch", "time", "seconds"}
    for e in evals:
        seen += [k for k, v in e.items() if k not in skip and k not in seen and isinstance(v, int | float)]
    return seen


def evals_section(run: RunFiles, evals: list[dict], best: dict | None, best_metric: str) -> str:
    if not evals:
        ended, _ = run_state(run)
        why = (run.summary or {}).get("final_eval_skipped") if ended else None
        said = f"None: {escape(str(why))}." if why else "None." if ended else "None yet."
        return f'<section id="evaluations"><h2>Evaluations</h2><p>{said}</p></section>'
    columns = _eval_columns(evals)
    shown = set(player_steps(run, evals, best))
    rows, css = [], []
    for e in reversed(evals):
        folder = sample_folder(run.folder, e.get("step"))
        if e.get("step") in shown and folder is not None:
            samples = f'<a href="#eval-{e["step"]}">listen</a>'
        elif folder is not None:
            samples = f'<a href="{_src(folder.relative_to(run.folder).as_posix())}/">folder</a>'
        else:
            samples = "–"
        is_best = e is best
        rows.append(
            [
                _fmt(e.get("step")) + (' <span class="best">best</span>' if is_best else ""),
                _fmt(e.get("tag")),
                _fmt(e.get("epoch")),
                # null in a record: a score that was NaN/Inf (metrics.jsonl is strict JSON)
                *["non-finite" if k in e and e[k] is None else _fmt(e.get(k)) for k in columns],
                _fmt(e.get("seconds"), 3),
                samples,
            ]
        )
        css.append("best" if is_best else "")
    header = ["step", "tag", "epoch", *[escape(k) for k in columns], "seconds", "samples"]
    note = (
        f"<p>Newest first. Best: the lowest <code>{escape(metric_name(best or evals[-1], best_metric))}"
        "</code> "
        f"(--best_metric {escape(best_metric)}) of the first "
        "validation set; the free-running scores (DTW mel, MCD, duration ratio) come from sentences spoken "
        "from text alone, as at inference.</p>"
    )
    return f'<section id="evaluations"><h2>Evaluations</h2>{note}{_table(header, rows, css)}</section>'


def scores_by_speaker(record: dict, prefix: str | None = None) -> tuple[str, dict] | None:
    """(the metric, {speaker name: entry}) of an evaluation record that scored each voice: "val_mel",
    or "feedback_val_mel" for a feedback round's first set; None for a record without. `prefix`: that
    of the set wanted ("", "feedback_"); None: the one set the record scored by voice, whichever it is.
    The report and the model card (model_card.py) both read the scores through it."""
    keys = [prefix + BY_SPEAKER] if prefix is not None else [k for k in record if k.endswith(BY_SPEAKER)]
    for key in keys:
        value = record.get(key)
        if isinstance(value, dict):
            return speaker_metric(key), value
    return None


def speaker_metric(key: str) -> str:
    """The metric a record's by-voice key holds: "by_speaker" -> "val_mel", "feedback_by_speaker" ->
    "feedback_val_mel" (the set's prefix, as on its other keys)."""
    return key.removesuffix(BY_SPEAKER) + "val_mel"


def speaker_columns(evals: list[dict], best: dict | None) -> list[tuple[str, dict]]:
    """(label, record) of the start, best and newest evaluations that scored each voice, one column per
    record (labels joined where they coincide, "best, newest"), in step order."""
    scored = [e for e in evals if scores_by_speaker(e)]
    chosen: list[tuple[list[str], dict]] = []

    def add(record: dict | None, label: str) -> None:
        if record is None or not scores_by_speaker(record):
            return
        for labels, known in chosen:
            if known is record:
                labels.append(label)
                return
        chosen.append(([label], record))

    add(next((e for e in scored if e.get("tag") == "start"), None), "start")
    add(best, "best")
    add(scored[-1] if scored else None, "newest")
    chosen.sort(key=lambda pair: pair[1].get("step", 0))
    return [(", ".join(labels), record) for labels, record in chosen]


def speakers_section(run: RunFiles, evals: list[dict], best: dict | None) -> str:
    """A multi-speaker run's val_mel of each voice at the start, best and newest evaluations: a mean over
    every voice hides one that lags. Which voices the samples below let you hear."""
    columns = speaker_columns(evals, best)
    if not columns:
        return ""
    metric, newest = scores_by_speaker(columns[-1][1])
    heard: dict[int, list[str]] = {}
    for clip, sentence in run.sentences.items():
        heard.setdefault(sentence.get("speaker"), []).append(clip)
    rows = []
    for name, entry in sorted(newest.items(), key=lambda kv: (kv[1].get("speaker_id", 0), kv[0])):
        sid = entry.get("speaker_id")
        cells = [escape(name), _fmt(sid), _fmt(entry.get("clips"))]
        for _, record in columns:
            cells.append(_fmt((scores_by_speaker(record)[1].get(name) or {}).get("val_mel")))
        clips = heard.get(sid) or []
        cells.append(", ".join(escape(c) for c in clips) if clips else "none")
        rows.append(cells)
    header = [
        "speaker",
        "speaker_id",
        "validation clips",
        *[f"{escape(metric)}, {escape(label)} (step {_fmt(r.get('step'))})" for label, r in columns],
        "in the samples",
    ]
    note = (
        f"<p>The teacher-forced <code>{escape(metric)}</code> of the first validation set, by voice (lower is "
        "better): the evaluations above are the mean over every clip: a voice counts as much as its clips "
        "do, and one that lags can hide in it. A voice "
        "with no validation clip is not measured; one not in the samples is not heard here "
        "(<code>speak.py --speaker</code> speaks it).</p>"
    )
    chart, left_out = voice_chart(evals, metric, newest)
    if chart:
        more = f" {left_out} more voice{'s' if left_out != 1 else ''} in the table below." if left_out else ""
        drawn = (
            f"the {VOICE_LINES - 1} voices that score worst at the newest evaluation and of the best one"
            if left_out
            else "every voice with a validation clip"
        )
        chart = (
            f"<p>The chart: the <code>{escape(metric)}</code> of {drawn} at each evaluation (hover a point "
            f"for its value).{more}</p><figure>{chart}</figure>"
        )
    return f'<section id="speakers"><h2>Speakers</h2>{note}{chart}{_table(header, rows)}</section>'


def voice_chart(evals: list[dict], metric: str, newest: dict) -> tuple[str, int]:
    """(the SVG of each voice's `metric` over the evaluations, how many measured voices it leaves out):
    with more than VOICE_LINES voices, the worst at the newest evaluation and the best one."""
    measured = [name for name, entry in newest.items() if is_finite_number(entry.get("val_mel"))]
    measured.sort(key=lambda name: -newest[name]["val_mel"])
    if len(measured) <= VOICE_LINES:  # in the table's order: each voice keeps its colour as the run goes
        drawn = sorted(measured, key=lambda name: (newest[name].get("speaker_id", 0), name))
    else:
        drawn = [*measured[: VOICE_LINES - 1], measured[-1]]
    scored = [(e.get("step"), scores_by_speaker(e)) for e in evals]
    lines = [
        series(
            name,
            [step for step, found in scored if found],
            [(found[1].get(name) or {}).get("val_mel") for _, found in scored if found],
            markers=True,
        )
        for name in drawn
    ]
    return line_chart(f"{metric} by voice", lines, f"{metric} (log-mel)"), len(measured) - len(drawn)


# ---- samples --------------------------------------------------------------------------------------


def sample_folder(folder: Path, step) -> Path | None:
    if not isinstance(step, int):
        return None
    path = folder / "samples" / f"step_{step:08d}"
    return path if path.is_dir() else None


def steps_with_samples(run: RunFiles, evals: list[dict]) -> list[int]:
    """The steps of the evaluations whose sample folder exists, oldest first, each once."""
    return sorted({e["step"] for e in evals if sample_folder(run.folder, e.get("step"))})


def player_steps(run: RunFiles, evals: list[dict], best: dict | None) -> list[int]:
    """Steps whose samples get players: the newest RECENT_WITH_PLAYERS evaluations with samples, and the
    best one; newest first."""
    with_samples = steps_with_samples(run, evals)[::-1]
    chosen = with_samples[:RECENT_WITH_PLAYERS]
    if best is not None and best.get("step") in with_samples and best["step"] not in chosen:
        chosen.append(best["step"])
    return chosen


def along_the_run_steps(run: RunFiles, evals: list[dict], best: dict | None) -> tuple[list[int], int]:
    """(steps of the evaluations "listen along the run" plays, oldest first; how many have samples):
    every one with samples, or with more than ALONG_THE_RUN of them the first, the newest, the best and
    the rest spread evenly over the evaluations between."""
    with_samples = steps_with_samples(run, evals)
    if len(with_samples) <= ALONG_THE_RUN:
        return with_samples, len(with_samples)
    kept = {with_samples[0], with_samples[-1]}
    if best is not None and best.get("step") in with_samples:
        kept.add(best["step"])
    between = [step for step in with_samples if step not in kept]
    wanted = ALONG_THE_RUN - len(kept)  # fewer than `between`: each pick lands on its own evaluation
    kept.update(between[(2 * k + 1) * len(between) // (2 * wanted)] for k in range(wanted))
    return sorted(kept), len(with_samples)


def along_the_run_section(run: RunFiles, evals: list[dict], best: dict | None) -> str:
    """The same validation sentences at the evaluations of `along_the_run_steps`, one row each under
    their recordings: a column is one sentence over the run, to hear what training changed."""
    steps, with_samples = along_the_run_steps(run, evals, best)
    if len(steps) < 2:  # one evaluation's samples: the Samples section has them all
        return ""
    folders = {step: sample_folder(run.folder, step) for step in steps}
    clips = [c for c in run.sentences if any((f / f"{c}.wav").is_file() for f in folders.values())]
    if not clips:
        return ""

    def player(folder: Path, clip: str) -> str:
        rel = folder.relative_to(run.folder).as_posix()
        return _audio(f"{rel}/{clip}.wav") if (folder / f"{clip}.wav").is_file() else "–"

    header = ["evaluation"] + [_sentence(run, clip) for clip in clips]
    rows = [["recording"] + [player(run.folder / "samples" / REFERENCE_FOLDER, clip) for clip in clips]]
    css = [""]
    for step in steps:
        is_best = best is not None and best.get("step") == step
        rows.append(
            [f"step {_step_and_tags(evals, step, best)}"] + [player(folders[step], clip) for clip in clips]
        )
        css.append("best" if is_best else "")
    best_too = ", the best" if best is not None and best.get("step") in steps else ""
    which = (
        f"{len(steps)} of the {with_samples} evaluations with samples: the first, the newest{best_too} "
        "and others spread between them"
        if len(steps) < with_samples
        else "every evaluation with samples"
    )
    note = (
        "<p>Each sentence spoken from text alone at evaluations along the run, oldest first: read a "
        f"column down to hear what training changed in it. The rows are {which}.</p>"
    )
    table = _table(header, rows, css)  # in a box that scrolls sideways: many --eval_samples make it wide
    return f'<section id="along-the-run"><h2>Listen along the run</h2>{note}<div class="wide">{table}</div></section>'


def samples_section(run: RunFiles, evals: list[dict], best: dict | None) -> str:
    steps = player_steps(run, evals, best)
    if not steps:
        return ""
    parts = [
        '<section id="samples"><h2>Samples</h2><p>The validation sentences spoken from text alone (as at '
        "inference) beside the recording; the alignment (text tokens against frames: a clean staircase "
        "reads every token in order) and the recorded mel above the spoken one. Newest evaluations first, "
        "and the best one; older ones are in the table above.</p>"
    ]
    for step in steps:
        parts.append(f'<h3 id="eval-{step}">Step {_step_and_tags(evals, step, best)}</h3>')
        parts.append(sample_table(run, sample_folder(run.folder, step)))
    parts.append("</section>")
    return "\n".join(parts)


def _step_and_tags(evals: list[dict], step: int, best: dict | None) -> str:
    """A step whose samples are shown, as the rows and headings name it: the step, the tags of its
    evaluations (one step may have several) and the best mark when it is the best one's; HTML."""
    tags = ", ".join(escape(str(e.get("tag"))) for e in evals if e.get("step") == step)
    mark = ' <span class="best">best</span>' if best is not None and best.get("step") == step else ""
    return f"{step} ({tags}){mark}"


def sample_table(run: RunFiles, folder: Path) -> str:
    clips = [c for c in run.sentences if (folder / f"{c}.wav").is_file()]
    clips += sorted(p.stem for p in folder.glob("*.wav") if p.stem not in clips)
    reference = run.folder / "samples" / REFERENCE_FOLDER
    rows = []
    for clip in clips:
        rel = folder.relative_to(run.folder).as_posix()
        cells = [
            _sentence(run, clip),
            _audio(f"{rel}/{clip}.wav"),
            _audio(f"samples/{REFERENCE_FOLDER}/{clip}.wav")
            if (reference / f"{clip}.wav").is_file()
            else "–",
            _picture(run.folder, f"{rel}/{clip}_alignment.png", f"alignment of {clip}"),
            _picture(run.folder, f"{rel}/{clip}_mel.png", f"mel of {clip}"),
        ]
        rows.append(cells)
    return _table(["sentence", "model", "recording", "alignment", "mel: recorded / spoken"], rows)


def _sentence(run: RunFiles, clip: str) -> str:
    """A sampled clip's id, voice (a multi-speaker run's) and text, as a table cell."""
    sentence = run.sentences.get(clip) or {}
    text, voice = sentence.get("text"), sentence.get("speaker_name")
    voice = f" (speaker {escape(str(voice))}, speaker_id {sentence.get('speaker')})" if voice else ""
    said = escape(str(text)) if text else ""
    return f'<b>{escape(clip)}</b>{voice}<br><span class="said" dir="auto">{said}</span>'


def _audio(rel: str) -> str:
    return f'<audio controls preload="none" src="{_src(rel)}"></audio>'


def _picture(root: Path, rel: str, alt: str) -> str:
    if not (root / rel).is_file():
        return "–"
    return f'<a href="{_src(rel)}"><img src="{_src(rel)}" alt="{escape(alt)}" loading="lazy"></a>'


# ---- what the run decided along the way -----------------------------------------------------------


def microbatch_section(run: RunFiles) -> str:
    parts = []
    for record in run.events("micro_batch"):
        rows = [
            [
                _fmt(r.get("micro_batch_size"))
                + (
                    ' <span class="best">chosen</span>'
                    if r.get("micro_batch_size") == record.get("chosen")
                    else ""
                ),
                _fmt(r.get("steps")),
                _fmt(r.get("measured_steps")),
                _fmt(r.get("samples_per_second"), 3),
                "out of memory" if r.get("out_of_memory") else "",
            ]
            for r in record.get("trial") or []
        ]
        parts.append(
            f"<p>Trial ending at step {_fmt(record.get('step'))}: chosen {_fmt(record.get('chosen'))} clips per pass.</p>"
        )
        parts.append(_table(["clips per pass", "steps", "measured", "samples/s", ""], rows))
    s = run.summary or {}
    if s.get("micro_batch_size") is not None:
        parts.append(
            f"<p>Trained with {_fmt(s['micro_batch_size'])} clips per pass x "
            f"{_fmt(s.get('micro_batches_per_step', s.get('gradient_accumulation_steps')))} "
            "(gradient accumulation).</p>"
        )
    compiled = s.get("compile")
    if isinstance(compiled, dict):
        parts.append(
            f"<p>Compiled step: {_fmt(compiled.get('state'))} (--compile {_fmt(compiled.get('setting'))})"
            + (f": {escape(str(compiled['reason']))}" if compiled.get("reason") else "")
            + (f"; speed-up {_fmt(compiled.get('speedup'), 3)}x" if compiled.get("speedup") else "")
            + ".</p>"
        )
    if not parts:
        parts.append(
            "<p>No micro-batch trial in the metrics (a forced size, a size chosen earlier, or a single option).</p>"
        )
    return '<section id="microbatch"><h2>Micro-batch trial and compile</h2>' + "".join(parts) + "</section>"


def stability_section(run: RunFiles) -> str:
    kinds = ("overflow", "skipped", "recovery", "oom", "damaged_checkpoint")
    records = [r for r in run.records if r.get("event") in kinds]
    s = run.summary or {}
    head = f"<p>Skipped steps: {_fmt(s.get('skipped_steps', len(run.events('skipped'))))}; recoveries: {len(run.events('recovery'))}; fp16 loss-scale overflows: {len(run.events('overflow'))}; out of memory: {len(run.events('oom'))}.</p>"
    rows = [[_fmt(r.get("step")), escape(r["event"]), describe_event(r)] for r in records]
    table = _table(["step", "event", "details"], rows) if rows else "<p>None: every step was finite.</p>"
    return f'<section id="stability"><h2>Precision, skipped steps, recoveries</h2>{head}{table}</section>'


def threads_section(run: RunFiles) -> str:
    threads = (run.summary or {}).get("threads")
    parts = []
    if isinstance(threads, dict):
        # unset, the policy is GOMP_SPINCOUNT's: in the log's words, not a dash
        shown = dict(threads)
        if "omp_wait_policy" in shown:
            shown["omp_wait_policy"] = shown["omp_wait_policy"] or f"unset: {wait_policy_words(threads)}"
        rows = "".join(
            f"<tr><th>{escape(str(k))}</th><td>{_fmt(v)}</td></tr>"
            for k, v in shown.items()
            if not isinstance(v, list | dict)
        )
        parts.append(f'<table class="facts">{rows}</table>')
    rows = [
        [_fmt(r.get("step")), _fmt(r.get("threads")), _fmt(r.get("others_cpus"), 3)]
        for r in run.events("threads")
    ]
    if rows:
        parts.append(
            "<p>The governor's changes (fewer threads while other processes use this run's CPUs):</p>"
        )
        parts.append(_table(["step", "torch threads", "CPUs used by others"], rows))
    elif not parts:
        parts.append("<p>No thread changes.</p>")
    return '<section id="threads"><h2>Threads</h2>' + "".join(parts) + "</section>"


def describe_event(r: dict) -> str:
    event = r.get("event")
    clips = r.get("clips") or []
    some = ", ".join(map(str, clips[:6])) + (" ..." if len(clips) > 6 else "")
    if event == "overflow":
        return escape(f"fp16 gradients overflowed; loss scale now {r.get('scale')}; clips {some}")
    if event == "skipped":
        return escape(f"non-finite loss or gradient, no weights changed; clips {some}")
    if event == "recovery":
        return escape(
            f"reloaded {r.get('source')}, learning rate x{r.get('lr_scale')}, precision {r.get('precision')}"
        )
    if event == "oom":
        if r.get("trial"):
            return escape(f"micro-batch trial: {r.get('micro_batch_size')} clips ran out of memory")
        return escape(f"out of memory: micro-batch split {r.get('split')}x")
    if event == "damaged_checkpoint":
        return escape(f"recovery could not reload {r.get('path')}")
    rest = {k: v for k, v in r.items() if k not in ("event", "step", "time")}
    return escape(json.dumps(rest, ensure_ascii=False)[:300])


def events_section(run: RunFiles) -> str:
    """Every event record in order, the ones above included: the raw history."""
    rows = []
    for r in run.records:
        event = r.get("event")
        if event is None or event == "eval":
            continue
        rows.append(
            [
                _fmt(r.get("step")),
                _clock(r.get("time")) if "time" in r else "–",
                escape(str(event)),
                describe_event(r),
            ]
        )
    if not rows:
        return ""
    return (
        '<section id="events"><h2>All events</h2><details><summary>'
        f"{len(rows)} records from metrics.jsonl</summary>{_table(['step', 'time', 'event', 'details'], rows)}"
        "</details></section>"
    )


CSS = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 1.5em auto; max-width: 1200px; padding: 0 1em; color: #222; }
h1 { font-size: 1.5em; } h2 { border-bottom: 1px solid #ddd; margin-top: 1.6em; } h3 { margin-bottom: .3em; }
table { border-collapse: collapse; margin: .4em 0; } th, td { border: 1px solid #ddd; padding: 3px 7px; vertical-align: top; text-align: left; }
thead th { background: #f4f4f4; } table.facts th { background: #f8f8f8; font-weight: 600; }
tr.best td { background: #fff7d6; } span.best { background: #f0b400; color: #fff; border-radius: 3px; padding: 0 4px; font-size: .85em; }
.ok { color: #2a7d2a; font-weight: 600; } .running { color: #b06000; font-weight: 600; }
pre { background: #f6f6f6; padding: .6em; overflow-x: auto; white-space: pre-wrap; }
img { max-width: 300px; height: auto; } audio { width: 220px; } div.wide { overflow-x: auto; } .said { font-weight: normal; }
.charts { display: grid; grid-template-columns: repeat(auto-fill, minmax(560px, 1fr)); gap: .5em; }
figure { margin: .3em 0; } svg.chart { max-width: 100%; height: auto; font: 11px system-ui, sans-serif; }
svg .grid { stroke: #eee; } svg .tick { fill: #555; } svg .axis { fill: #333; }
svg .mark { stroke: #888; stroke-dasharray: 3 3; } svg .deadline { stroke: #d62728; fill: #d62728; stroke-width: 2; }
svg .plan { stroke: #555; stroke-dasharray: 4 2; } svg .stop { stroke: #000; stroke-width: 2; } svg .event { stroke: #d62728; }
svg text.deadline { fill: #d62728; stroke: none; } svg text.stop { fill: #000; stroke: none; } svg text.note { fill: #555; }
.legend .swatch { display: inline-block; width: 12px; height: 12px; margin: 0 3px 0 8px; vertical-align: middle; }
.swatch.deadline { background: #d62728; } .swatch.plan { background: #888; } .swatch.stop { background: #000; }
"""
