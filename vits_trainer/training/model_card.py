"""The model card (README.md) of every exported model folder, in the Hugging Face format: YAML front
matter (language, license, base_model, pipeline_tag, tags, library_name, and a widget the hub's
model page plays: the folder's samples/), then what the weights sound like, how to use the model and
what its weights were trained on.

`model_card(facts)` is the text, a pure function of `CardFacts`. `base_model_facts` reads what is known
of the model a run started from; `run_facts` gathers the rest from a session when a folder is exported
(outputs.RunOutputs.export, the one place that writes the card): only what is known at that moment.
best_model is exported during the run (no final evaluation yet), final_model at its end; a feedback
version's judgement comes after its export, so its card points to the report instead.

The license is the base model's: a fine-tune inherits it. MMS-TTS checkpoints (facebook/mms-tts-*)
are CC-BY-NC 4.0; a base folder's own README.md `license:` is taken as it says; anything else (a
model this tool initialised itself, a folder without a card, another hub id) gets `license: other`
and a line telling the user to set the right one before sharing.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, replace
from pathlib import Path

from ..hub import is_repo_id
from ..model.speakers import is_bare_id
from .demo import made_by_demo
from .report import scores_by_speaker

CARD_FILE = "README.md"
MMS_PREFIX = "facebook/mms-tts-"
MMS_LICENSE = "cc-by-nc-4.0"
LICENSE_NAMES = {MMS_LICENSE: "CC-BY-NC 4.0"}
SCORES = ("val_mel", "val_mel_dtw", "val_mcd", "val_duration_ratio")  # the columns of the score table
SCORE_HEADERS = {"val_mcd": "val_mcd (dB)"}


@dataclass(frozen=True)
class BaseModel:
    """The model a run started from, as far as it is known."""

    card_id: str | None  # the front matter's base_model: a hub id, a local folder's name; None: no base
    license: str | None = None  # None: not known (or not set)
    language: tuple[str, ...] = ()
    script: str | None = None  # an MMS id's -script_xxx suffix, e.g. "latin"
    fresh: bool = False  # a model this tool initialised itself (the demo's tiny model): nothing to inherit
    folder: str | None = None  # the name of the local folder the run started from (never its path)


@dataclass(frozen=True)
class Evaluation:
    """One evaluation of the run, as the card shows it."""

    label: str  # "start (before training)", "best", "final", or several joined when they coincide
    step: int
    scores: dict[str, float]  # the SCORES that were measured
    # a multi-speaker model's val_mel of each voice: {name: {"speaker_id", "clips", "val_mel"}}
    by_speaker: dict[str, dict] = field(default_factory=dict)


@dataclass(frozen=True)
class Sample:
    """A validation sentence these weights spoke from its text, copied into the model folder."""

    file: str  # its path in the folder, e.g. "samples/sample_1.wav"
    text: str
    clip: str  # the validation clip's id (its recording is in the run's samples/reference/)
    speaker_id: int | None = None  # the voice, for a model of several
    speaker: str | None = None  # its name in the training data (speakers.json)


@dataclass(frozen=True)
class CardFacts:
    """What the card says; None (or empty) leaves a line out."""

    kind: str  # "best_model" | "final_model"
    base: BaseModel
    step: int  # optimiser steps of these weights
    best_metric: str = "val_mel"
    hours: float | None = None  # audio in the training clips
    clips: int | None = None
    val_clips: int | None = None
    speakers: int | None = None  # speakers named in the data
    voices: int = 1  # the model's speaker embeddings (1: a single voice)
    speaker_names: dict[str, int] = field(default_factory=dict)  # speakers.json: name -> speaker_id
    feedback_clips: int | None = None  # a feedback version (train_feedback.py): its feedback clips
    target_seconds: float | None = None  # --target_hours of this session (the run's last)
    total_seconds: float | None = None  # --total_hours, when the run spans several sessions
    spent_seconds: float | None = None  # time spent when these weights were exported (all sessions)
    sessions: int = 1  # sessions the run has had (resumes), this one included
    # the data figures are the last session's: whether earlier sessions trained on other clips (None: not
    # known, a run resumed from a checkpoint that did not record it)
    other_clips_before: bool | None = False
    hardware: str | None = None
    precision: str | None = None
    eval_set: str = "validation clips"
    eval_trained: bool = False  # the eval set's clips are also trained on (a feedback round of few clips)
    evaluations: tuple[Evaluation, ...] = ()
    best_model_step: int | None = None  # the step of the weights the run's best_model/ holds (None: none)
    uroman: bool = False  # the tokenizer expects romanised text
    samples: tuple[Sample, ...] = ()  # spoken by these weights at their evaluation (step `step`)


# ---- the base model ------------------------------------------------------------------------------


def read_front_matter(text: str) -> dict[str, str | list[str]]:
    """The top-level `key: value` and `key:` + `- item` entries of a card's YAML front matter (what a
    model card needs; nested mappings are skipped). Empty when the text has none."""
    lines = text.splitlines()
    if not lines or lines[0].strip() != "---":
        return {}
    found: dict[str, str | list[str]] = {}
    key = None
    for line in lines[1:]:
        if line.strip() == "---":
            return found
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if line.startswith("- ") or (line.startswith(" ") and stripped.startswith("- ")):
            if key is not None and isinstance(found.get(key), list):
                found[key].append(_unquote(stripped[2:]))
            continue
        if line.startswith(" ") or ":" not in line:
            continue  # inside a nested mapping
        key, _, value = line.partition(":")
        key, value = key.strip(), value.strip()
        if not value:
            found[key] = []
        elif value.startswith("[") and value.endswith("]"):
            found[key] = [_unquote(v) for v in value[1:-1].split(",") if v.strip()]
        else:
            found[key] = _unquote(value)
    return {}  # no closing line: not front matter


def _unquote(value: str) -> str:
    value = value.strip()
    if len(value) >= 2 and value[0] == value[-1] == '"':
        try:
            return str(json.loads(value))
        except ValueError:
            return value[1:-1]
    if len(value) >= 2 and value[0] == value[-1] == "'":
        return value[1:-1].replace("''", "'")
    return value


def _first(value) -> str | None:
    if isinstance(value, list):
        return value[0] if value else None
    return value or None


def mms_language(model_id: str | None) -> tuple[str | None, str | None]:
    """(iso code, script) of an MMS-TTS hub id: facebook/mms-tts-kmr-script_latin -> ("kmr", "latin")."""
    if not model_id or not model_id.startswith(MMS_PREFIX):
        return None, None
    iso, _, script = model_id[len(MMS_PREFIX) :].partition("-script_")
    return iso or None, script or None


def base_model_facts(model_name: str, fresh: bool = False) -> BaseModel:
    """What is known of --model_name: a hub id as it is; a local folder by its own README.md (the
    base_model, license and language an earlier export or a downloaded hub card records), else by its
    name. An MMS-TTS id gives the language and the license. `fresh`: a model this tool initialised."""
    folder = Path(model_name).expanduser()
    name = folder.resolve().name if folder.is_dir() else None
    if fresh:
        return BaseModel(card_id=None, fresh=True, folder=name)
    card: dict = {}
    if name is not None:
        try:
            card = read_front_matter((folder / "README.md").read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError):
            card = {}
        card_id = _first(card.get("base_model")) or name
    else:
        card_id = model_name
    iso, script = mms_language(card_id)
    license = _first(card.get("license")) or (MMS_LICENSE if iso else None)
    language = card.get("language") or ([iso] if iso else [])
    return BaseModel(
        card_id=card_id,
        license=None if license == "other" else license,  # "other": not set, the user must choose
        language=tuple([language] if isinstance(language, str) else language),
        script=script,
        folder=name,
    )


# ---- the card ------------------------------------------------------------------------------------


def model_card(facts: CardFacts) -> str:
    """The README.md text of an exported model folder."""
    base = facts.base
    parts = [_front_matter(facts), f"# {_title(base)}", _license_paragraph(base)]
    if base.folder and not base.fresh:
        # the front matter names no local folder (the hub would refuse it): the text does
        whose = f", whose own card names {base.card_id} as its base" if base.card_id != base.folder else ""
        parts.append(f"Trained from the local folder `{base.folder}`{whose}.")
    if base.language:
        script = f" ({base.script.capitalize()} script)" if base.script else ""
        parts.append(f"Language: {', '.join(base.language)}{script}.")
    parts.append(_weights_line(facts))
    if facts.samples:
        parts += ["## Samples", _samples(facts)]
    parts += ["## Usage", _usage(facts)]
    training = _training_lines(facts)
    if training:
        parts += ["## Training", "\n".join(training)]
    if facts.evaluations:
        parts += ["## Evaluation", _evaluation(facts)]
    return "\n\n".join(parts) + "\n"


def _yaml_scalar(value: str) -> str:
    plain = re.fullmatch(r"[A-Za-z][A-Za-z0-9._/-]*", value) and value.lower() not in (
        "true",
        "false",
        "yes",
        "no",
        "on",
        "off",
        "null",
    )
    if plain:
        return value
    # JSON strings are YAML too, but for what JSON leaves raw and YAML may not hold: C1 controls (a
    # transcript decoded with the wrong code page), which YAML refuses, and NEL / line and paragraph
    # separators, which it reads as line breaks; escaped as \uXXXX, which both read alike
    return re.sub(
        r"[\x7f-\x9f\u2028\u2029]",
        lambda m: f"\\u{ord(m.group()):04x}",
        json.dumps(value, ensure_ascii=False),
    )


def _front_matter(facts: CardFacts) -> str:
    base = facts.base
    lines = ["---"]
    if base.language:
        lines += ["language:", *(f"- {_yaml_scalar(code)}" for code in base.language)]
    lines.append(f"license: {_yaml_scalar(base.license or 'other')}")
    if base.card_id and is_repo_id(base.card_id):
        # the hub refuses a card whose base_model is no model id (a local folder's name): the upload
        # at the end of a run would fail
        lines.append(f"base_model: {_yaml_scalar(base.card_id)}")
    lines += ["pipeline_tag: text-to-speech", "library_name: transformers", "tags:"]
    tags = ["text-to-speech", "vits", *(["mms"] if _is_mms(base) else []), "vits-trainer"]
    lines += [f"- {tag}" for tag in tags]
    if facts.samples:  # the hub's model page plays these beside the sentence (its text-to-speech widget)
        lines.append("widget:")
        for sample in facts.samples:
            lines += [
                f"- text: {_yaml_scalar(sample.text)}",
                "  output:",
                f"    url: {_yaml_scalar(sample.file)}",
            ]
    lines.append("---")
    return "\n".join(lines)


def _is_mms(base: BaseModel) -> bool:
    return bool(base.card_id and base.card_id.startswith(MMS_PREFIX))


def _base_ref(base: BaseModel) -> str:
    if base.card_id and is_repo_id(base.card_id):  # a local folder is named without its path
        return f"[{base.card_id}](https://huggingface.co/{base.card_id})"
    return f"`{base.card_id}`"


def _title(base: BaseModel) -> str:
    if base.fresh:
        return "VITS text-to-speech model, trained from scratch"
    return f"VITS text-to-speech: a fine-tune of {base.card_id}"


def _license_name(license: str) -> str:
    name = LICENSE_NAMES.get(license, license)
    return f"{name}: non-commercial use only" if "-nc" in license.lower() else name


def _license_paragraph(base: BaseModel) -> str:
    if base.fresh:
        folder = f" (`{base.folder}`)" if base.folder else ""
        return (
            f"This model was trained from a freshly initialised VITS model{folder} that vits-trainer "
            "built, not from a published checkpoint, so there is no base model license to "
            "inherit. No license is set (`license: other`): choose one and set it above before sharing "
            "the model."
        )
    if base.license is None:
        return (
            f"This model is a fine-tune of {_base_ref(base)}, whose license vits-trainer does not know; "
            "a fine-tune inherits its base model's license. `license: other` stands in for it: look up "
            "the base model's license and set it above before sharing the model."
        )
    return (
        f"This model is a fine-tune of {_base_ref(base)} and inherits its license, "
        f"{_license_name(base.license)}."
    )


def _weights_line(facts: CardFacts) -> str:
    metric = f"`{facts.best_metric}` on the {facts.eval_set}"
    if facts.kind == "best_model":
        return (
            f"These weights are the run's best so far by {metric}, at optimiser step {facts.step} "
            "(exported during the run)."
        )
    best = [e for e in facts.evaluations if "best" in e.label]
    also = f" They are also its best by {metric}." if best and best[0].step == facts.step else ""
    if facts.evaluations and all(e.step != facts.step for e in facts.evaluations):
        # a signal, or a budget too short for the final evaluation: the table's scores are other weights'
        also = (
            " They were not evaluated: the run ended without its final evaluation, so the scores below"
            " are of the weights at the steps they name"
            + (
                f"; its best by {metric} is step {best[0].step}'s{_best_folder(facts, best[0].step)}."
                if best
                else "."
            )
        )
    return f"These are the weights at the end of the run, optimiser step {facts.step}.{also}"


def _best_folder(facts: CardFacts, step: int) -> str:
    """Where the best weights are: the run's best_model/ when it holds them; the weights a run started
    from are never exported as a best model."""
    if facts.best_model_step == step:
        return ", in its `best_model` folder"
    if step != 0:
        return ""
    if any(e.step > 0 for e in facts.evaluations):
        return ", the weights it started from (no trained weights scored better)"
    return ", the weights it started from (no trained weights were evaluated)"  # stopped before any


def _samples(facts: CardFacts) -> str:
    voices = facts.voices > 1
    lines = [
        f"Sentences of the {facts.eval_set} ({_held_out(facts)}) spoken by these weights from their text "
        f"alone, as at inference, at the evaluation of step {facts.step}:",
        "",
    ]
    for sample in facts.samples:
        voice = ""
        if voices and sample.speaker_id is not None:
            named = f"speaker {_markdown_text(sample.speaker)}, " if sample.speaker else ""
            voice = f", {named}speaker_id {sample.speaker_id}"
        name = sample.file.rsplit("/", 1)[-1]
        lines.append(
            f"- [{name}]({sample.file}) (clip {_markdown_text(sample.clip)}{voice}): {_markdown_text(sample.text)}"
        )
    return "\n".join(lines)


def _markdown_text(text: str) -> str:
    """`text` shown as it is in Markdown (its emphasis, link, HTML and entity characters escaped)."""
    return re.sub(r"([\\`*_\[\]<>|#&])", r"\\\1", " ".join(text.split()))


def _usage(facts: CardFacts) -> str:
    # the first sample's sentence and voice: a sentence of the model's language, heard on the hub page
    first = facts.samples[0] if facts.samples else None
    sentence = json.dumps(first.text if first else "Text to speak.", ensure_ascii=False)  # a Python literal
    speaker_id = first.speaker_id if first is not None and first.speaker_id is not None else 0
    lines = [
        "```python",
        "import soundfile as sf",
        "import torch",
        *(["import uroman"] if facts.uroman else []),
        "from transformers import VitsModel, VitsTokenizer",
        "",
        'model = VitsModel.from_pretrained("path/to/this/folder")  # or its hub id once uploaded',
        'tokenizer = VitsTokenizer.from_pretrained("path/to/this/folder")',
        f"text = {sentence}",
    ]
    if facts.uroman:  # pip install uroman
        lines.append("text = uroman.Uroman().romanize_string(text)  # this tokenizer expects romanised text")
    call = f"model(**inputs, speaker_id={speaker_id})" if facts.voices > 1 else "model(**inputs)"
    lines += [
        'inputs = tokenizer(text, return_tensors="pt")',
        "torch.manual_seed(0)  # VITS samples durations and noise: a seed makes the speech repeatable",
        "with torch.no_grad():",
        f"    speech = {call}.waveform[0]",
        'sf.write("speech.wav", speech.numpy(), model.config.sampling_rate)',
        "```",
    ]
    if facts.voices > 1:
        # transformers' VitsModel drops the speaker embedding when speaker_id is None (the pipeline's
        # default): every layer trained with one then gets none, a voice no speaker was trained as
        lines.append(
            f"\nThe model has {facts.voices} voices{_voices(facts.speaker_names)}. "
            "Always give a `speaker_id`: without one, the model "
            "speaks with no speaker embedding, a voice it was never trained on. With the pipeline:\n\n"
            "```python\n"
            "from transformers import pipeline\n\n"
            'tts = pipeline("text-to-speech", model="path/to/this/folder")\n'
            f'speech = tts({sentence}, forward_params={{"speaker_id": {speaker_id}}})\n'
            "```"
        )
    return "\n".join(lines)


def _voices(names: dict[str, int], limit: int = 20) -> str:
    """Which speaker of the training data each `speaker_id` speaks as: the card travels without the
    run's log. Ids that are their own names (a speaker column of 0, 1, ...) say nothing more."""
    named = sorted((sid, name) for name, sid in names.items() if not is_bare_id(name, sid))
    if not named:
        return " (`speaker_id`); `speakers.json` maps the speakers' names in the training data to them"
    shown = ", ".join(f"{sid}: {_markdown_text(name)}" for sid, name in named[:limit])
    more = f", and {len(named) - limit} more in `speakers.json`" if len(named) > limit else ""
    return f", one per speaker of the training data: `speaker_id` {shown}{more}"


