"""GenCLS++'s prompt strategies for generative classification (arXiv 2504.19898).

GenCLS++ trains a generative classifier (the model writes the label) with an SFT warm-up, then
RL with a rule reward, and studies five strategy dimensions, each used in the training prompts
(SFT and RL) and the inference prompts alike:

  in-context examples   "none" | "random" (k pool examples drawn per query) | "nearest" (the k
                        pool examples of highest bag-of-words cosine to the query);
  definitions           one line per category: what it means;
  uncertain             an explicit "uncertain" label the model may answer;
  numeric               labels shown as meaningless numbers ("class 3");
  decoding              "free" generation, or perplexity-based: the label whose completion the
                        policy finds most likely (`ppl_scores`, inference only);

plus the paper's reasoning question: a short reasoning span before the label
(`<think>...</think><answer>label</answer>`), compared with the direct answer.

`StrategyConfig` holds one combination; `StrategyTask(base, strategy)` rewrites any
classification task's examples with it (prompt, answer label text, SFT solution, score). The base
task must expose its raw text and label names: `envs.text.topics.TopicsTask` (its `view`) or a
TFDS `ClassificationTask` (`ag_news`, `imdb`: the text is read back out of its prompt template).

Rule reward (the paper's RL reward; `StrategyTask.score`):

    r(y) = 1[extract(y) = label]   (case-folded; "uncertain", a wrong or no label: 0)

Choices where the paper leaves room (see docs/gencls.md):
  * "uncertain" always scores 0 (it is never the gold label): abstaining earns nothing, so RL
    with the exact-label reward pushes the policy to commit. Its SFT targets are the texts the
    base task marks as undecidable (`ClassView.ambiguous`: the topics task's two-agent texts); a
    base that marks none (ag_news) only gets the option in the prompt.
  * numeric labels are "class N" with N a fixed permutation of 1..C, and the prompt gives no
    mapping to the names: the numbers are semantically irrelevant, the model learns what each
    means from its training data (with `definitions`, the definition lines say it).
  * perplexity-based decoding scores the whole completion `<answer>LABEL</answer>` + EOS, by
    default per token (perplexity, `ppl_norm="mean"`), or summed (`"sum"`: log-likelihood).
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import re
from collections.abc import Sequence
from typing import ClassVar, NamedTuple

import jax
import numpy as np

from jaxrl_suite.core.config import Count, check_fields
from jaxrl_suite.core.parallel import batch_shards
from jaxrl_suite.core.study import check_variants
from jaxrl_suite.envs.text.base import SPLITS, Example, Task, Verdicts
from jaxrl_suite.envs.text.tfds_tasks import ClassificationTask
from jaxrl_suite.envs.text.topics import ClassView
from jaxrl_suite.rewards.format import answer_tags, extract_answer

ICL_MODES = ("none", "random", "nearest")
DECODINGS = ("free", "ppl")
PPL_NORMS = ("mean", "sum")
UNCERTAIN = "uncertain"
INVALID = "invalid"  # the outcome of a completion that names no label
_WORD = re.compile(r"[a-z0-9]+")

# One-line category definitions of the TFDS adapters' classes, in label order (GenCLS++ has an
# LLM write them; these are short hand-written ones).
DEFINITIONS: dict[str, tuple[str, ...]] = {
    "ag_news": ("international news: countries, wars, diplomacy",
                "games, teams, athletes",
                "companies, markets, the economy",
                "research, computers, the internet"),
    "imdb": ("the review dislikes the movie", "the review likes the movie"),
}


@dataclasses.dataclass(frozen=True)
class StrategyConfig:
    """One GenCLS++ strategy combination (module docstring); every switch but `decoding` changes
    the training and the inference prompts or targets alike."""

    icl: str = "none"  # in-context examples: "none" | "random" | "nearest" (bag-of-words cosine)
    shots: int = 2  # k in-context examples per prompt (icl != "none")
    pool_size: int = 256  # the fixed pool they come from: the base's first train examples
    definitions: bool = False  # one definition line per category in the prompt
    uncertain: bool = False  # an explicit "uncertain" label (always scores 0)
    numeric: bool = False  # labels as meaningless numbers "class N", no mapping in the prompt
    decoding: str = "free"  # inference: "free" generation | "ppl" (most likely label)
    ppl_norm: str = "mean"  # ppl decoding: "mean" log-prob per token (perplexity) | "sum"
    reasoning: bool = False  # `<think>cue</think>` before the answer (SFT cue from the task)
    max_text_chars: int | None = None  # cut the raw text to this many characters (None: whole)

    def __post_init__(self):
        for field, allowed in (("icl", ICL_MODES), ("decoding", DECODINGS),
                               ("ppl_norm", PPL_NORMS)):
            if getattr(self, field) not in allowed:
                raise ValueError(f"strategy.{field} must be one of {list(allowed)}, got "
                                 f"{getattr(self, field)!r}")
        if self.shots < 1 or self.pool_size < 1:
            raise ValueError(f"strategy.shots and strategy.pool_size must be >= 1, got "
                             f"{self.shots} and {self.pool_size}")
        if self.icl != "none" and self.pool_size <= self.shots:
            raise ValueError(f"strategy.pool_size ({self.pool_size}) must exceed strategy.shots "
                             f"({self.shots})")
        if self.decoding == "ppl" and self.reasoning:
            raise ValueError("strategy.decoding='ppl' scores label completions and cannot "
                             "score a reasoning span: set strategy.reasoning=false")
        if self.max_text_chars is not None and self.max_text_chars < 1:
            raise ValueError(f"strategy.max_text_chars must be >= 1 or null, got "
                             f"{self.max_text_chars}")

    @property
    def training(self) -> StrategyConfig:
        """The strategy a model is trained under: decoding is inference-only, so a "ppl"
        strategy trains exactly as its "free" twin."""
        return dataclasses.replace(self, decoding="free", ppl_norm="mean")


# strategy name -> its switches (StrategyConfig fields; the shared ones come from `strategies`)
STRATEGIES: dict[str, dict] = {
    "base": {},
    "icl_random": {"icl": "random"},
    "icl_nearest": {"icl": "nearest"},
    "definitions": {"definitions": True},
    "uncertain": {"uncertain": True},
    "numeric": {"numeric": True},
    "ppl": {"decoding": "ppl"},
    "reasoning": {"reasoning": True},
}


@dataclasses.dataclass(frozen=True)
class StrategiesConfig:
    """The strategies a study runs (`names`, entries of STRATEGIES) and the switches they
    share (the experiment's `strategies` config section)."""

    names: tuple[str, ...] = tuple(STRATEGIES)  # which strategies to run (STRATEGIES)
    shots: Count = 2  # in-context examples per prompt (icl_random, icl_nearest)
    pool_size: Count = 256  # their pool: the task's first train examples
    ppl_norm: str = "mean"  # ppl decoding: "mean" log-prob per token (perplexity) or "sum"
    max_text_chars: Count | None = None  # cut each text to this many characters (e.g. ag_news)

    def __post_init__(self):
        check_fields(self, "strategies.")  # the Ranges declared above
        check_variants(self.names, STRATEGIES, "strategies.names")
        for name in self.names:
            self.strategy(name)  # one-line errors for bad shared fields
            if name != self.twin(name) and self.twin(name) not in self.names[
                    : self.names.index(name)]:
                raise ValueError(f"strategies.names: {name!r} evaluates the models of "
                                 f"{self.twin(name)!r}, which must be listed before it")

    def strategy(self, name: str) -> StrategyConfig:
        """The `StrategyConfig` of strategy `name`."""
        return StrategyConfig(shots=self.shots, pool_size=self.pool_size,
                              ppl_norm=self.ppl_norm, max_text_chars=self.max_text_chars,
                              **STRATEGIES[name])

    def twin(self, name: str) -> str:
        """The strategy whose models `name` evaluates: itself, or for a decoding-only strategy
        ("ppl") the strategy that trains the same way (STRATEGIES' first with that training)."""
        training = self.strategy(name).training
        return next(v for v in STRATEGIES if self.strategy(v).decoding == "free"
                    and self.strategy(v).training == training)


class GenclsMeta(NamedTuple):
    """A strategy example's meta: gold label index, the label texts shown (names or "class N"),
    the raw text, the cue (reasoning target) and whether the text is undecidable."""

    label: int
    labels: tuple[str, ...]
    text: str
    cue: str | None
    ambiguous: bool


def classification_view(task: Task, ex: Example) -> ClassView:
    """A classification example's raw text, label and names (and cue, ambiguity where known):
    `task.view(ex)` if the task has one (topics), else for a `ClassificationTask` (meta =
    (label, names)) the text read back out of its prompt template."""
    if hasattr(task, "view"):
        return task.view(ex)
    if not isinstance(task, ClassificationTask):
        raise ValueError(f"task {task.name!r} is not a classification task (it has no view(ex) "
                         "and is not a ClassificationTask)")
    label, names = int(ex.meta[0]), tuple(ex.meta[1])
    head, found, tail = task.template.partition("{text}")
    labels = ", ".join(names)
    prefix, suffix = head.format(labels=labels), tail.format(labels=labels)
    if not found or not (ex.prompt.startswith(prefix) and ex.prompt.endswith(suffix)):
        raise ValueError(f"{task.name}: prompt {ex.prompt[:40]!r} does not follow its template")
    return ClassView(ex.prompt[len(prefix) : len(ex.prompt) - len(suffix)], label, names)


def label_texts(names: Sequence[str], numeric: bool) -> tuple[str, ...]:
    """The label texts in label order: the names, or "class N" with N a fixed permutation of
    1..C (the same for every run: labels carry no order either)."""
    if not numeric:
        return tuple(names)
    perm = np.random.default_rng([0x6C5, len(names)]).permutation(len(names))
    return tuple(f"class {int(n) + 1}" for n in perm)


def bag_of_words(texts: Sequence[str], vocab: dict[str, int]) -> np.ndarray:
    """Word counts [len(texts), len(vocab)] (lower-cased alphanumeric runs; unknown words
    dropped)."""
    out = np.zeros((len(texts), len(vocab)), np.float64)
    for i, t in enumerate(texts):
        for w in _WORD.findall(t.lower()):
            j = vocab.get(w)
            if j is not None:
                out[i, j] += 1
    return out


@dataclasses.dataclass(frozen=True)
class StrategyTask(Task):
    """`base`'s examples under `strategy`: same problems and splits, rewritten prompts, label
    texts, solutions and score.

    Prompt (each part only when its switch is on; C label texts L_c, k shots):

        L_1: definition 1              definitions
        ...
        <shot text> = <shot label>     icl (k lines; "uncertain" for an undecidable shot)
        or say uncertain               uncertain
        think first                    reasoning
        <text> =

    Answer: the gold label text. Solution (the SFT target): `<answer>L</answer>`, with
    L = "uncertain" for an undecidable text under `uncertain`, and `<think>cue</think>` before
    it under `reasoning` (the base's cue: what decides the class). Reward: the rule reward of
    the module docstring. `definitions` (one per label, in label order) default to the base's
    `definitions()` or `DEFINITIONS[base.name]`. Not registered: it is built in code.
    """

    name: ClassVar[str] = "gencls_strategy"
    base: Task
    strategy: StrategyConfig = StrategyConfig()
    definitions: tuple[str, ...] | None = None
    seed: int = 0

    def __post_init__(self):
        s = self.strategy
        if s.definitions and self.definitions is None:
            found = self.base.definitions() if callable(getattr(self.base, "definitions",
                                                                None)) else \
                DEFINITIONS.get(self.base.name)
            if found is None:
                raise ValueError(f"strategy.definitions: task {self.base.name!r} has no "
                                 "category definitions; pass StrategyTask(definitions=...)")
            object.__setattr__(self, "definitions", tuple(found))
        if s.reasoning and not hasattr(self.base, "view"):
            raise ValueError(f"strategy.reasoning needs a task that knows what decides its "
                             f"class (a view(ex) with a cue); {self.base.name!r} has none")

    # ---- label texts, pool, shots ----
    @functools.cached_property
    def names(self) -> tuple[str, ...]:
        """The base's label names, in label order (from its first train example)."""
        names = classification_view(self.base, self.base.example("train", 0)).names
        if self.strategy.uncertain and UNCERTAIN in {n.strip().casefold() for n in names}:
            raise ValueError(f"strategy.uncertain: {self.base.name!r} already has a label "
                             f"named {UNCERTAIN!r}")
        if self.strategy.definitions and len(self.definitions) != len(names):
            raise ValueError(f"definitions: {len(self.definitions)} lines for {len(names)} "
                             "labels")
        return names

    @functools.cached_property
    def labels(self) -> tuple[str, ...]:
        """The label texts the prompts and answers use (names, or "class N")."""
        return label_texts(self.names, self.strategy.numeric)

    def candidates(self) -> tuple[str, ...]:
        """The answers perplexity-based decoding chooses among: the labels (+ "uncertain")."""
        return self.labels + ((UNCERTAIN,) if self.strategy.uncertain else ())

    def _view(self, ex: Example) -> ClassView:
        v = classification_view(self.base, ex)
        if self.strategy.max_text_chars is not None:
            v = v._replace(text=v.text[: self.strategy.max_text_chars])
        return v

    @functools.cached_property
    def pool(self) -> tuple[ClassView, ...]:
        """The fixed in-context pool: views of the base's first `pool_size` train examples."""
        return tuple(self._view(e) for e in self.base.examples("train", 0,
                                                                self.strategy.pool_size))

    @functools.cached_property
    def _pool_vectors(self) -> tuple[dict[str, int], np.ndarray, np.ndarray]:
        """(vocabulary, pool word counts [M, V], their L2 norms [M])."""
        words = sorted({w for v in self.pool for w in _WORD.findall(v.text.lower())})
        vocab = {w: i for i, w in enumerate(words)}
        counts = bag_of_words([v.text for v in self.pool], vocab)
        return vocab, counts, np.linalg.norm(counts, axis=1)

    def similarities(self, text: str) -> np.ndarray:
        """Bag-of-words cosine of `text` to each pool text [M]:
        cos(q, p) = q . p / (|q| |p|) on word counts (0 where either is empty; the query's
        words outside the pool's vocabulary count in |q|)."""
        vocab, counts, norms = self._pool_vectors
        q = bag_of_words([text], vocab)[0]
        q_norm = np.sqrt(sum(c * c for c in collections.Counter(
            _WORD.findall(text.lower())).values()))
        denom = norms * q_norm
        return np.divide(counts @ q, denom, out=np.zeros(len(norms)), where=denom > 0)

    def shot_indices(self, text: str, split: str, index: int) -> list[int]:
        """The pool indices of the query's in-context examples (pool entries with the query's
        own text excluded): "random": k drawn without replacement with rng (seed, split,
        index); "nearest": the k highest cosines, most similar first, ties to the lower index."""
        s = self.strategy
        if s.icl == "none":
            return []
        allowed = np.array([v.text != text for v in self.pool])
        if s.icl == "random":
            rng = np.random.default_rng([self.seed, SPLITS.index(split), index, 0x1C1])
            return [int(i) for i in rng.choice(np.flatnonzero(allowed), s.shots, replace=False)]
        sims = np.where(allowed, self.similarities(text), -np.inf)
        return [int(i) for i in np.argsort(-sims, kind="stable")[: s.shots]]

    # ---- examples ----
    def _shown_label(self, v: ClassView) -> str:
        """The label a shot or SFT target shows: "uncertain" for an undecidable text under the
        uncertain strategy, else the gold label text."""
        return UNCERTAIN if self.strategy.uncertain and v.ambiguous else self.labels[v.label]

    def render(self, text: str, shots: Sequence[tuple[str, str]] = ()) -> str:
        """The strategy's prompt for `text` with in-context `shots` [(text, label text)]
        (class docstring)."""
        s, lines = self.strategy, []
        if s.definitions:
            lines += [f"{lab}: {d}" for lab, d in zip(self.labels, self.definitions, strict=True)]
        lines += [f"{t} = {lab}" for t, lab in shots]
        if s.uncertain:
            lines.append(f"or say {UNCERTAIN}")
        if s.reasoning:
            lines.append("think first")
        lines.append(f"{text} =")
        return "\n".join(lines)

    def example(self, split: str, index: int) -> Example:
        ex = self.base.example(split, index)
        v = self._view(ex)
        shots = [(self.pool[i].text, self._shown_label(self.pool[i]))
                 for i in self.shot_indices(v.text, split, index)]
        return Example(prompt=self.render(v.text, shots), answer=self.labels[v.label],
                       meta=GenclsMeta(v.label, self.labels, v.text, v.cue, v.ambiguous))

    def _generate(self, rng: np.random.Generator) -> Example:
        raise NotImplementedError("StrategyTask rewrites its base's examples (see example)")

    def solution(self, ex: Example) -> str:
        m = GenclsMeta(*ex.meta)
        target = answer_tags(UNCERTAIN if self.strategy.uncertain and m.ambiguous else ex.answer)
        return f"<think>{m.cue}</think>{target}" if self.strategy.reasoning else target

    def score(self, completion: str, ex: Example) -> float:
        """r = 1[extract(completion) = gold label text] (case-folded; "uncertain" scores 0)."""
        pred = extract_answer(completion)
        return float(pred is not None and pred.casefold() == ex.answer.casefold())

    def predicted(self, completion: str) -> str:
        """The class a completion names, as a base label name, "uncertain" or "invalid"."""
        pred = (extract_answer(completion) or "").casefold()
        by_text = {t.casefold(): n for t, n in zip(self.labels, self.names, strict=True)}
        if self.strategy.uncertain and pred == UNCERTAIN:
            return UNCERTAIN
        return by_text.get(pred, INVALID)

    def verify_batch(self, completions: Sequence[str], examples: Sequence[Example]) -> Verdicts:
        if len(completions) != len(examples):
            raise ValueError(f"{len(completions)} completions for {len(examples)} examples")
        return Verdicts([self.score(c, e) for c, e in zip(completions, examples, strict=True)],
                        [self.predicted(c) for c in completions])

    def max_prompt_chars(self, max_text: int) -> int:
        """The longest prompt this strategy writes for texts of at most `max_text` characters
        (exact for an ASCII task such as topics: every other part is fixed or a label)."""
        longest = max(self.candidates(), key=len)
        k = self.strategy.shots if self.strategy.icl != "none" else 0
        return len(self.render("x" * max_text, [("x" * max_text, longest)] * k))


# ----------------------------------------------------------------------------- decoding


def ppl_scores(trainer, params, task: StrategyTask, examples: Sequence[Example], *,
               batch_size: int, norm: str | None = None) -> np.ndarray:
    """Perplexity-based decoding's scores [len(examples), C] of each candidate answer
    y_c = `<answer>L_c</answer>` + EOS (`task.candidates()`) under the policy `params`:

        s_c = (1/|y_c|) sum_t log pi(y_c,t | x, y_c,<t)   (strategy.ppl_norm "mean": -log PPL)
        s_c = sum_t log pi(y_c,t | x, y_c,<t)             ("sum": the log-likelihood)

    (`norm`, default the strategy's `ppl_norm`), and the prediction is argmax_c s_c. `trainer`
    is a `GRPOTrainer` (its `completion_logprobs`, at its sampling temperature); rows =
    examples x candidates in fixed-size batches of about `batch_size` rows (the last padded:
    one compiled shape)."""
    norm = norm or task.strategy.ppl_norm
    if norm not in PPL_NORMS:
        raise ValueError(f"strategy.ppl_norm must be one of {list(PPL_NORMS)}, got {norm!r}")
    cands = task.candidates()
    n_c, n_dev = len(cands), batch_shards(trainer.mesh)
    per = max(1, batch_size // n_c)  # examples per call
    while (per * n_c) % (n_dev * jax.process_count()):
        per += 1
    rows = [e for e in examples for _ in cands]  # example i -> rows [i*C, (i+1)*C)
    answers = [answer_tags(c) for _ in examples for c in cands]
    logp, mask = trainer.score(params, rows, answers, logprob_fn=trainer.completion_logprobs,
                               batch_size=per * n_c)  # `per` examples a call
    total = (logp * mask).sum(axis=1)
    if norm == "mean":
        total = total / mask.sum(axis=1)
    return total.reshape(len(examples), n_c)


def evaluate_strategy(trainer, params, task: StrategyTask, examples: Sequence[Example], *,
                      batch_size: int, decoding: str | None = None,
                      norm: str | None = None) -> dict[str, float]:
    """Held-out accuracy of `params` under the strategy's decoding (or `decoding`, `norm`):
    greedy free generation, or perplexity-based (`ppl_scores`; needs a `GRPOTrainer`). Also the
    fractions of "uncertain" and of invalid (no label) answers."""
    decoding = decoding or task.strategy.decoding
    if decoding not in DECODINGS:
        raise ValueError(f"strategy.decoding must be one of {list(DECODINGS)}, got {decoding!r}")
    if decoding == "ppl":
        cands = task.candidates()
        best = ppl_scores(trainer, params, task, examples, batch_size=batch_size,
                          norm=norm).argmax(axis=1)
        texts = [answer_tags(cands[int(i)]) for i in best]
    else:
        texts, _ = trainer.complete(params, examples, batch_size=batch_size)
    v = task.verify_batch(texts, examples)
    return {"accuracy": float(np.mean(v.scores)),
            "uncertain_rate": v.outcomes.count(UNCERTAIN) / len(texts),
            "invalid_rate": v.outcomes.count(INVALID) / len(texts)}


def needed_lengths(task: StrategyTask, tokenizer, *, n: int = 512) -> tuple[int, int]:
    """(prompt tokens, completion tokens incl. EOS) that every example of `task` fits: exact
    bounds where the base knows its longest text and cue (`max_text_len()`, `max_cue_len()`:
    topics, ASCII, one byte token per character), else the longest of the first `n` examples
    of each split."""
    base, s = task.base, task.strategy
    scan = []
    if not (hasattr(base, "max_text_len") and s.max_text_chars is None) or (
            s.reasoning and not hasattr(base, "max_cue_len")):
        scan = task.examples("train", 0, n) + task.examples("test", 0, n)
    if hasattr(base, "max_text_len") and s.max_text_chars is None:
        prompt = len(tokenizer.encode("x" * task.max_prompt_chars(base.max_text_len())))
    else:
        prompt = max(len(tokenizer.encode(e.prompt)) for e in scan)
    completion = max(len(tokenizer.encode(answer_tags(c))) for c in task.candidates())
    if s.reasoning:
        cue = base.max_cue_len() if hasattr(base, "max_cue_len") else max(
            len(GenclsMeta(*e.meta).cue) for e in scan)
        completion += len(tokenizer.encode(f"<think>{'x' * cue}</think>"))
    return prompt, completion + 1


__all__ = ["DECODINGS", "DEFINITIONS", "ICL_MODES", "STRATEGIES", "UNCERTAIN", "GenclsMeta",
           "StrategiesConfig", "StrategyConfig", "StrategyTask", "bag_of_words",
           "classification_view", "evaluate_strategy", "label_texts", "needed_lengths",
           "ppl_scores"]
