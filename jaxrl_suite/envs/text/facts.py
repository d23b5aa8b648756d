"""A generated fact world for multi-hop retrieval QA: the corpus, questions and naive retrieval of
s3's searcher task (Jiang et al., "s3: You Don't Need That Much Data to Train a Search Agent via
RL", arXiv 2505.14146), and the "facts_qa" task.

The world (`FactWorld(...).build(seed)` -> `World`) holds made-up, pronounceable entities
(two syllables each; people have a first and a last name) and four relations, each fact stated
by one short passage (at most 40 characters: the LMs here read bytes):

    person  born_in    city        "Mira Tolvek was born in Danow."
    person  works_for  company     "Mira Tolvek works for Brantek."
    company based_in   city        "Brantek is based in Danow."
    city    located_in country     "Danow is a city in Veldor."

Distractors that share most of a question's words (BM25 ranks them near the gold): a share
`twin_frac` of the people, cities, countries and companies come in near-duplicate pairs whose
names differ by one vowel ("Mira Tolvek" / "Mira Tolvik"; twin people share the first name), and
twins have different facts: twin cities lie in different countries, twin companies in different
cities, a twin person's birth city (half the time the twin of the other's) lies in another
country and their employer in another city, so a wrong pick among twins gives a wrong answer.
First names are shared by about n_people / n_first_names people. (At the defaults, a twin
person's question has the twin's first-hop passage in its naive top-8 45% of the time.)

Questions need two passages and never name the bridge entity, e.g. "In which country was Mira
Tolvek born?" (born_in -> located_in; bridge: the birth city) and "In which city is Mira Tolvek's
employer based?" (works_for -> based_in; bridge: the employer); the one-hop kinds "birth_city"
and "employer" can be mixed in (`FactWorld.kinds`). A raw-question BM25 query finds the first hop
(it names the person) but rarely the second (it shares no name with the question). A share
`combined_frac` of the people's two-hop chains also get a combined passage ("Mira Tolvek, born
in Danow, Veldor."), so that naive retrieval answers some questions (`Question.shortcut`).
Measured at the defaults, seed 0 (643 passages, 250 questions of each kind; the test
tests/envs/test_facts.py checks loose bounds): BM25 top-8 for the raw question holds both gold
passages for 3% of the questions (birth_country 0%: no passage says "country"; employer_city
6%), the first hop for 100% and an answering passage (both hops, or the combined one) for 15%;
a query of the bridge's name ranks the second hop first (or tied first) for every question.

The task ("facts_qa"): prompt = the question, answer = the final entity's name, meta = (question
index, gold passage ids, kind). Problems about one person share a split (the split key is the
person). `score` is `rewards.qa.span_match` of the first `<answer>` content (the answer's
normalised tokens occur in it: s3's generation accuracy), and 0.0 for a hedge that also names
another entity of the answer's type ("Veldor or Veldar"; `reject_hedges`).

`Retriever` (`envs.text.retrieval`, BM25) over `world.passages` is `world_retriever(world)`;
`naive_topk(task, split, i, k)` is the naive RAG baseline of s3's Gain Beyond RAG: the top-k
passages for the raw question, cached per question.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Mapping
from typing import Annotated, ClassVar, NamedTuple

import numpy as np

from jaxrl_suite.core.config import Probability, Range, check_fields
from jaxrl_suite.envs.text.base import TASKS, Example, Task
from jaxrl_suite.envs.text.retrieval import STOPWORDS, Retriever
from jaxrl_suite.rewards.format import answer_tags, extract_answer
from jaxrl_suite.rewards.qa import normalize_answer, span_match

# ---- names: two syllables of onset + vowel + optional coda -----------------------------------
VOWELS = "aeiou"
ONSETS = ("b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "t", "v", "z", "br", "dr", "kr", "tr",
          "st")
# no "s" coda (the S-stemmer would fold names that end in it); no "w" after i or u (_AWKWARD)
CODAS = ("", "", "", "n", "r", "l", "k", "m", "t", "w")
_AWKWARD = ("iw", "uw")
NAME_LEN = (4, 6)  # characters of a name (a person: of each of their two names)


class Relation(NamedTuple):
    """A relation: its subject's and object's entity types and the passage stating one fact."""

    subject: str
    object: str
    template: str


RELATIONS: dict[str, Relation] = {
    "born_in": Relation("person", "city", "{} was born in {}."),
    "works_for": Relation("person", "company", "{} works for {}."),
    "based_in": Relation("company", "city", "{} is based in {}."),
    "located_in": Relation("city", "country", "{} is a city in {}."),
}
# a two-hop chain of a person -> the passage that states both hops (person, bridge, answer)
COMBINED: dict[tuple[str, str], str] = {
    ("born_in", "located_in"): "{}, born in {}, {}.",
    ("works_for", "based_in"): "{} works at {} in {}.",
}


class QuestionKind(NamedTuple):
    """A question about a person: its text and the relations walked from the person."""

    template: str
    chain: tuple[str, ...]


QUESTION_KINDS: dict[str, QuestionKind] = {
    "birth_country": QuestionKind("In which country was {} born?", ("born_in", "located_in")),
    "employer_city": QuestionKind("In which city is {}'s employer based?",
                                  ("works_for", "based_in")),
    "birth_city": QuestionKind("In which city was {} born?", ("born_in",)),
    "employer": QuestionKind("Which company does {} work for?", ("works_for",)),
}
ENTITY_TYPES = ("person", "city", "country", "company")
# words of the templates (and stop words): never names
_RESERVED = STOPWORDS | frozenset(re.findall(r"[a-z]+", " ".join((
    *(r.template for r in RELATIONS.values()), *COMBINED.values(),
    *(q.template for q in QUESTION_KINDS.values()))).lower()))


class Question(NamedTuple):
    """A question about one person.

    text: the question, e.g. "In which country was Mira Tolvek born?"; answer: the final
    entity's name; gold: the ids of the passages of the hops, in hop order; kind: its
    `QUESTION_KINDS` name; bridge: the intermediate entity's name ("" for one hop), never in
    `text`; subject: the person's name; shortcut: the id of the person's combined passage for
    this chain, which answers the question alone (-1 if none).
    """

    text: str
    answer: str
    gold: tuple[int, ...]
    kind: str
    bridge: str
    subject: str
    shortcut: int = -1


@dataclasses.dataclass(frozen=True)
class FactWorld:
    """The fact world's configuration; `build(seed)` is deterministic in (config, seed)."""

    # people, each with a birth city and an employer
    n_people: Annotated[int, Range(ge=2, le=5000)] = 250
    # the first-name pool (people share first names)
    n_first_names: Annotated[int, Range(ge=1, le=1000)] = 40
    n_cities: Annotated[int, Range(ge=2, le=1000)] = 50  # cities, each in a country
    n_countries: Annotated[int, Range(ge=2, le=200)] = 10
    n_companies: Annotated[int, Range(ge=2, le=1000)] = 30  # companies, each based in a city
    # share of each entity type in near-duplicate pairs (one vowel apart)
    twin_frac: Probability = 0.3
    # chance that a person's two-hop chain has a combined passage
    combined_frac: Probability = 0.15
    kinds: tuple[str, ...] = ("birth_country", "employer_city")  # question kinds, per person

    def __post_init__(self):
        # A task's `facts` YAML mapping reaches here unchecked (`FactsQATask`, `search._facts`):
        # the types first, so that the Ranges below compare numbers.
        for field in ("n_people", "n_first_names", "n_cities", "n_countries", "n_companies",
                      "twin_frac", "combined_frac"):
            value = getattr(self, field)
            kind = int if field.startswith("n_") else int | float
            if isinstance(value, bool) or not isinstance(value, kind):
                raise ValueError(f"FactWorld: {field} must be "
                                 f"{'an integer' if kind is int else 'a number'}, got {value!r}")
        check_fields(self, "facts.")  # the Ranges declared above
        object.__setattr__(self, "kinds", tuple(self.kinds))  # a YAML list -> a tuple
        if not self.kinds or len(set(self.kinds)) != len(self.kinds) or any(
                k not in QUESTION_KINDS for k in self.kinds):
            raise ValueError(f"FactWorld: kinds must be distinct entries of "
                             f"{list(QUESTION_KINDS)}, got {list(self.kinds)}")

    def build(self, seed: int) -> World:
        """The world of `seed` (cached per process: built once per (config, seed))."""
        return build_world(self, int(seed))


