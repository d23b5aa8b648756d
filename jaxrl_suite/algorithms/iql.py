"""Offline RL baselines on D4RL-layout data: IQL (Kostrikov et al. 2021, arXiv 2110.06169) and BC.

IQL, one `IQL.update` (losses in `losses/iql.py`), on a minibatch (s, a, r, s', done) drawn
uniformly from the dataset:

  1. V   <- expectile regression onto min(Q1_hat, Q2_hat)(s, a)        (target critics)
  2. Q_i <- squared TD error against r + gamma (1 - done) V(s')       (the updated V)
  3. pi  <- advantage-weighted regression, weight min(exp(beta (Q_hat - V)), 100)
  4. Q_hat <- polyak average of Q with rate `polyak`

As in the authors' code, the policy's learning rate follows a cosine decay over the run, and the
policy is a Gaussian with a tanh mean and a state-independent log std (its mean is evaluated).
`done` is the dataset's `terminals`; a time-limit cut (`timeouts`) bootstraps through
`next_observations`.

Rewards: `train(rng, rewards=None)` trains on the dataset's rewards, or on `rewards` [N] given
(e.g. relabelled by a learned preference reward, `algorithms/pref_reward.py`), which may be
traced. Either is rescaled by `reward_normalization` first ("minmax": affinely onto [0, 1] over
the dataset, the same map for true and learned rewards; "none").

BC (`losses/bc.py`) trains the same policy network by maximum likelihood on every action.

Both are `make_train(config, env, data) -> train(rng)`: one jitted `lax.scan` over the steps and
a final evaluation ("eval_return"), so `jax.vmap(train)(keys)` is a seed sweep.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

import flax.struct
import jax
import jax.numpy as jnp
import optax

from jaxrl_suite.envs.contextual import ContextualEnv
from jaxrl_suite.envs.offline import (
    action_scale_shift,
    check_dataset,
    dataset_actions,
    evaluate_policy,
)
from jaxrl_suite.losses.bc import bc_loss
from jaxrl_suite.losses.iql import awr_policy_loss, iql_q_loss, iql_value_loss
from jaxrl_suite.models.offline import OfflinePolicy, TwinQ, ValueNet

REWARD_NORMALIZATIONS = ("minmax", "none")


@dataclasses.dataclass(frozen=True)
class IQLConfig:
    hidden: tuple[int, ...] = (64, 64)  # widths of the policy, Q and V MLPs
    batch_size: int = 256  # transitions per step
    steps: int = 10_000  # gradient steps
    lr: float = 3e-4  # Adam for Q, V and the policy (the policy's decays to 0 by a cosine)
    gamma: float = 0.99
    expectile: float = 0.7  # tau of the value's expectile regression
    beta: float = 3.0  # inverse temperature of the advantage weights
    max_weight: float = 100.0  # the advantage weights are clipped here
    polyak: float = 0.005  # target-critic update rate
    reward_normalization: Literal["minmax", "none"] = "minmax"
    eval_episodes: int = 10  # episodes of the policy's mean action in the final evaluation

    def __post_init__(self):
        for name in ("batch_size", "steps", "eval_episodes"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not 0.0 < self.expectile < 1.0:
            raise ValueError(f"expectile must be in (0, 1), got {self.expectile}")
        if self.reward_normalization not in REWARD_NORMALIZATIONS:
            raise ValueError(f"reward_normalization '{self.reward_normalization}' is not one of "
                             f"{list(REWARD_NORMALIZATIONS)}")


@dataclasses.dataclass(frozen=True)
class BCConfig:
    hidden: tuple[int, ...] = (64, 64)  # policy MLP widths
    batch_size: int = 256  # transitions per step
    steps: int = 5_000  # gradient steps
    lr: float = 3e-4  # Adam
    eval_episodes: int = 10  # episodes of the policy's mean action in the final evaluation

    def __post_init__(self):
        for name in ("batch_size", "steps", "eval_episodes"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")


def normalize_rewards(rewards: jax.Array, method: str = "minmax") -> jax.Array:
    """"minmax": (r - min r) / (max r - min r) over the dataset (constant rewards map to 0);
    "none": r unchanged. [N] -> [N]."""
    if method == "none":
        return rewards
    if method != "minmax":
        raise ValueError(f"reward_normalization '{method}' is not one of "
                         f"{list(REWARD_NORMALIZATIONS)}")
    lo, hi = jnp.min(rewards), jnp.max(rewards)
    return (rewards - lo) / jnp.where(hi > lo, hi - lo, 1.0)


class OfflineState(flax.struct.PyTreeNode):
    params: Any  # {"pi": ...} (BC) or {"pi", "q", "v"} (IQL)
    target_q: Any  # IQL's target critics (() for BC)
    opt_state: Any  # one optimizer state per entry of params
    rng: jax.Array
    step: jax.Array


class _OfflineAgent:
    """The dataset arrays, the policy network and its evaluation, shared by BC and IQL."""

    def __init__(self, config, env: ContextualEnv, data):
        self.config, self.env = config, env
        self.num_rows = check_dataset(data)
        self.obs = jnp.asarray(data["observations"], jnp.float32)
        self.actions, _ = dataset_actions(env, data)
        scale, shift = action_scale_shift(env)
        self.policy = OfflinePolicy(action_dim=env.num_actions, discrete=env.discrete,
                                    action_scale=scale, action_shift=shift, hidden=config.hidden)

    def act(self, pi_params, obs: jax.Array) -> jax.Array:
        """The policy's mean (continuous) or most likely (discrete) action for obs [B, obs_dim]."""
        return self.policy.apply(pi_params, obs).mode()

    def evaluate(self, params, key: jax.Array) -> jax.Array:
        """Mean return of `eval_episodes` episodes of the policy's mode."""
        returns = evaluate_policy(self.env, lambda obs, k: self.act(params["pi"], obs), key,
                                  num_episodes=self.config.eval_episodes)
        return returns.mean()

    def _rows(self, key):
        return jax.random.randint(key, (self.config.batch_size,), 0, self.num_rows)


