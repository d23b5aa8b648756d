"""The topics task (envs/text/topics.py): determinism, disjoint splits, the agent decides the
topic, a keyword matcher does poorly, the reward and the one-line errors."""

import re
from collections import Counter

import numpy as np
import pytest

from jaxrl_suite.envs.text import TASKS, make_task
from jaxrl_suite.envs.text.tfds_tasks import CLASSIFY_TEMPLATE
from jaxrl_suite.envs.text.topics import (
    KEYWORDS,
    TEMPLATES,
    TopicMeta,
    TopicsTask,
    keyword_baseline_accuracy,
    keyword_topic,
)

TOPIC_OF = {w: t for t, words in KEYWORDS.items() for w in words}


def _agent(text: str) -> list[str]:
    """An independent reading of the sentence: the person word(s) doing the main verb."""
    words = re.findall(r"[a-z]+", text)
    if " and " in text:  # two agents, then the verb
        return [words[0], words[2]]
    if " was " in text:  # passive: the noun after "by"
        return [words[words.index("by") + 1]]
    if "," in text:  # fronted phrase: the subject follows the comma
        return [re.findall(r"[a-z]+", text.split(",")[1])[0]]
    return [words[0]]


def test_registered_deterministic_and_well_formed():
    assert "topics" in TASKS.names()
    task = make_task("topics", seed=3)
    assert task.example("train", 11) == TopicsTask(seed=3).example("train", 11)
    assert task.example("train", 11) != TopicsTask(seed=4).example("train", 11)
    names = TopicsTask.labels()
    assert 6 <= len(names) <= 8
    for ex in task.examples("train", 0, 300):
        m = TopicMeta(*ex.meta)
        assert ex.prompt == CLASSIFY_TEMPLATE.format(text=m.text, labels=", ".join(names))
        assert ex.answer == names[m.label] and m.names == names
        assert len(m.text) <= task.max_text_len() <= 70
        assert [TOPIC_OF[w] for w in m.agents] == [TOPIC_OF[w] for w in _agent(m.text)] or \
            m.template == "ambiguous"
        if m.template == "ambiguous":  # gold is one of the two agents' topics
            assert sorted(m.agents) == sorted(_agent(m.text)) and ex.answer in {
                TOPIC_OF[w] for w in m.agents} and len({TOPIC_OF[w] for w in m.agents}) == 2
        else:
            assert ex.answer == TOPIC_OF[_agent(m.text)[0]]
        persons = [w for w in re.findall(r"[a-z]+", m.text) if w in TOPIC_OF]
        assert len(persons) == 3  # every text names three people ...
        assert len({TOPIC_OF[w] for w in persons}) >= 2  # ... of at least two topics
        assert hash(ex)


def test_splits_are_disjoint_and_balanced():
    task = TopicsTask()
    train = {TopicMeta(*e.meta).text for e in task.examples("train", 0, 1500)}
    test = task.examples("test", 0, 300)
    assert not train & {TopicMeta(*e.meta).text for e in test}
    counts = Counter(e.answer for e in test)
    assert set(counts) == set(KEYWORDS) and min(counts.values()) > 300 / len(KEYWORDS) / 2
    templates = Counter(TopicMeta(*e.meta).template for e in test)
    assert set(templates) == {"active", "passive", "fronted", "ambiguous"}
    assert 0.04 < templates["ambiguous"] / len(test) < 0.18  # ambiguous=0.1
    assert "ambiguous" not in {TopicMeta(*e.meta).template
                               for e in TopicsTask(ambiguous=0.0).examples("test", 0, 200)}


def test_keywords_alone_do_not_decide():
    task = TopicsTask()
    assert keyword_topic("banker was sued by nurse behind pilot") == "finance"  # first mention
    assert keyword_topic("pilot met banker near trader") == "finance"  # the majority
    assert keyword_topic("nothing here") is None
    acc = keyword_baseline_accuracy(task, "test", 1000)
    examples = task.examples("test", 0, 1000)
    want = np.mean([keyword_topic(TopicMeta(*e.meta).text) == e.answer for e in examples])
    assert acc == pytest.approx(want)
    assert acc < 0.45  # a reader of the structure scores 1 - ambiguous / 2 = 0.95
    # With the agent always first the same matcher does well: the structure is what it misses.
    assert keyword_baseline_accuracy(TopicsTask(ambiguous=0.0, templates=("active",)),
                                     "test", 300) > 0.7


def test_score_solution_and_malformed():
    task = TopicsTask()
    ex = task.example("test", 0)
    assert task.score(task.solution(ex), ex) == 1.0
    assert task.score(f"<answer> {ex.answer.upper()} </answer>", ex) == 1.0
    wrong = next(n for n in TopicsTask.labels() if n != ex.answer)
    for bad in [f"<answer>{wrong}</answer>", ex.answer, f"<answer>{ex.answer}", "",
                "<answer></answer>", "\x00" * 1000]:
        assert task.score(bad, ex) == 0.0
    v = task.verify_batch([task.solution(ex), f"<answer>{wrong}</answer>", "junk"], [ex] * 3)
    assert v.scores == [1.0, 0.0, 0.0] and v.outcomes == [ex.answer, wrong, "invalid"]


def test_view_and_bounds():
    task = TopicsTask()
    longest = max(len(TopicMeta(*e.meta).text) for e in task.examples("train", 0, 3000))
    assert longest <= task.max_text_len() <= longest + 4
    for ex in task.examples("train", 0, 200):
        v = task.view(ex)
        assert (v.text, v.label) == (TopicMeta(*ex.meta).text, TopicMeta(*ex.meta).label)
        assert v.ambiguous == (TopicMeta(*ex.meta).template == "ambiguous")
        assert v.cue.split()[1:] == list(TopicMeta(*ex.meta).agents)
        assert len(v.cue) <= task.max_cue_len()


def test_bad_options_are_one_line_errors():
    with pytest.raises(ValueError, match="ambiguous"):
        TopicsTask(ambiguous=1.0)
    with pytest.raises(ValueError, match="templates"):
        TopicsTask(templates=("active", "sideways"))
    assert set(TEMPLATES) >= set(TopicsTask().templates)
