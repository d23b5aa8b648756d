"""GenCLS++ strategies (algorithms/gencls.py): each strategy's prompt and target against hand-
written ones, nearest-neighbour shots against an independent cosine, perplexity-based decoding
against direct log-prob sums, the rule reward, lengths, ag_news on mock TFDS data, errors."""

from __future__ import annotations

import dataclasses
import functools
import re
from collections import Counter
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from lm_helpers import peaked_params

from jaxrl_suite.algorithms.gencls import (
    StrategyConfig,
    StrategyTask,
    classification_view,
    evaluate_strategy,
    label_texts,
    needed_lengths,
    ppl_scores,
)
from jaxrl_suite.algorithms.grpo import GRPOTrainer
from jaxrl_suite.algorithms.grpo_config import GRPOConfig
from jaxrl_suite.core.parallel import make_mesh
from jaxrl_suite.envs.text.base import Example, Task
from jaxrl_suite.envs.text.sort import SortTask
from jaxrl_suite.envs.text.tokenizer import load_tokenizer
from jaxrl_suite.envs.text.topics import ClassView, TopicsTask
from jaxrl_suite.models import CausalLM, LMConfig

NAMES = ("fruit", "sky")
TRAIN = [("red apple pie", 0, False), ("green apple", 0, False), ("blue sky high", 1, False),
         ("dark blue sea", 1, False), ("red red wine", 0, False), ("blue or red", 1, True)]
TEST = [("blue apple", 1, False), ("red or blue", 0, True)]


@dataclasses.dataclass(frozen=True)
class Tiny(Task):
    """A hand-made classification task: fixed texts; its cue is the first word."""

    name: ClassVar[str] = "tiny"
    seed: int = 0

    def example(self, split, index):
        text, label, ambiguous = (TRAIN if split == "train" else TEST)[index % len(
            TRAIN if split == "train" else TEST)]
        return Example(prompt=f"classify: {text}", answer=NAMES[label], meta=(label, ambiguous))

    def view(self, ex):
        text = ex.prompt.removeprefix("classify: ")
        return ClassView(text, ex.meta[0], NAMES, f"word {text.split()[0]}", ex.meta[1])

    @staticmethod
    def definitions():
        return ("red or green things", "blue things")

    def _generate(self, rng):
        raise NotImplementedError

    def solution(self, ex):
        return f"<answer>{ex.answer}</answer>"

    def score(self, completion, ex):
        return float(completion == self.solution(ex))


def _task(**kw) -> StrategyTask:
    return StrategyTask(Tiny(), StrategyConfig(pool_size=len(TRAIN), **kw))


# ----------------------------------------------------------------------------- prompts


def test_each_strategy_prompt_and_target():
    blue = lambda t: t.example("test", 0)  # "blue apple" -> sky
    ex = blue(_task())
    assert ex.prompt == "blue apple =" and ex.answer == "sky"
    assert _task().solution(ex) == "<answer>sky</answer>"

    t = _task(definitions=True)
    assert blue(t).prompt == "fruit: red or green things\nsky: blue things\nblue apple ="

    # nearest: cos("blue apple", .) = 1/sqrt(6), 1/2, 1/sqrt(6), 1/sqrt(6), 0, 1/sqrt(6):
    # "green apple" first, then the tie at 1/sqrt(6) goes to the lowest pool index
    t = _task(icl="nearest")
    assert blue(t).prompt == "green apple = fruit\nred apple pie = fruit\nblue apple ="

    t = _task(uncertain=True)
    undecidable = t.example("test", 1)
    assert blue(t).prompt == "or say uncertain\nblue apple ="
    assert t.solution(undecidable) == "<answer>uncertain</answer>"  # the SFT target ...
    assert undecidable.answer == "fruit"  # ... while the gold label stays
    assert t.score("<answer>uncertain</answer>", undecidable) == 0.0  # abstaining earns 0
    assert t.solution(blue(t)) == "<answer>sky</answer>"
    assert t.candidates() == ("fruit", "sky", "uncertain")

    t = _task(numeric=True)
    numbers = label_texts(NAMES, True)
    assert sorted(numbers) == ["class 1", "class 2"] and t.labels == numbers
    assert blue(t).prompt == "blue apple =" and blue(t).answer == numbers[1]
    assert t.score(f"<answer>{numbers[1]}</answer>", blue(t)) == 1.0
    assert t.score("<answer>sky</answer>", blue(t)) == 0.0  # the names are not the labels
    assert label_texts(TopicsTask.labels(), True) == label_texts(TopicsTask.labels(), True)

    t = _task(reasoning=True)
    assert blue(t).prompt == "think first\nblue apple ="
    assert t.solution(blue(t)) == "<think>word blue</think><answer>sky</answer>"
    assert t.score(t.solution(blue(t)), blue(t)) == 1.0

    # every switch at once: definitions, shots (an undecidable shot shows "uncertain"), the
    # uncertain line, the reasoning cue, the query; numbers instead of names everywhere
    t = _task(icl="nearest", shots=3, definitions=True, uncertain=True, numeric=True,
              reasoning=True)
    n0, n1 = numbers
    q = t.example("test", 1)  # "red or blue": nearest "blue or red" (cos 1), "red apple pie",
    # "red red wine" (cos 2/sqrt(3 * 5) > 1/3)
    assert q.prompt == (f"{n0}: red or green things\n{n1}: blue things\n"
                        f"blue or red = uncertain\nred red wine = {n0}\nred apple pie = {n0}\n"
                        "or say uncertain\nthink first\nred or blue =")
    assert t.solution(q) == "<think>word red</think><answer>uncertain</answer>"


