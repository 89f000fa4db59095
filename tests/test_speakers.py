"""--num_speakers: a single-speaker checkpoint fine-tuned on a multi-speaker corpus."""

from __future__ import annotations

import json
import re
import subprocess

import pytest
import torch
from helpers import PYTHON, ROOT, sigterm_at_batch, tiny_config, train_tiny
from transformers import VitsModel

from vits_trainer.data.items import speaker_map
from vits_trainer.data.synthetic import make_corpus
from vits_trainer.errors import UserError, run_cli
from vits_trainer.model.speakers import add_speakers, resolve_speakers
from vits_trainer.model.vits import apply_decoder_weight_norm, export_model, load_vits_model
from vits_trainer.speak import main as speak_main


def _speak(model, speaker_id=None, seed=7):
    ids = torch.tensor([[3, 5, 8, 2, 9, 4]])
    kwargs = {} if speaker_id is None else {"speaker_id": speaker_id}
    torch.manual_seed(seed)
    with torch.no_grad():
        return model.eval()(input_ids=ids, **kwargs).waveform


@pytest.fixture
def single(tiny_model_dir):
    model = load_vits_model(tiny_model_dir)
    apply_decoder_weight_norm(model)  # as a training session holds it
    return model


def test_new_speakers_start_with_the_original_voice(single):
    wide = add_speakers(single, 3)
    assert wide.config.num_speakers == 3 and wide.config.speaker_embedding_size > 0
    before = _speak(single)
    for speaker in range(3):
        assert torch.equal(_speak(wide, speaker), before), speaker


def test_exported_multi_speaker_model_loads_with_transformers_and_voices_differ(
    single, tiny_model_dir, tmp_path
):
    from transformers import VitsTokenizer

    wide = add_speakers(single, 2)
    torch.manual_seed(0)
    with torch.no_grad():  # what training does to the zero-initialised projections, in one jump
        for name, p in wide.named_parameters():
            if ".cond" in name:
                p.normal_(0, 0.3)
    out = export_model(
        wide, VitsTokenizer.from_pretrained(tiny_model_dir), tmp_path / "out", {"a": 0, "b": 1}
    )
    loaded = VitsModel.from_pretrained(out)
    assert loaded.config.num_speakers == 2
    assert json.loads((out / "speakers.json").read_text()) == {"a": 0, "b": 1}
    a, b = _speak(loaded, 0), _speak(loaded, 1)
    assert not torch.allclose(a[..., : min(a.size(-1), b.size(-1))], b[..., : min(a.size(-1), b.size(-1))])
    assert torch.allclose(_speak(wide, 1), b, atol=1e-4)  # the export is the trained model


def test_without_the_flag_one_voice_and_a_warning_that_names_it():
    lines = []
    assert speaker_map(["0", "1", "1"], 1, log=lines.append) == {"0": 0, "1": 0}
    assert "--num_speakers auto" in lines[0]


@pytest.mark.parametrize("value", ["0", "two", "-1"])
def test_bad_num_speakers_is_one_clear_error(value, tmp_path, tone_corpus, tiny_model_dir):
    with pytest.raises(UserError, match="--num_speakers"):
        tiny_config(tmp_path, tone_corpus, tiny_model_dir, num_speakers=value)


