"""envs.text.base: ExampleList (a data filter's training list over a base task), the batch
verifier `verify_batch` and its outcome counts."""

import pytest

from jaxrl_suite.envs.text import ExampleList, make_task
from jaxrl_suite.envs.text.base import Verdicts, outcome_fractions


@pytest.fixture(scope="module")
def base():
    return make_task("arithmetic", digits=2)


def test_example_list_walks_its_examples_in_seeded_epochs(base):
    train = tuple(base.examples("train", 0, 5))
    task = ExampleList(base, train, seed=3)
    epochs = [[task.example("train", e * 5 + i) for i in range(5)] for e in range(3)]
    for epoch in epochs:  # each epoch is a permutation of the list
        assert sorted(x.prompt for x in epoch) == sorted(x.prompt for x in train)
    assert [x.prompt for x in epochs[0]] != [x.prompt for x in epochs[1]] or \
        [x.prompt for x in epochs[1]] != [x.prompt for x in epochs[2]]
    again = ExampleList(base, train, seed=3)
    assert [again.example("train", i) for i in range(15)] == [x for e in epochs for x in e]
    assert task.example("test", 4) == base.example("test", 4)  # held-out: the base's
    ex = train[0]
    assert task.solution(ex) == base.solution(ex)
    assert task.score(base.solution(ex), ex) == 1.0


def test_example_list_errors(base):
    with pytest.raises(ValueError, match="no train examples"):
        ExampleList(base, ())
    task = ExampleList(base, tuple(base.examples("train", 0, 2)))
    with pytest.raises(ValueError, match="unknown split"):
        task.example("valid", 0)
    with pytest.raises(ValueError, match="index must be >= 0"):
        task.example("train", -1)


def test_verify_batch_is_score_by_default(base):
    exs = base.examples("train", 0, 3)
    texts = [base.solution(exs[0]), "<answer>-1</answer>", "garbage"]
    v = base.verify_batch(texts, exs)
    assert v.scores == [base.score(t, e) for t, e in zip(texts, exs, strict=True)]
    assert v.scores == [1.0, 0.0, 0.0]
    assert v.outcomes is None and outcome_fractions(v) == {}
    with pytest.raises(ValueError, match="3 completions for 2 examples"):
        base.verify_batch(texts, exs[:2])


def test_outcome_fractions():
    v = Verdicts([0.0, 1.0, 0.0, 0.5], ["syntax", "ok", "timeout", "failed"])
    assert outcome_fractions(v) == {"outcome_failed": 0.25, "outcome_ok": 0.25,
                                    "outcome_syntax": 0.25, "outcome_timeout": 0.25}
