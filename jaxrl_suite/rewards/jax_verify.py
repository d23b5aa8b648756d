"""Verifiers that run inside JAX: the text tasks' rewards from token ids, with fixed shapes.

The Python verifiers (`rewards.format`, `rewards.match`) score decoded text on the host. These
compute the same rewards from the sampler's token ids [B, N] and completion mask, jittable and
vmappable, so a GRPO step can sample, verify, and update without leaving the device
(`algorithms.grpo_ondevice`). Each step mirrors one Python step exactly:

  1. `decode`: the byte tokenizer's `Tokenizer.decode_batch` (`envs.text.tokenizer`): keep the
     masked-in tokens before the first EOS, map byte tokens to bytes and drop every other id,
     then UTF-8 decode with errors="ignore". A character is kept iff its first byte starts a
     well-formed UTF-8 sequence (Unicode 15, Table 3-7): Python's decoder skips the maximal
     invalid subparts, which never hold such a byte, so no decoding state is needed.
  2. `answer_span`: `extract_answer`: the first "<answer>", the first "</answer>" after it, the
     content between with `str.strip()`'s whitespace (`str.isspace`, 29 code points) removed.
  3. a matcher: `exact_answer` (`string_match`: arithmetic) or `number_list` (`parse_numbers`:
     `str.split()` on the same whitespace, every part `str.isdecimal` — any Unicode decimal digit
     — with at most MAX_INT_DIGITS of them, then `positional_matches`: count and sort).
  4. `format_scores`: `format_reward`.

Numbers of up to 18 digits are compared as two int32 halves (the last 9 digits and the ones
before), so no int64 is needed. Equality with the Python verifiers on random and adversarial
completions is tested property-based (tests/rewards/test_jax_verify.py).
"""

from __future__ import annotations

import dataclasses
import functools
import unicodedata
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_suite.rewards.format import ANSWER_CLOSE, ANSWER_OPEN
from jaxrl_suite.rewards.match import MAX_INT_DIGITS

# Python's str.isspace() (and so str.strip() / str.split()) code points.
WHITESPACE = np.array([0x9, 0xA, 0xB, 0xC, 0xD, 0x1C, 0x1D, 0x1E, 0x1F, 0x20, 0x85, 0xA0,
                       0x1680, *range(0x2000, 0x200B), 0x2028, 0x2029, 0x202F, 0x205F, 0x3000],
                      np.int32)
BYTE_OFFSET = 3  # ByT5: token id = byte + 3
_POW10 = np.array([10**i for i in range(9)], np.int32)
_OPEN = np.array([ord(c) for c in ANSWER_OPEN], np.int32)
_CLOSE = np.array([ord(c) for c in ANSWER_CLOSE], np.int32)


@functools.cache
def decimal_zeros() -> np.ndarray:
    """The code points of the Unicode decimal digits of value 0 (this Python's `unicodedata`):
    every decimal digit (`str.isdecimal`) is zero + v for one of them and its value v in 0..9
    (Unicode keeps category Nd in runs of ten)."""
    return np.array([c for c in range(0x110000)
                     if unicodedata.decimal(chr(c), -1) == 0], np.int32)


def byte_table(tokenizer) -> np.ndarray:
    """[V] int32: the byte each token id decodes to, -1 for ids that decode to nothing (pad,
    EOS, unk, extra ids). Only the byte-level ByT5 tokenizer maps ids to single bytes; a BPE
    tokenizer decodes differently (invalid UTF-8 becomes U+FFFD) and is refused.

    Raises:
      ValueError: for a tokenizer that is not byte-level.
    """
    if not getattr(tokenizer, "_is_bytes", False):
        raise ValueError(f"JAX verifiers need the byte-level tokenizer (run.tokenizer: byt5), "
                         f"got {type(tokenizer.hf).__name__}")
    table = np.full(tokenizer.vocab_size, -1, np.int32)
    table[BYTE_OFFSET:BYTE_OFFSET + 256] = np.arange(256, dtype=np.int32)
    return table