def _data():
    return dataclasses.field(compare=False, repr=False)


@dataclasses.dataclass(frozen=True)
class World:
    """A built fact world; equal (and hashed) by (config, seed), which determine the rest.

    names: entity type -> names by index; twins: entity type -> near-duplicate index pairs;
    relations: relation -> the object index of each subject (by subject index); fact_passage:
    relation -> the id of the passage stating each subject's fact; combined: two-hop chain ->
    {person index: id of the combined passage}; passages: the corpus, ids 0..P-1 (in an order
    shuffled by the seed); questions: every person's question of each kind, person-major.
    """

    config: FactWorld
    seed: int
    names: Mapping[str, tuple[str, ...]] = _data()
    twins: Mapping[str, tuple[tuple[int, int], ...]] = _data()
    relations: Mapping[str, tuple[int, ...]] = _data()
    fact_passage: Mapping[str, tuple[int, ...]] = _data()
    combined: Mapping[tuple[str, str], Mapping[int, int]] = _data()
    passages: tuple[str, ...] = _data()
    questions: tuple[Question, ...] = _data()

    @functools.cached_property
    def name_tokens(self) -> Mapping[str, frozenset[str]]:
        """Entity type -> its names, normalised (`rewards.qa.normalize_answer`)."""
        return {t: frozenset(normalize_answer(n) for n in ns) for t, ns in self.names.items()}


