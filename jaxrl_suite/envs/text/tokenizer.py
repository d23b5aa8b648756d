"""A thin wrapper over a Hugging Face tokenizer: fixed-length numpy batches and fast decoding.

The default is the byte-level ByT5 tokenizer (vocab 384: pad 0, eos 1, unk 2, bytes 3..258,
extra ids 259..383), which needs no files. For it `encode`/`decode` are direct byte maps; any
other tokenizer goes through its Hugging Face `encode`/`decode`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

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


def load_tokenizer(name_or_path: str = "byt5") -> Tokenizer:
    """Loads "byt5" (built in, no files) or a local Hugging Face tokenizer directory / cache entry.

    Raises:
      FileNotFoundError: if `name_or_path` is neither "byt5" nor loadable without the network.
    """
    if name_or_path == "byt5":
        return Tokenizer(transformers.ByT5Tokenizer())
    try:
        hf = transformers.AutoTokenizer.from_pretrained(name_or_path, local_files_only=True)
    except (OSError, ValueError) as e:
        raise FileNotFoundError(
            f"no tokenizer at {name_or_path!r} (not a local directory or cached model)"
        ) from e
    return Tokenizer(hf)


__all__ = ["Tokenizer", "load_tokenizer"]