class Decoded(NamedTuple):
    """Decoded completions: `chars` [B, L] int32 code points (L = N), left-aligned, -1 after
    `length` [B] int32."""

    chars: jax.Array
    length: jax.Array


def compact(values: jax.Array, keep: jax.Array, fill: int = -1) -> tuple[jax.Array, jax.Array]:
    """The kept entries of values [L] moved to the front in order, `fill` after: ([L], count)."""
    n = values.shape[0]
    dest = jnp.where(keep, jnp.cumsum(keep) - 1, n)  # dropped entries scatter out of range
    return jnp.full_like(values, fill).at[dest].set(values, mode="drop"), jnp.sum(keep)


def _shift(x: jax.Array, k: int) -> jax.Array:
    """x[i + k] at i, -1 past the end."""
    return jnp.concatenate([x[k:], jnp.full((k,), -1, x.dtype)])


def utf8_chars(data: jax.Array) -> tuple[jax.Array, jax.Array]:
    """UTF-8 decoding with errors="ignore" of bytes [L] (-1 = none): (code points [L], starts
    [L] bool), where starts[i] says a well-formed sequence begins at byte i and code points[i]
    is its character. Well-formed (Unicode Table 3-7): 00-7F; C2-DF 80-BF; E0 A0-BF 80-BF;
    E1-EC and EE-EF 80-BF 80-BF; ED 80-9F 80-BF; F0 90-BF 80-BF 80-BF; F1-F3 80-BF x3;
    F4 80-8F 80-BF 80-BF. Everything else is what "ignore" drops."""
    b0, b1, b2, b3 = data, _shift(data, 1), _shift(data, 2), _shift(data, 3)

    def cont(x):
        return (x >= 0x80) & (x <= 0xBF)

    one = (b0 >= 0) & (b0 < 0x80)
    two = (b0 >= 0xC2) & (b0 <= 0xDF) & cont(b1)
    lo3 = jnp.where(b0 == 0xE0, 0xA0, 0x80)
    hi3 = jnp.where(b0 == 0xED, 0x9F, 0xBF)
    three = (b0 >= 0xE0) & (b0 <= 0xEF) & (b1 >= lo3) & (b1 <= hi3) & cont(b2)
    lo4 = jnp.where(b0 == 0xF0, 0x90, 0x80)
    hi4 = jnp.where(b0 == 0xF4, 0x8F, 0xBF)
    four = (b0 >= 0xF0) & (b0 <= 0xF4) & (b1 >= lo4) & (b1 <= hi4) & cont(b2) & cont(b3)
    c1, c2, c3 = b1 & 0x3F, b2 & 0x3F, b3 & 0x3F
    cp = jnp.select(
        [one, two, three, four],
        [b0, ((b0 & 0x1F) << 6) | c1, ((b0 & 0x0F) << 12) | (c1 << 6) | c2,
         ((b0 & 0x07) << 18) | (c1 << 12) | (c2 << 6) | c3], -1)
    return cp, one | two | three | four


def decode(table: jax.Array, tokens: jax.Array, mask: jax.Array, *, eos_id: int) -> Decoded:
    """`Tokenizer.decode_batch(tokens, mask)` of the byte tokenizer as code points.

    Args:
      table: [V] `byte_table`.
      tokens: [B, N] int token ids; mask: [B, N] (bool or 0/1), False on dropped positions.
      eos_id: the tokenizer's EOS id; decoding stops at the first masked-in EOS.
    Returns: `Decoded` ([B, N] code points, [B] lengths).
    """
    def row(tok, m):
        m = m.astype(bool)
        before_eos = jnp.cumsum(m & (tok == eos_id)) == 0
        data = jnp.where(m & before_eos, table[tok], -1)  # [N] bytes, -1 = dropped
        data, _ = compact(data, data >= 0)
        cp, starts = utf8_chars(data)
        return compact(cp, starts)

    chars, length = jax.vmap(row)(tokens.astype(jnp.int32), mask)
    return Decoded(chars, length.astype(jnp.int32))


