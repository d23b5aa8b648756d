"""The two-step baseline OPPO argues against: learn a reward from preferences, then run IQL on it.

Step 1 (the preference reward model of Christiano et al. 2017 and of PT/OPRL in offline PbRL): an
MLP r(s, a), summed over each K-step segment, R(tau) = sum_t r(s_t, a_t), is fit to the labelled
pairs by the Bradley-Terry loss (`losses.oppo.bradley_terry_loss`):

    P(tau_a > tau_b) = sigmoid(R(tau_a) - R(tau_b))

Step 2: every row of the dataset is relabelled with r(s, a) and IQL (`algorithms/iql.py`) trains on
those rewards (normalised by IQL's `reward_normalization`, the same map as for the true reward).

`make_train(reward_config, iql_config, env, data, prefs) -> train(rng)` runs both steps in one
jitted program, so `jax.vmap(train)(keys)` trains reward model and agent per seed.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import optax

from jaxrl_suite.algorithms import iql
from jaxrl_suite.envs.contextual import ContextualEnv
from jaxrl_suite.envs.offline import (
    check_dataset,
    check_preferences,
    dataset_actions,
    gather_segments,
)
from jaxrl_suite.losses.oppo import bradley_terry_loss
from jaxrl_suite.models.offline import RewardNet


@dataclasses.dataclass(frozen=True)
class RewardModelConfig:
    segment_length: int = 20  # K: steps per segment (must match the preferences' segments)
    hidden: tuple[int, ...] = (64, 64)  # reward MLP widths
    batch_pairs: int = 64  # labelled pairs per step
    steps: int = 2000  # gradient steps
    lr: float = 3e-4  # Adam

    def __post_init__(self):
        for name in ("segment_length", "batch_pairs", "steps"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")


class RewardState(flax.struct.PyTreeNode):
    params: Any
    opt_state: Any
    rng: jax.Array
    step: jax.Array


class RewardModel:
    """A Bradley-Terry reward model over `data`'s segments labelled by `prefs`."""

    def __init__(self, config: RewardModelConfig, env: ContextualEnv, data, prefs):
        self.config = config
        check_dataset(data)
        self.starts, self.label = check_preferences(prefs, data, config.segment_length)
        self.obs = jnp.asarray(data["observations"], jnp.float32)
        _, self.action_features = dataset_actions(env, data)
        self.net = RewardNet(hidden=config.hidden)
        self.optimizer = optax.adam(config.lr)

    def init(self, rng: jax.Array) -> RewardState:
        k_net, rng = jax.random.split(rng)
        params = self.net.init(k_net, self.obs[:1], self.action_features[:1])
        return RewardState(params, self.optimizer.init(params), rng, jnp.zeros((), jnp.int32))

    def segment_returns(self, params, starts: jax.Array) -> jax.Array:
        """Predicted R(tau) = sum_t r(s_t, a_t) of the segments starting at `starts` [...]."""
        k = self.config.segment_length
        obs = gather_segments(self.obs, starts, k)  # [..., K, obs_dim]
        feats = gather_segments(self.action_features, starts, k)
        return self.net.apply(params, obs, feats).sum(axis=-1)

    def update(self, state: RewardState) -> tuple[RewardState, dict[str, jax.Array]]:
        rng, k = jax.random.split(state.rng)
        idx = jax.random.randint(k, (self.config.batch_pairs,), 0, self.starts.shape[0])
        starts, label = self.starts[idx], self.label[idx]  # [B, 2], [B]

        def loss_fn(params):
            r = self.segment_returns(params, starts)  # [B, 2]
            return bradley_terry_loss(r[:, 0], r[:, 1], label)

        (loss, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
        updates, opt_state = self.optimizer.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        return RewardState(params, opt_state, rng, state.step + 1), {"bt_loss": loss, **metrics}

    def relabel(self, params) -> jax.Array:
        """r(s, a) of every dataset row: [N]."""
        return self.net.apply(params, self.obs, self.action_features)


def make_train_reward(config: RewardModelConfig, env: ContextualEnv, data, prefs):
    """`train(rng) -> (RewardState, metrics)`: `config.steps` Bradley-Terry updates in a scan."""
    model = RewardModel(config, env, data, prefs)

    def train(rng: jax.Array):
        state = model.init(rng)
        return jax.lax.scan(lambda s, _: model.update(s), state, None, config.steps)

    train.model = model
    return train


def make_train(reward_config: RewardModelConfig, iql_config: iql.IQLConfig, env: ContextualEnv,
               data, prefs):
    """Preference reward + IQL: `train(rng) -> ((RewardState, OfflineState), metrics)`.

    metrics: the reward model's ("bt_loss", "bt_acc", [reward steps]), IQL's ([IQL steps]),
    "eval_return", and "reward_corr", the Pearson correlation of the learned and true rewards
    over the dataset (a diagnostic; training never sees the true rewards)."""
    train_reward = make_train_reward(reward_config, env, data, prefs)
    train_iql = iql.make_train(iql_config, env, data)
    true_r = train_iql.agent.rewards

    def train(rng: jax.Array):
        k_reward, k_iql = jax.random.split(rng)
        r_state, r_metrics = train_reward(k_reward)
        learned = train_reward.model.relabel(r_state.params)  # [N]
        agent_state, metrics = train_iql(k_iql, learned)
        corr = jnp.corrcoef(learned, true_r)[0, 1]
        return (r_state, agent_state), {**r_metrics, **metrics, "reward_corr": corr}

    train.reward_model = train_reward.model
    train.agent = train_iql.agent
    return train


__all__ = ["RewardModel", "RewardModelConfig", "RewardState", "make_train", "make_train_reward"]
