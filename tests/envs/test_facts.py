"""The generated fact world and facts_qa task (envs/text/facts.py) and the BM25 retriever
(envs/text/retrieval.py): determinism, gold passages checked by an independent walk over the
relation tables, near-duplicate twins, disjoint splits, the span-match score, hostile queries and
the naive-retrieval coverage that leaves the searcher room to gain (s3, arXiv 2505.14146)."""

import re
from collections import Counter

import numpy as np
import pytest

from jaxrl_suite.algorithms.lm_study import TaskConfig
from jaxrl_suite.envs.text import TASKS, Example, make_task
from jaxrl_suite.envs.text.facts import (
    FactsQATask,
    FactWorld,
    build_world,
    naive_topk,
    world_retriever,
)
from jaxrl_suite.envs.text.retrieval import Retriever

TASK = FactsQATask()
WORLD = TASK.world

# the test's own reading of the passages: (relation, subject, object) or a combined fact
_FORMS = {
    "born_in": re.compile(r"(\w+ \w+) was born in (\w+)\."),
    "works_for": re.compile(r"(\w+ \w+) works for (\w+)\."),
    "based_in": re.compile(r"(\w+) is based in (\w+)\."),
    "located_in": re.compile(r"(\w+) is a city in (\w+)\."),
    "combined_birth": re.compile(r"(\w+ \w+), born in (\w+), (\w+)\."),
    "combined_work": re.compile(r"(\w+ \w+) works at (\w+) in (\w+)\."),
}
# question kind -> (relations walked from the person, the answer's entity type)
_CHAINS = {
    "birth_country": (("born_in", "located_in"), "country"),
    "employer_city": (("works_for", "based_in"), "city"),
    "birth_city": (("born_in",), "city"),
    "employer": (("works_for",), "company"),
}
_OBJECT = {"born_in": "city", "works_for": "company", "based_in": "city", "located_in": "country"}


def _parse(passage: str) -> tuple[str, tuple[str, ...]]:
    for form, pattern in _FORMS.items():
        m = pattern.fullmatch(passage)
        if m:
            return form, m.groups()
    raise AssertionError(f"unreadable passage {passage!r}")


def _walk(world, person: int, chain) -> list[str]:
    """The entity names reached from `person` along `chain`, from the relation tables."""
    x, path = person, []
    for rel in chain:
        x = world.relations[rel][x]
        path.append(world.names[_OBJECT[rel]][x])
    return path


def _words(text: str) -> set[str]:
    return set(re.findall(r"[a-z]+", text.lower()))


def test_registered_and_deterministic():
    assert TASKS.get("facts_qa") is FactsQATask
    assert TaskConfig(name="facts_qa", prompt_len=64).build() == TASK
    assert make_task("facts_qa", seed=3).example("train", 5) == FactsQATask(seed=3).example(
        "train", 5)
    again = build_world.__wrapped__(FactWorld(), 0)  # a real rebuild (its time: bench_hostile.py)
    for field in ("names", "twins", "relations", "fact_passage", "combined", "passages",
                  "questions"):
        assert getattr(again, field) == getattr(WORLD, field), field
    other = FactWorld().build(1)
    assert other.passages != WORLD.passages and other.questions != WORLD.questions
    assert len(set(other.passages) & set(WORLD.passages)) < 0.05 * len(WORLD.passages)
    assert FactsQATask(seed=1).examples("train", 0, 20) != TASK.examples("train", 0, 20)