def is_space(chars: jax.Array) -> jax.Array:
    """str.isspace of each code point: [...] -> [...] bool."""
    return jnp.any(chars[..., None] == jnp.asarray(WHITESPACE), axis=-1)


def _matches(chars: jax.Array, length: jax.Array, pattern: np.ndarray) -> jax.Array:
    """[L] bool: where `pattern` occurs in chars[:length] (one row)."""
    k, n = len(pattern), chars.shape[0]
    padded = jnp.concatenate([chars, jnp.full((k,), -1, chars.dtype)])
    windows = jnp.stack([padded[j:j + n] for j in range(k)], axis=-1)  # [L, k]
    return jnp.all(windows == pattern, axis=-1) & (jnp.arange(n) + k <= length)


def _find(chars: jax.Array, length: jax.Array, pattern: np.ndarray, start: jax.Array):
    """First i >= start with chars[i : i + len(pattern)] == pattern inside [0, length), as
    (found, i); chars [L] of one row."""
    hits = _matches(chars, length, pattern) & (jnp.arange(chars.shape[0]) >= start)
    return jnp.any(hits), jnp.argmax(hits)


def _count(chars: jax.Array, length: jax.Array, pattern: np.ndarray) -> jax.Array:
    """Occurrences of `pattern` in chars[:length] (one row; the answer tags cannot overlap
    themselves, so this is str.count)."""
    return jnp.sum(_matches(chars, length, pattern))


def _strip(space: jax.Array, lo: jax.Array, hi: jax.Array) -> tuple[jax.Array, jax.Array]:
    """[a, b): the interval [lo, hi) of one row without leading and trailing whitespace."""
    i = jnp.arange(space.shape[0])
    body = (i >= lo) & (i < hi) & ~space
    a = jnp.where(jnp.any(body), jnp.argmax(body), hi)
    b = jnp.where(jnp.any(body), space.shape[0] - jnp.argmax(body[::-1]), a)
    return a, b


class Span(NamedTuple):
    """`extract_answer` per row: found [B] bool; the content with surrounding whitespace as
    [start, end), and stripped as [lo, hi) ([B] int32 each)."""

    found: jax.Array
    start: jax.Array
    end: jax.Array
    lo: jax.Array
    hi: jax.Array


def answer_span(decoded: Decoded) -> Span:
    """The first `<answer>...</answer>` of each row, as `rewards.format.extract_answer`."""
    def row(chars, length):
        has_open, i = _find(chars, length, _OPEN, jnp.int32(0))
        start = i + len(_OPEN)
        has_close, end = _find(chars, length, _CLOSE, start)
        lo, hi = _strip(is_space(chars), start, end)
        return has_open & has_close, start, end, lo, hi

    return Span(*jax.vmap(row)(*decoded))


def format_scores(decoded: Decoded) -> jax.Array:
    """`rewards.format.format_reward` per row, [B] float32: 1 iff the stripped text starts
    with "<answer>", ends with "</answer>" and holds one of each."""
    def row(chars, length):
        a, b = _strip(is_space(chars), jnp.int32(0), length)
        padded = jnp.concatenate([chars, jnp.full((len(_CLOSE),), -1, chars.dtype)])
        starts = (b - a >= len(_OPEN)) & jnp.all(
            jax.lax.dynamic_slice(padded, (a,), (len(_OPEN),)) == _OPEN)
        ends = (b - a >= len(_CLOSE)) & jnp.all(jax.lax.dynamic_slice(
            padded, (jnp.maximum(b - len(_CLOSE), 0),), (len(_CLOSE),)) == _CLOSE)
        once = (_count(chars, length, _OPEN) == 1) & (_count(chars, length, _CLOSE) == 1)
        return (starts & ends & once).astype(jnp.float32)

    return jax.vmap(row)(*decoded)