# ---- the build --------------------------------------------------------------------------------

def _fresh(rng: np.random.Generator, taken: set[str]) -> str:
    """A new name, not in `taken` (lowercase names), which it joins."""
    for _ in range(100_000):
        name = "".join(ONSETS[rng.integers(len(ONSETS))] + VOWELS[rng.integers(len(VOWELS))]
                       + CODAS[rng.integers(len(CODAS))] for _ in range(2))
        if (NAME_LEN[0] <= len(name) <= NAME_LEN[1] and name not in taken
                and not any(a in name for a in _AWKWARD)):
            taken.add(name)
            return name.capitalize()
    raise RuntimeError("no fresh name in 100000 draws")  # unreachable at the validated sizes


def _twin(rng: np.random.Generator, name: str, taken: set[str]) -> str | None:
    """A new name one vowel away from `name` ("Tolvek" -> "Tolvik"), or None if all are taken."""
    low = name.lower()
    for pos in rng.permutation([i for i, c in enumerate(low) if c in VOWELS]):
        for v in rng.permutation([v for v in VOWELS if v != low[pos]]):
            cand = low[:pos] + v + low[pos + 1:]
            if cand not in taken and not any(a in cand for a in _AWKWARD):
                taken.add(cand)
                return cand.capitalize()
    return None


def _names(rng: np.random.Generator, n: int, twin_frac: float,
           taken: set[str]) -> tuple[tuple[str, ...], tuple[tuple[int, int], ...]]:
    """`n` distinct names, about `twin_frac * n` of them in near-duplicate pairs, in a random
    order, and the pairs' index pairs."""
    names: list[str] = []
    pairs: list[tuple[int, int]] = []
    for _ in range(int(round(twin_frac * n / 2))):
        a = _fresh(rng, taken)
        b = _twin(rng, a, taken)
        names.append(a)
        if b is not None:
            pairs.append((len(names) - 1, len(names)))
            names.append(b)
    while len(names) < n:
        names.append(_fresh(rng, taken))
    order = rng.permutation(n)
    where = np.argsort(order)  # old index -> new index
    return (tuple(names[int(i)] for i in order),
            tuple((int(where[a]), int(where[b])) for a, b in pairs))


def _assign(rng: np.random.Generator, n: int, m: int) -> list[int]:
    """An object in range(m) for each of n subjects: the first min(n, m) distinct, the rest
    uniform (so that at least two objects are used)."""
    return [i if i < m else int(rng.integers(m)) for i in range(n)]


def _other(rng: np.random.Generator, m: int, avoid: int) -> int:
    """A uniform draw from range(m) other than `avoid` (m >= 2)."""
    return (avoid + 1 + int(rng.integers(m - 1))) % m