class BC(_OfflineAgent):
    """Behaviour cloning of every action in `data`."""

    def __init__(self, config: BCConfig, env: ContextualEnv, data):
        super().__init__(config, env, data)
        self.optimizer = optax.adam(config.lr)

    def init(self, rng: jax.Array) -> OfflineState:
        k_pi, rng = jax.random.split(rng)
        params = {"pi": self.policy.init(k_pi, self.obs[:1])}
        return OfflineState(params, (), self.optimizer.init(params), rng,
                            jnp.zeros((), jnp.int32))

    def update(self, state: OfflineState, rewards=None):
        del rewards  # BC ignores rewards
        rng, k = jax.random.split(state.rng)
        idx = self._rows(k)

        def loss_fn(params):
            logp = self.policy.apply(params["pi"], self.obs[idx]).log_prob(self.actions[idx])
            return bc_loss(logp)

        (loss, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
        updates, opt_state = self.optimizer.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        return (OfflineState(params, (), opt_state, rng, state.step + 1),
                {"bc_loss": loss, **metrics})


class IQL(_OfflineAgent):
    """Implicit Q-learning on `data` (needs "next_observations", as `envs.offline.collect`
    writes)."""

    def __init__(self, config: IQLConfig, env: ContextualEnv, data):
        super().__init__(config, env, data)
        if "next_observations" not in data:
            raise ValueError("offline dataset is missing field 'next_observations' (IQL needs "
                             "s'); envs.offline.collect and load_tfds_d4rl write it")
        self.next_obs = jnp.asarray(data["next_observations"], jnp.float32)
        self.done = jnp.asarray(data["terminals"], jnp.float32)
        self.rewards = jnp.asarray(data["rewards"], jnp.float32)
        self.q_net = TwinQ(num_actions=env.num_actions, discrete=env.discrete,
                           hidden=config.hidden)
        self.v_net = ValueNet(hidden=config.hidden)
        actor_lr = optax.cosine_decay_schedule(config.lr, config.steps)
        self.optimizers = {"pi": optax.adam(actor_lr), "q": optax.adam(config.lr),
                           "v": optax.adam(config.lr)}

    def init(self, rng: jax.Array) -> OfflineState:
        k_pi, k_q, k_v, rng = jax.random.split(rng, 4)
        obs, act = self.obs[:1], self.actions[:1]
        params = {"pi": self.policy.init(k_pi, obs), "q": self.q_net.init(k_q, obs, act),
                  "v": self.v_net.init(k_v, obs)}
        opt_state = {k: self.optimizers[k].init(params[k]) for k in params}
        return OfflineState(params, params["q"], opt_state, rng, jnp.zeros((), jnp.int32))

    def _step(self, name, loss_fn, params, opt_state):
        (loss, aux), grads = jax.value_and_grad(loss_fn, has_aux=True)(params[name])
        updates, new_opt = self.optimizers[name].update(grads, opt_state[name], params[name])
        return ({**params, name: optax.apply_updates(params[name], updates)},
                {**opt_state, name: new_opt}, loss, aux)

    def update(self, state: OfflineState, rewards: jax.Array):
        """One IQL step on rewards [N] (already normalised)."""
        c = self.config
        rng, k = jax.random.split(state.rng)
        idx = self._rows(k)
        obs, act, next_obs = self.obs[idx], self.actions[idx], self.next_obs[idx]
        q_hat = jnp.minimum(*self.q_net.apply(state.target_q, obs, act))  # [B]
        params, opt_state = state.params, state.opt_state

        def v_loss(p):
            v = self.v_net.apply(p, obs)
            return iql_value_loss(q_hat, v, c.expectile), {"v_mean": v.mean()}

        params, opt_state, lv, v_aux = self._step("v", v_loss, params, opt_state)
        next_v = self.v_net.apply(params["v"], next_obs)

        def q_loss(p):
            q1, q2 = self.q_net.apply(p, obs, act)
            loss = sum(iql_q_loss(q, rewards[idx], self.done[idx], next_v, c.gamma)
                       for q in (q1, q2))
            return loss, {"q_mean": q1.mean()}

        params, opt_state, lq, q_aux = self._step("q", q_loss, params, opt_state)
        v = self.v_net.apply(params["v"], obs)

        def pi_loss(p):
            logp = self.policy.apply(p, obs).log_prob(act)
            return awr_policy_loss(logp, q_hat, v, c.beta, c.max_weight)

        params, opt_state, lp, pi_aux = self._step("pi", pi_loss, params, opt_state)
        target_q = optax.incremental_update(params["q"], state.target_q, c.polyak)
        metrics = {"v_loss": lv, "q_loss": lq, "pi_loss": lp, **v_aux, **q_aux, **pi_aux}
        return OfflineState(params, target_q, opt_state, rng, state.step + 1), metrics


def _make_train(agent, steps: int, rewards_of):
    def train(rng: jax.Array, rewards: jax.Array | None = None):
        k_init, k_eval = jax.random.split(rng)
        r = rewards_of(rewards)
        state = agent.init(k_init)
        state, metrics = jax.lax.scan(lambda s, _: agent.update(s, r), state, None, steps)
        metrics["eval_return"] = agent.evaluate(state.params, k_eval)
        return state, metrics

    train.agent = agent
    return train


def make_train(config: IQLConfig, env: ContextualEnv, data):
    """IQL: `train(rng, rewards=None) -> (OfflineState, metrics)`; metrics stacked over steps,
    plus "eval_return". `rewards` [N] replaces the dataset's rewards (before normalisation)."""
    iql = IQL(config, env, data)

    def rewards_of(rewards):
        r = iql.rewards if rewards is None else jnp.asarray(rewards, jnp.float32)
        if r.shape != iql.rewards.shape:
            raise ValueError(f"rewards must have shape {iql.rewards.shape} (one per dataset row), "
                             f"got {r.shape}")
        return normalize_rewards(r, config.reward_normalization)

    return _make_train(iql, config.steps, rewards_of)


def make_train_bc(config: BCConfig, env: ContextualEnv, data):
    """BC: `train(rng) -> (OfflineState, metrics)`, metrics stacked over steps plus
    "eval_return"."""
    return _make_train(BC(config, env, data), config.steps, lambda rewards: None)


__all__ = [
    "BC",
    "BCConfig",
    "IQL",
    "IQLConfig",
    "OfflineState",
    "make_train",
    "make_train_bc",
    "normalize_rewards",
]