def encode_texts(texts, length: int) -> tuple[np.ndarray, np.ndarray]:
    """Gold strings as code points for `exact_answer`: ([B, length] int32, -1 padded; [B]
    int32 lengths).

    Raises:
      ValueError: if a text has more than `length` characters.
    """
    out = np.full((len(texts), length), -1, np.int32)
    lens = np.zeros(len(texts), np.int32)
    for row, text in enumerate(texts):
        if len(text) > length:
            raise ValueError(f"gold answer {text[:40]!r} has {len(text)} characters, more "
                             f"than {length}")
        out[row, :len(text)] = [ord(c) for c in text]
        lens[row] = len(text)
    return out, lens


def exact_answer(decoded: Decoded, span: Span, gold: jax.Array, gold_len: jax.Array
                 ) -> jax.Array:
    """`string_match(extract_answer(text), gold)` per row, [B] float32 (gold: [B, G] code
    points from `encode_texts`, [B] lengths)."""
    def row(chars, found, lo, hi, g, g_len):
        width = g.shape[0]
        window = jax.lax.dynamic_slice(
            jnp.concatenate([chars, jnp.full((width,), -1, chars.dtype)]), (lo,), (width,))
        same = jnp.all((window == g) | (jnp.arange(width) >= g_len))
        return (found & (hi - lo == g_len) & same).astype(jnp.float32)

    return jax.vmap(row)(decoded.chars, span.found, span.lo, span.hi, gold, gold_len)


class Numbers(NamedTuple):
    """Lists of non-negative integers, each as int32 halves: value = hi * 10^9 + lo.
    hi, lo: [B, K]; count: [B] int32 (items); valid: [B] bool (`parse_numbers` is not None)."""

    hi: jax.Array
    lo: jax.Array
    count: jax.Array
    valid: jax.Array


def encode_numbers(lists, width: int) -> Numbers:
    """Gold integer lists (each value in [0, 10^18)) as host `Numbers` of `width` items.

    Raises:
      ValueError: if a list is longer than `width` or a value is out of range.
    """
    hi = np.zeros((len(lists), width), np.int32)
    lo = np.zeros((len(lists), width), np.int32)
    count = np.zeros(len(lists), np.int32)
    for row, values in enumerate(lists):
        if len(values) > width:
            raise ValueError(f"gold list of {len(values)} numbers, more than {width}")
        for k, v in enumerate(values):
            if not 0 <= v < 10**MAX_INT_DIGITS:
                raise ValueError(f"gold number {v} outside [0, 10^{MAX_INT_DIGITS})")
            hi[row, k], lo[row, k] = divmod(int(v), 10**9)
        count[row] = len(values)
    return Numbers(hi, lo, count, np.ones(len(lists), bool))


