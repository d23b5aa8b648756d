"""A thin wrapper over a Hugging Face tokenizer: fixed-length numpy batches and fast decoding.

The default is the byte-level ByT5 tokenizer (vocab 384: pad 0, eos 1, unk 2, bytes 3..258,
extra ids 259..383), which needs no files. For it `encode`/`decode` are direct byte maps; any
other tokenizer goes through its Hugging Face `encode`/`decode`.

`train_bpe` (`load_tokenizer("bpe:N", texts=...)`) trains a byte-level BPE of N ids on a task's
own text, in well under a second and without files: made-up names become one or two tokens, so
sequences are about 3x shorter than in bytes and decoding stays exact (every byte has an id).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

# transformers warns at import that PyTorch is absent; only its tokenizers are used here.
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
import transformers  # noqa: E402

_BYTE_OFFSET = 3  # ByT5: token id = byte + 3
_SIDES = ("left", "right")


class Tokenizer:
    """Encodes text to int ids and back; `decode` stops at the first EOS and drops special ids.

    Attributes:
      hf: the wrapped Hugging Face tokenizer.
      vocab_size: len(hf).
      pad_id, eos_id: padding and end-of-sequence ids (pad falls back to eos when absent).
    """

    def __init__(self, hf):
        if hf.eos_token_id is None:
            raise ValueError(f"tokenizer {type(hf).__name__} has no EOS token")
        self.hf = hf
        self.vocab_size = len(hf)
        self.eos_id = int(hf.eos_token_id)
        self.pad_id = self.eos_id if hf.pad_token_id is None else int(hf.pad_token_id)
        self._is_bytes = isinstance(hf, transformers.ByT5Tokenizer)

    def encode(self, text: str) -> list[int]:
        """Ids of `text` without special tokens or EOS (ByT5: each UTF-8 byte + 3)."""
        if self._is_bytes:
            return [b + _BYTE_OFFSET for b in text.encode("utf-8")]
        return self.hf.encode(text, add_special_tokens=False)

    def decode(self, ids) -> str:
        """Text of `ids` up to (excluding) the first EOS, skipping pad and other special tokens."""
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        eos = np.flatnonzero(ids == self.eos_id)
        if eos.size:
            ids = ids[: eos[0]]
        if self._is_bytes:
            byte_ids = ids[(ids >= _BYTE_OFFSET) & (ids < _BYTE_OFFSET + 256)] - _BYTE_OFFSET
            return byte_ids.astype(np.uint8).tobytes().decode("utf-8", errors="ignore")
        return self.hf.decode(ids.tolist(), skip_special_tokens=True)

    def encode_batch(
        self, texts: Sequence[str], length: int, *, side: str = "left", add_eos: bool = False
    ) -> tuple[np.ndarray, np.ndarray]:
        """Encodes and pads `texts` to a fixed `length`.

        Args:
          texts: B strings.
          length: T, the padded length (includes the EOS when `add_eos`).
          side: "left" (prompts: text ends at position T-1) or "right" padding.
          add_eos: append `eos_id` to every text.

        Returns:
          ids: int32 [B, T], pad positions hold `pad_id`.
          mask: bool [B, T], True on real tokens.

        Raises:
          ValueError: if `side` is unknown or a text needs more than `length` tokens.
        """
        if side not in _SIDES:
            raise ValueError(f"side must be one of {_SIDES}, got {side!r}")
        ids = np.full((len(texts), length), self.pad_id, dtype=np.int32)  # [B, T]
        mask = np.zeros((len(texts), length), dtype=bool)  # [B, T]
        for row, text in enumerate(texts):
            tokens = self.encode(text) + ([self.eos_id] if add_eos else [])
            n = len(tokens)
            if n > length:
                raise ValueError(
                    f"text {row} needs {n} tokens (add_eos={add_eos}), more than length={length}:"
                    f" {text[:40]!r}"
                )
            cols = slice(length - n, length) if side == "left" else slice(0, n)
            ids[row, cols] = tokens
            mask[row, cols] = True
        return ids, mask

    def decode_batch(self, ids, mask=None) -> list[str]:
        """Decodes each row of ids [B, T], dropping positions where mask [B, T] is False."""
        ids = np.asarray(ids)
        if ids.ndim != 2:
            raise ValueError(f"ids must have shape [B, T], got {ids.shape}")
        if mask is None:
            return [self.decode(row) for row in ids]
        mask = np.asarray(mask, dtype=bool)
        if mask.shape != ids.shape:
            raise ValueError(f"mask shape {mask.shape} != ids shape {ids.shape}")
        return [self.decode(row[keep]) for row, keep in zip(ids, mask, strict=True)]


BPE_SPECIALS = ("<pad>", "</s>", "<unk>")  # ids 0, 1, 2 of a `train_bpe` tokenizer, as in ByT5


def train_bpe(texts: Sequence[str], vocab_size: int) -> Tokenizer:
    """A byte-level BPE tokenizer (the GPT-2 scheme: bytes, then merges; Sennrich et al. 2016)
    of `vocab_size` ids trained on `texts` with the `tokenizers` library: ids 0, 1, 2 are
    `<pad>`, `</s>` (EOS), `<unk>`, then the 256 byte symbols, then merges. Deterministic for
    the same texts; `decode(encode(t)) == t` for every text.

    Raises:
      ValueError: if `vocab_size` cannot hold the specials and the byte alphabet, or `texts` is
        empty.
    """
    import tokenizers
    from tokenizers import decoders, models, pre_tokenizers, trainers

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    if vocab_size < len(BPE_SPECIALS) + len(alphabet):
        raise ValueError(f"bpe vocab_size must be >= {len(BPE_SPECIALS) + len(alphabet)} (the "
                         f"specials and the 256 bytes), got {vocab_size}")
    if not texts:
        raise ValueError("train_bpe needs at least one text")
    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(list(texts), trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=list(BPE_SPECIALS), initial_alphabet=alphabet,
        show_progress=False))
    pad, eos, unk = BPE_SPECIALS
    return Tokenizer(transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token=pad, eos_token=eos, unk_token=unk))


def _saved_class(path: str):
    """The transformers class a tokenizer directory was saved from (its tokenizer_config.json's
    `tokenizer_class`), else `AutoTokenizer`. transformers 5's AutoTokenizer prefers the class
    of the model type in a config.json beside it: a ByT5 or byte-level BPE tokenizer saved with a
    Qwen2-type checkpoint (`save_hf_checkpoint`) came back as a Qwen2Tokenizer that encodes
    differently (ByT5: no tokens at all)."""
    config = Path(path) / "tokenizer_config.json"
    name = None
    if config.is_file():
        try:
            name = json.loads(config.read_text()).get("tokenizer_class")
        except (OSError, ValueError, AttributeError):
            name = None
    cls = getattr(transformers, name, None) if isinstance(name, str) else None
    return cls if hasattr(cls, "from_pretrained") else transformers.AutoTokenizer


def load_tokenizer(name_or_path: str = "byt5", texts: Sequence[str] | None = None) -> Tokenizer:
    """Loads "byt5" (built in, no files), "bpe:N" (`train_bpe` with N ids on `texts`), or a local
    Hugging Face tokenizer directory / cache entry.

    Raises:
      ValueError: if "bpe:N" has no integer N or no `texts`.
      FileNotFoundError: if `name_or_path` is none of these or not loadable without the network.
    """
    if name_or_path == "byt5":
        return Tokenizer(transformers.ByT5Tokenizer())
    if name_or_path.startswith("bpe:"):
        size = name_or_path.removeprefix("bpe:")
        if not size.isdigit():
            raise ValueError(f"tokenizer {name_or_path!r}: expected 'bpe:<vocab size>'")
        if texts is None:
            raise ValueError(f"tokenizer {name_or_path!r} is trained on a task's texts; none "
                             f"were given")
        return train_bpe(texts, int(size))
    try:
        hf = _saved_class(name_or_path).from_pretrained(name_or_path, local_files_only=True)
    except (OSError, ValueError) as e:
        raise FileNotFoundError(
            f"no tokenizer at {name_or_path!r} (not a local directory or cached model)"
        ) from e
    return Tokenizer(hf)


__all__ = ["Tokenizer", "load_tokenizer"]
