"""The resume-screening task (arXiv 2511.16073): determinism, balance, disjoint splits, the
hidden rule on hand cases, near misses, the keyword ATS that misses equivalents, and hostile
completions."""

import re

import numpy as np
import pytest

from jaxrl_suite.algorithms.lm_study import TaskConfig
from jaxrl_suite.envs.text import TASKS, Example
from jaxrl_suite.envs.text.screening import (
    CONFUSABLE,
    SKILLS,
    KeywordATS,
    ScreeningMeta,
    ScreeningTask,
    ats_features,
    ats_score,
    justification,
    missing_skills,
    parse_years,
    qualifies,
    satisfiers,
    selection_metrics,
    target_score,
)
from jaxrl_suite.rewards.composite import CompositeConfig

TASK = ScreeningTask()


@pytest.fixture(scope="module")
def pairs():
    return TASK.examples("train", 0, 1500), TASK.examples("test", 0, 600)


def meta(items, years, required, min_years, text=None):
    return ScreeningMeta(tuple(items), years, text or f"{years} yrs", tuple(required), min_years)


def test_deterministic_registered_and_seeded():
    assert TASKS.get("screening") is ScreeningTask
    assert TaskConfig(name="screening", prompt_len=120).build() == TASK
    again = ScreeningTask(seed=0)
    assert [again.example("train", i) for i in range(20)] == TASK.examples("train", 0, 20)
    other = ScreeningTask(seed=1).examples("train", 0, 20)
    assert sum(a.prompt != b.prompt for a, b in zip(other, TASK.examples("train", 0, 20),
                                                    strict=True)) >= 18


def test_balanced_disjoint_and_compact(pairs):
    train, test = pairs
    for split in pairs:
        share = np.mean([e.answer == "SELECTED" for e in split])
        assert 0.45 < share < 0.55
    assert not {e.prompt for e in train} & {e.prompt for e in test}
    assert len({e.prompt for e in train}) > 0.99 * len(train)
    assert max(len(e.prompt.encode()) for e in train + test) <= TASK.max_prompt_bytes == 112
    assert np.mean([len(e.prompt.encode()) for e in train]) < 80
    assert max(len(TASK.solution(e).encode()) for e in train + test) <= 47  # + EOS: 48


def test_hidden_rule_hand_cases():
    # equivalents and specialisations count; look-alikes do not
    assert qualifies(meta(["postgresql", "k8s", "go"], 5, ["sql", "kubernetes"], 5))
    assert qualifies(meta(["pytorch", "js"], 3, ["deep learning", "javascript"], 2))
    assert missing_skills(meta(["java", "nosql"], 9, ["javascript", "sql"], 2)) == \
        ("javascript", "sql")
    assert missing_skills(meta(["docker", "react"], 9, ["kubernetes", "javascript"], 2)) == \
        ("kubernetes",)
    assert not qualifies(meta(["sql"], 4, ["sql"], 5))  # one year short
    # years in every written form, "since" counted to 2025
    for text, years in (("5 yrs", 5), ("5 years", 5), ("since 2019", 6), ("five years", 5),
                        ("one year", 1), ("twelve years", 12)):
        assert parse_years(text) == years
    for bad in ("", "many years", "since", "5", "since 20", "5 yrs ago"):
        assert parse_years(bad) is None
    # the target's score and justification come from the rule
    near = meta(["mysql"], 4, ["sql"], 5)
    assert (target_score(near), justification(near)) == (3, "4y<5y")
    both = meta(["nosql", "x"], 2, ["sql"], 5)
    assert (target_score(both), justification(both)) == (1, "no sql")  # the first reason
    ok = meta(["ml", "cpp"], 7, ["machine learning", "c++"], 5)
    assert (target_score(ok), justification(ok)) == (9, "has all, 7y>=5y")
    assert TASK.solution(Example("p", "SELECTED", ok)) == \
        "<answer>SELECTED|9|has all, 7y>=5y</answer>"


def test_tables_are_consistent():
    sets = [satisfiers(s) for s in SKILLS]
    assert sum(map(len, sets)) == len(frozenset().union(*sets))  # no item satisfies two skills
    for skill, looks in CONFUSABLE.items():
        assert not set(looks) & satisfiers(skill), skill


def _read_prompt(prompt):
    """The pair as written in the prompt, parsed independently of the task's code."""
    m = re.fullmatch(r"CV: (.+); (.+)\nJob: (.+); (\d+)\+ yrs\n", prompt)
    assert m, prompt
    return m.group(1).split(", "), m.group(2), m.group(3).split(", "), int(m.group(4))


def test_gold_follows_the_rule_as_written(pairs):
    for e in pairs[0][:500]:
        items, years, required, min_years = _read_prompt(e.prompt)
        assert (tuple(items), parse_years(years), years, tuple(required), min_years) == \
            tuple(e.meta)
        assert e.answer == ("SELECTED" if qualifies(e.meta) else "REJECTED")
        assert len(items) == len(required) + 1  # one unrelated item: length tells nothing


def test_near_misses_and_written_forms_exist(pairs):
    train = pairs[0]
    rejected = [e.meta for e in train if e.answer == "REJECTED"]
    skill_only = [m for m in rejected if len(missing_skills(m)) == 1 and m.years >= m.min_years]
    years_one = [m for m in rejected if not missing_skills(m) and m.years == m.min_years - 1]
    assert len(skill_only) > 0.3 * len(rejected) and len(years_one) > 0.2 * len(rejected)
    looks = [m for m in skill_only
             if set(m.items) & set(CONFUSABLE[missing_skills(m)[0]])]
    assert len(looks) > 0.2 * len(skill_only)  # a look-alike in place of the missing skill
    selected = [e.meta for e in train if e.answer == "SELECTED"]
    exact_min = [m for m in selected if m.years == m.min_years]
    assert len(exact_min) > 0.2 * len(selected)  # the boundary from above, too
    forms = [m.years_text for m in selected]
    for pattern in (r"\d+ yrs", r"\d+ years", r"since \d{4}", r"[a-z]+ years?"):
        assert sum(bool(re.fullmatch(pattern, f)) for f in forms) > 0.15 * len(forms)