def number_list(decoded: Decoded, span: Span) -> Numbers:
    """`parse_numbers(extract_answer(text))` per row, K = L items: the content split on
    whitespace; valid iff the answer is found, there is at least one part, and every part is
    1..MAX_INT_DIGITS Unicode decimal digits."""
    zeros, pow10 = jnp.asarray(decimal_zeros()), jnp.asarray(_POW10)
    n = decoded.chars.shape[1]

    def row(chars, found, start, end):
        i = jnp.arange(n)
        word = (i >= start) & (i < end) & ~is_space(chars)  # [L] in a part
        first = word & ~jnp.concatenate([jnp.zeros((1,), bool), word[:-1]])
        part = jnp.where(word, jnp.cumsum(first) - 1, n)  # [L] part index; n = none
        count = jnp.sum(first)
        offset = chars[:, None] - zeros  # [L, Z]
        in_run = (offset >= 0) & (offset < 10)
        digit = jnp.sum(jnp.where(in_run, offset, 0), axis=-1)  # [L] value of a decimal
        decimal = jnp.any(in_run, axis=-1)
        seg = functools.partial(jax.ops.segment_sum, segment_ids=part, num_segments=n)
        size = seg(word.astype(jnp.int32))  # [K] characters per part
        bad = seg((word & ~decimal).astype(jnp.int32))  # [K] non-digits per part
        first_at = seg(jnp.where(first, i, 0))  # [K] where each part starts
        place = size[jnp.minimum(part, n - 1)] - 1 - (i - first_at[jnp.minimum(part, n - 1)])
        low = word & (place < 9)
        lo = seg(jnp.where(low, digit * pow10[jnp.clip(place, 0, 8)], 0))
        hi = seg(jnp.where(word & ~low & (place < 18),
                           digit * pow10[jnp.clip(place - 9, 0, 8)], 0))
        k = jnp.arange(n)
        ok = jnp.all((k >= count) | ((bad == 0) & (size <= MAX_INT_DIGITS)))
        return hi, lo, count.astype(jnp.int32), found & (count > 0) & ok

    return Numbers(*jax.vmap(row)(decoded.chars, span.found, span.start, span.end))


def positional_matches(got: Numbers, gold: Numbers) -> jax.Array:
    """`rewards.match.positional_matches` per row, [B] int32: #{i < gold.count : i <
    got.count and got[i] == gold[i]}."""
    k = min(got.hi.shape[1], gold.hi.shape[1])
    i = jnp.arange(k)
    same = (got.hi[:, :k] == gold.hi[:, :k]) & (got.lo[:, :k] == gold.lo[:, :k])
    inside = (i < got.count[:, None]) & (i < gold.count[:, None])
    return jnp.sum(same & inside, axis=1).astype(jnp.int32)


_PLUS, _MINUS, _TIMES, _DIVIDE, _OPEN_PAREN = 1, 2, 3, 4, 5  # operator codes on the stack
_OPS = {ord("+"): _PLUS, ord("-"): _MINUS, ord("*"): _TIMES, ord("/"): _DIVIDE}
_MAX_LITERAL_DIGITS = 9  # longer literals fit no int32 and are never available numbers


class Fraction(NamedTuple):
    """Exact rationals as int32 pairs, reduced, per row: num [B], den [B] (den != 0 where
    valid); valid [B] bool."""

    num: jax.Array
    den: jax.Array
    valid: jax.Array


def _apply(op, a_num, a_den, b_num, b_den):
    """a op b for int32 fractions, reduced; (num, den, ok) with ok False on division by 0."""
    num = jnp.select([op == _PLUS, op == _MINUS, op == _TIMES],
                     [a_num * b_den + b_num * a_den, a_num * b_den - b_num * a_den,
                      a_num * b_num], a_num * b_den)
    den = jnp.where(op == _DIVIDE, a_den * b_num, a_den * b_den)
    ok = (op != _DIVIDE) | (b_num != 0)
    g = jnp.maximum(jnp.gcd(num, den), 1)
    return num // g, jnp.where(ok, den // g, 1), ok


