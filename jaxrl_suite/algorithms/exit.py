"""ExIt training and multi-step evaluation on top of `GRPOTrainer` (arXiv 2509.04575).

One `ExItTrainer.step`:
  1. the buffer (`curricula.exit.ExItBuffer`) decides, per prompt, whether to start from a fresh
     training task (turn 0) or from a stored partial history, and whether the step is
     self-divergent;
  2. the prompts are built on the host (`envs.text.iteration_prompt`: task, previous answer,
     score and feedback) and GRPO samples G completions per prompt (`GRPOTrainer.rollout`);
  3. the learnability of each group (variance of its min-max normalised rewards) becomes the
     priority of the entry it expanded, and every completion enters the buffer as a new partial
     history one turn deeper, with its group's learnability as priority;
  4. the group advantages get the diversity bonus (the policy's mean-pooled final hidden states
     of the completions, `GRPOTrainer.completion_embeddings`) and GRPO updates (`update`).

Only single self-improvement steps are trained. `evaluate_iterations` runs a policy greedily (or
sampling at a temperature) for 1..T self-iteration steps on held-out tasks and returns the mean
score after each step.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_suite.algorithms.grpo import GRPOTrainer, GRPOTrainState
from jaxrl_suite.core.config import Count, Positive, Probability, check_fields
from jaxrl_suite.core.parallel import gather_rows, host_local
from jaxrl_suite.curricula.exit import ExItBuffer, ExItState, diversity_bonus, learnability
from jaxrl_suite.envs.text import Example, iteration_prompt
from jaxrl_suite.models.sequence import SeqBatch
from jaxrl_suite.sampling import repeat_each


@dataclasses.dataclass(frozen=True)
class ExItConfig:
    # probability of starting from a buffer entry (once it holds min_size)
    p_select: Probability = 0.5
    p_div: Probability = 0.1  # probability of a self-divergent step
    capacity: Count = 1024  # buffer entries
    min_size: Count = 64  # sample from the buffer only once it holds this many entries
    rank_temperature: Positive = 1.0  # T of the rank-based sampling weights
    diversity_bonus: bool = True  # scale successful responses' advantages by their diversity
    max_previous_chars: Count = 48  # how much of the previous answer a prompt shows

    def __post_init__(self):
        check_fields(self, "exit.")  # the Ranges declared above (the buffer's own checks too)

    def buffer(self, response_len: int) -> ExItBuffer:
        return ExItBuffer(capacity=self.capacity, response_len=response_len,
                          p_select=self.p_select, p_div=self.p_div, min_size=self.min_size,
                          rank_temperature=self.rank_temperature)


class ExItTrainState(NamedTuple):
    """What an ExIt run checkpoints: the GRPO train state (with its `step` and SIREN anchor)
    and the buffer."""

    train: GRPOTrainState
    buffer: ExItState

    @property
    def step(self):
        return self.train.step


def _decode_rows(tokenizer, seq) -> list[str]:
    """Every completion of a rollout (all processes' rows, in order) as text."""
    tokens = gather_rows(host_local(seq.completion))
    mask = gather_rows(host_local(seq.completion_mask)) > 0
    return tokenizer.decode_batch(tokens, mask)


class ExItTrainer:
    """ExIt on `grpo`'s task: single-step iterations from a learnability-prioritised buffer.

    Follows the `algorithms.loop.fit` protocol: `batch(cursor)` gives the step's B fresh training
    tasks (index, example), of which `step` uses those the buffer does not replace."""

    def __init__(self, grpo: GRPOTrainer, config: ExItConfig):
        self.grpo, self.config = grpo, config
        self.task, self.tokenizer = grpo.task, grpo.tokenizer
        self.buffer = config.buffer(grpo.config.max_new_tokens)
        self._sample = jax.jit(self.buffer.sample, static_argnums=2)
        self._update_priority = jax.jit(self.buffer.update_priority)
        self._insert = jax.jit(self.buffer.insert)
        self._learnability = jax.jit(learnability)
        self._bonus = jax.jit(jax.vmap(lambda e, a: diversity_bonus(e, a)[0]))

    def init_state(self, params, rng, *, anchor: float | None = None) -> ExItTrainState:
        return ExItTrainState(self.grpo.init_state(params, rng, anchor=anchor),
                              self.buffer.init())

    def batch(self, cursor: int) -> list[tuple[int, Example]]:
        b = self.grpo.config.prompts_per_step
        return [(cursor + i, self.task.example("train", cursor + i)) for i in range(b)]

    def prompt_for(self, example: Example, previous: str | None, divergent: bool) -> Example:
        """`example` with its prompt replaced by the self-iteration prompt."""
        prompt = iteration_prompt(self.task, example, previous, divergent=divergent,
                                  max_previous_chars=self.config.max_previous_chars)
        return dataclasses.replace(example, prompt=prompt)

    def select(self, bstate: ExItState, fresh: Sequence[tuple[int, Example]], key: jax.Array):
        """The step's prompts: (examples [B], task index [B], turn [B] of the histories they
        extend, from_buffer [B], divergent [B], buffer index [B])."""
        sel = jax.device_get(self._sample(bstate, key, len(fresh)))
        responses, lens = np.asarray(bstate.response), np.asarray(bstate.response_len)
        buf_task, buf_turn = np.asarray(bstate.task), np.asarray(bstate.turn)  # one copy each
        tasks, turns, examples = [], [], []
        for i, (idx, ex) in enumerate(fresh):
            turn = 0
            if sel.from_buffer[i]:
                j = int(sel.index[i])
                idx, turn = int(buf_task[j]), int(buf_turn[j])
                previous = self.tokenizer.decode(responses[j, : lens[j]])
                ex = self.prompt_for(self.task.example("train", idx), previous,
                                     bool(sel.divergent[i]))
            tasks.append(idx)
            turns.append(turn)
            examples.append(ex)
        return (examples, np.array(tasks, np.int32), np.array(turns, np.int32),
                np.asarray(sel.from_buffer), np.asarray(sel.divergent), np.asarray(sel.index))

    def step(self, state: ExItTrainState, fresh: Sequence[tuple[int, Example]]):
        g = self.grpo.config.group_size
        t0 = time.perf_counter()
        train, bstate = state
        self.grpo.use_sampler_state(train)  # the rollout engine continues from the state's
        key = jax.random.fold_in(jax.random.wrap_key_data(train.rng), train.step)
        examples, tasks, turns, from_buffer, divergent, index = self.select(
            bstate, fresh, jax.random.fold_in(key, 1))
        seq, old_logp, rewards, info = self.grpo.rollout(train, examples)
        info = dict(info, gen_time=time.perf_counter() - t0)
        learn = np.asarray(self._learnability(jnp.asarray(rewards, jnp.float32)))  # [B]
        bstate = self._update_priority(bstate, index, learn, from_buffer)
        tokens = gather_rows(host_local(seq.completion))  # [B*G, N]
        lengths = gather_rows(host_local(seq.completion_mask)).sum(1).astype(np.int32)
        bstate = self._insert(bstate, np.repeat(tasks, g), np.repeat(turns + 1, g), tokens,
                              lengths, rewards.reshape(-1), np.repeat(learn, g),
                              np.ones(tokens.shape[0], bool))
        advantages = self.grpo.group_advantages(rewards)  # [B*G]
        if self.config.diversity_bonus:
            emb = gather_rows(host_local(self.grpo.completion_embeddings(train.params, seq)))
            advantages = np.asarray(self._bonus(emb.reshape(len(examples), g, -1),
                                                advantages.reshape(len(examples), g))).reshape(-1)
        train, metrics = self.grpo.update(train, seq, old_logp, rewards, info,
                                          advantages=advantages, t0=t0)
        metrics.update({k: float(v) for k, v in self.buffer.metrics(bstate).items()})
        metrics.update(from_buffer_frac=float(from_buffer.mean()),
                       divergent_frac=float((divergent & from_buffer).mean()),
                       batch_mean_turn=float(turns.mean()), learnability=float(learn.mean()),
                       tokens=float(info["tokens"]))
        return ExItTrainState(train, bstate), metrics


class MultiTurnTrainer:
    """The naive fixed-depth baseline: GRPO on whole K-turn revision episodes.

    Each of the G episodes per task answers the task, then revises its own answer K-1 times
    (self-iteration prompts, one sample per turn); the episode's reward is the final answer's
    reward, and every turn's tokens get the episode's group-normalised advantage. Follows the
    `fit` protocol (`batch(cursor)` = B fresh training tasks)."""

    def __init__(self, grpo: GRPOTrainer, turns: int = 3, max_previous_chars: int = 48):
        if turns < 1:
            raise ValueError(f"turns must be >= 1, got {turns}")
        self.grpo, self.turns, self.max_previous_chars = grpo, turns, max_previous_chars

    def init_state(self, params, rng, *, anchor: float | None = None) -> GRPOTrainState:
        return self.grpo.init_state(params, rng, anchor=anchor)

    def batch(self, cursor: int) -> list[Example]:
        return self.grpo.batch(cursor)

    def step(self, state: GRPOTrainState, examples: Sequence[Example]):
        grpo, g = self.grpo, self.grpo.config.group_size
        t0 = time.perf_counter()
        grpo.use_sampler_state(state)  # the rollout engine continues from the state's
        key = jax.random.fold_in(jax.random.wrap_key_data(state.rng), state.step)
        seq, old_logp, rewards, info = grpo.rollout(state, examples, key=jax.random.fold_in(
            key, 0))
        seqs, logps, tokens = [seq], [old_logp], info["tokens"]
        rows = repeat_each(examples, g)  # episode i of task j: row j * G + i
        for t in range(1, self.turns):
            previous = _decode_rows(grpo.tokenizer, seq)
            prompts = [dataclasses.replace(e, prompt=iteration_prompt(
                grpo.task, e, p, max_previous_chars=self.max_previous_chars))
                for e, p in zip(rows, previous, strict=True)]
            seq, old_logp, last, info_t = grpo.rollout(state, prompts, group_size=1,
                                                       key=jax.random.fold_in(key, t))
            seqs.append(seq)
            logps.append(old_logp)
            tokens += info_t["tokens"]
            rewards, info = last.reshape(len(examples), g), info_t
        advantages = np.tile(grpo.group_advantages(rewards), self.turns)  # [K*B*G]
        seq = SeqBatch(*(None if parts[0] is None else jnp.concatenate(parts)
                         for parts in zip(*seqs, strict=True)))
        info = dict(info, tokens=tokens, gen_time=time.perf_counter() - t0)
        state, metrics = grpo.update(state, seq, jnp.concatenate(logps), rewards, info,
                                     advantages=advantages, t0=t0)
        metrics["tokens"] = float(tokens)
        return state, metrics


def evaluate_iterations(grpo: GRPOTrainer, params, examples: Sequence[Example], *, steps: int,
                        batch_size: int, temperature: float | None = None,
                        rng: jax.Array | None = None) -> np.ndarray:
    """Greedy self-iteration on `examples` for `steps` steps: mean score after each step [T].

    Step 1 answers the task's own prompt; step t > 1 answers the self-iteration prompt built from
    step t-1's completion and its feedback (improve mode). `scores[-1] - scores[0]` is the gain
    from iterating. With `temperature` (and `rng`), each step samples one completion per example
    at that temperature instead (`LMRunner.complete`, step t's batches keyed from
    fold_in(rng, t)), in the same batches as the greedy steps."""
    if (temperature is None) != (rng is None):
        raise ValueError("evaluate_iterations: give temperature and rng together (sampled) or "
                         "neither (greedy)")
    previous: list[str | None] = [None] * len(examples)
    scores = np.zeros((steps, len(examples)), np.float32)
    for t in range(steps):
        prompts = [dataclasses.replace(e, prompt=iteration_prompt(grpo.task, e, p))
                   for e, p in zip(examples, previous, strict=True)]
        texts, _ = grpo.complete(params, prompts, batch_size=batch_size, temperature=temperature,
                                 rng=None if rng is None else jax.random.fold_in(rng, t))
        scores[t] = grpo.task.verify_batch(texts, examples).scores
        previous = texts
    return scores.mean(axis=1)


__all__ = ["ExItConfig", "ExItTrainState", "ExItTrainer", "MultiTurnTrainer", "evaluate_iterations"]