def test_random_shots_are_deterministic_pool_members_without_the_query():
    t = _task(icl="random", shots=2)
    train = [t.example("train", i) for i in range(len(TRAIN))]
    for i, ex in enumerate(train):
        lines = ex.prompt.split("\n")
        shots = [line.rsplit(" = ", 1)[0] for line in lines[:-1]]
        assert len(shots) == 2 == len(set(shots))
        assert set(shots) <= {text for text, _, _ in TRAIN} and TRAIN[i][0] not in shots
        assert ex == t.example("train", i) == _task(icl="random", shots=2).example("train", i)
    draws = {tuple(t.shot_indices("blue apple", "test", i)) for i in range(30)}
    assert len(draws) > 5  # a fresh draw per query
    reseeded = StrategyTask(Tiny(), StrategyConfig(icl="random", pool_size=6), seed=1)
    assert [reseeded.example("train", i) for i in range(len(TRAIN))] != train


def _cosines(query: str, pool: list[str]) -> np.ndarray:
    """An independent bag-of-words cosine: Counter dot products."""
    words = lambda s: Counter(re.findall(r"[a-z0-9]+", s.lower()))
    q = words(query)
    out = []
    for p in map(words, pool):
        dot = sum(q[w] * p[w] for w in q)
        den = np.sqrt(sum(v * v for v in q.values())) * np.sqrt(sum(v * v for v in p.values()))
        out.append(dot / den if den else 0.0)
    return np.array(out)


def test_nearest_shots_match_an_independent_cosine():
    t = StrategyTask(TopicsTask(), StrategyConfig(icl="nearest", shots=2, pool_size=64))
    pool = [v.text for v in t.pool]
    for i in range(25):
        for split in ("test", "train"):
            ex = t.example(split, i)
            query = ex.meta.text
            want = _cosines(query, pool)
            np.testing.assert_allclose(t.similarities(query), want, atol=1e-12)
            want[[j for j, p in enumerate(pool) if p == query]] = -np.inf  # not the query
            order = sorted(range(len(pool)), key=lambda j: (-want[j], j))[:2]
            assert t.shot_indices(query, split, i) == order
            shown = [line.rsplit(" = ", 1)[0] for line in ex.prompt.split("\n")[:-1]]
            assert shown == [pool[j] for j in order]
    # a train query is in the pool (the first 64 train examples): it is never its own shot
    first = t.example("train", 0)
    assert first.meta.text == pool[0] and 0 not in t.shot_indices(pool[0], "train", 0)


def test_lengths_bound_every_strategy():
    tok, base = load_tokenizer("byt5"), TopicsTask()
    for kw in [{}, {"icl": "random"}, {"icl": "nearest"}, {"definitions": True},
               {"uncertain": True}, {"numeric": True}, {"reasoning": True},
               {"icl": "nearest", "definitions": True, "uncertain": True, "numeric": True}]:
        t = StrategyTask(base, StrategyConfig(pool_size=64, **kw))
        prompt, completion = needed_lengths(t, tok)
        examples = t.examples("train", 0, 300) + t.examples("test", 0, 100)
        longest = max(len(tok.encode(e.prompt)) for e in examples)
        assert longest <= prompt <= 1.2 * longest, kw  # a bound, and not a loose one
        assert max(len(tok.encode(t.solution(e))) + 1 for e in examples) <= completion, kw
        for e in examples[:20]:  # the solutions score 1 (but an "uncertain" target)
            assert t.score(t.solution(e), e) == float(not (kw.get("uncertain") and
                                                          e.meta.ambiguous))