def expression_value(decoded: Decoded, span: Span, numbers: jax.Array, n_numbers: jax.Array,
                     *, max_chars: int, max_depth: int) -> Fraction:
    """`rewards.expression.parse_expression(extract_answer(text), numbers)` per row, exactly:
    integer literals (ASCII digits, no leading zero, each an unused one of the row's
    `numbers` [B, K] (the first n_numbers [B]), a multiset), + - * / with the usual precedence
    and left association, parentheses nested at most `max_depth` deep, whitespace between
    tokens, at most `max_chars` characters; anything else, or a division by zero, is invalid.
    Evaluated by a shunting-yard pass over the characters (`lax.scan`) with int32 fractions
    reduced after every operation, so values must stay within int32 (the caller bounds the
    task's numbers: `CountdownTask.token_verifier`)."""
    n = decoded.chars.shape[1]
    stack = n + 1  # at most one value or operator per character

    def row(chars, found, lo, hi, nums, k):
        def reduce(state, until_open: bool, prec=None):
            """Apply the operators on top of the stack: down to '(' (until_open), or while the
            top one binds at least as tightly as `prec`."""
            def cond(st):
                ops, osp = st[2], st[3]
                top = ops[jnp.maximum(osp - 1, 0)]
                more = (osp > 0) & (top != _OPEN_PAREN) & st[6]
                if not until_open:
                    more &= jnp.where(top >= _TIMES, 2, 1) >= prec
                return more

            def body(st):
                vnum, vden, ops, osp, vsp, used, ok = st
                op = ops[osp - 1]
                ok2 = ok & (vsp >= 2)
                i, j = jnp.maximum(vsp - 2, 0), jnp.maximum(vsp - 1, 0)
                num, den, fine = _apply(op, vnum[i], vden[i], vnum[j], vden[j])
                vnum, vden = vnum.at[i].set(num), vden.at[i].set(den)
                return vnum, vden, ops, osp - 1, vsp - 1, used, ok2 & fine

            return jax.lax.while_loop(cond, body, state)

        def flush(carry):
            """End a pending literal: check it and push its value."""
            (vnum, vden, ops, osp, vsp, used, ok), lit = carry[0], carry[1]
            value, digits, lead_zero, pending = lit
            free = (nums == value) & ~used & (jnp.arange(nums.shape[0]) < k)
            take = jnp.argmax(free)
            good = jnp.any(free) & ~lead_zero & (digits <= _MAX_LITERAL_DIGITS)
            used = jnp.where(pending, used.at[take].set(used[take] | good), used)
            vnum = jnp.where(pending, vnum.at[vsp].set(value), vnum)
            vden = jnp.where(pending, vden.at[vsp].set(1), vden)
            state = (vnum, vden, ops, osp, vsp + pending, used, ok & (~pending | good))
            return state, (jnp.int32(0), jnp.int32(0), False, False)

        def step(carry, i):
            state, lit, expect_operand, depth = carry
            c = chars[i]
            inside = (i >= lo) & (i < hi)
            digit = (c >= ord("0")) & (c <= ord("9")) & inside
            value, digits, lead_zero, pending = lit
            # a digit: start or extend the literal (a literal where an operator is due is an
            # error: "3 5")
            start = digit & ~pending
            vnum, vden, ops, osp, vsp, used, ok = state
            ok &= ~(start & ~expect_operand)
            d = c - ord("0")
            new_lit = (jnp.where(start, d, jnp.where(digit & (digits < _MAX_LITERAL_DIGITS),
                                                     value * 10 + d, value)),
                       digits + digit, jnp.where(start, False, lead_zero | (digit & pending &
                                                                              (digits == 1) &
                                                                              (value == 0))),
                       pending | digit)
            lit = jax.tree.map(lambda a, b: jnp.where(digit, a, b), new_lit, lit)
            state = (vnum, vden, ops, osp, vsp, used, ok)
            expect_operand = jnp.where(start, False, expect_operand)
            # a non-digit inside the content: the pending literal ends first
            other = inside & ~digit
            flushed, cleared = flush((state, lit))
            state = jax.tree.map(lambda a, b: jnp.where(other, a, b), flushed, state)
            lit = jax.tree.map(lambda a, b: jnp.where(other, a, b), cleared, lit)
            op = jnp.zeros((), jnp.int32)
            for ch, code in _OPS.items():
                op = jnp.where(c == ch, code, op)
            binop = other & (op > 0)
            opening = other & (c == ord("("))
            closing = other & (c == ord(")"))
            space = other & jnp.any(c == jnp.asarray(WHITESPACE))
            vnum, vden, ops, osp, vsp, used, ok = state
            ok &= ~(other & ~(binop | opening | closing | space))  # an unexpected character
            ok &= ~((binop | closing) & expect_operand) & ~(opening & ~expect_operand)
            ok &= ~(opening & (depth >= max_depth)) & ~(closing & (depth == 0))
            state = (vnum, vden, ops, osp, vsp, used, ok)
            prec = jnp.where(op >= _TIMES, 2, 1)
            reduced = jax.lax.cond(binop & ok, lambda st: reduce(st, False, prec),
                                   lambda st: st, state)
            reduced = jax.lax.cond(closing & ok, lambda st: reduce(st, True), lambda st: st,
                                   reduced)
            vnum, vden, ops, osp, vsp, used, ok = reduced
            push = (binop | opening) & ok
            ops = jnp.where(push, ops.at[osp].set(jnp.where(opening, _OPEN_PAREN, op)), ops)
            osp = osp + push - (closing & ok)  # ')' pops its '('
            depth = depth + opening - closing
            expect_operand = jnp.where(binop | opening, True, expect_operand)
            return ((vnum, vden, ops, osp, vsp, used, ok), lit, expect_operand, depth), None

        zeros = jnp.zeros((stack,), jnp.int32)
        state = (zeros, jnp.ones((stack,), jnp.int32), zeros, jnp.int32(0), jnp.int32(0),
                 jnp.zeros(nums.shape, bool), found & (hi - lo <= max_chars))
        lit = (jnp.int32(0), jnp.int32(0), jnp.asarray(False), jnp.asarray(False))
        (state, lit, expect_operand, depth), _ = jax.lax.scan(
            step, (state, lit, jnp.asarray(True), jnp.int32(0)), jnp.arange(n))
        state, _ = flush((state, lit))
        expect_operand = expect_operand & ~lit[3]
        vnum, vden, ops, osp, vsp, used, ok = reduce(state, True)
        ok &= ~expect_operand & (depth == 0) & (vsp == 1) & (osp == 0)
        return vnum[0], vden[0], ok

    return Fraction(*jax.vmap(row)(decoded.chars, span.found, span.lo, span.hi, numbers,
                                   n_numbers))


