"""TextEncoder against the checkpoint's own VitsTokenizer, uroman romanisation, vocabulary extension."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch
import uroman
from transformers import VitsModel, VitsTokenizer

from vits_trainer.data.text import TextEncoder, extend_vocabulary
from vits_trainer.model.tiny import make_tokenizer

LATIN = "abcdefghijklmnopqrstuvwxyz '"
# Cyrillic, Arabic, Ethiopic (lower-case already: the tokenizer lower-cases before romanising)
NON_LATIN = ["привет мир", "سلام عليكم", "ሰላም ልዑል"]


@pytest.fixture
def tokenizer(tmp_path: Path) -> VitsTokenizer:
    return make_tokenizer(tmp_path / "tok")  # a-o and space, blank "_" at id 0


def uroman_tokenizer_dir(folder: Path) -> Path:
    """A latin-letter tokenizer marked `is_uroman`, saved the way a checkpoint ships it."""
    make_tokenizer(folder, LATIN)
    config_file = folder / "tokenizer_config.json"
    config = json.loads(config_file.read_text(encoding="utf-8"))
    config["is_uroman"] = True
    config_file.write_text(json.dumps(config, indent=1), encoding="utf-8")
    return folder


@pytest.fixture(scope="module")
def uroman_encoder(tmp_path_factory) -> TextEncoder:
    """Built once for the module: a Uroman instance takes about 2 s to construct."""
    return TextEncoder.from_pretrained(uroman_tokenizer_dir(tmp_path_factory.mktemp("uroman_tok")))


# --- plain character tokenizers --------------------------------------------------------------------


def test_encode_matches_the_tokenizer_with_blanks(tokenizer: VitsTokenizer) -> None:
    encoder = TextEncoder(tokenizer)
    vocab = tokenizer.encoder
    for text in ["abc def", "ABC Def", "a", "no", "hello, world!"]:
        ids = encoder.encode(text)
        assert ids == tokenizer(text)["input_ids"], text
        # add_blank: the blank (id 0) around and between every kept character
        kept = [ch for ch in text.lower() if ch in vocab]
        assert ids[0::2] == [0] * (len(kept) + 1)
        assert ids[1::2] == [vocab[ch] for ch in kept]
    assert encoder.encode("") == tokenizer("")["input_ids"]


def test_encode_normalises_to_nfc(tokenizer: VitsTokenizer, tmp_path: Path) -> None:
    encoder = TextEncoder(make_tokenizer(tmp_path / "accents", "abcé "))
    # "e" + combining acute is "é" after NFC; the tokenizer alone would drop the combining mark
    assert encoder.encode("cafe\u0301") == encoder.encode("caf\u00e9")


def test_unknown_characters_respects_lower_casing(tokenizer: VitsTokenizer) -> None:
    encoder = TextEncoder(tokenizer)
    assert encoder.unknown_characters(["abc", "ABC DEF", "Hello"]) == {}
    missing = encoder.unknown_characters(["abz", "AbZ!", "xyz"])
    # 'Z' is lower-cased by the tokenizer, then dropped: one missing character 'z' (a run with 'R' and
    # 'r' listed both as missing, then extended its vocabulary by 'r' alone)
    assert missing == {"z": 3, "!": 1, "x": 1, "y": 1}
    # exactly the characters the tokenizer drops
    assert encoder.encode("a!b") == encoder.encode("ab")


def test_unknown_characters_without_normalisation(tmp_path: Path) -> None:
    make_tokenizer(tmp_path, "abc ")
    tok = VitsTokenizer(
        str(tmp_path / "vocab.json"), pad_token="_", unk_token="_", normalize=False, phonemize=False
    )
    # no lower-casing: "A" is not "a"
    assert TextEncoder(tok).unknown_characters(["aA"]) == {"A": 1}


# --- uroman ----------------------------------------------------------------------------------------


def test_is_uroman_round_trips_through_the_saved_config(uroman_encoder: TextEncoder) -> None:
    assert uroman_encoder.tokenizer.is_uroman
    assert uroman_encoder._uroman is not None


def test_uroman_encode_equals_encoding_the_romanisation(uroman_encoder: TextEncoder) -> None:
    reference = uroman.Uroman()
    tok = uroman_encoder.tokenizer
    for text in NON_LATIN:
        romanised = reference.romanize_string(text)
        assert romanised.isascii() and romanised.strip(), (text, romanised)
        ids = uroman_encoder.encode(text)
        assert ids == tok(romanised)["input_ids"], (text, romanised)
        assert any(i != 0 for i in ids), text  # real characters, not only blanks
        assert uroman_encoder.unknown_characters([text]) == {}


def test_uroman_encode_equals_the_tokenizer_itself(uroman_encoder: TextEncoder) -> None:
    """The tokenizer romanises on its own (a new Uroman per call): one call covers all three scripts."""
    text = " ".join(NON_LATIN) + " Привет ABC"
    assert uroman_encoder.encode(text) == uroman_encoder.tokenizer(text)["input_ids"]


def test_one_uroman_instance_for_any_number_of_calls(tmp_path: Path, monkeypatch) -> None:
    made = []

    class CountingUroman(uroman.Uroman):
        def __init__(self, *args, **kwargs):
            start = time.perf_counter()
            super().__init__(*args, **kwargs)
            made.append(time.perf_counter() - start)

    monkeypatch.setattr(uroman, "Uroman", CountingUroman)
    encoder = TextEncoder.from_pretrained(uroman_tokenizer_dir(tmp_path))
    assert len(made) == 1
    texts = [f"{NON_LATIN[i % 3]} {i}" for i in range(200)]
    start = time.perf_counter()
    encoded = [encoder.encode(t) for t in texts]
    elapsed = time.perf_counter() - start
    assert len(made) == 1, "a Uroman was built per call"
    assert all(len(ids) > 1 for ids in encoded)
    # 200 constructions would take 200x made[0]; one shared instance is a small fraction of even 20
    assert elapsed < 20 * made[0], (elapsed, made[0])


# --- vocabulary extension --------------------------------------------------------------------------


def test_extend_vocabulary_grows_embedding_and_tokenizer(tiny_model_dir: Path, tmp_path: Path) -> None:
    model = VitsModel.from_pretrained(tiny_model_dir)
    encoder = TextEncoder.from_pretrained(tiny_model_dir)
    old_vocab = dict(encoder.vocab)
    old_rows = model.text_encoder.embed_tokens.weight.detach().clone()
    before = {k: v.clone() for k, v in model.state_dict().items() if "embed_tokens" not in k}

    # duplicates and already-known characters ("a", " ") are ignored
    added = extend_vocabulary(model, encoder, ["x", "ŋ", "x", "a", " ", "ŋ", "z"], tmp_path / "ext")
    assert added == ["x", "ŋ", "z"]
    n_old, n_new = len(old_vocab), len(old_vocab) + 3
    assert len(encoder.vocab) == n_new
    assert {ch: encoder.vocab[ch] for ch in old_vocab} == old_vocab  # old ids unchanged
    assert [encoder.vocab[ch] for ch in added] == [n_old, n_old + 1, n_old + 2]

    embed = model.text_encoder.embed_tokens
    assert embed.weight.shape == (n_new, old_rows.shape[1])
    assert torch.equal(embed.weight[:n_old], old_rows)  # bit-identical
    assert torch.isfinite(embed.weight[n_old:]).all()
    assert embed.weight.requires_grad
    assert model.config.vocab_size == n_new
    # nothing else in the model changed
    after = model.state_dict()
    assert all(torch.equal(after[k], v) for k, v in before.items())

    # the saved tokenizer reloads with plain transformers and knows the new characters
    reloaded = VitsTokenizer.from_pretrained(tmp_path / "ext")
    assert reloaded.encoder == encoder.vocab
    assert reloaded.add_blank and reloaded.normalize and not reloaded.phonemize
    ids = reloaded("xaŋz")["input_ids"]
    assert ids == [0, n_old, 0, old_vocab["a"], 0, n_old + 1, 0, n_old + 2, 0]
    assert encoder.encode("xaŋz") == ids
    assert encoder.unknown_characters(["xaŋz"]) == {}

    # the extended model synthesises from text with the new characters
    torch.manual_seed(0)
    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids]))
    assert out.waveform.shape[0] == 1 and out.waveform.shape[-1] > 0
    assert torch.isfinite(out.waveform).all()


def test_extend_vocabulary_with_nothing_new_changes_nothing(tiny_model_dir: Path, tmp_path: Path) -> None:
    model = VitsModel.from_pretrained(tiny_model_dir)
    encoder = TextEncoder.from_pretrained(tiny_model_dir)
    embed, tok = model.text_encoder.embed_tokens, encoder.tokenizer
    assert extend_vocabulary(model, encoder, ["a", "b", "a"], tmp_path / "ext") == []
    assert model.text_encoder.embed_tokens is embed and encoder.tokenizer is tok


def test_extend_vocabulary_never_shares_an_embedding_row(tmp_path: Path) -> None:
    """A vocabulary with a gap in its ids and an embedding larger than the vocabulary: new characters
    get ids past both, so no new character reuses an existing row; upper case folds to lower case."""
    from vits_trainer.model.tiny import tiny_config

    folder = tmp_path / "gappy"
    folder.mkdir()
    (folder / "vocab.json").write_text(json.dumps({"_": 0, "a": 1, "b": 3, " ": 4}), encoding="utf-8")
    tok = VitsTokenizer(str(folder / "vocab.json"), pad_token="_", unk_token="_", phonemize=False)
    torch.manual_seed(0)
    model = VitsModel(tiny_config(vocab_size=20))  # 20 rows for a 4-entry vocabulary
    encoder = TextEncoder(tok)
    old = model.text_encoder.embed_tokens.weight.detach().clone()
    added = extend_vocabulary(model, encoder, ["X", "x", "a"], tmp_path / "out")
    assert added == ["x"]
    assert encoder.vocab["x"] == 20 and model.config.vocab_size == 21
    weight = model.text_encoder.embed_tokens.weight
    assert weight.shape[0] == 21 and torch.equal(weight[:20], old)
    assert encoder.encode("xa")[1] == 20
