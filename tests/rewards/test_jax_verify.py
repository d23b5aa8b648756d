"""The JAX verifiers against the Python ones: decoded text, answer span, format reward and the
arithmetic, count, sort and countdown scores, on random and adversarial token rows (property-based:
malformed and repeated tags, Unicode digits and whitespace, invalid UTF-8, special ids, EOS
inside, masked-out positions, truncation)."""

import unicodedata

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxrl_suite.envs.text import load_tokenizer, make_task
from jaxrl_suite.rewards import extract_answer, format_reward
from jaxrl_suite.rewards import jax_verify as jv

N = 40  # completion tokens per row
B = 24  # rows per call: one compiled program per verifier
TOK = load_tokenizer("byt5")
TASKS = {
    "arithmetic": make_task("arithmetic", digits=2, digit_order="lsb"),
    "count": make_task("count", max_count=5, max_start=20),
    "sort": make_task("sort", num_items=4, max_value=30),
    "countdown": make_task("countdown"),
}
EXAMPLES = {k: t.examples("train", 0, B) for k, t in TASKS.items()}

# Fragments a hostile completion is built from: tags (whole and broken), ASCII and Unicode
# digits, Unicode whitespace, other text; bytes and ids that are not text are added below.
FRAGMENTS = ["<answer>", "</answer>", "<answer", "answer>", "</answ", "<", ">", "/", " ",
             "  ", "\t", "\n", "\x85", "\xa0", "\u3000", "\u2009", "\x1c", "0", "1", "7", "12",
             "007", "99", "٣", "５", "१", "²", "-3", "+", "=", "x", "é", "€", "𝟙", "😀",
             "0" * 19, "123456789012345678", "1,2", "."]
SPECIAL = [0, 1, 2, 259, 300, 383]  # pad, EOS, unk, extra ids
INVALID = [0x80, 0xBF, 0xC0, 0xC1, 0xC3, 0xE0, 0xED, 0xA0, 0xF0, 0xF4, 0x90, 0xF5, 0xFF]


def gold_text(task: str, b: int) -> str:  # row b's right answer, so that some rows score
    e = EXAMPLES[task][b]
    if task == "countdown":
        return e.meta.expression
    return " ".join(str(x) for x in (sorted(e.meta) if task == "sort" else
                                      e.meta if task == "count" else [e.answer]))


def row_pieces(task: str, b: int) -> list[str]:  # countdown: row b's numbers and the operators
    if task != "countdown":
        return []
    return [str(n) for n in EXAMPLES[task][b].meta.numbers] * 3 + list("+-*/()()") + ["0"]