def test_corpus_shape_and_names():
    cfg = WORLD.config
    n_facts = 2 * cfg.n_people + cfg.n_companies + cfg.n_cities
    n_combined = len(WORLD.passages) - n_facts
    assert 0.08 < n_combined / (2 * cfg.n_people) < 0.25  # combined_frac = 0.15
    assert max(map(len, WORLD.passages)) <= 40 and len(set(WORLD.passages)) == len(WORLD.passages)
    assert Counter(q.kind for q in WORLD.questions) == {"birth_country": 250, "employer_city": 250}
    # every name token is one entity's, except shared first names; none ends in "s" (stemmer)
    first = [p.split()[0] for p in WORLD.names["person"]]
    last = [p.split()[1] for p in WORLD.names["person"]]
    singles = last + [n for t in ("city", "country", "company") for n in WORLD.names[t]]
    tokens = [n.lower() for n in singles + sorted(set(first))]
    assert len(set(tokens)) == len(tokens) and not any(t.endswith("s") for t in tokens)
    assert all(re.fullmatch(r"[A-Z][a-z]{3,5}", n) for n in singles + first)
    assert len(set(WORLD.names["person"])) == cfg.n_people
    assert max(Counter(first).values()) >= 3  # shared first names


def test_gold_passages_state_both_hops_by_an_independent_walk():
    facts = [_parse(p) for p in WORLD.passages]
    # the passages state exactly the relation tables, one passage per fact
    for rel, obj_type in _OBJECT.items():
        subj_type = "person" if rel in ("born_in", "works_for") else (
            "company" if rel == "based_in" else "city")
        stated = sorted(args for form, args in facts if form == rel)
        table = sorted((WORLD.names[subj_type][s], WORLD.names[obj_type][o])
                       for s, o in enumerate(WORLD.relations[rel]))
        assert stated == table, rel
    person_index = {p: i for i, p in enumerate(WORLD.names["person"])}
    for q in WORLD.questions:
        chain, answer_type = _CHAINS[q.kind]
        path = _walk(WORLD, person_index[q.subject], chain)
        assert q.answer == path[-1] and q.answer in WORLD.names[answer_type]
        assert q.bridge == path[0] and len(q.gold) == 2
        assert q.subject in q.text
        # hop 1 names the person and the bridge, hop 2 the bridge and the answer
        assert facts[q.gold[0]] == (chain[0], (q.subject, q.bridge))
        assert facts[q.gold[1]] == (chain[1], (q.bridge, q.answer))
        if q.shortcut >= 0:
            form = "combined_birth" if q.kind == "birth_country" else "combined_work"
            assert facts[q.shortcut] == (form, (q.subject, q.bridge, q.answer))
    shortcuts = np.mean([q.shortcut >= 0 for q in WORLD.questions])
    assert 0.08 < shortcuts < 0.25
    # the one-hop kinds behind the mix
    mixed = FactWorld(kinds=("birth_city", "employer", "birth_country")).build(0)
    assert Counter(q.kind for q in mixed.questions) == {
        "birth_city": 250, "employer": 250, "birth_country": 250}
    for q in mixed.questions:
        if q.kind in ("birth_city", "employer"):
            rel = _CHAINS[q.kind][0][0]
            assert len(q.gold) == 1 and q.bridge == "" and q.shortcut == -1
            assert _parse(mixed.passages[q.gold[0]]) == (rel, (q.subject, q.answer))


def test_near_duplicate_twins_differ_in_their_facts_and_questions_hide_the_bridge():
    names, rel = WORLD.names, WORLD.relations

    def one_vowel_apart(a, b):
        diff = [(x, y) for x, y in zip(a, b, strict=True) if x != y]
        return len(a) == len(b) and len(diff) == 1 and set(diff[0]) <= set("aeiou")

    for etype, minimum in (("person", 25), ("city", 6), ("company", 4), ("country", 1)):
        assert len(WORLD.twins[etype]) >= minimum, etype
        for a, b in WORLD.twins[etype]:
            assert one_vowel_apart(names[etype][a], names[etype][b])
    for a, b in WORLD.twins["city"]:
        assert rel["located_in"][a] != rel["located_in"][b]
    for a, b in WORLD.twins["company"]:
        assert rel["based_in"][a] != rel["based_in"][b]
    twin_cities = {frozenset(p) for p in WORLD.twins["city"]}
    born_in_twin_cities = 0
    for a, b in WORLD.twins["person"]:
        assert names["person"][a].split()[0] == names["person"][b].split()[0]
        for chain, _ in _CHAINS.values():  # a wrong pick between twins gives a wrong answer
            if len(chain) == 2:
                assert _walk(WORLD, a, chain)[-1] != _walk(WORLD, b, chain)[-1]
        born_in_twin_cities += frozenset((rel["born_in"][a], rel["born_in"][b])) in twin_cities
    assert born_in_twin_cities >= 3  # "born in Krolow" / "born in Kralow"
    for q in WORLD.questions:
        assert q.bridge.lower() not in _words(q.text)
        assert q.answer.lower() not in _words(q.text)


