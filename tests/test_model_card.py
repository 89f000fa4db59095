"""The model card (README.md) in every exported folder: Hugging Face front matter, the base model's
license inherited and said plainly, only what is known at export time, and a real run's final_model
carrying one that its export marker lists."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml  # comes with transformers (and accelerate, datasets)

from tests.helpers import train_tiny
from vits_trainer.safety import read_marker
from vits_trainer.training.model_card import (
    CardFacts,
    Evaluation,
    Sample,
    base_model_facts,
    evaluations_known,
    model_card,
    read_front_matter,
)

MMS = "facebook/mms-tts-kmr-script_latin"
INHERITS = "inherits its license, CC-BY-NC 4.0: non-commercial use only"


def front_matter(text: str) -> dict:
    """The card's front matter as a YAML reader makes of it; the project's own reader
    (`read_front_matter`, for a base model's card) must agree on every flat key and list."""
    lines = text.splitlines()
    assert lines[0] == "---", lines[:3]
    end = lines.index("---", 1)
    found = yaml.safe_load("\n".join(lines[1:end]))
    flat = {k: v for k, v in found.items() if k != "widget"}  # the widget is a list of mappings
    assert {k: v for k, v in read_front_matter(text).items() if k != "widget"} == flat
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
    assert meta["license"] == "apache-2.0"
    assert "base_model" not in meta  # a folder's name is no hub id: the hub would refuse the card
    assert "language" not in meta  # not known: left out, never guessed
    assert "a fine-tune of `my voice: v2` and inherits its license, apache-2.0." in text
    assert "Trained from the local folder `my voice: v2`." in text  # named here, not in the front matter


def test_an_unknown_license_is_other_and_the_card_says_to_set_it(tmp_path):
    folder = tmp_path / "someones_model"
    folder.mkdir()
    for base, base_model in (
        (base_model_facts(str(folder)), None),
        (base_model_facts("someone/vits-model"), "someone/vits-model"),
    ):
        text = card(base)
        meta = front_matter(text)
        assert meta["license"] == "other" and meta.get("base_model") == base_model
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


def test_samples_are_played_on_the_hub_and_listed_in_the_card():
    samples = (
        Sample("samples/sample_1.wav", 'silav: "tu çawa yî?"', "clip 7", 2, "azad_b"),
        Sample("samples/sample_2.wav", "no | *emphasis* [here](x) <b> &lt;", "clip8", 0),
    )
    text = card(base_model_facts(MMS), samples=samples, voices=3)
    meta = front_matter(text)  # the sentences' colons, quotes and non-ASCII letters stay valid YAML
    assert meta["widget"] == [
        {"text": 'silav: "tu çawa yî?"', "output": {"url": "samples/sample_1.wav"}},
        {"text": "no | *emphasis* [here](x) <b> &lt;", "output": {"url": "samples/sample_2.wav"}},
    ]
    body = text.split("## Samples")[1].split("## Usage")[0]
    assert "at the evaluation of step 120" in body
    assert (
        '- [sample_1.wav](samples/sample_1.wav) (clip clip 7, speaker azad\\_b, speaker_id 2): silav: "tu çawa yî?"'
        in body
    )
    # shown as written, not as Markdown: `&lt;` stays those four characters, not a "<"
    assert r"no \| \*emphasis\* \[here\](x) \<b\> \&lt;" in body
    one_voice = card(base_model_facts(MMS), samples=samples[:1])
    assert "speaker_id" not in one_voice.split("## Usage")[0]
    assert "widget" not in front_matter(card(base_model_facts(MMS))) and "## Samples" not in card(
        base_model_facts(MMS)
    )


def test_a_multi_speaker_card_scores_each_voice():
    """The score table is a mean over every voice: a card shared with others says how each one did."""

    def voices(ali: float, zin: float) -> dict:
        return {
            "ali": {"speaker_id": 0, "clips": 3, "val_mel": ali},
            "zin_b": {"speaker_id": 1, "clips": 1, "val_mel": zin},
            "rojda": {"speaker_id": 2, "clips": 0},
        }

    evaluations = (
        Evaluation("start (before training)", 0, {"val_mel": 4.0}, voices(4.1, 3.8)),
        Evaluation("best, final", 120, {"val_mel": 1.4}, voices(1.25, 1.85)),
    )
    names = {"ali": 0, "zin_b": 1, "rojda": 2}
    body = card(base_model_facts(MMS), evaluations=evaluations, voices=3, speaker_names=names)
    body = body.split("## Evaluation")[1]
    assert "each speaker's clips among the validation clips" in body
    assert "rojda: none of these clips, so not measured" in body
    # the scores above are a mean over clips (ali's 3 weigh three times zin_b's 1), not over voices
    assert "averages over every voice" not in body
    assert "the table above is the mean over every clip: a voice counts as much as its clips do" in body
    table = [line for line in body.splitlines() if line.startswith("| ")]
    assert table[-5:] == [
        "| speaker | speaker_id | clips | val_mel, start (before training) | val_mel, best, final |",
        "| --- | --- | --- | --- | --- |",
        "| ali | 0 | 3 | 4.1 | 1.25 |",
        "| zin\\_b | 1 | 1 | 3.8 | 1.85 |",
        "| rojda | 2 | 0 | – | – |",
    ]
    one_voice = card(base_model_facts(MMS), evaluations=evaluations)  # no voices to tell apart
    assert "By voice" not in one_voice
    # a feedback round's card: the voices as scored on its own set (the same prefix as its scores)
    history = [
        {
            "tag": "start",
            "step": 0,
            "val_mel": 1.2,
            "feedback_val_mel": 1.3,
            "feedback_by_speaker": voices(1.4, 1.1),
        },
        {
            "tag": "final",
            "step": 8,
            "val_mel": 1.2,
            "feedback_val_mel": 1.1,
            "feedback_by_speaker": voices(1.2, 0.9),
        },
    ]
    known = evaluations_known(history, 8, 8, "feedback_")
    assert [e.by_speaker["ali"]["val_mel"] for e in known] == [1.4, 1.2]
    fb = card(base_model_facts(MMS), evaluations=known, voices=3, eval_set="held-out feedback clips")
    assert "each speaker's clips among the held-out feedback clips" in fb  # not "validation clips"


@pytest.mark.slow
def test_a_real_runs_exports_carry_the_card(tmp_path, tone_corpus, tiny_model_dir):
    session, summary = train_tiny(
        tmp_path, tone_corpus, tiny_model_dir, max_steps=2, freerun_samples=2, eval_samples=2
    )
    final = Path(summary["final_model"])
    text = (final / "README.md").read_text(encoding="utf-8")
    meta = front_matter(text)
    assert meta["license"] == "other" and "base_model" not in meta  # a local folder: no hub id
    assert meta["pipeline_tag"] == "text-to-speech" and meta["library_name"] == "transformers"
    assert "README.md" in read_marker(final)["files"]  # so only a later export of this tool replaces it
    assert "at the end of the run, optimiser step 2" in text and "- Optimiser steps: 2." in text
    clips = len(session.data.train)
    assert f"training clips from 1 speaker; {sum(map(len, session.data.val_sets.values()))} more" in text
    assert f" in {clips} training clips" in text and "- Hardware: CPU, precision fp32." in text
    seconds = float(session.data.train.audio_lengths().sum()) / session.data.train.sample_rate
    audio = f"{seconds / 60:.1f} min" if seconds >= 60 else f"{seconds:.0f} s"
    assert f"- Data: {audio} of audio in {clips} training clips" in text
    assert "- Budget: --target_hours 9.5;" in text
    final_row = next(line for line in text.splitlines() if line.startswith("| ") and "final" in line)
    assert final_row.count("|") == 7  # evaluation, step and the four scores, free-running ones included
    # the sentences the final evaluation spoke: in the folder, listed by the marker, played by the card
    items = next(iter(session.data.val_sets.values()))
    step_folder = Path(session.checkpoint_dir) / "samples" / "step_00000002"
    for k, widget in enumerate(meta["widget"]):
        url = widget["output"]["url"]
        assert url == f"samples/sample_{k + 1}.wav" and url in read_marker(final)["files"]
        assert widget["text"] == items.text(k)
        assert (final / url).read_bytes() == (step_folder / f"{items.clip_id(k)}.wav").read_bytes()
    assert len(meta["widget"]) == 2
    if summary["best_model"]:  # the final weights were the best: best_model is a copy, card and all
        assert (Path(summary["best_model"]) / "README.md").read_text(encoding="utf-8") == text


@pytest.mark.slow
def test_a_resumed_runs_card_counts_every_session(tmp_path, tone_corpus, tiny_model_dir):
    # The budget line of the second session's export: its --target_hours is that session's alone, the
    # time spent is both sessions' (without the count the spent time read like an overrun).
    train_tiny(tmp_path, tone_corpus, tiny_model_dir, max_steps=1)
    session, summary = train_tiny(tmp_path, tone_corpus, tiny_model_dir, max_steps=2)
    assert session.resumed_from is not None and summary["steps"] == 2
    text = (Path(summary["final_model"]) / "README.md").read_text(encoding="utf-8")
    assert "- Budget: --target_hours 9.5 in the last of 2 sessions; " in text and " spent in all when" in text
    assert "training clips from 1 speaker, the same clips in each of its 2 sessions; " in text


@pytest.mark.slow
def test_a_resumed_runs_card_says_its_data_is_the_last_sessions(tmp_path, tone_corpus, tiny_model_dir):
    """The data line counts the session that exported: after a first session on 30 of the clips and a
    second on all 40, it read "in 40 training clips" as if the run had trained on those alone."""
    train_tiny(tmp_path, tone_corpus, tiny_model_dir, max_steps=1, max_samples=30)
    session, summary = train_tiny(tmp_path, tone_corpus, tiny_model_dir, max_steps=2)
    assert session.resumed_from is not None and summary["steps"] == 2
    text = (Path(summary["final_model"]) / "README.md").read_text(encoding="utf-8")
    line = next(x for x in text.splitlines() if x.startswith("- Data: "))
    clips = len(session.data.train)
    assert f" in {clips} training clips from 1 speaker in the last of its 2 sessions " in line, line
    assert "(earlier ones trained on other clips)" in line, line


def test_the_data_line_says_whose_data_it_counts():
    base = base_model_facts(MMS)
    facts = dict(hours=1.5, clips=400, speakers=1, val_clips=20)
    assert "- Data: 1.50 h of audio in 400 training clips from 1 speaker; 20 more" in card(base, **facts)
    same = card(base, sessions=3, other_clips_before=False, **facts)
    assert "in 400 training clips from 1 speaker, the same clips in each of its 3 sessions; 20 more" in same
    other = card(base, sessions=3, other_clips_before=True, **facts)
    assert (
        "in 400 training clips from 1 speaker in the last of its 3 sessions (earlier ones trained on other "
        "clips); 20 more clips held out" in other
    )
    unknown = card(base, sessions=2, other_clips_before=None, **facts)
    assert "in the last of its 2 sessions (the clips of earlier ones are not recorded);" in unknown


@pytest.mark.slow
def test_samples_that_cannot_be_copied_leave_a_complete_folder(
    tmp_path, tone_corpus, tiny_model_dir, monkeypatch, capsys
):
    """A full disk is simulated at the samples' copy alone: the export goes on without them, says so once,
    and its card names no file that is not there."""
    import errno

    from vits_trainer.training import outputs

    copy = outputs.shutil.copyfile

    def disk_full_for_wavs(src, dst, *args, **kwargs):
        if str(dst).endswith(".wav"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return copy(src, dst, *args, **kwargs)

    monkeypatch.setattr(outputs.shutil, "copyfile", disk_full_for_wavs)
    _, summary = train_tiny(
        tmp_path, tone_corpus, tiny_model_dir, max_steps=2, freerun_samples=2, eval_samples=2
    )
    final = Path(summary["final_model"])
    assert not (final / "samples").exists() and "widget" not in front_matter(
        (final / "README.md").read_text()
    )
    assert (final / "model.safetensors").is_file() and "README.md" in read_marker(final)["files"]
    assert (
        capsys.readouterr().out.count(
            "warning: samples not copied into final_model (No space left on device)"
        )
        == 1
    )


def test_final_weights_that_were_never_evaluated_say_so():
    """A run stopped by a signal (or with no time left for its final evaluation) exports weights no
    evaluation scored: the card says so, and where its best is, rather than let the table's scores
    pass for these weights'."""
    scored = (
        Evaluation("start (before training)", 0, {"val_mel": 2.0}),
        Evaluation("best", 100, {"val_mel": 1.0}),
    )
    text = card(base_model_facts(MMS), evaluations=scored, best_model_step=100)  # these weights: step 120
    assert "These are the weights at the end of the run, optimiser step 120. They were not evaluated" in text
    assert "its best by `val_mel` on the validation clips is step 100's, in its `best_model` folder." in text
    # a best that no best_model/ holds is not sent there: the start's weights are never exported as one
    start_best = (Evaluation("start (before training), best", 0, {"val_mel": 2.0}),)
    text = card(base_model_facts(MMS), evaluations=start_best)
    assert "is step 0's, the weights it started from (no trained weights were evaluated)." in text
    assert "best_model" not in text
    start_best_of_two = (*start_best, Evaluation("step 60", 60, {"val_mel": 2.5}))
    text = card(base_model_facts(MMS), evaluations=start_best_of_two)
    assert "is step 0's, the weights it started from (no trained weights scored better)." in text
    final = (*scored, Evaluation("final", 120, {"val_mel": 1.1}))
    assert "not evaluated" not in card(base_model_facts(MMS), evaluations=final)
    assert "not evaluated" not in card(base_model_facts(MMS))  # no evaluation at all: no table to misread


def test_a_run_of_several_sessions_says_its_budget_is_each_sessions():
    """--target_hours is each session's: after five sessions "--target_hours 0.015 (54 s); 5.7 min
    spent" read like a budget overrun, and "per session" was wrong when the sessions' budgets differed."""
    text = card(base_model_facts(MMS), target_seconds=54.0, spent_seconds=342.0, sessions=5)
    assert (
        "- Budget: --target_hours 0.015 (54 s) in the last of 5 sessions; 5.7 min spent in all when" in text
    )
    one = card(base_model_facts(MMS), target_seconds=54.0, spent_seconds=50.0)
    assert "- Budget: --target_hours 0.015 (54 s); 50 s spent when" in one


def test_a_multi_speaker_card_says_to_give_a_speaker_id_also_to_the_pipeline():
    """transformers' VitsModel speaks with no speaker embedding when speaker_id is None (the pipeline's
    default): a voice no speaker was trained as. The card's usage gives one on every path it shows."""
    usage = card(base_model_facts(MMS), voices=3).split("## Usage")[1]
    assert "model(**inputs, speaker_id=0)" in usage
    assert 'forward_params={"speaker_id": 0}' in usage and "never trained on" in usage
    assert "forward_params" not in card(base_model_facts(MMS)).split("## Usage")[1]  # one voice: none needed


def test_a_card_never_calls_clips_also_trained_on_held_out():
    """A feedback round of fewer than 5 clips evaluates on clips it also trains on: its card must not
    call its samples and scores held out."""
    samples = (Sample("samples/sample_1.wav", "a b", "fb1"),)
    scores = (Evaluation("final", 120, {"val_mel": 1.0}),)
    trained = card(
        base_model_facts(MMS),
        samples=samples,
        evaluations=scores,
        eval_set="feedback clips",
        eval_trained=True,
    )
    assert "never trained on" not in trained and trained.count("also trained on") == 2
    held = card(base_model_facts(MMS), samples=samples, evaluations=scores)
    assert held.count("held out, never trained on") == 2


def test_a_resumed_session_that_trains_no_step_keeps_the_final_model_as_it_was(
    tmp_path, tone_corpus, tiny_model_dir, monkeypatch, capsys
):
    """A session resumed where no step fits (its budget too short) on other data exported the same
    weights again, and their card then named the new data's clips and hours, which never trained them."""
    from vits_trainer.data.synthetic import make_corpus
    from vits_trainer.training.budget import Budget

    run = dict(max_steps=2, val_fraction=0.1)
    _, first = train_tiny(tmp_path, tone_corpus, tiny_model_dir, **run)
    final = Path(first["final_model"])
    before = {p.name: p.read_bytes() for p in final.iterdir() if p.is_file()}
    assert "in 36 training clips" in before["README.md"].decode()
    other = tmp_path / "other"
    make_corpus(other, num_clips=60, sample_rate=16000, seed=5)
    monkeypatch.setattr(Budget, "should_stop", lambda self: True)  # no step fits
    capsys.readouterr()
    _, second = train_tiny(tmp_path, other, tiny_model_dir, **run)
    assert second["session_steps"] == 0 and second["final_model"] == str(final)
    assert {p.name: p.read_bytes() for p in final.iterdir() if p.is_file()} == before
    assert f"final model: {final} holds the weights of step 2 already" in capsys.readouterr().out


def test_the_data_line_counts_the_speakers_the_training_clips_have():
    """The speaker map names voices this data lacks (a base's speakers.json, a resumed run's) and may give
    one voice two names (a feedback folder's "0"): the card said "from 4 speakers" for clips of 3."""
    from vits_trainer.training.model_card import speakers_trained

    names = {"7": 0, "ali": 1, "zin": 2, "0": 0}
    assert speakers_trained(names, 3, np.array([0, 0, 1, 2, 1])) == 3
    assert speakers_trained(names, 3, np.array([1, 2, 2])) == 2
    assert speakers_trained({"a": 0, "b": 0, "c": 0}, 1, np.zeros(3, np.int64)) == 3  # one voice from 3


def test_a_multi_speaker_card_names_the_voice_of_each_speaker_id():
    # a stranger on the hub has the card, not the run's log: which speaker_id is which voice
    usage = card(base_model_facts(MMS), voices=2, speaker_names={"narin": 1, "azad": 0}).split("## Usage")[1]
    assert "`speaker_id` 0: azad, 1: narin" in usage
    many = {f"s{i:02d}": i for i in range(30)}
    usage = card(base_model_facts(MMS), voices=30, speaker_names=many).split("## Usage")[1]
    assert "s19" in usage and "s20" not in usage and "and 10 more in `speakers.json`" in usage
    # ids that are their own names (the data's speaker column held 0, 1) say nothing new: no list
    plain = card(base_model_facts(MMS), voices=2, speaker_names={"0": 0, "1": 1}).split("## Usage")[1]
    assert "`speaker_id` 0:" not in plain and "`speakers.json` maps" in plain


def test_the_usage_speaks_a_sentence_of_the_models_language():
    # "Text to speak." is not a sentence of a Kurdish voice; its samples' first sentence is
    samples = (Sample("samples/sample_1.wav", 'Silav, "tu" çawa yî?', "c1", 1, "narin"),)
    usage = (
        card(base_model_facts(MMS), samples=samples, voices=2).split("## Usage")[1].split("## Training")[0]
    )
    assert 'text = "Silav, \\"tu\\" çawa yî?"' in usage
    assert 'tts("Silav, \\"tu\\" çawa yî?", forward_params={"speaker_id": 1})' in usage  # its voice too
    assert "Text to speak." not in usage
    assert 'text = "Text to speak."' in card(base_model_facts(MMS)).split("## Usage")[1]  # no samples


def test_a_sentence_with_characters_yaml_may_not_hold_raw_keeps_the_front_matter_valid():
    """A transcript decoded with the wrong code page keeps C1 control characters ("it\\x92s"), which a YAML
    reader refuses raw: the whole front matter (license, widget) was unreadable, as the hub reads it
    too. Line and paragraph separators raw in a quoted scalar are read as line breaks: another text."""
    texts = ["it\x92s \x7fhere", "one\u2028two\u2029three\x85four"]
    samples = tuple(Sample(f"samples/sample_{k + 1}.wav", t, f"c{k}") for k, t in enumerate(texts))
    text = card(base_model_facts(MMS), samples=samples)
    assert [w["text"] for w in front_matter(text)["widget"]] == texts