@dataclasses.dataclass(frozen=True, eq=False)  # hashed by identity: a jit-able callable
class TokenVerifier:
    """A task's verifier on token ids (`Task.token_verifier`): `gold(examples)` puts what the
    score needs on the host as arrays with a leading [B] axis (a prompt table holds them on
    the device), and `verifier(tokens, mask, gold)` returns (scores [B], format [B]) float32,
    equal to `task.score` and `format_reward` of the decoded completions. Pure and jittable.

    Attributes:
      table: [V] `byte_table` of the tokenizer; eos_id: its EOS id.
      gold_fn: examples -> a pytree of numpy arrays [B, ...].
      score_fn: (Decoded, Span, gold) -> [B] float32 scores in [0, 1].
    """

    table: np.ndarray
    eos_id: int
    gold_fn: Callable[[Sequence[Any]], Any]
    score_fn: Callable[[Decoded, Span, Any], jax.Array]

    def gold(self, examples: Sequence[Any]):
        return self.gold_fn(examples)

    def __call__(self, tokens: jax.Array, mask: jax.Array, gold) -> tuple[jax.Array, jax.Array]:
        decoded = decode(jnp.asarray(self.table), tokens, mask, eos_id=self.eos_id)
        return self.score_fn(decoded, answer_span(decoded), gold), format_scores(decoded)


__all__ = [
    "WHITESPACE",
    "Decoded",
    "Fraction",
    "Numbers",
    "Span",
    "TokenVerifier",
    "answer_span",
    "byte_table",
    "compact",
    "decimal_zeros",
    "decode",
    "encode_numbers",
    "encode_texts",
    "exact_answer",
    "expression_value",
    "format_scores",
    "is_space",
    "number_list",
    "positional_matches",
    "utf8_chars",
]