def test_splits_are_disjoint_by_person():
    train = TASK.examples("train", 0, 400)
    test = TASK.examples("test", 0, 100)
    person = lambda e: WORLD.questions[e.meta[0]].subject  # noqa: E731
    assert not {person(e) for e in train} & {person(e) for e in test}
    assert not {e.prompt for e in train} & {e.prompt for e in test}
    assert 10 <= len({person(e) for e in test}) <= 50  # ~10% of 250 people
    assert {e.meta[2] for e in test} == {"birth_country", "employer_city"}
    for e in train[:50] + test[:20]:
        q = WORLD.questions[e.meta[0]]
        assert e == Example(prompt=q.text, answer=q.answer, meta=(e.meta[0], q.gold, q.kind))


def test_score_exact_normalised_wrong_hedged_and_garbage():
    ex = next(e for e in TASK.examples("train", 0, 400) if e.meta[2] == "birth_country")
    q = WORLD.questions[ex.meta[0]]
    country = ex.answer
    other = next(c for c in WORLD.names["country"] if c != country)
    assert TASK.score(f"<answer>{country}</answer>", ex) == 1.0
    assert TASK.score(TASK.solution(ex), ex) == 1.0
    for ok in (country.upper(), f"  the {country.lower()}!", f"Born in {q.bridge}, {country}."):
        assert TASK.score(f"<answer>{ok}</answer>", ex) == 1.0, ok
    for wrong in (other, q.bridge, country + "ia", country[:-1], ""):
        assert TASK.score(f"<answer>{wrong}</answer>", ex) == 0.0, wrong
    a, b = WORLD.twins["country"][0]
    twin = WORLD.names["country"][b if WORLD.names["country"][a] == country else a]
    if twin != country:
        assert TASK.score(f"<answer>{twin}</answer>", ex) == 0.0
    hedge = f"<answer>{country} or {other}</answer>"
    assert TASK.score(hedge, ex) == 0.0
    assert FactsQATask(reject_hedges=False).score(hedge, ex) == 1.0
    for garbage in (country, f"<answer>{country}", "<answer></answer>", "", "\x00" * 100,
                    "<answer>" * 1000, "☃" * 10_000, f"<answer>{'x ' * 5000}</answer>", None):
        assert TASK.score(garbage, ex) == 0.0
    exs = TASK.examples("test", 0, 30)
    assert TASK.verify_batch([TASK.solution(e) for e in exs], exs).scores == [1.0] * 30


@pytest.mark.parametrize("kwargs, field", [
    (dict(n_people=1), "n_people"), (dict(n_cities=0), "n_cities"),
    (dict(n_countries=1), "n_countries"), (dict(n_companies=2.5), "n_companies"),
    (dict(n_first_names=True), "n_first_names"), (dict(twin_frac=1.5), "twin_frac"),
    (dict(combined_frac=-0.1), "combined_frac"), (dict(kinds=()), "kinds"),
    (dict(kinds=("birth_country", "birth_country")), "kinds"), (dict(kinds=("age",)), "kinds"),
])
def test_bad_config_is_a_one_line_error_naming_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field) as e:
        FactWorld(**kwargs)
    assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match=field):
        FactsQATask(facts=kwargs)  # a YAML section
    with pytest.raises(ValueError, match="unknown facts field .n_peple."):
        FactsQATask(facts={"n_peple": 3})
    with pytest.raises(ValueError, match="reject_hedges"):
        FactsQATask(reject_hedges="yes")


