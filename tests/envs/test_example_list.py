"""envs.text.base: ExampleList (a data filter's training list over a base task), the batch
verifier `verify_batch` and its outcome counts."""

import pytest

from jaxrl_suite.envs.text import ExampleList, make_task
from jaxrl_suite.envs.text.base import Verdicts, label_entropy, outcome_fractions, verdict_metrics


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


def test_label_entropy_in_bits():
    assert label_entropy([]) == 0.0
    assert label_entropy(["rejected"] * 7) == 0.0  # a collapsed batch
    assert label_entropy(["a", "b"] * 3) == pytest.approx(1.0)
    assert label_entropy(["a", "b", "c", "d"]) == pytest.approx(2.0)
    # 3 : 1 -> -(0.75 log2 0.75 + 0.25 log2 0.25), computed by hand: 0.811278...
    assert label_entropy(["x", "x", "x", "y"]) == pytest.approx(0.8112781245)


def test_verdict_metrics_log_outcomes_their_entropy_and_reward_components():
    v = Verdicts([1.0, 0.0, 0.0, 0.0], ["selected", "rejected", "rejected", "invalid"],
                 rewards=[2.0, -1.0, 0.5, -1.0],
                 components={"decision": [1.0, 0.0, 0.0, 0.0], "length": [0.0, -0.2, 0.0, 0.0]})
    m = verdict_metrics(v)
    assert m == pytest.approx({
        "outcome_invalid": 0.25, "outcome_rejected": 0.5, "outcome_selected": 0.25,
        "outcome_entropy": 1.5, "reward_decision": 0.25, "reward_length": -0.05})
    assert verdict_metrics(Verdicts([1.0])) == {}
