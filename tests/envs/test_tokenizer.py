"""Tests for the tokenizer wrapper (default ByT5 byte tokenizer)."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxrl_suite.envs.text import Tokenizer, load_tokenizer


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer()


def test_byt5_ids(tok):
    assert (tok.vocab_size, tok.pad_id, tok.eos_id) == (384, 0, 1)
    assert tok.encode("ab") == [ord("a") + 3, ord("b") + 3]
    assert tok.encode("12+3=") == tok.hf.encode("12+3=", add_special_tokens=False)


@pytest.mark.parametrize("text", ["", "123+456=", "<answer>(3+5)*7</answer>", "héllo ✓ 🙂\n"])
def test_round_trip(tok, text):
    assert tok.decode(tok.encode(text)) == text


def test_decode_stops_at_eos_and_skips_special(tok):
    ids = tok.encode("ab") + [tok.pad_id] + tok.encode("c") + [260] + [tok.eos_id] + tok.encode("z")
    assert tok.decode(ids) == "abc"
    assert tok.decode(np.array(ids, dtype=np.int32)) == "abc"
    assert tok.decode([tok.eos_id] + tok.encode("z")) == ""


@settings(max_examples=200, deadline=None)
@given(ids=st.lists(st.integers(0, 383), max_size=40))
def test_fast_decode_matches_hf(tok, ids):
    upto = ids.index(tok.eos_id) if tok.eos_id in ids else len(ids)
    assert tok.decode(ids) == tok.hf.decode(ids[:upto], skip_special_tokens=True)


def test_generic_path_matches_fast_path(tok):
    generic = Tokenizer(tok.hf)
    generic._is_bytes = False  # force the Hugging Face encode/decode path
    text = "12+34=<answer>46</answer> é"
    assert generic.encode(text) == tok.encode(text)
    ids = tok.encode(text) + [tok.eos_id] + tok.encode("junk")
    assert generic.decode(ids) == tok.decode(ids) == text


@pytest.mark.parametrize("side", ["left", "right"])
def test_encode_batch_padding(tok, side):
    texts = ["1+2=", "10+20=", ""]
    ids, mask = tok.encode_batch(texts, 8, side=side)
    assert ids.shape == mask.shape == (3, 8)
    assert ids.dtype == np.int32 and mask.dtype == bool
    np.testing.assert_array_equal(mask.sum(1), [4, 6, 0])
    assert np.all(ids[~mask] == tok.pad_id)
    if side == "left":
        assert mask[:2, -1].all() and not mask[0, :4].any()
        np.testing.assert_array_equal(ids[0, 4:], tok.encode("1+2="))
    else:
        assert mask[:2, 0].all() and not mask[0, 4:].any()
        np.testing.assert_array_equal(ids[0, :4], tok.encode("1+2="))
    assert tok.decode_batch(ids, mask) == texts


def test_encode_batch_add_eos(tok):
    ids, mask = tok.encode_batch(["ab"], 4, side="right", add_eos=True)
    np.testing.assert_array_equal(ids[0], tok.encode("ab") + [tok.eos_id, tok.pad_id])
    np.testing.assert_array_equal(mask[0], [True, True, True, False])
    with pytest.raises(ValueError, match="length=2"):
        tok.encode_batch(["ab"], 2, add_eos=True)


def test_encode_batch_too_long(tok):
    with pytest.raises(ValueError, match=r"text 1 needs 7 tokens.*length=5"):
        tok.encode_batch(["ok", "1234567"], 5)
    with pytest.raises(ValueError, match="side"):
        tok.encode_batch(["ok"], 5, side="middle")


def test_decode_batch_respects_mask_and_eos(tok):
    prompt_ids, prompt_mask = tok.encode_batch(["1+1=", "22+2="], 6)
    completions = np.array(
        [tok.encode("<a>2") + [tok.eos_id, 120], tok.encode("24") + [tok.eos_id] * 4], np.int32
    )
    ids = np.concatenate([prompt_ids, completions], axis=1)  # [2, 12]
    mask = np.concatenate([np.zeros_like(prompt_mask), np.ones(completions.shape, bool)], axis=1)
    assert tok.decode_batch(ids, mask) == ["<a>2", "24"]
    assert tok.decode_batch(ids[:, 6:]) == ["<a>2", "24"]
    holes = mask.copy()
    holes[1, 7] = False  # masked-out positions are skipped
    assert tok.decode_batch(ids, holes)[1] == "2"
    full = np.concatenate([prompt_mask, np.ones(completions.shape, bool)], axis=1)
    assert tok.decode_batch(ids, full) == ["1+1=<a>2", "22+2=24"]
    with pytest.raises(ValueError, match="mask shape"):
        tok.decode_batch(ids, mask[:, :3])


def test_missing_tokenizer_dir_raises(tmp_path):
    missing = tmp_path / "no_such_tokenizer"
    with pytest.raises(FileNotFoundError, match="no_such_tokenizer"):
        load_tokenizer(str(missing))


def test_local_hugging_face_directory_loads_through_same_interface(tok, tmp_path):
    tok.hf.save_pretrained(tmp_path / "tok")  # any HF tokenizer directory, made locally
    local = load_tokenizer(str(tmp_path / "tok"))
    assert (local.vocab_size, local.pad_id, local.eos_id) == (384, 0, 1)
    ids, mask = local.encode_batch(["12+34=", "5+6="], 8)
    np.testing.assert_array_equal(ids, tok.encode_batch(["12+34=", "5+6="], 8)[0])
    assert local.decode_batch(ids, mask) == ["12+34=", "5+6="]


@pytest.mark.parametrize("kind", ["byt5", "bpe:300"])
def test_a_tokenizer_saved_beside_a_qwen2_config_loads_back_as_itself(kind, tmp_path):
    """save_hf_checkpoint writes the tokenizer next to a Qwen2-type config.json; transformers 5's
    AutoTokenizer would pick Qwen2Tokenizer from that config (ByT5 then encoded to nothing)."""
    texts = ["12+34=46", "the answer is <answer>7</answer>"] * 20
    saved = load_tokenizer(kind, texts)
    saved.hf.save_pretrained(tmp_path)
    (tmp_path / "config.json").write_text('{"model_type": "qwen2"}')
    back = load_tokenizer(str(tmp_path))
    assert type(back.hf).__name__ == type(saved.hf).__name__
    for text in texts[:2]:
        assert back.encode(text) == saved.encode(text) and len(back.encode(text)) > 0


BPE_TEXTS = [f"{a} {b} was born in {c}." for a in ("Mira", "Rawka", "Tolvek", "Zalba")
             for b in ("Tolvek", "Tolvik", "Rutru") for c in ("Danow", "Krake", "Veldor")]


@pytest.fixture(scope="module")
def bpe():
    return load_tokenizer("bpe:300", texts=BPE_TEXTS)


def test_bpe_specials_bytes_and_merges(bpe):
    assert (bpe.pad_id, bpe.eos_id, bpe.vocab_size) == (0, 1, 300)
    text = "Mira Tolvek was born in Danow."
    ids = bpe.encode(text)
    assert len(ids) < len(text.encode()) // 2  # merges learned from the texts
    assert bpe.decode(ids + [bpe.eos_id, 5]) == text  # stops at EOS
    # every byte has an id: unseen text (and non-ASCII) still round-trips exactly
    for t in ("<query>Qx zz</query>\n[3] ünïcödé 7", "  two  spaces", ""):
        assert bpe.decode(bpe.encode(t)) == t
    ids, mask = bpe.encode_batch([text, "Krake"], 24, side="left", add_eos=True)
    assert bpe.decode_batch(ids, mask) == [text, "Krake"] and (ids[~mask] == bpe.pad_id).all()


def test_bpe_is_deterministic_and_errors_name_the_cause(bpe):
    again = load_tokenizer("bpe:300", texts=list(BPE_TEXTS))
    assert again.hf.get_vocab() == bpe.hf.get_vocab()
    with pytest.raises(ValueError, match="texts"):
        load_tokenizer("bpe:300")
    with pytest.raises(ValueError, match="bpe:<vocab size>"):
        load_tokenizer("bpe:big", texts=BPE_TEXTS)
    with pytest.raises(ValueError, match="vocab_size must be >= 259"):
        load_tokenizer("bpe:100", texts=BPE_TEXTS)