def _pick(rng: np.random.Generator, candidates: list[int]) -> int:
    return candidates[int(rng.integers(len(candidates)))]


@functools.lru_cache(maxsize=16)
def build_world(config: FactWorld, seed: int) -> World:
    rng = np.random.default_rng([seed, 0xFAC75])
    taken = set(_RESERVED)
    first = [_fresh(rng, taken) for _ in range(config.n_first_names)]
    names, twins = {}, {}
    for etype, n in (("country", config.n_countries), ("city", config.n_cities),
                     ("company", config.n_companies), ("person", config.n_people)):
        names[etype], twins[etype] = _names(rng, n, config.twin_frac, taken)
    twin_of = {t: {**dict(ps), **{b: a for a, b in ps}} for t, ps in twins.items()}

    first_of = rng.integers(config.n_first_names, size=config.n_people)
    for a, b in twins["person"]:
        first_of[b] = first_of[a]
    names["person"] = tuple(f"{first[f]} {last}" for f, last in zip(first_of, names["person"],
                                                                    strict=True))

    located_in = _assign(rng, config.n_cities, config.n_countries)
    for a, b in twins["city"]:  # twin cities lie in different countries
        if located_in[b] == located_in[a]:
            located_in[b] = _other(rng, config.n_countries, located_in[a])
    based_in = _assign(rng, config.n_companies, config.n_cities)
    for a, b in twins["company"]:  # twin companies are based in different cities
        if based_in[b] == based_in[a]:
            based_in[b] = _other(rng, config.n_cities, based_in[a])
    born_in = [int(c) for c in rng.integers(config.n_cities, size=config.n_people)]
    works_for = [int(c) for c in rng.integers(config.n_companies, size=config.n_people)]
    for a, b in twins["person"]:  # twin people: another birth country, another employer city
        city, company = born_in[a], works_for[a]
        if city in twin_of["city"] and rng.random() < 0.5:
            born_in[b] = twin_of["city"][city]
        else:
            born_in[b] = _pick(rng, [c for c in range(config.n_cities)
                                     if located_in[c] != located_in[city]])
        if company in twin_of["company"] and rng.random() < 0.5:
            works_for[b] = twin_of["company"][company]
        else:
            works_for[b] = _pick(rng, [c for c in range(config.n_companies)
                                       if based_in[c] != based_in[company]])
    relations = {"born_in": tuple(born_in), "works_for": tuple(works_for),
                 "based_in": tuple(based_in), "located_in": tuple(located_in)}

    texts: list[str] = []
    fact_passage: dict[str, list[int]] = {}
    for rel, r in RELATIONS.items():
        fact_passage[rel] = []
        for s, o in enumerate(relations[rel]):
            fact_passage[rel].append(len(texts))
            texts.append(r.template.format(names[r.subject][s], names[r.object][o]))
    combined: dict[tuple[str, str], dict[int, int]] = {}
    for chain, template in COMBINED.items():
        combined[chain] = {}
        first_rel, second_rel = (RELATIONS[c] for c in chain)
        for p in range(config.n_people):
            if rng.random() < config.combined_frac:
                mid = relations[chain[0]][p]
                end = relations[chain[1]][mid]
                combined[chain][p] = len(texts)
                texts.append(template.format(names["person"][p], names[first_rel.object][mid],
                                             names[second_rel.object][end]))
    order = rng.permutation(len(texts))  # passage id -> its text's build index
    new_id = np.argsort(order)
    passages = tuple(texts[int(i)] for i in order)
    fact_passage = {rel: tuple(int(new_id[i]) for i in ids) for rel, ids in fact_passage.items()}
    combined = {c: {p: int(new_id[i]) for p, i in d.items()} for c, d in combined.items()}

    questions = []
    for p, person in enumerate(names["person"]):
        for kind in config.kinds:
            template, chain = QUESTION_KINDS[kind]
            x, gold, path = p, [], []
            for rel in chain:
                gold.append(fact_passage[rel][x])
                x = relations[rel][x]
                path.append(names[RELATIONS[rel].object][x])
            questions.append(Question(
                text=template.format(person), answer=path[-1], gold=tuple(gold), kind=kind,
                bridge=path[0] if len(chain) > 1 else "", subject=person,
                shortcut=combined.get(chain, {}).get(p, -1)))
    return World(config=config, seed=seed, names=names, twins=twins, relations=relations,
                 fact_passage=fact_passage, combined=combined, passages=passages,
                 questions=tuple(questions))