def _duration(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:.2f} h"
    if seconds >= 60:
        return f"{seconds / 60:.1f} min"
    return f"{seconds:.0f} s"


def _training_lines(facts: CardFacts) -> list[str]:
    lines = []
    if facts.hours is not None and facts.clips is not None:
        data = f"- Data: {_duration(facts.hours * 3600)} of audio in {facts.clips} training clips"
        if facts.speakers:
            data += f" from {facts.speakers} speaker{'s' if facts.speakers != 1 else ''}"
            if facts.speakers > 1 and facts.voices == 1:
                data += " (trained as one voice)"
        if facts.sessions > 1:  # the figures are this session's data: said so unless every session's
            if facts.other_clips_before is False:
                data += f", the same clips in each of its {facts.sessions} sessions"
            else:
                earlier = (
                    "earlier ones trained on other clips"
                    if facts.other_clips_before
                    else "the clips of earlier ones are not recorded"
                )
                data += f" in the last of its {facts.sessions} sessions ({earlier})"
        if facts.val_clips:
            data += f"; {facts.val_clips} more clips held out for evaluation"
        lines.append(data + ".")
    if facts.feedback_clips is not None:
        lines.append(
            f"- Feedback: a feedback round (train_feedback.py): {facts.feedback_clips} feedback clips trained "
            "on together with original clips replayed from the base model's data (both counted above). "
            "Whether this version was promoted, judged on held-out feedback clips, is in "
            "`feedback_report.json` in the version folder, written after this export."
        )
    if facts.target_seconds is not None:
        budget = f"- Budget: --target_hours {round(facts.target_seconds / 3600, 4):g}"
        if facts.target_seconds < 3600:  # 0.0333 hours reads better as 2.0 min
            budget += f" ({_duration(facts.target_seconds)})"
        if facts.sessions > 1:  # --target_hours is each session's own: the time spent is all of them
            budget += f" in the last of {facts.sessions} sessions"
        if facts.total_seconds is not None:
            budget += f" (--total_hours {facts.total_seconds / 3600:g} across sessions)"
        if facts.spent_seconds is not None:
            spent = " in all" if facts.sessions > 1 else ""
            budget += f"; {_duration(facts.spent_seconds)} spent{spent} when these weights were exported"
        lines.append(budget + ".")
    if facts.hardware:
        precision = f", precision {facts.precision}" if facts.precision else ""
        lines.append(f"- Hardware: {facts.hardware}{precision}.")
    lines.append(f"- Optimiser steps: {facts.step}.")
    return lines


