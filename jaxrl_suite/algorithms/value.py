"""Regression of a value model over text states (the VM / ORM of ReST-RL's value-guided decoding).

ReST-RL (Zhoubian et al. 2025, arXiv 2508.19576) fits a value model V_phi (`models.ValueLM`) to
the Monte-Carlo value targets y_i in [0, 1] that a reward-guided tree search collects
(`sampling.mcts`, `SearchResult.targets`): the states s_i are prompts plus the first lines of a
program, y_i the mean verified reward of the completions below them. An outcome reward model is
the same fit on finished programs and their rewards. The loss is

    L(phi) = mean_i (V_phi(s_i) - y_i)^2

and `ValueTrainer.value_fn(params)` is the `value_fn(states) -> [len(states)]` that VM-MCTS
decodes with. States are left-padded to a fixed `state_len` (a longer state keeps its last
`state_len` tokens), batches have fixed shapes, so training is one compiled program and
prediction another.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_suite.core.config import Count, NonNegative, NonNegativeInt, Positive, check_fields
from jaxrl_suite.core.parallel import (
    batch_shards,
    jit_on_mesh,
    process_rows,
    shard_batch,
)
from jaxrl_suite.core.train import TrainState, init_train_state, make_optimizer, make_train_step
from jaxrl_suite.envs.text.tokenizer import Tokenizer
from jaxrl_suite.models.sharding import check_model_mesh, shard_tree
from jaxrl_suite.models.value import ValueLM, init_from_policy
from jaxrl_suite.sampling.runner import map_batches


@dataclasses.dataclass(frozen=True)
class ValueConfig:
    steps: Count = 200  # regression updates of `fit` (and the cosine decay horizon)
    batch_size: Count = 32  # states per update (and per `predict` call by default)
    lr: Positive = 1e-3  # peak AdamW learning rate (warm-up, then cosine to 10% over `steps`)
    warmup_steps: NonNegativeInt = 0  # linear warm-up steps (0 = none)
    weight_decay: NonNegative = 0.0  # AdamW weight decay
    max_grad_norm: Positive = 1.0  # global-norm gradient clipping

    def __post_init__(self):
        check_fields(self, "value.")  # the Ranges declared above


class ValueBatch(NamedTuple):
    """Encoded states and their targets (leading axis = rows, sharded over "data")."""

    tokens: jax.Array  # [B, S] int32, left-padded
    mask: jax.Array  # [B, S] bool
    targets: jax.Array  # [B] float32 in [0, 1]


def value_mse_loss(values: jax.Array, targets: jax.Array) -> tuple[jax.Array, dict]:
    """L = mean_i (v_i - y_i)^2 of values, targets [B]; metrics `mse` and `value_mean`."""
    if values.shape != targets.shape or values.ndim != 1:
        raise ValueError(f"values {values.shape} and targets {targets.shape} must be equal [B]")
    loss = jnp.mean(jnp.square(values - targets))
    return loss, {"mse": loss, "value_mean": jnp.mean(values)}


class ValueTrainer:
    """MSE regression of a `ValueLM` on (state text, target) pairs, and batched prediction."""

    def __init__(self, model: ValueLM, tokenizer: Tokenizer, config: ValueConfig, *, mesh,
                 state_len: int):
        check_model_mesh(model.config, mesh)
        if not 0 < state_len <= model.config.max_len:
            raise ValueError(f"state_len must be in 1..{model.config.max_len} (the model's "
                             f"max_len), got {state_len}")
        if config.batch_size % batch_shards(mesh):
            raise ValueError(f"value.batch_size={config.batch_size} is not a multiple of the "
                             f"{batch_shards(mesh)} batch shards of the mesh (data x fsdp)")
        self.model, self.tokenizer, self.config, self.mesh = model, tokenizer, config, mesh
        self.state_len = state_len
        self.optimizer = make_optimizer(
            config.lr, warmup_steps=config.warmup_steps, total_steps=config.steps,
            weight_decay=config.weight_decay, max_grad_norm=config.max_grad_norm,
        )

        def loss_fn(params, batch: ValueBatch):
            return value_mse_loss(model.apply(params, batch.tokens, batch.mask), batch.targets)

        self._update = jit_on_mesh(make_train_step(loss_fn, self.optimizer), keep_placement=True)
        self._values = jit_on_mesh(model.apply)

    def encode(self, states: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """(tokens [B, S] int32, mask [B, S] bool) of `states`, left-padded to S = state_len.

        A state of more than S tokens keeps its last S (the lines nearest the decision):
        `Tokenizer.encode_batch` refuses overlong text, so the ids are cut here, on the left.

        Raises:
          ValueError: if a state has no tokens (its value would see no key).
        """
        ids = [self.tokenizer.encode(s)[-self.state_len:] for s in states]
        tokens = np.full((len(ids), self.state_len), self.tokenizer.pad_id, np.int32)  # [B, S]
        mask = np.zeros((len(ids), self.state_len), bool)  # [B, S]
        for row, x in enumerate(ids):
            if not x:
                raise ValueError(f"state {row} has no tokens: {states[row]!r}")
            tokens[row, self.state_len - len(x):] = x
            mask[row, self.state_len - len(x):] = True
        return tokens, mask

    def place_state(self, state):
        """The state (or params) on the mesh by `models.sharding`'s rules."""
        return shard_tree(state, self.mesh)

    def init_state(self, params, rng) -> TrainState:
        return self.place_state(init_train_state(params, self.optimizer, rng))

    def step(self, state: TrainState, states: Sequence[str],
             targets: np.ndarray) -> tuple[TrainState, dict]:
        """One MSE update on a global batch of `states` [B] and their `targets` [B] in [0, 1]."""
        targets = _check_targets(states, targets)
        return self._step(state, *self.encode(states), targets)

    def _step(self, state: TrainState, tokens: np.ndarray, mask: np.ndarray,
              targets: np.ndarray) -> tuple[TrainState, dict]:
        rows = process_rows(len(tokens))  # this process's rows of the global batch
        batch = shard_batch(ValueBatch(tokens[rows], mask[rows], targets[rows]), self.mesh)
        return self._update(state, batch)

    def fit(self, state: TrainState, states: Sequence[str], targets: np.ndarray, *,
            steps: int | None = None, seed: int = 0) -> tuple[TrainState, dict[str, np.ndarray]]:
        """`steps` updates (None: value.steps) on minibatches of value.batch_size rows.

        Each pass visits the rows in a fresh random order (`np.random.default_rng(seed)`); its
        last, short minibatch is filled up with rows drawn at random, so every update has the
        same shape (one compile). On several processes each passes the same states, targets and
        seed (the minibatches are global; `step` keeps this process's rows). Past value.steps
        updates the learning rate stays at its final 10%. Returns (state, {metric: [steps]}).
        """
        targets = _check_targets(states, targets)
        if not states:
            raise ValueError("fit needs at least one state")
        tokens, mask = self.encode(states)  # tokenized once
        steps = self.config.steps if steps is None else steps
        if steps < 1:
            raise ValueError(f"fit: steps must be positive, got {steps}")
        batches = _minibatches(len(states), self.config.batch_size, np.random.default_rng(seed))
        history = []
        for _ in range(steps):
            idx = next(batches)
            state, metrics = self._step(state, tokens[idx], mask[idx], targets[idx])
            history.append(metrics)
        history = jax.device_get(history)  # one transfer at the end: the updates run async
        return state, {k: np.stack([m[k] for m in history]) for k in history[0]}

    def fit_from_policy(self, policy_params, states: Sequence[str], targets, *, init_key,
                        state_key, seed: int = 0, steps: int | None = None
                        ) -> tuple[TrainState, dict[str, np.ndarray]]:
        """`fit` from a value model warm-started from a policy of the same `LMConfig`: params
        `init_from_policy(model.init(init_key, ...), policy_params)` (the head from `init_key`),
        the optimizer state from `init_state(., state_key)`, then `fit(steps=, seed=)`."""
        init = self.model.init(init_key, *self.encode(["x"]))
        state = self.init_state(init_from_policy(init, policy_params), state_key)
        return self.fit(state, states, np.asarray(targets), steps=steps, seed=seed)

    def predict(self, params, states: Sequence[str], *,
                batch_size: int | None = None) -> np.ndarray:
        """V(s) of every state (all processes' rows, in order): [len(states)] float32.

        Fixed batches of `batch_size` rows (None: value.batch_size, rounded down to a multiple
        of the mesh's batch shards), the last one padded with copies of its last state, so one
        compiled program serves every call of that size (`sampling.map_batches`).
        """
        if len(states) == 0:
            return np.zeros((0,), np.float32)
        params = self.place_state(params)
        return map_batches(
            lambda local, _: self._values(params, *shard_batch(self.encode(local), self.mesh)),
            states, batch_size=self.config.batch_size if batch_size is None else batch_size,
            mesh=self.mesh)

    def value_fn(self, params, *, batch_size: int | None = None
                 ) -> Callable[[Sequence[str]], np.ndarray]:
        """`value_fn(states) -> [len(states)]` for `sampling.mcts` (VM-MCTS, ORM-MCTS)."""
        return functools.partial(self.predict, self.place_state(params), batch_size=batch_size)


def _check_targets(states: Sequence[str], targets) -> np.ndarray:
    """`targets` as float32 [len(states)] in [0, 1] (the range of the sigmoid value)."""
    targets = np.asarray(targets, np.float32)
    if targets.shape != (len(states),):
        raise ValueError(f"targets must have shape ({len(states)},) (one per state), got "
                         f"{targets.shape}")
    if not np.all((targets >= 0) & (targets <= 1)):
        raise ValueError("targets must lie in [0, 1] (the value model's sigmoid range)")
    return targets


def _minibatches(n: int, batch_size: int, rng: np.random.Generator):
    """Endless row indices [batch_size]: passes over a permutation of the n rows, the last,
    short minibatch of each pass completed by rows drawn uniformly at random."""
    while True:
        order = rng.permutation(n)
        for start in range(0, n, batch_size):
            idx = order[start : start + batch_size]
            if len(idx) < batch_size:
                idx = np.concatenate([idx, rng.integers(0, n, batch_size - len(idx))])
            yield idx


__all__ = ["ValueBatch", "ValueConfig", "ValueTrainer", "value_mse_loss"]
