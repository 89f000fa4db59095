"""Text side: the checkpoint's own VitsTokenizer, uroman romanisation, vocabulary extension.

MMS tokenizers are character vocabularies with `add_blank` (id 0 between characters) and a normaliser
that lower-cases and silently drops characters the vocabulary lacks. Dropped characters are reported
here before training, never discarded quietly.
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections import Counter
from pathlib import Path

import torch
from transformers import VitsTokenizer

from ..errors import UserError

_NON_ASCII = re.compile(r"[^\x00-\x7F]")


class TextEncoder:
    """Turns transcripts into token ids exactly as the checkpoint's tokenizer does at inference."""

    def __init__(self, tokenizer: VitsTokenizer):
        self.tokenizer = tokenizer
        self._uroman = None
        if getattr(tokenizer, "is_uroman", False):
            try:
                import uroman
            except ImportError:
                raise UserError(
                    "this checkpoint's tokenizer expects romanised text (is_uroman): pip install uroman"
                ) from None
            # one instance for the whole run: the tokenizer would build a new one (slow) per call
            self._uroman = uroman.Uroman()

    @classmethod
    def from_pretrained(cls, model_dir: str | Path) -> TextEncoder:
        try:
            tokenizer = VitsTokenizer.from_pretrained(str(model_dir))
        except (OSError, ValueError) as err:
            raise UserError(f"{model_dir}: cannot load the tokenizer ({err})") from None
        return cls(tokenizer)

    @property
    def vocab(self) -> dict[str, int]:
        return self.tokenizer.encoder

    def prepare(self, text: str) -> str:
        """The text the tokenizer actually sees: NFC, romanised when the checkpoint wants it."""
        text = unicodedata.normalize("NFC", text)
        if self._uroman is not None:
            # same order as the tokenizer: lower-case, language fix-ups, then romanise
            if getattr(self.tokenizer, "normalize", True):
                text = self.tokenizer.normalize_text(text)
            text = self.tokenizer._preprocess_char(text)
        if self._uroman is not None and _NON_ASCII.search(text):
            text = self._uroman.romanize_string(text)
        return text

    def encode(self, text: str) -> list[int]:
        return self.tokenizer(self.prepare(text))["input_ids"]

    def unknown_characters(self, texts: list[str]) -> Counter:
        """Characters the vocabulary lacks (after the tokenizer's own lower-casing): they would be dropped."""
        vocab = self.vocab
        normalise = getattr(self.tokenizer, "normalize", True)
        missing: Counter = Counter()
        for text in texts:
            for ch in self.prepare(text):
                if ch in vocab or (normalise and ch.lower() in vocab):
                    continue
                # as the tokenizer drops it: 'R' and 'r' are one missing character, 'r' (as
                # prepare_data.py counts them, and as --extend_vocab adds them)
                missing[ch.lower() if normalise else ch] += 1
        return missing


def extend_vocabulary(model, text_encoder: TextEncoder, characters: list[str], save_dir: Path) -> list[str]:
    """Add `characters` to the vocabulary and the text embedding; existing rows are kept as they are.

    New rows start at the mean of the existing ones (a neutral point the model already handles) plus
    a little noise so they can separate. The extended tokenizer is written to `save_dir`.
    """
    tokenizer = text_encoder.tokenizer
    if getattr(tokenizer, "normalize", True):  # the tokenizer lower-cases what it does not know
        characters = [c.lower() for c in characters]
    new = [c for c in dict.fromkeys(characters) if c not in tokenizer.encoder]
    if not new:
        return []
    embed = model.text_encoder.embed_tokens
    # ids after both the vocabulary's highest id and the embedding's last row: never share a row
    first = max(max(tokenizer.encoder.values(), default=-1) + 1, embed.num_embeddings)
    vocab = dict(tokenizer.encoder)
    for offset, ch in enumerate(new):
        vocab[ch] = first + offset
    save_dir.mkdir(parents=True, exist_ok=True)
    vocab_file = save_dir / "vocab.json"
    # save_dir: a fresh temp folder (training/datasplit.py: tempfile.mkdtemp)
    vocab_file.write_text(json.dumps(vocab, ensure_ascii=False, indent=1), encoding="utf-8")
    init_kwargs = {
        k: getattr(tokenizer, k)
        for k in ("language", "add_blank", "normalize", "phonemize", "is_uroman")
        if hasattr(tokenizer, k)
    }
    extended = VitsTokenizer(
        str(vocab_file), pad_token=tokenizer.pad_token, unk_token=tokenizer.unk_token, **init_kwargs
    )
    extended.save_pretrained(save_dir)
    text_encoder.tokenizer = extended

    old = embed.weight.data
    size = first + len(new)
    grown = torch.nn.Embedding(size, old.shape[1], padding_idx=embed.padding_idx).to(old.device, old.dtype)
    with torch.no_grad():
        grown.weight[: old.shape[0]] = old
        grown.weight[old.shape[0] :] = old.mean(0) + 0.01 * old.std() * torch.randn(
            size - old.shape[0], old.shape[1], device=old.device, dtype=old.dtype
        )
    model.text_encoder.embed_tokens = grown
    model.config.vocab_size = size
    return new