def test_multi_speaker_fine_tune_exports_each_voice_and_resume_keeps_the_map(
    tmp_path, tiny_model_dir, capsys
):
    corpus = tmp_path / "corpus"
    make_corpus(corpus, num_clips=24, num_speakers=2, seed=3)
    fast = dict(val_fraction=0.2)
    session, summary = train_tiny(tmp_path, corpus, tiny_model_dir, max_steps=2, num_speakers="auto", **fast)
    first_lines = capsys.readouterr().out
    assert session.model.config.num_speakers == 2 and session.speakers == {"0": 0, "1": 1}

    final = tmp_path / "final_model"
    model = VitsModel.from_pretrained(final)  # plain transformers, no project code
    assert model.config.num_speakers == 2
    assert json.loads((final / "speakers.json").read_text()) == {"0": 0, "1": 1}
    a, b = _speak(model, 0), _speak(model, 1)
    n = min(a.size(-1), b.size(-1))
    assert not torch.equal(a[..., :n], b[..., :n])  # two steps already separate the voices

    state = json.loads((tmp_path / "checkpoints" / "step_00000002" / "trainer_state.json").read_text())
    assert state["speakers"] == {"0": 0, "1": 1}
    # speak.py hears the checkpoint as the export of the same step: same voice by name, same take
    for model_dir in ("final_model", "checkpoints/step_00000002"):
        wav = tmp_path / f"{model_dir.replace('/', '_')}.wav"
        args = ["--model", tmp_path / model_dir, "--text", "abc", "--out", wav, "--speaker", "1"]
        assert run_cli(speak_main, [str(a) for a in args]) == 0
    assert (tmp_path / "final_model.wav").read_bytes() == (
        tmp_path / "checkpoints_step_00000002.wav"
    ).read_bytes()
    # resumed without the flag: the checkpoint's multi-speaker model and map come back as they were
    resumed, _ = train_tiny(tmp_path, corpus, tiny_model_dir, max_steps=3, **fast)
    assert resumed.resumed_from is not None
    assert resumed.model.config.num_speakers == 2 and resumed.speakers == {"0": 0, "1": 1}
    # the start line counted the single-speaker model loaded (0.8 M), the resumed one the trained (1.1 M)
    trained = sum(p.numel() for p in resumed.model.parameters()) / 1e6
    resumed_line = re.search(r"model: .*\(([\d.]+) M parameters\)", capsys.readouterr().out).group(1)
    assert resumed_line == f"{trained:.1f}"
    assert f"model: {trained:.1f} M parameters trained (" in first_lines and "for 2 speakers" in first_lines


def test_a_resumed_single_voice_run_trains_its_voice_on_speakers_it_has_not_seen(single):
    # its map is {"0": 0} when its data named no speaker; prepare_data.py now reads a table's speaker
    # column, so the same table prepared again names them: every clip was dropped as an unknown speaker
    # and the resume ended in "no usable training clips"
    _, mapping = resolve_speakers(None, single, ["ben", "anna", "ben"], {"0": 0}, print)
    assert mapping == {"0": 0, "anna": 0, "ben": 0}
    wide = add_speakers(single, 2)  # a multi-speaker run's map stays as it is: its voices are its own
    assert resolve_speakers(None, wide, ["anna"], {"0": 0, "1": 1}, print)[1] == {"0": 0, "1": 1}


def test_the_start_line_says_which_id_each_speaker_got(single):
    # the ids are what speak.py --speaker_id and the pipeline's forward_params take: the log names them
    lines = []
    _, mapping = resolve_speakers("auto", single, ["narin", "azad", "narin"], None, lines.append)
    assert mapping == {"azad": 0, "narin": 1}
    assert any("azad = 0, narin = 1" in line for line in lines), lines


def test_a_run_from_an_exported_model_of_several_voices_keeps_their_ids(single, tmp_path):
    """An export's speakers.json (7 = 0, ali = 1, zin = 2) fine-tuned on ali and zin alone was renumbered
    from the data (ali = 0, zin = 1): each trained another voice's embedding, and nothing said so."""
    from vits_trainer.model.speakers import read_known_speakers

    wide = add_speakers(single, 3)
    (tmp_path / "speakers.json").write_text(json.dumps({"7": 0, "ali": 1, "zin": 2}))
    known = read_known_speakers(tmp_path, print)
    lines = []
    _, mapping = resolve_speakers(None, wide, ["zin", "ali", "zin"], None, lines.append, known=known)
    assert mapping == {"ali": 1, "zin": 2, "7": 0}  # the voice absent from this data is still named
    # a new name takes an id no known voice has; with none left, one of a voice absent here, said
    assert speaker_map(["bob", "ali"], 4, known=known) == {"ali": 1, "bob": 3, "7": 0, "zin": 2}
    lines = []
    assert speaker_map(["bob", "ali"], 3, log=lines.append, known=known) == {"ali": 1, "bob": 0, "zin": 2}
    assert lines == [
        "note: speaker 'bob' takes speaker_id 0, the voice of 7 in the model's speakers.json (not in this "
        "data): every other id is taken"
    ]
    assert read_known_speakers(tmp_path / "nowhere", print) is None
    # two names of one voice (a feedback round's "0" beside "7"): both stay
    assert speaker_map(["0", "ali"], 3, known={**known, "0": 0}) == {"0": 0, "7": 0, "ali": 1, "zin": 2}
    # data without a speaker column (all "0") trains voice 0, whose name the note gives
    lines = []
    assert speaker_map(["0"], 3, log=lines.append, known=known) == {"0": 0, "ali": 1, "zin": 2}
    assert lines == [
        "note: speaker '0' is not a name of the model's speakers.json; it trains speaker_id 0, the voice "
        "of 7 there"
    ]