def test_retriever_names_ties_and_hostile_queries():
    r = world_retriever(WORLD)
    assert r is world_retriever(FactWorld().build(0)) and len(r) == len(WORLD.passages)
    for person in WORLD.names["person"][:40]:
        mine = {i for i, p in enumerate(WORLD.passages) if p.startswith(person)}
        assert set(r.search(person, len(mine))) == mine, person
    for etype, rel in (("city", "located_in"), ("company", "based_in")):
        for i, name in enumerate(WORLD.names[etype]):  # a bridge ranks its hop 2 top (or tied)
            scores = r.scores(name)
            assert scores[WORLD.fact_passage[rel][i]] == scores.max() > 0
    # ties: every based_in passage scores the same for "based" -> ascending ids
    assert r.search("based", 100) == sorted(WORLD.fact_passage["based_in"])
    assert Retriever(["blue red", "red blue", "green", "red blue"]).search("red", 4) == [0, 1, 3]
    assert r.search_batch(["based", "Krolow"], 5) == [r.search("based", 5), r.search("Krolow", 5)]
    # hostile queries: [] when no query token is in the vocabulary, else at most k ids
    rng = np.random.default_rng(0)
    noise = "".join(map(chr, rng.integers(32, 0x3000, size=10_000)))
    for query in ("", "   ", "the of and was in", "?!.,;", "\x00\n\t", "☃ 日本語 ñ", noise):
        assert r.search(query, 8) == [] or query == noise
        hits = r.search(query, 8)
        assert len(hits) <= 8 and all(isinstance(i, int) for i in hits)
    person = WORLD.names["person"][0]
    long_query = "zzz " * 2500 + person  # 10k characters, the name at the end
    assert WORLD.passages[r.search(long_query, 1)[0]].startswith(person)  # time: bench_hostile
    assert len(r.search(long_query, 8)) <= 8
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="k must be"):
            r.search(person, bad)
    with pytest.raises(TypeError, match="query must be a str"):
        r.search(None, 3)
    with pytest.raises(ValueError, match="passages"):
        Retriever([])


def test_naive_retrieval_finds_the_first_hop_but_rarely_both():
    """s3's naive RAG baseline (top-8 for the raw question): the question names the person, so
    the first hop is found; it shares no name with the second hop, so both rarely are; the
    bridge alone finds the second hop (the searcher's job)."""
    r = world_retriever(WORLD)
    examples = TASK.examples("train", 0, 200)
    tops = [naive_topk(TASK, "train", i, 8) for i in range(200)]
    assert naive_topk(TASK, "train", 0, 8) is tops[0]  # cached
    assert list(tops[7]) == r.search(examples[7].prompt, 8)
    questions = [WORLD.questions[e.meta[0]] for e in examples]
    both = np.mean([set(q.gold) <= set(t) for q, t in zip(questions, tops, strict=True)])
    first = np.mean([q.gold[0] in t for q, t in zip(questions, tops, strict=True)])
    answerable = np.mean([set(q.gold) <= set(t) or q.shortcut in t
                          for q, t in zip(questions, tops, strict=True)])
    second_by_bridge = np.mean([q.gold[1] in r.search(q.bridge, 8) for q in questions])
    print(f"\nnaive top-8 over 200 questions: both gold {both:.3f}, first hop {first:.3f}, "
          f"answering passage (both or combined) {answerable:.3f}; "
          f"bridge query finds hop 2: {second_by_bridge:.3f}")
    assert both < 0.5 and first > 0.7
    assert 0.05 < answerable < 0.4  # naive RAG answers some questions (combined passages)
    assert second_by_bridge == 1.0