def _held_out(facts: CardFacts) -> str:
    if facts.eval_trained:
        return "also trained on, too few clips to hold any out: not a test on unseen sentences"
    return "held out, never trained on"


def _evaluation(facts: CardFacts) -> str:
    columns = [k for k in SCORES if any(k in e.scores for e in facts.evaluations)]
    intro = (
        f"Scores on the {facts.eval_set} ({_held_out(facts)}); lower is better, except "
        "`val_duration_ratio`, where 1.0 is the recordings' speaking rate. `val_mel` is teacher-forced "
        "(the recording guides the model); `val_mel_dtw`, `val_mcd` and `val_duration_ratio` are "
        "free-running: the sentences spoken from their text alone, compared with the recordings after "
        "dynamic time warping."
    )
    header = ["evaluation", "step", *(SCORE_HEADERS.get(k, k) for k in columns)]
    rows = [
        [e.label, str(e.step), *(f"{e.scores[k]:.4g}" if k in e.scores else "" for k in columns)]
        for e in facts.evaluations
    ]
    text = intro + "\n\n" + _markdown_table(header, rows)
    if facts.voices > 1:
        text += _speaker_scores(facts)
    return text


def _speaker_scores(facts: CardFacts) -> str:
    """The table of each voice's val_mel at the evaluations above that measured it ("" when none did):
    the scores above are a mean over every clip, in which a voice that lags can hide."""
    evaluations = [e for e in facts.evaluations if e.by_speaker]
    if not evaluations:
        return ""
    voices = evaluations[-1].by_speaker
    header = ["speaker", "speaker_id", "clips", *(f"val_mel, {e.label}" for e in evaluations)]
    rows = []
    for name, entry in sorted(voices.items(), key=lambda kv: (kv[1].get("speaker_id", 0), kv[0])):
        cells = [_markdown_text(name), str(entry.get("speaker_id", "")), str(entry.get("clips", 0))]
        for e in evaluations:
            mel = (e.by_speaker.get(name) or {}).get("val_mel")
            cells.append("–" if mel is None else f"{mel:.4g}")
        rows.append(cells)
    unmeasured = [name for name, entry in voices.items() if not entry.get("clips")]
    note = (
        f" {', '.join(_markdown_text(n) for n in unmeasured)}: none of these clips, so not measured."
        if unmeasured
        else ""
    )
    return (
        f"\n\nBy voice: the teacher-forced `val_mel` of each speaker's clips among the {facts.eval_set}; "
        f"the table above is the mean over every clip: a voice counts as much as its clips do.{note}\n\n"
        + _markdown_table(header, rows)
    )


