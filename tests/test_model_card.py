"""The model card (README.md) in every exported folder: Hugging Face front matter, the base model's
license inherited and said plainly, only what is known at export time, and a real run's final_model
carrying one that its export marker lists."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml  # comes with transformers (and accelerate, datasets)

from tests.helpers import train_tiny
from vits_trainer.safety import read_marker
from vits_trainer.training.model_card import (
    CardFacts,
    Evaluation,
    base_model_facts,
    evaluations_known,
    model_card,
)

MMS = "facebook/mms-tts-kmr-script_latin"
INHERITS = "inherits its license, CC-BY-NC 4.0: non-commercial use only"


def front_matter(text: str) -> dict:
    """The card's front matter: `key: value` lines and `key:` followed by `- item` lines."""
    lines = text.splitlines()
    assert lines[0] == "---", lines[:3]
    end = lines.index("---", 1)
    found, key = {}, None
    for line in lines[1:end]:
        if line.startswith("- "):
            found[key].append(line[2:])
            continue
        key, _, value = line.partition(": ") if ": " in line else line.partition(":")
        assert key and not key.startswith(" "), line
        found[key] = json.loads(value) if value.startswith('"') else (value or [])
    assert yaml.safe_load("\n".join(lines[1:end])) == found  # what a YAML reader makes of it too
    return found


def card(base, **facts) -> str:
    return model_card(CardFacts(kind=facts.pop("kind", "final_model"), base=base, step=120, **facts))


def test_mms_base_gives_language_and_inherited_cc_by_nc_license():
    text = card(base_model_facts(MMS), hours=1.5, clips=400, speakers=1)
    assert front_matter(text) == {
        "language": ["kmr"],
        "license": "cc-by-nc-4.0",
        "base_model": MMS,
        "pipeline_tag": "text-to-speech",
        "library_name": "transformers",
        "tags": ["text-to-speech", "vits", "mms", "vits-trainer"],
    }
    assert f"This model is a fine-tune of [{MMS}](https://huggingface.co/{MMS}) and {INHERITS}." in text
    assert "Language: kmr (Latin script)." in text
    assert "VitsModel.from_pretrained" in text and 'sf.write("speech.wav"' in text
    assert "- Data: 1.50 h of audio in 400 training clips from 1 speaker." in text


def test_a_local_base_folder_is_known_by_its_own_card(tmp_path):
    # an earlier export of this tool: its card names the hub model it came from, and its license
    earlier = tmp_path / "best_model"
    earlier.mkdir()
    (earlier / "README.md").write_text(card(base_model_facts(MMS)), encoding="utf-8")
    text = card(base_model_facts(str(earlier)))
    meta = front_matter(text)
    assert (meta["base_model"], meta["license"], meta["language"]) == (MMS, "cc-by-nc-4.0", ["kmr"])
    assert INHERITS in text and "Trained from the local folder `best_model`" in text
    # a model folder with a card of its own (e.g. downloaded from the hub): its license, its name
    mine = tmp_path / "my voice: v2"
    mine.mkdir()
    (mine / "README.md").write_text(
        "---\nlicense: apache-2.0\ntags:\n- vits\nmodel-index:\n  - name: x\n---\n# Mine\n", encoding="utf-8"
    )
    text = card(base_model_facts(str(mine)))
    meta = front_matter(text)
    assert (meta["base_model"], meta["license"]) == ("my voice: v2", "apache-2.0")
    assert "language" not in meta  # not known: left out, never guessed
    assert "a fine-tune of `my voice: v2` and inherits its license, apache-2.0." in text


def test_an_unknown_license_is_other_and_the_card_says_to_set_it(tmp_path):
    folder = tmp_path / "someones_model"
    folder.mkdir()
    for base in (base_model_facts(str(folder)), base_model_facts("someone/vits-model")):
        text = card(base)
        meta = front_matter(text)
        assert meta["license"] == "other" and meta["base_model"] in ("someones_model", "someone/vits-model")
        assert "does not know" in text and "set it above before sharing" in text
        assert "mms" not in meta["tags"]


def test_a_fresh_model_has_no_base_and_no_license(tmp_path):
    tiny = tmp_path / "tiny_model"
    tiny.mkdir()
    text = card(base_model_facts(str(tiny), fresh=True))
    meta = front_matter(text)
    assert meta["license"] == "other" and "base_model" not in meta and "language" not in meta
    assert "freshly initialised VITS model (`tiny_model`)" in text
    assert "choose one and set it above before sharing" in text
    short = card(base_model_facts(str(tiny), fresh=True), target_seconds=120.0, spent_seconds=114.0)
    assert "- Budget: --target_hours 0.0333 (2.0 min); 1.9 min spent when these weights" in short


def test_best_model_card_says_only_what_is_known_during_the_run():
    history = [
        {"tag": "start", "step": 0, "val_mel": 2.0, "val_mel_dtw": 3.0},
        {"tag": "epoch 3", "step": 60, "val_mel": 1.0, "val_mel_dtw": 2.0},
    ]
    rows = evaluations_known(history, best_step=60, step=60, prefix="", final=False)
    assert [(e.label, e.step) for e in rows] == [("start (before training)", 0), ("best", 60)]
    text = card(base_model_facts(MMS), kind="best_model", evaluations=rows)
    assert "best so far by `val_mel`" in text and "| best | 60 | 1 | 2 |" in text
    assert "final" not in text.split("## Evaluation")[1]
    for unknown in ("- Data:", "- Budget:", "- Hardware:", "- Feedback:"):
        assert unknown not in text
    # at the end: the final evaluation is the best one; a feedback run scores its held-out feedback clips
    history.append({"tag": "final", "step": 90, "feedback_val_mel": 0.5, "val_mel": 0.9})
    rows = evaluations_known(history, best_step=90, step=90, prefix="feedback_")
    assert rows[-1] == Evaluation("best, final", 90, {"val_mel": 0.5})
    assert evaluations_known(history, best_step=60, step=95, prefix="")[-1].label == "best"  # not final
    # an epoch's evaluation with no training step after it scored the final weights: it is the final one
    history.append({"tag": "epoch 4", "step": 95, "val_mel": 0.95})
    assert evaluations_known(history, best_step=90, step=95, prefix="")[-1].label == "final"


@pytest.mark.slow
def test_a_real_runs_exports_carry_the_card(tmp_path, tone_corpus, tiny_model_dir):
    session, summary = train_tiny(tmp_path, tone_corpus, tiny_model_dir, max_steps=2, freerun_samples=2)
    final = Path(summary["final_model"])
    text = (final / "README.md").read_text(encoding="utf-8")
    meta = front_matter(text)
    assert meta["license"] == "other" and meta["base_model"] == tiny_model_dir.name
    assert meta["pipeline_tag"] == "text-to-speech" and meta["library_name"] == "transformers"
    assert "README.md" in read_marker(final)["files"]  # so only a later export of this tool replaces it
    assert "at the end of the run, optimiser step 2" in text and "- Optimiser steps: 2." in text
    clips = len(session.data.train)
    assert f"training clips from 1 speaker; {sum(map(len, session.data.val_sets.values()))} more" in text
    assert f" in {clips} training clips" in text and "- Hardware: CPU, precision fp32." in text
    assert "- Budget: --target_hours 9.5;" in text
    final_row = next(line for line in text.splitlines() if line.startswith("| ") and "final" in line)
    assert final_row.count("|") == 7  # evaluation, step and the four scores, free-running ones included
    if summary["best_model"]:  # the final weights were the best: best_model is a copy, card and all
        assert (Path(summary["best_model"]) / "README.md").read_text(encoding="utf-8") == text