# ---- retrieval --------------------------------------------------------------------------------

@functools.lru_cache(maxsize=16)
def world_retriever(world: World) -> Retriever:
    """The (per-process cached) BM25 `Retriever` over `world.passages`."""
    return Retriever(world.passages)


@functools.lru_cache(maxsize=65536)
def naive_ids(world: World, question: int, k: int) -> tuple[int, ...]:
    """The top-`k` BM25 passage ids for the raw text of `world.questions[question]`, best first
    (cached per world, question and k)."""
    return tuple(world_retriever(world).search(world.questions[question].text, k))


def naive_topk(task: FactsQATask, split: str, index: int, k: int = 8) -> tuple[int, ...]:
    """The naive RAG baseline's passages for problem `index` of `split`: the ids of the top-`k`
    BM25 passages for the raw question, best first (cached per question and k)."""
    return naive_ids(task.world, task.example(split, index).meta[0], k)


# ---- the task ---------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class FactsQATask(Task):
    """Multi-hop questions over a generated fact world (module docstring); `world` is the corpus.

    Prompt: the question; answer: the final entity's name; meta: (question index into
    `world.questions`, gold passage ids, kind). The split key is the question's person, so a
    held-out person's questions are all held out. `score`: 1.0 iff the first `<answer>`
    content contains the answer as a run of whole normalised tokens (`rewards.qa.span_match`)
    and, with `reject_hedges`, names no other entity of the answer's type; else 0.0.
    """

    name: ClassVar[str] = "facts_qa"
    seed: int = 0  # the world's seed and the problem order's
    facts: FactWorld = FactWorld()
    reject_hedges: bool = True  # an answer naming two entities of the answer's type scores 0

    def __post_init__(self):
        if isinstance(self.facts, Mapping):  # a YAML section -> the config
            known = {f.name for f in dataclasses.fields(FactWorld)}
            unknown = sorted(map(str, set(self.facts) - known))
            if unknown:
                raise ValueError(f"facts_qa: unknown facts field {unknown[0]!r}; expected one of "
                                 f"{sorted(known)}")
            object.__setattr__(self, "facts", FactWorld(**self.facts))
        if not isinstance(self.facts, FactWorld):
            raise ValueError(f"facts_qa: facts must be a FactWorld, got "
                             f"{type(self.facts).__name__}")
        if not isinstance(self.reject_hedges, bool):
            raise ValueError(f"facts_qa: reject_hedges must be a bool, got {self.reject_hedges!r}")

    @property
    def world(self) -> World:
        """The corpus and questions of this task's seed."""
        return self.facts.build(self.seed)

    def _generate(self, rng: np.random.Generator) -> Example:
        questions = self.world.questions
        q = int(rng.integers(len(questions)))
        question = questions[q]
        return Example(prompt=question.text, answer=question.answer,
                       meta=(q, question.gold, question.kind))

    def _problem_key(self, ex: Example) -> str:
        return self.world.questions[ex.meta[0]].subject

    def solution(self, ex: Example) -> str:
        return answer_tags(ex.answer)

    def score(self, completion: str, ex: Example) -> float:
        if not isinstance(completion, str):
            return 0.0
        prediction = extract_answer(completion)
        if not span_match(prediction, ex.answer):
            return 0.0
        if self.reject_hedges:
            answer_type = RELATIONS[QUESTION_KINDS[ex.meta[2]].chain[-1]].object
            others = self.world.name_tokens[answer_type] - {normalize_answer(ex.answer)}
            if others & set(normalize_answer(prediction).split()):
                return 0.0
        return 1.0


TASKS.register(FactsQATask.name, FactsQATask)

__all__ = ["COMBINED", "ENTITY_TYPES", "QUESTION_KINDS", "RELATIONS", "FactWorld", "FactsQATask",
           "Question", "QuestionKind", "Relation", "World", "naive_ids", "naive_topk",
           "world_retriever"]