def _markdown_table(header: list[str], rows: list[list[str]]) -> str:
    """A Markdown table; cells are Markdown already (escape what is text before: `_markdown_text`)."""
    lines = [header, ["---"] * len(header), *rows]
    return "\n".join("| " + " | ".join(row) + " |" for row in lines)


# ---- the facts of a run, at export time ----------------------------------------------------------


def evaluations_known(
    history: list[dict], best_step: int | None, step: int, prefix: str, final: bool = True
) -> tuple:
    """The start, best and final evaluations among `history` (the run's evaluation records), one row
    per record; the final one (when `final`: the export at the run's end) only when it evaluated the
    weights at `step`: the final evaluation, or an earlier one with no training step since."""
    chosen: dict[int, tuple[dict, list[str]]] = {}  # id(record) -> (record, labels)

    def add(record: dict | None, label: str) -> None:
        if record is not None:
            chosen.setdefault(id(record), (record, []))[1].append(label)

    add(history[0] if history and history[0].get("tag") == "start" else None, "start (before training)")
    if best_step is not None:
        add(next((r for r in reversed(history) if r.get("step") == best_step), None), "best")
    last = history[-1] if history else None
    add(last if final and last and last.get("step") == step else None, "final")
    rows = []
    for record, labels in sorted(chosen.values(), key=lambda pair: pair[0].get("step", 0)):
        scores = {k: float(record[prefix + k]) for k in SCORES if prefix + k in record}
        _, voices = scores_by_speaker(record, prefix) or ("", {})
        rows.append(Evaluation(", ".join(labels), int(record.get("step", 0)), scores, dict(voices)))
    return tuple(rows)


