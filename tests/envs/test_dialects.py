"""The dialects task (envs/text/dialects.py): determinism, disjoint vocabularies with a shared
surface, the content words decide the label, balance, disjoint splits, the reward and errors."""

import numpy as np
import pytest

from jaxrl_suite.envs.text import TASKS, make_task
from jaxrl_suite.envs.text.dialects import FUNCTION_WORDS, DialectsTask, dialect_vocab


def test_registered_deterministic_and_well_formed():
    assert "dialects" in TASKS.names()
    task = make_task("dialects", seed=3)
    assert task.example("train", 7) == DialectsTask(seed=3).example("train", 7)
    assert task.vocab() != DialectsTask(seed=4).vocab()
    for ex in task.examples("train", 0, 50):
        words = ex.prompt.split()
        assert len(words) == task.content_words + task.function_words
        assert len(ex.prompt) <= task.max_text_len()
        assert [w for w in words if w not in FUNCTION_WORDS] == list(ex.meta.content)


def test_vocabularies_are_disjoint_and_alike_on_the_surface():
    a, b = dialect_vocab(0, 48)
    assert len(set(a)) == len(set(b)) == 48 and not set(a) & set(b)
    assert not (set(a) | set(b)) & set(FUNCTION_WORDS)
    assert abs(np.mean([len(w) for w in a]) - np.mean([len(w) for w in b])) < 1.0


def test_content_words_decide_the_balanced_label():
    task = DialectsTask()
    vocab = task.vocab()
    exs = task.examples("train", 0, 400)
    for ex in exs:
        assert set(ex.meta.content) <= set(vocab[ex.meta.label])
        assert ex.answer == "AB"[ex.meta.label]
    assert 0.4 < np.mean([ex.meta.label for ex in exs]) < 0.6
    test = {ex.prompt for ex in task.examples("test", 0, 100)}
    assert not test & {ex.prompt for ex in exs}


def test_reward_and_errors():
    task = DialectsTask()
    ex = task.example("train", 0)
    assert task.score(task.solution(ex), ex) == 1.0
    assert task.score("<answer>C</answer>", ex) == 0.0
    with pytest.raises(ValueError, match="words_per_dialect"):
        DialectsTask(words_per_dialect=1)
    with pytest.raises(ValueError, match="content_words"):
        DialectsTask(content_words=0)