def test_a_long_speaker_map_is_cut_short_in_the_log(single):
    lines = []
    names = [f"s{i:02d}" for i in range(30)]
    resolve_speakers("auto", single, names, None, lines.append)
    line = next(line for line in lines if line.startswith("speakers:"))
    assert "s00 = 0" in line and "and 22 more" in line and "s29" not in line, line


def test_the_speaker_map_line_names_only_what_the_ids_do_not_say():
    from vits_trainer.model.speakers import describe_map

    assert describe_map({"narin": 1, "azad": 0}) == "azad = 0, narin = 1"
    # a corpus whose speakers are named by number: "0 = 0, 1 = 1" told the reader nothing
    assert describe_map({"0": 0, "1": 1}) == "ids 0 and 1, as the data names them"
    assert describe_map({str(i): i for i in range(12)}) == "ids 0 to 11, as the data names them"


def test_speaker_names_are_read_without_loading_torch():
    """speak.py checks a model's speaker names before torch loads, with model/speakers.py's rule for a
    name that is just its id: that module must import without torch."""
    code = (
        "import sys\n"
        "from vits_trainer.model.speakers import is_bare_id\n"
        "import vits_trainer.speak\n"
        "print(is_bare_id('0', 0), is_bare_id('azad', 0), 'torch' in sys.modules)"
    )
    out = subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert out.stdout.split() == ["True", "False", "False"], out.stderr


def test_a_multi_speaker_run_scores_and_samples_every_voice(tmp_path, tiny_model_dir, capsys):
    """Clip ids that go speaker by speaker (p225_001 ... p226_001, as many corpora's do): the samples and
    the free-running sentences take the first validation clips, which were all one voice's; and the
    scores averaged over every voice hid one that lags. Each evaluation now scores each voice, in the
    log, metrics.jsonl, report.html and the model card, and the samples take each voice in turn."""
    corpus = tmp_path / "corpus"
    make_corpus(corpus, num_clips=24, num_speakers=1, seed=3)
    meta = corpus / "metadata.csv"
    rows = [row.rsplit("|", 1)[0] for row in meta.read_text(encoding="utf-8").splitlines()]
    # clips 0-15 are speaker 0's, 16-23 speaker 1's: the first validation clips (seed 0) are 7 and 13
    meta.write_text("".join(f"{row}|{int(k >= 16)}\n" for k, row in enumerate(rows)), encoding="utf-8")
    session, _ = train_tiny(
        tmp_path, corpus, tiny_model_dir, max_steps=2, num_speakers="auto", val_fraction=0.2, eval_samples=2
    )
    out = capsys.readouterr().out
    val = session.data.val_sets["val"]
    assert set(val.speaker_ids.tolist()) == {0, 1}
    folder = tmp_path / "checkpoints"
    evals = [
        json.loads(line)
        for line in (folder / "metrics.jsonl").read_text().splitlines()
        if json.loads(line).get("event") == "eval"
    ]
    assert [e["tag"] for e in evals] == ["start", "final"]
    for record in evals:
        voices = record["by_speaker"]
        assert sorted(voices) == ["0", "1"] and [voices[n]["speaker_id"] for n in ("0", "1")] == [0, 1]
        assert sum(v["clips"] for v in voices.values()) == len(val)
        mean = sum(v["val_mel"] * v["clips"] for v in voices.values()) / len(val)
        assert mean == pytest.approx(record["val_mel"], rel=1e-5)  # the same clips, split by voice
        line = f"eval ({record['tag']}) step {record['step']}, val_mel by speaker: 0 {voices['0']['val_mel']:.4f}"
        assert line in out, out
    summary = json.loads((folder / "train_summary.json").read_text())
    assert summary["final_by_speaker"] == evals[-1]["by_speaker"]  # the final weights' scores by voice
    sentences = json.loads((folder / "samples" / "reference" / "sentences.json").read_text())
    assert sorted(s["speaker"] for s in sentences.values()) == [0, 1]  # both voices heard
    assert '<section id="speakers">' in (folder / "report.html").read_text(encoding="utf-8")
    card = (tmp_path / "final_model" / "README.md").read_text(encoding="utf-8")
    assert "By voice" in card and f"| 1 | 1 | {evals[-1]['by_speaker']['1']['clips']} |" in card