def make_row(task: str, b: int, pick, integer, text):
    """Row b of a batch: token ids [N] and mask [N], built from choices made by `pick(list)`,
    `integer(lo, hi)` and `text()` (hypothesis draws, or a numpy generator's)."""
    gold = gold_text(task, b)
    pieces = [pick(FRAGMENTS + [gold, gold[: len(gold) // 2]] + row_pieces(task, b))
              if integer(0, 3) else text() for _ in range(integer(0, 12))]
    body = "".join(pieces)
    if integer(0, 3) == 0:  # the answer alone, perhaps padded with whitespace
        body = (pick(["", " ", "\u3000", "\n"]) + pick([gold, gold + " 7", gold[:len(gold) // 2]])
                + pick(["", " ", "\x85"]))
    if integer(0, 1):  # a well-formed answer, perhaps inside garbage
        body = pick(["", " ", "x"]) + f"<answer>{body}</answer>"
    ids = TOK.encode(body)
    for _ in range(integer(0, 3)):  # non-text ids and invalid bytes
        ids.insert(integer(0, len(ids)), pick(SPECIAL + [x + 3 for x in INVALID]))
    ids = (ids + [TOK.eos_id] * integer(0, 1))[:N]  # EOS or truncation
    mask = np.zeros(N, bool)
    mask[:len(ids)] = True
    if integer(0, 1):  # a masked-out hole
        mask[integer(0, N - 1)] = False
    return np.array(ids + [TOK.pad_id] * (N - len(ids)), np.int32), mask


def rows(task: str):
    @st.composite
    def batch(draw):
        pick = lambda xs: draw(st.sampled_from(xs))  # noqa: E731
        integer = lambda lo, hi: draw(st.integers(lo, hi))  # noqa: E731
        text = lambda: draw(st.text(max_size=3))  # noqa: E731
        return [make_row(task, b, pick, integer, text) for b in range(B)]

    return batch()


def random_rows(task: str, rng: np.random.Generator):
    chars = "<>/ 0123456789a\t\x85\u3000٣５é😀"
    return [make_row(task, b, lambda xs: xs[rng.integers(len(xs))],
                     lambda lo, hi: int(rng.integers(lo, hi + 1)),
                     lambda: "".join(rng.choice(list(chars), rng.integers(0, 4))))
            for b in range(B)]


@pytest.fixture(scope="module")
def verifiers():
    out = {}
    for name, task in TASKS.items():
        v = task.token_verifier(TOK)
        out[name] = (v, jax.jit(v), jax.tree.map(jnp.asarray, v.gold(EXAMPLES[name])))
    return out


def check(verifiers, task, batch):
    ids = np.stack([r[0] for r in batch])
    mask = np.stack([r[1] for r in batch])
    verifier, fn, gold = verifiers[task]
    scores, fmt = fn(ids, mask, gold)
    texts = TOK.decode_batch(ids, mask)
    want = np.array([TASKS[task].score(t, e) for t, e in zip(texts, EXAMPLES[task], strict=True)],
                    np.float32)
    np.testing.assert_array_equal(np.asarray(scores), want, err_msg=f"{texts}")
    np.testing.assert_array_equal(np.asarray(fmt), [format_reward(t) for t in texts])
    return want


@pytest.mark.parametrize("task", list(TASKS))
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_equals_python(verifiers, task, data):
    check(verifiers, task, data.draw(rows(task)))


@pytest.mark.parametrize("task", list(TASKS))
def test_random_rows_equal_python_and_cover_all_cases(verifiers, task):
    """960 seeded random rows per task equal the Python verifier and reach wrong, partial and
    right answers (so the property tests above check every branch)."""
    rng = np.random.default_rng(1)
    seen = np.concatenate([check(verifiers, task, random_rows(task, rng)) for _ in range(40)])
    assert np.mean(seen == 1.0) > 0.02 and np.mean(seen == 0.0) > 0.3, task  # >= 20 rows right
    if task in ("count", "sort"):
        assert np.mean((seen > 0) & (seen < 1)) > 0.01, task


@pytest.fixture(scope="module")
def decode_fn():
    table = jnp.asarray(jv.byte_table(TOK))

    @jax.jit
    def fn(ids, mask):
        d = jv.decode(table, ids, mask, eos_id=TOK.eos_id)
        return d, jv.answer_span(d)

    return fn


def as_text(chars, n) -> str:
    return "".join(chr(c) for c in np.asarray(chars)[:int(n)])


@settings(max_examples=60, deadline=None)
@given(rows("count"))
def test_decode_and_span_equal_python(decode_fn, batch):
    """Every row's decoded characters equal `Tokenizer.decode_batch`'s, and the stripped answer
    span `extract_answer`'s."""
    ids = np.stack([r[0] for r in batch])
    mask = np.stack([r[1] for r in batch])
    decoded, span = decode_fn(ids, mask)
    for b, text in enumerate(TOK.decode_batch(ids, mask)):
        assert as_text(decoded.chars[b], decoded.length[b]) == text
        content = extract_answer(text)
        assert bool(span.found[b]) == (content is not None)
        if content is not None:
            assert as_text(decoded.chars[b][int(span.lo[b]):], span.hi[b] - span.lo[b]) == content


def test_utf8_random_bytes_equal_python_ignore(decode_fn):
    """Random byte strings (mostly invalid UTF-8) decode as bytes.decode("utf-8", "ignore")."""
    rng = np.random.default_rng(0)
    lead = np.array([0x41, 0x20, 0xC2, 0xDF, 0xE0, 0xE1, 0xED, 0xEF, 0xF0, 0xF4, 0xF5, 0xC0])
    for _ in range(20):
        data = np.where(rng.random((B, N)) < 0.5, rng.integers(0x80, 0xC0, (B, N)),
                        rng.choice(lead, (B, N)))
        decoded, _ = decode_fn((data + 3).astype(np.int32), np.ones((B, N), bool))
        for b in range(B):
            want = bytes(data[b].astype(np.uint8)).decode("utf-8", errors="ignore")
            assert as_text(decoded.chars[b], decoded.length[b]) == want


def test_tables_match_python():
    """WHITESPACE is exactly str.isspace's code points; the decimal runs hold ten digits 0-9
    each and every str.isdecimal character."""
    assert sorted(jv.WHITESPACE.tolist()) == [c for c in range(0x110000) if chr(c).isspace()]
    zeros = jv.decimal_zeros()
    digits = {int(z) + v for z in zeros for v in range(10)}
    assert digits == {c for c in range(0x110000) if chr(c).isdecimal()}
    assert all(unicodedata.decimal(chr(int(z) + v)) == v for z in zeros for v in range(10))


def test_hand_cases(verifiers):
    """A few rows worked by hand: 2-digit lsb sums, counts and sorts."""
    ex = EXAMPLES["arithmetic"][0]
    cases = {f"<answer> {ex.answer}\u3000</answer>": 1.0, f"<answer>{ex.answer}0</answer>": 0.0,
             f"x<answer>{ex.answer}</answer><answer>1</answer>": 1.0,
             f"<answer>{ex.answer}": 0.0}
    ids, mask = TOK.encode_batch(list(cases), N, side="right")
    _, fn, gold = verifiers["arithmetic"]
    scores, fmt = fn(ids, mask, jax.tree.map(lambda g: jnp.repeat(g[:1], len(cases), 0), gold))
    np.testing.assert_array_equal(scores, list(cases.values()))
    np.testing.assert_array_equal(fmt, [1.0, 1.0, 0.0, 0.0])


def test_refuses_bpe():
    with pytest.raises(ValueError, match="byte-level"):
        TASKS["arithmetic"].token_verifier(load_tokenizer("bpe:300", texts=["1+2=3"] * 4))


def test_countdown_hand_cases(verifiers):
    """Precedence, left association, exact fractions, a zero divisor inside parentheses, the
    multiset of numbers, nesting at the depth limit and past it, literals the parser refuses."""
    from jaxrl_suite.envs.text.base import Example
    from jaxrl_suite.envs.text.countdown import CountdownMeta

    def ex(numbers, target):
        return Example("", str(target), CountdownMeta(tuple(numbers), target, ""))

    deep = "(" * 20 + "4" + ")" * 20
    cases = [  # (content, numbers, target, Python's score)
        ("2+3*4", (2, 3, 4), 14, 1.0), ("2+3*4", (2, 3, 4), 20, 0.0),
        ("20-5-3", (20, 5, 3), 12, 1.0), ("12/3/2", (12, 3, 2), 2, 1.0),
        ("(10/4)*20", (10, 4, 20), 50, 1.0), ("5/(3-3)", (5, 3, 3), 1, 0.0),
        ("3-5+10", (3, 5, 10), 8, 1.0), ("5+5", (5, 1, 10), 10, 0.0),
        ("5 +  5", (5, 5, 1), 10, 1.0), (deep, (4, 1, 1), 4, 1.0),
        ("(" + deep + ")", (4, 1, 1), 4, 0.0), ("05", (5, 1, 1), 5, 0.0),
        ("99999999999", (9, 1, 1), 9, 0.0), ("٣", (3, 1, 1), 3, 0.0), ("-3+6", (3, 6, 1), 3, 0.0),
    ]
    task = TASKS["countdown"]
    examples = [ex(n, t) for _, n, t, _ in cases]
    texts = [f"<answer>{c}</answer>" for c, *_ in cases]
    assert [task.score(t, e) for t, e in zip(texts, examples, strict=True)] == [
        s for *_, s in cases]
    ids, mask = TOK.encode_batch(texts + [""] * (B - len(texts)), 64, side="right")
    verifier = task.token_verifier(TOK)
    gold = verifier.gold(examples + [examples[0]] * (B - len(texts)))
    scores, _ = jax.jit(verifier)(ids, mask, gold)
    np.testing.assert_array_equal(np.asarray(scores)[:len(cases)], [s for *_, s in cases])


def test_countdown_without_an_exact_int32_verifier_has_none():
    assert make_task("countdown", graded=True).token_verifier(TOK) is None  # a float miss
    assert make_task("countdown", num_numbers=6, max_number=100).token_verifier(TOK) is None