def speakers_trained(speakers: dict[str, int], voices: int, speaker_ids) -> int:
    """How many speakers the training clips have: every name of the map for a single voice (one voice
    learnt from them all), else the voices the clips train. The map also names voices absent from this
    data (a resumed run's, an exported base's) and gives a feedback folder's speaker "0" the id of a
    named voice: counted as names, a card said "from 4 speakers" of 3 voices, or of 2 voices trained."""
    if voices <= 1:
        return len(speakers)
    return len({int(i) for i in speaker_ids})


def run_facts(s, kind: str, samples: tuple[Sample, ...] = ()) -> CardFacts:
    """The card's facts of session `s` (training/session.py) at the moment `kind` is exported, with the
    `samples` the export copied into the folder."""
    import torch

    from .evaluate import set_prefix

    cfg, data, budget = s.cfg, s.data, s.budget
    base = base_model_facts(cfg.model_name, fresh=made_by_demo(cfg, "model_name"))
    language = getattr(s.text.tokenizer, "language", None)
    if not base.language and isinstance(language, str) and language:
        base = replace(base, language=(language,))  # the tokenizer's own (MMS tokenizers name it)
    first_set = next(iter(data.val_sets), "val")  # the one that picks the best model and the card scores
    device = s.device
    hardware = torch.cuda.get_device_name(device) if device.type == "cuda" else device.type.upper()
    if s.accelerator.num_processes > 1:
        hardware = f"{s.accelerator.num_processes} x {hardware}"
    precision = s.accelerator.mixed_precision
    lengths = data.train.audio_lengths()
    trained = data.val_trained_clips > 0
    if first_set == "val":
        eval_set = "validation clips"
    else:  # a feedback round's "feedback": its clips may be trained on too (too few to hold any out)
        eval_set = f"{first_set} clips" if trained else f"held-out {first_set} clips"
    return CardFacts(
        kind=kind,
        base=base,
        step=budget.global_step,
        best_metric=cfg.best_metric,
        hours=float(lengths.sum()) / data.train.sample_rate / 3600,
        clips=len(data.train),
        val_clips=sum(len(v) for v in data.val_sets.values()) - data.val_trained_clips,
        speakers=speakers_trained(s.speakers, s.model.config.num_speakers, data.train.speaker_ids),
        voices=s.model.config.num_speakers,
        speaker_names=dict(s.speakers) if s.model.config.num_speakers > 1 else {},
        feedback_clips=data.feedback_clips,
        target_seconds=budget.target_seconds,
        total_seconds=budget.total_seconds,
        spent_seconds=budget.spent_seconds(),
        sessions=s.state.sessions + 1,  # state.sessions counts the resumes
        other_clips_before=s.state.other_clips_before,
        hardware=hardware,
        precision="fp32" if precision == "no" else precision,
        eval_set=eval_set,
        eval_trained=trained,
        evaluations=evaluations_known(
            s.state.val_history,
            s.state.best_step,
            budget.global_step,
            set_prefix(first_set),
            final=kind == "final_model",
        ),
        best_model_step=s.state.best_model_step,
        uroman=bool(getattr(s.text.tokenizer, "is_uroman", False)),
        samples=samples,
    )