def test_rule_reward_and_outcomes():
    t = _task(uncertain=True)
    ex = t.example("test", 0)  # sky
    for completion, score, outcome in [
        ("<answer>sky</answer>", 1.0, "sky"), ("<answer> SKY </answer>", 1.0, "sky"),
        ("<answer>fruit</answer>", 0.0, "fruit"), ("<answer>uncertain</answer>", 0.0,
                                                   "uncertain"),
        ("sky", 0.0, "invalid"), ("<answer>sky", 0.0, "invalid"), ("", 0.0, "invalid"),
        ("<answer>skyline</answer>", 0.0, "invalid"), ("<think>x</think><answer>sky</answer>",
                                                       1.0, "sky")]:
        v = t.verify_batch([completion], [ex])
        assert (v.scores, v.outcomes) == ([score], [outcome]), completion
    assert _task().predicted("<answer>uncertain</answer>") == "invalid"  # not offered


def test_bad_options_are_one_line_errors():
    for kw, field in [({"icl": "knn"}, "strategy.icl"), ({"decoding": "beam"},
                      "strategy.decoding"), ({"ppl_norm": "max"}, "strategy.ppl_norm"),
                      ({"shots": 0}, "strategy.shots"), ({"icl": "random", "pool_size": 2},
                      "strategy.pool_size"), ({"decoding": "ppl", "reasoning": True},
                      "strategy.reasoning"), ({"max_text_chars": 0},
                      "strategy.max_text_chars")]:
        with pytest.raises(ValueError, match=re.escape(field)):
            StrategyConfig(**kw)
    assert StrategyConfig(decoding="ppl", ppl_norm="sum").training == StrategyConfig()
    with pytest.raises(ValueError, match="not a classification task"):
        classification_view(SortTask(), Example("a", "b"))
    with pytest.raises(ValueError, match="no category definitions"):
        StrategyTask(_NoDefinitions(), StrategyConfig(definitions=True))


@dataclasses.dataclass(frozen=True)
class _NoDefinitions(Tiny):
    name: ClassVar[str] = "no_definitions"
    definitions: ClassVar = None


# ----------------------------------------------------------------------------- ppl decoding


@pytest.fixture(scope="module")
def ppl_setup():
    tok = load_tokenizer("byt5")
    model = CausalLM(LMConfig(vocab_size=tok.vocab_size, d_model=32, n_layers=1, n_heads=2,
                              n_kv_heads=1, d_ff=64, max_len=128))
    params = jax.jit(lambda rng: peaked_params(model, rng))(jax.random.key(3))
    task = _task(uncertain=True, decoding="ppl")
    trainer = GRPOTrainer(model, tok, task, GRPOConfig(prompts_per_step=2, group_size=2,
                                                       max_new_tokens=32),
                          mesh=make_mesh(None), prompt_len=48)
    return tok, model, params, task, trainer


@functools.cache
def _forward(model):
    return jax.jit(model.apply)


def _direct_logprob(tok, model, params, prompt: str, completion: str) -> tuple[float, int]:
    """Sum of log pi(y_t | x, y_<t) over `completion` + EOS by one forward pass of the sequence
    starting at position 0, padded on the RIGHT to 128 tokens (one compiled shape; the model is
    causal, so the padding after the sequence cannot change its log-probs; the trainer pads
    prompts on the left instead)."""
    x, y = tok.encode(prompt), tok.encode(completion) + [tok.eos_id]
    tokens = np.full((1, 128), tok.pad_id, np.int32)
    tokens[0, : len(x) + len(y)] = x + y
    logits = _forward(model)(params, jnp.asarray(tokens))[0][0]  # [T, V]
    logp = np.asarray(jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1))  # index on host
    return float(sum(logp[len(x) - 1 + t, y[t]] for t in range(len(y)))), len(y)


def test_ppl_scores_are_direct_logprob_sums(ppl_setup):
    tok, model, params, task, trainer = ppl_setup
    examples = [task.example("train", i) for i in range(5)] + [task.example("test", 0)]
    cands = task.candidates()
    direct = np.array([[_direct_logprob(tok, model, params, e.prompt, f"<answer>{c}</answer>")
                        for c in cands] for e in examples])  # [E, C, 2]: sum, tokens
    # 5 rows per call: 1 example x 3 candidates, padded -> one shape for every batch
    total = ppl_scores(trainer, params, task, examples, batch_size=5, norm="sum")
    np.testing.assert_allclose(total, direct[..., 0], rtol=1e-4, atol=1e-4)
    mean = ppl_scores(trainer, params, task, examples, batch_size=64)  # the strategy's "mean"
    np.testing.assert_allclose(mean, direct[..., 0] / direct[..., 1], rtol=1e-4, atol=1e-4)
    # here the length normalisation changes the choice (the shortest label has the highest sum)
    assert (mean.argmax(1) != total.argmax(1)).any()

    result = evaluate_strategy(trainer, params, task, examples, batch_size=6)
    picked = [cands[i] for i in mean.argmax(1)]
    assert result["accuracy"] == pytest.approx(np.mean([p == e.answer for p, e in
                                                        zip(picked, examples, strict=True)]))
    assert result["uncertain_rate"] == pytest.approx(picked.count("uncertain") / len(picked))
    assert result["invalid_rate"] == 0.0  # ppl always names a candidate
    sums = evaluate_strategy(trainer, params, task, examples, batch_size=6, norm="sum")
    assert sums["accuracy"] == pytest.approx(np.mean(
        [cands[i] == e.answer for i, e in zip(direct[..., 0].argmax(1), examples, strict=True)]))


