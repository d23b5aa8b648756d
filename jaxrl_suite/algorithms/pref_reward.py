"""The two-step baseline OPPO argues against: learn a reward from preferences, then run IQL on it.

Step 1 (the preference reward model of Christiano et al. 2017 and of PT/OPRL in offline PbRL): an
MLP r(s, a), summed over each K-step segment, R(tau) = sum_t r(s_t, a_t), is fit to the labelled
pairs by the Bradley-Terry loss (`losses.oppo.bradley_terry_loss`):

    P(tau_a > tau_b) = sigmoid(R(tau_a) - R(tau_b))

Step 2: every row of the dataset is relabelled with r(s, a) and IQL (`algorithms/iql.py`) trains on
those rewards (normalised by IQL's `reward_normalization`, the same map as for the true reward).

`make_train(reward_config, iql_config, env) -> (train, agent)` with `train(rng, data)` runs both
steps in one jitted program on `data = agent.prepare(dataset, prefs)`, an argument, so
`jax.vmap(train, in_axes=(0, None))(keys, data)` trains reward model and agent per seed and one
compilation serves every dataset of the same shape. The reward model's updates go through
`core.train.apply_gradients` (a non-finite one is refused, and the run halts at its last finite
parameters; "nonfinite" counts the refused updates).
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import flax.struct
import jax
import jax.numpy as jnp
import optax

from jaxrl_suite.algorithms import iql
from jaxrl_suite.algorithms.offline_data import PreferenceData, Transitions, preference_data
from jaxrl_suite.core.config import Count, NonNegative, check_fields
from jaxrl_suite.core.train import TrainAndAgent, apply_gradients
from jaxrl_suite.envs.contextual import ContextualEnv
from jaxrl_suite.envs.offline import gather_segments
from jaxrl_suite.losses.oppo import bradley_terry_loss
from jaxrl_suite.models.offline import RewardNet


@dataclasses.dataclass(frozen=True)
class RewardModelConfig:
    segment_length: Count = 20  # K: steps per segment (must match the preferences' segments)
    hidden: tuple[Count, ...] = (64, 64)  # reward MLP widths
    batch_pairs: Count = 64  # labelled pairs per step
    steps: Count = 2000  # gradient steps
    lr: NonNegative = 3e-4  # Adam

    def __post_init__(self):
        check_fields(self, "reward.")  # the Ranges declared above


class RewardState(flax.struct.PyTreeNode):
    params: Any
    opt_state: Any
    rng: jax.Array
    step: jax.Array


class RewardModel:
    """A Bradley-Terry reward model over a dataset's segments labelled by preferences."""

    def __init__(self, config: RewardModelConfig, env: ContextualEnv):
        self.config, self.env = config, env
        self.net = RewardNet(hidden=config.hidden)
        self.optimizer = optax.adam(config.lr)

    def prepare(self, data, prefs) -> PreferenceData:
        """A D4RL-layout dataset and its `make_preferences` pairs as the `PreferenceData` that
        `train(rng, data)` takes (checked against `config.segment_length`)."""
        return preference_data(self.env, data, prefs, self.config.segment_length)

    def init(self, rng: jax.Array, data: PreferenceData) -> RewardState:
        k_net, rng = jax.random.split(rng)
        params = self.net.init(k_net, data.obs[:1], data.action_features[:1])
        return RewardState(params, self.optimizer.init(params), rng, jnp.zeros((), jnp.int32))

    def segment_returns(self, params, data: PreferenceData, starts: jax.Array) -> jax.Array:
        """Predicted R(tau) = sum_t r(s_t, a_t) of the segments starting at `starts` [...]."""
        k = self.config.segment_length
        obs = gather_segments(data.obs, starts, k)  # [..., K, obs_dim]
        feats = gather_segments(data.action_features, starts, k)
        return self.net.apply(params, obs, feats).sum(axis=-1)

    def update(self, state: RewardState,
               data: PreferenceData) -> tuple[RewardState, dict[str, jax.Array]]:
        rng, k = jax.random.split(state.rng)
        idx = jax.random.randint(k, (self.config.batch_pairs,), 0, data.starts.shape[0])
        starts, label = data.starts[idx], data.label[idx]  # [B, 2], [B]

        def loss_fn(params):
            r = self.segment_returns(params, data, starts)  # [B, 2]
            return bradley_terry_loss(r[:, 0], r[:, 1], label)

        (loss, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
        state, norms = apply_gradients(state.replace(rng=rng), grads, self.optimizer, loss=loss,
                                       keep="params")
        finite = norms.pop("finite")
        return state, {"bt_loss": loss, **metrics, **norms,
                       "nonfinite": (~finite).astype(jnp.int32)}

    def relabel(self, params, data: PreferenceData) -> jax.Array:
        """r(s, a) of every dataset row: [N]."""
        return self.net.apply(params, data.obs, data.action_features)


def make_train_reward(config: RewardModelConfig, env: ContextualEnv) -> TrainAndAgent:
    """`(train, model)`: `train(rng, data) -> (RewardState, metrics)` runs `config.steps`
    Bradley-Terry updates in a scan on `data = model.prepare(dataset, prefs)`."""
    model = RewardModel(config, env)

    def train(rng: jax.Array, data: PreferenceData):
        state = model.init(rng, data)
        return jax.lax.scan(lambda s, _: model.update(s, data), state, None, config.steps)

    return TrainAndAgent(train, model)


class PrefIQL(NamedTuple):
    """The agent of `make_train`: the reward model and the IQL agent trained on its rewards."""

    reward_model: RewardModel
    iql: iql.IQL

    def prepare(self, data, prefs) -> tuple[PreferenceData, Transitions]:
        """A dataset and its preferences as the `(PreferenceData, Transitions)` pair that
        `train(rng, data)` takes."""
        return self.reward_model.prepare(data, prefs), self.iql.prepare(data)


def make_train(reward_config: RewardModelConfig, iql_config: iql.IQLConfig,
               env: ContextualEnv) -> TrainAndAgent:
    """Preference reward + IQL: `(train, PrefIQL)` with `train(rng, data) ->
    ((RewardState, OfflineState), metrics)` on `data = agent.prepare(dataset, prefs)`.

    metrics: the reward model's ("bt_loss", "bt_acc", "reward_nonfinite", [reward steps]), IQL's
    ([IQL steps]),
    "eval_return", and "reward_corr", the Pearson correlation of the learned and true rewards
    over the dataset (a diagnostic; training never sees the true rewards)."""
    train_reward, model = make_train_reward(reward_config, env)
    train_iql, agent = iql.make_train(iql_config, env)

    def train(rng: jax.Array, data: tuple[PreferenceData, Transitions]):
        pref_data, transitions = data
        k_reward, k_iql = jax.random.split(rng)
        r_state, r_metrics = train_reward(k_reward, pref_data)
        learned = model.relabel(r_state.params, pref_data)  # [N]
        agent_state, metrics = train_iql(k_iql, transitions, learned)
        corr = jnp.corrcoef(learned, transitions.rewards)[0, 1]
        # the reward model's metrics that IQL's share a name with ("nonfinite") get "reward_"
        r_metrics = {f"reward_{k}" if k in metrics else k: v for k, v in r_metrics.items()}
        return (r_state, agent_state), {**r_metrics, **metrics, "reward_corr": corr}

    return TrainAndAgent(train, PrefIQL(model, agent))


__all__ = ["PrefIQL", "RewardModel", "RewardModelConfig", "RewardState", "make_train",
           "make_train_reward"]