def test_validation_clips_take_each_voice_in_turn_and_one_voice_keeps_its_order():
    from vits_trainer.training.datasplit import interleave_voices

    names = ["b", "b", "b", "a", "c", "a"]  # the store's speaker of each position
    speakers = {"a": 0, "b": 1, "c": 2}
    assert interleave_voices([0, 1, 2, 3, 4, 5], names, speakers) == [3, 0, 4, 5, 1, 2]
    assert interleave_voices([2, 0, 1], names, speakers) == [2, 0, 1]  # one voice: as it was
    assert interleave_voices([2, 0, 5], names, {"a": 0, "b": 0, "c": 0}) == [2, 0, 5]  # trained as one voice


def test_the_voices_line_names_the_set_it_scored():
    """A feedback round scores the voices on its feedback clips, whose val_mel is feedback_val_mel: its
    line read `val_mel by speaker`, the original validation's name, beside a different val_mel."""
    from vits_trainer.training.outputs import describe_speaker_scores

    voices = {
        "zin": {"speaker_id": 1, "clips": 1, "val_mel": 1.5},
        "ali": {"speaker_id": 0, "clips": 2, "val_mel": 1.25},
        "rojda": {"speaker_id": 2, "clips": 0},
    }
    assert describe_speaker_scores("by_speaker", voices) == (
        "val_mel by speaker: ali 1.2500 (2 clips), zin 1.5000 (1 clip), rojda – (no validation clip)"
    )
    assert describe_speaker_scores("feedback_by_speaker", voices).startswith(
        "feedback_val_mel by speaker: ali"
    )
    many = {f"s{i}": {"speaker_id": i, "clips": 1, "val_mel": 1.0} for i in range(10)}
    assert describe_speaker_scores("by_speaker", many, limit=3).endswith(
        "s2 1.0000 (1 clip) and 7 more in report.html"
    )


def test_voices_without_a_validation_clip_are_named_before_training():
    """A random split of a few clips leaves voices out: every evaluation then leaves them unscored and
    unheard, which the start of the run now says, with what to do."""
    from vits_trainer.training.datasplit import unscored_voices_note

    speakers = {"ali": 0, "zin": 1, "rojda": 2}
    note = unscored_voices_note(speakers, [0, 0, 2])
    assert note.startswith("note: 1 of 3 voices have no validation clip (zin): ") and "--val_fraction" in note
    assert unscored_voices_note(speakers, [2, 1, 0]) is None
    assert unscored_voices_note({"ali": 0, "zin": 0}, [0]) is None  # trained as one voice
    many = {f"s{i:02d}": i for i in range(12)}
    assert "(s01, s02, s03, s04, s05, s06, s07, s08 and 3 more)" in unscored_voices_note(many, [0])


def test_a_run_without_validation_is_not_told_its_voices_lack_a_validation_clip(tmp_path, tiny_model_dir):
    """--val_fraction 0 holds out nothing on purpose: no voice was left out by the random split, and the
    note (with its advice to raise --val_fraction) would only repeat what the run asked for."""
    from vits_trainer.data.clipstore import load_clip_store
    from vits_trainer.data.text import TextEncoder
    from vits_trainer.training.datasplit import split_data

    corpus = tmp_path / "corpus"
    make_corpus(corpus, num_clips=12, num_speakers=2, seed=3)
    store, _ = load_clip_store(corpus, 16000, log=lambda line: None, progress=False)
    speakers = speaker_map(store.speakers, 2)
    text = TextEncoder.from_pretrained(tiny_model_dir)
    cfg = tiny_config(tmp_path, corpus, tiny_model_dir, val_fraction=0.0, num_speakers="auto")
    lines = []
    data = split_data(cfg, store, text, speakers, 256, None, lines.append)
    assert data.val_sets == {} and len(set(speakers.values())) == 2
    assert not any("no validation clip" in line for line in lines), lines


