"""rewards.qa: SQuAD's answer normalisation (articles, punctuation, whitespace, case), EM and
token F1 on hand-worked cases, and the normalisation against a token-level reference."""

import string

import pytest
from hypothesis import given
from hypothesis import strategies as st

from jaxrl_suite.core.registry import UnknownNameError
from jaxrl_suite.rewards import QA_METRICS, exact_match, normalize_answer, span_match, token_f1


@pytest.mark.parametrize("text, expected", [
    # case
    ("Eiffel TOWER", "eiffel tower"),
    # articles: a/an/the as whole words only, anywhere
    ("The Eiffel Tower", "eiffel tower"),
    ("a cat, an apple & the dog.", "cat apple dog"),
    ("Theatre anthem", "theatre anthem"),
    ("The the THE", ""),
    # punctuation: removed, not replaced by a space (so "Eiffel-Tower" is one token)
    ("The  Eiffel-Tower!", "eiffeltower"),
    ("U.S.A.", "usa"),
    ("\"Hello,\" (world)?", "hello world"),
    ("a-the", "athe"),  # punctuation goes before the articles do
    # whitespace: every run becomes one space, none at the ends
    ("  New\t\tYork \n City  ", "new york city"),
    ("", ""),
])
def test_normalize_answer(text, expected):
    assert normalize_answer(text) == expected


def test_exact_match():
    assert exact_match("the Eiffel Tower.", "eiffel tower") == 1.0
    assert exact_match("Eiffel", "Eiffel Tower") == 0.0
    assert exact_match("tower eiffel", "eiffel tower") == 0.0  # EM keeps the order
    assert exact_match(None, "x") == 0.0


def test_token_f1_hand_worked():
    # pred "cat sat on mat" (4 tokens), gold "cat on mat" (3): 3 shared, P = 3/4, R = 1.
    assert token_f1("The cat sat on the mat", "a cat on the mat") == pytest.approx(6 / 7)
    # multisets: pred "cat cat cat", gold "cat dog": 1 shared, P = 1/3, R = 1/2, F1 = 2/5.
    assert token_f1("cat cat cat", "cat dog") == pytest.approx(0.4)
    assert token_f1("tower eiffel", "Eiffel Tower") == 1.0  # F1 ignores the order
    assert token_f1("Ohio", "Paris") == 0.0
    # a side with no tokens (SQuAD v2.0): 1.0 iff both have none.
    assert token_f1("the", "An") == 1.0 and token_f1("the", "barn") == 0.0
    assert token_f1(None, "x") == 0.0


def test_span_match_hand_worked():
    # normalised "born in veldor" holds the gold "veldor" as a whole token
    assert span_match("She was born in Veldor.", "veldor") == 1.0
    assert span_match("Veldoria", "Veldor") == 0.0  # a prefix of a token is not the token
    assert span_match("new york city", "New York") == 1.0  # a two-token run
    assert span_match("york new", "New York") == 0.0  # in the wrong order
    assert span_match("the answer: Port-Ell", "port ell") == 0.0  # "portell" vs "port ell"
    assert span_match("the answer: Port Ell!", "Port-Ell") == 0.0  # gold "portell"
    assert span_match("Port-Ell", "Port-Ell") == 1.0
    assert span_match("anything", "the") == 0.0 and span_match(None, "x") == 0.0
    assert span_match("", "x") == 0.0


def test_qa_metrics_registry():
    assert QA_METRICS.names() == ["em", "f1", "span"]
    assert QA_METRICS.get("em") is exact_match and QA_METRICS.get("f1") is token_f1
    assert QA_METRICS.get("span") is span_match
    with pytest.raises(UnknownNameError, match="'bleu'.*em, f1, span"):
        QA_METRICS.get("bleu")


_ASCII = string.ascii_letters + string.digits + string.punctuation + " \t\n"


def _reference_normalize(text: str) -> str:
    """Token-level SQuAD normalisation, valid for ASCII: after punctuation is gone, words are
    runs of [A-Za-z0-9] between whitespace, so "article" means "a whole token a/an/the"."""
    kept = text.lower().translate(str.maketrans("", "", string.punctuation))
    return " ".join(t for t in kept.split() if t not in ("a", "an", "the"))


@given(st.text(alphabet=_ASCII, max_size=60))
def test_normalize_answer_matches_token_reference(text):
    assert normalize_answer(text) == _reference_normalize(text)


@given(st.text(alphabet="ab .,-", max_size=24), st.text(alphabet="ab .,-", max_size=8))
def test_span_match_equals_padded_substring_reference(prediction, gold):
    # Independent formulation: a run of whole tokens is a substring of the space-padded texts.
    pred, ref = _reference_normalize(prediction), _reference_normalize(gold)
    want = float(bool(ref) and f" {ref} " in f" {pred} ")
    assert span_match(prediction, gold) == want