def test_ppl_picks_the_label_a_trained_model_prefers(ppl_setup):
    """A model pushed (a few SFT steps on one label's completions) to answer "sky" is decoded
    to "sky" by ppl for every prompt, and free decoding agrees."""
    from jaxrl_suite.algorithms.sft import SFTConfig, SFTTrainer

    tok, model, params, task, trainer = ppl_setup
    sky = dataclasses.replace(task, base=_AlwaysSky())
    sft = SFTTrainer(model, tok, sky, SFTConfig(steps=40, batch_size=4, lr=1e-2,
                                                warmup_steps=1), mesh=make_mesh(None),
                     prompt_len=48, max_new_tokens=32)
    state = sft.init_state(params, jax.random.key(0))
    for i in range(40):
        state, _ = sft.step(state, sft.batch(4 * i))
    examples = [task.example("test", 0), task.example("train", 0), task.example("train", 3)]
    best = ppl_scores(trainer, state.params, task, examples, batch_size=6).argmax(1)
    assert [task.candidates()[i] for i in best] == ["sky"] * 3
    examples = [sky.example(*e) for e in (("test", 0), ("train", 0), ("train", 3))]
    assert all(e.answer == "sky" for e in examples)
    assert evaluate_strategy(trainer, state.params, sky, examples, batch_size=6,
                             decoding="free")["accuracy"] == 1.0


@dataclasses.dataclass(frozen=True)
class _AlwaysSky(Tiny):
    """Tiny with every label "sky" (its views too)."""

    def example(self, split, index):
        ex = super().example(split, index)
        return dataclasses.replace(ex, answer="sky", meta=(1, False))


# ----------------------------------------------------------------------------- ag_news


AG_NEWS = ("World", "Sports", "Business", "Sci/Tech")
AG_TRAIN = [{"title": f"Title {i}".encode(), "description": f"Desc {i} team.".encode(),
             "label": i % 4} for i in range(8)]


def test_ag_news_on_mock_tfds():
    tfds = pytest.importorskip("tensorflow_datasets")
    from jaxrl_suite.envs.text import make_task
    from jaxrl_suite.envs.text.tfds_tasks import clear_dataset_cache

    def as_data_source(builder, split, **kwargs):
        return list({"train": AG_TRAIN, "test": AG_TRAIN[:2]}[split])

    clear_dataset_cache()
    try:
        with tfds.testing.mock_data(policy=tfds.testing.MockPolicy.USE_CODE,
                                    as_data_source_fn=as_data_source):
            base = make_task("ag_news")
            ex = {e.answer: e for e in base.examples("train", 0, 8)}["Sci/Tech"]
            view = classification_view(base, ex)
            t = StrategyTask(base, StrategyConfig(icl="nearest", shots=1, pool_size=8,
                                                  definitions=True, uncertain=True))
            wrapped = [t.example("train", i) for i in range(8)]
            numeric = StrategyTask(base, StrategyConfig(numeric=True)).example("test", 0)
            with pytest.raises(ValueError, match="reasoning"):
                StrategyTask(base, StrategyConfig(reasoning=True))
    finally:
        clear_dataset_cache()
    assert view.text in {f"Title {i}\nDesc {i} team." for i in (3, 7)} and view.label == 3
    assert view.names == AG_NEWS and not view.ambiguous and view.cue is None
    sci = next(e for e in wrapped if e.meta.text == view.text)
    lines = sci.prompt.split("\n")
    assert lines[:4] == ["World: international news: countries, wars, diplomacy",
                         "Sports: games, teams, athletes",
                         "Business: companies, markets, the economy",
                         "Sci/Tech: research, computers, the internet"]
    # one shot, the nearest other text: "Title k / Desc k team." shares 3 of 4 words with all
    # seven others; the tie goes to the lowest pool index
    others = [v for v in t.pool if v.text != view.text]
    assert lines[4:6] == [others[0].text.split("\n")[0],
                          f"{others[0].text.split(chr(10))[1]} = {AG_NEWS[others[0].label]}"]
    assert lines[6:] == ["or say uncertain", view.text.split("\n")[0],
                         view.text.split("\n")[1] + " ="]
    assert sci.answer == "Sci/Tech" and t.solution(sci) == "<answer>Sci/Tech</answer>"
    assert t.score("<answer>sci/tech</answer>", sci) == 1.0
    assert numeric.answer == label_texts(AG_NEWS, True)[numeric.meta.label]