def test_a_voice_the_data_does_not_speak_is_not_said_to_lack_a_validation_clip(tmp_path, tiny_model_dir):
    """A voice of the base's speakers.json with no clip in this data kept its id in the map; the note
    said it had no validation clip and advised a larger --val_fraction, which cannot hold it out."""
    from vits_trainer.data.clipstore import load_clip_store
    from vits_trainer.data.text import TextEncoder
    from vits_trainer.training.datasplit import split_data

    corpus = tmp_path / "corpus"
    make_corpus(corpus, num_clips=12, num_speakers=1, seed=3)
    store, _ = load_clip_store(corpus, 16000, log=lambda line: None, progress=False)
    speakers = speaker_map(store.speakers, 3, known={"rojda": 1, "zin": 2})
    assert set(speakers) == {"0", "rojda", "zin"}
    cfg = tiny_config(tmp_path, corpus, tiny_model_dir, val_fraction=0.25)
    lines = []
    data = split_data(
        cfg, store, TextEncoder.from_pretrained(tiny_model_dir), speakers, 256, None, lines.append
    )
    assert len(data.val_sets["val"]) > 0
    assert not any("no validation clip" in line for line in lines), lines


def test_the_note_on_voices_without_a_validation_clip_comes_when_the_split_is_drawn_only():
    """A resume keeps its split (a new --val_fraction changes nothing there): the note, whose advice is a
    larger --val_fraction, is said when the split is drawn, not again at every resume."""
    from types import SimpleNamespace

    import numpy as np

    from vits_trainer.data.clipstore import ClipStore
    from vits_trainer.training.config import TrainConfig
    from vits_trainer.training.datasplit import split_data

    n = 12
    lengths = np.full(n, 4000, dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    names = ["ali"] * (n - 1) + ["zin"]  # one clip of zin's: in training, or the only validation one
    store = ClipStore(
        [f"c{k}" for k in range(n)], ["a"] * n, names, offsets, np.zeros(offsets[-1], np.int16), 16000
    )
    text = SimpleNamespace(encode=lambda s: [1, 2])
    cfg = TrainConfig(val_fraction=0.25, seed=0)
    speakers = {"ali": 0, "zin": 1}
    lines: list[str] = []
    data = split_data(cfg, store, text, speakers, 256, None, lines.append)
    assert "c11" not in data.val_ids  # zin's clip trains: zin is never scored
    notes = [line for line in lines if "no validation clip" in line]
    assert len(notes) == 1 and "(zin)" in notes[0], lines
    lines.clear()
    split_data(cfg, store, text, speakers, 256, data.val_ids, lines.append)  # the resume
    assert not [line for line in lines if "no validation clip" in line], lines


def test_voice_scores_weigh_each_clip_and_leave_out_a_batch_of_several_voices():
    """evaluate's by_speaker is each voice's mean over its clips: a batch of two clips counts twice, and
    a batch mixing voices (one mean for all of them) is no voice's."""
    from types import SimpleNamespace

    from vits_trainer.training.evaluate import evaluate

    class Fixed(torch.nn.Module):  # the batch's val_mel is its first token
        def forward(self, input_ids, *rest, **kwargs):
            return SimpleNamespace(mel=float(input_ids[0, 0]), kl=0.0, duration=0.0)

    def batch(mel: float, speakers: list[int]) -> dict:
        n = len(speakers)
        return {
            "input_ids": torch.full((n, 1), mel),
            "attention_mask": torch.ones(n, 1),
            "audio": torch.zeros(n, 4),
            "audio_lengths": torch.full((n,), 4),
            "speaker_ids": torch.tensor(speakers),
        }

    voices: dict = {}
    loader = [batch(1.0, [0, 0]), batch(3.0, [1]), batch(2.0, [0]), batch(5.0, [0, 1])]
    result = evaluate(Fixed(), loader, torch.device("cpu"), by_speaker=voices)
    assert voices == {0: (pytest.approx(4 / 3), 3), 1: (3.0, 1)}
    assert result["val_mel"] == pytest.approx((2 * 1.0 + 3.0 + 2.0 + 2 * 5.0) / 6)


def test_the_voices_are_scored_on_the_first_set_alone_under_its_name(monkeypatch):
    """A feedback round scores its feedback clips first, then the original validation: the voice scores
    are the first set's alone, under its prefix; a first set that scores no voice gives none, not the
    next set's under its name."""
    from types import SimpleNamespace

    from vits_trainer.training import outputs
    from vits_trainer.training.outputs import RunOutputs

    per_set = {"feedback": {0: (1.0, 2)}, "val": {0: (9.0, 3), 1: (8.0, 3)}}

    def fake_evaluate(generator, loader, device, autocast=None, weights=None, by_speaker=None):
        if by_speaker is not None:
            by_speaker.update(per_set[loader])
        return {"val_mel": 1.0}

    monkeypatch.setattr(outputs, "evaluate", fake_evaluate)
    monkeypatch.setattr(outputs, "free_running_eval", lambda s: ({}, []))
    session = SimpleNamespace(
        val_loaders={"feedback": "feedback", "val": "val"},
        generator_raw=None,
        device="cpu",
        accelerator=SimpleNamespace(autocast=None),
        cfg=SimpleNamespace(loss_weights=lambda: None),
        model=SimpleNamespace(config=SimpleNamespace(num_speakers=2)),
        speakers={"ali": 0, "zin": 1},
    )
    results, _, voices = RunOutputs.score(SimpleNamespace(s=session))
    assert results == {"feedback_val_mel": 1.0, "val_mel": 1.0}
    assert voices == {
        "feedback_by_speaker": {
            "ali": {"speaker_id": 0, "clips": 2, "val_mel": 1.0},
            "zin": {"speaker_id": 1, "clips": 0},
        }
    }
    session.model.config.num_speakers = 1  # one voice: its score is the mean itself
    assert RunOutputs.score(SimpleNamespace(s=session))[2] == {}
    session.model.config.num_speakers = 2
    per_set["feedback"] = {}  # no voice scored on the first set
    assert RunOutputs.score(SimpleNamespace(s=session))[2] == {}


def test_a_run_whose_final_weights_were_not_scored_gives_no_final_voice_scores(
    tmp_path, tiny_model_dir, monkeypatch
):
    """train_summary.json's final_by_speaker is the final weights' evaluation alone, as final_val is: a
    run stopped before its final evaluation gave the start evaluation's voice scores as the final ones."""

    corpus = tmp_path / "corpus"
    make_corpus(corpus, num_clips=24, num_speakers=1, seed=3)
    meta = corpus / "metadata.csv"
    rows = [row.rsplit("|", 1)[0] for row in meta.read_text(encoding="utf-8").splitlines()]
    meta.write_text("".join(f"{row}|{int(k >= 16)}\n" for k, row in enumerate(rows)), encoding="utf-8")
    sigterm_at_batch(monkeypatch, 2)
    _, summary = train_tiny(
        tmp_path, corpus, tiny_model_dir, max_steps=50, num_speakers="auto", val_fraction=0.2
    )
    assert summary["stopped_reason"] == "signal" and summary["final_val"] is None
    assert "final_by_speaker" not in summary, summary


def test_a_voice_with_no_training_clip_is_named_before_training():
    """50 speakers of one clip each with --num_speakers auto: the 4 voices whose only clip was held out
    for validation got an embedding no step trains, exported in speakers.json as if trained, and nothing
    said so. A warning names them; a voice with a training clip, or a model of one voice, gets none."""
    from types import SimpleNamespace

    import numpy as np

    from vits_trainer.data.clipstore import ClipStore
    from vits_trainer.training.config import TrainConfig
    from vits_trainer.training.datasplit import split_data

    n = 12
    lengths = np.full(n, 4000, dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    names = ["ali"] * (n - 1) + ["zin"]
    store = ClipStore(
        [f"c{k}" for k in range(n)], ["a"] * n, names, offsets, np.zeros(offsets[-1], np.int16), 16000
    )
    text = SimpleNamespace(encode=lambda s: [1, 2])
    cfg = TrainConfig(val_fraction=0.25, seed=0)
    lines: list[str] = []
    split_data(cfg, store, text, {"ali": 0, "zin": 1}, 256, ["c0", "c11"], lines.append)  # zin: val only
    warnings = [line for line in lines if "no training clip" in line]
    assert len(warnings) == 1 and warnings[0].startswith("warning: 1 of 2 voices have no training clip (zin)")
    lines.clear()
    split_data(cfg, store, text, {"ali": 0, "zin": 1}, 256, ["c0", "c1"], lines.append)  # zin trains
    split_data(cfg, store, text, {"ali": 0, "zin": 0}, 256, ["c0", "c11"], lines.append)  # one voice
    assert not [line for line in lines if "no training clip" in line], lines
    # --max_samples 2 leaves zin's clip out, not zin: the model still gets (and exports) that voice
    cfg = TrainConfig(val_fraction=0.25, seed=0, max_samples=2)
    split_data(cfg, store, text, {"ali": 0, "zin": 1}, 256, ["c0"], lines.append)
    assert any(
        line.startswith("warning: 1 of 2 voices have no training clip (zin)") and "past --max_samples" in line
        for line in lines
    ), lines