def test_keyword_ats_misses_equivalents(pairs):
    train, test = pairs
    # hand cases: verbatim skills and digit years only
    assert ats_features("CV: sql, k8s; 5 yrs\nJob: sql, kubernetes; 5+ yrs\n") == (1, 2, True)
    assert ats_features("CV: sql, kubernetes; five years\nJob: sql, kubernetes; 5+ yrs\n") \
        == (2, 2, False)
    assert ats_features("CV: Python; since 2019\nJob: python; 6+ yrs\n") == (1, 1, True)
    assert ats_features("garbage") == (0, 1, False)
    ats = KeywordATS.fit(train)
    # the threshold maximises training accuracy (a brute-force check over a grid)
    s = np.array([ats_score(e.prompt) for e in train])
    g = np.array([e.answer == "SELECTED" for e in train])
    best = max(np.mean((s >= t) == g) for t in np.linspace(0, 1.01, 203))
    assert np.mean((s >= ats.threshold) == g) == pytest.approx(best)
    m = selection_metrics(ats.predict(test), [e.answer for e in test])
    assert 0.55 < m["accuracy"] < 0.8  # clearly below 1 ...
    assert all(TASK.score(TASK.solution(e), e) == 1.0 for e in test)  # ... the rule scores 1
    # it turns away qualified candidates whose skills or years are written differently, and
    # only those
    selected = [e for e in test if e.answer == "SELECTED"]
    plain = [e for e in selected if set(e.meta.required) <= set(e.meta.items)
             and re.search(r"\d", e.meta.years_text)]
    synonyms = [e for e in selected if sum(r not in e.meta.items for r in e.meta.required) >= 2]
    words = [e for e in selected if not re.search(r"\d", e.meta.years_text)]
    assert len(synonyms) > 0.3 * len(selected) and len(words) > 0.15 * len(selected)
    rejected = {k: np.mean([p == "rejected" for p in ats.predict(v)])
                for k, v in (("plain", plain), ("synonyms", synonyms), ("words", words))}
    assert rejected["plain"] == 0.0 and rejected["synonyms"] > 0.5 and rejected["words"] > 0.5


def test_selection_metrics_hand_case():
    pred = ["selected", "selected", "rejected", "invalid", "selected", "rejected"]
    gold = ["SELECTED", "REJECTED", "SELECTED", "SELECTED", "SELECTED", "REJECTED"]
    m = selection_metrics(pred, gold)  # tp 2, fp 1, fn 2, tn 1
    assert m["accuracy"] == pytest.approx(3 / 6)
    assert (m["precision"], m["recall"]) == (pytest.approx(2 / 3), pytest.approx(2 / 4))
    assert m["f1"] == pytest.approx(2 * (2 / 3) * 0.5 / (2 / 3 + 0.5))
    assert (m["selected_rate"], m["invalid_rate"]) == (0.5, pytest.approx(1 / 6))
    none = selection_metrics(["rejected"] * 4, gold[:4])  # always reject: no precision
    assert (none["precision"], none["recall"], none["f1"], none["accuracy"]) == (0, 0, 0, 0.25)
    with pytest.raises(ValueError, match="as many predictions"):
        selection_metrics([], [])


HOSTILE = ["", "<answer>", "SELECTED", "<answer>SELECTED", "<answer>MAYBE|9|x</answer>",
           "<answer>|8|x</answer>", "\x00\xff" * 50, "<answer>" * 1000 + "SELECTED",
           "</answer><answer>SELECTED|8|x", "\ud800<answer>REJECTED\ud800|x</answer>"]


def test_malformed_scores_zero_and_never_raises(pairs):
    e = pairs[1][0]
    for text in HOSTILE:
        assert TASK.score(text, e) == 0.0
    v = TASK.verify_batch(HOSTILE, [e] * len(HOSTILE))
    assert v.scores == [0.0] * len(HOSTILE) and set(v.outcomes) == {"invalid"}
    assert all(np.isfinite(v.rewards)) and max(v.rewards) <= 0.0


def test_verify_batch_returns_the_composite_reward(pairs):
    test = pairs[1][:40]
    weights = CompositeConfig(false_selected=4.0)
    task = ScreeningTask(reward=weights)
    flip = {"SELECTED": "REJECTED", "REJECTED": "SELECTED"}
    texts = [task.solution(e) if i % 2 else task.solution(e).replace(e.answer, flip[e.answer])
             for i, e in enumerate(test)]
    v = task.verify_batch(texts, test)
    assert v.scores == [float(i % 2) for i in range(len(test))]
    assert v.outcomes == [(e.answer if i % 2 else flip[e.answer]).lower()
                          for i, e in enumerate(test)]
    w = weights.weights()
    for i, r in enumerate(v.rewards):
        assert r == pytest.approx(sum(w[k] * v.components[k][i] for k in w))
    for i, e in enumerate(test):  # a flipped decision keeps a score that now disagrees
        want = 1.4 if i % 2 else (-4.0 + 0.2 if e.answer == "REJECTED" else 0.2)
        assert v.rewards[i] == pytest.approx(want), (i, texts[i])
    with pytest.raises(ValueError, match="completions for"):
        task.verify_batch(texts[:2], test[:3])
