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

Rewards: `train(rng, data, rewards=None)` trains on the dataset's rewards, or on `rewards` [N] given
(e.g. relabelled by a learned preference reward, `algorithms/pref_reward.py`), which may be
traced. Either is rescaled by `reward_normalization` first ("minmax": affinely onto [0, 1] over
the dataset, the same map for true and learned rewards; "none").

BC (`losses/bc.py`) trains the same policy network by maximum likelihood on every action.

Both are `make_train(config, env) -> (train, agent)` with `train(rng, data)`: one jitted `lax.scan`
over the steps and a final evaluation ("eval_return"). The dataset is an argument, the
`Transitions` of `agent.prepare(data_dict)`, so `jax.vmap(train, in_axes=(0, None))(keys, data)`
is a seed sweep and one compilation serves every dataset of the same shape. Every update goes
through `core.train.apply_gradients`, which refuses an update with a non-finite loss, gradient
or update (that network's parameters stay as they were; its optimizer state is not rolled back,
so after a non-finite gradient the run halts at its last finite parameters); the per-step metric
"nonfinite" counts the refused updates (IQL: up to 3 per step).
"""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any, Literal

import flax.struct
import jax
import jax.numpy as jnp
import optax

from jaxrl_suite.algorithms.offline_data import Transitions, transitions
from jaxrl_suite.core.config import (
    Count,
    NonNegative,
    Positive,
    Probability,
    Range,
    UnitInterval,
    check_fields,
)
from jaxrl_suite.core.train import ParamState, TrainAndAgent, apply_gradients
from jaxrl_suite.envs.contextual import ContextualEnv
from jaxrl_suite.envs.offline import action_scale_shift, evaluate_policy
from jaxrl_suite.losses.bc import bc_loss
from jaxrl_suite.losses.iql import awr_policy_loss, iql_q_loss, iql_value_loss
from jaxrl_suite.models.offline import OfflinePolicy, TwinQ, ValueNet

REWARD_NORMALIZATIONS = ("minmax", "none")


@dataclasses.dataclass(frozen=True)
class IQLConfig:
    hidden: tuple[Count, ...] = (64, 64)  # widths of the policy, Q and V MLPs
    batch_size: Count = 256  # transitions per step
    steps: Count = 10_000  # gradient steps
    lr: NonNegative = 3e-4  # Adam for Q, V and the policy (the policy's decays to 0 by a cosine)
    gamma: Probability = 0.99  # discount factor
    # tau of the value's expectile regression
    expectile: Annotated[float, Range(gt=0, lt=1)] = 0.7
    beta: NonNegative = 3.0  # inverse temperature of the advantage weights (0 = plain BC)
    max_weight: Positive = 100.0  # the advantage weights are clipped here
    polyak: UnitInterval = 0.005  # target-critic update rate (1 = copy Q each step)
    reward_normalization: Literal["minmax", "none"] = "minmax"
    eval_episodes: Count = 10  # episodes of the policy's mean action in the final evaluation

    def __post_init__(self):
        check_fields(self, "iql.")  # the Ranges declared above
        if self.reward_normalization not in REWARD_NORMALIZATIONS:
            raise ValueError(f"reward_normalization '{self.reward_normalization}' is not one of "
                             f"{list(REWARD_NORMALIZATIONS)}")


@dataclasses.dataclass(frozen=True)
class BCConfig:
    hidden: tuple[Count, ...] = (64, 64)  # policy MLP widths
    batch_size: Count = 256  # transitions per step
    steps: Count = 5_000  # gradient steps
    lr: NonNegative = 3e-4  # Adam
    eval_episodes: Count = 10  # episodes of the policy's mean action in the final evaluation

    def __post_init__(self):
        check_fields(self, "bc.")  # the Ranges declared above


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
    """The policy network, its evaluation and the minibatch draw, shared by BC and IQL."""

    def __init__(self, config, env: ContextualEnv):
        self.config, self.env = config, env
        scale, shift = action_scale_shift(env)
        self.policy = OfflinePolicy(action_dim=env.num_actions, discrete=env.discrete,
                                    action_scale=scale, action_shift=shift, hidden=config.hidden)

    def prepare(self, data) -> Transitions:
        """A D4RL-layout dict as the `Transitions` that `train(rng, data)` takes."""
        return transitions(self.env, data)

    def act(self, pi_params, obs: jax.Array) -> jax.Array:
        """The policy's mean (continuous) or most likely (discrete) action for obs [B, obs_dim]."""
        return self.policy.apply(pi_params, obs).mode()

    def evaluate(self, params, key: jax.Array) -> jax.Array:
        """Mean return of `eval_episodes` episodes of the policy's mode."""
        returns = evaluate_policy(self.env, lambda obs, k: self.act(params["pi"], obs), key,
                                  num_episodes=self.config.eval_episodes)
        return returns.mean()

    def _rows(self, key, data: Transitions):
        return jax.random.randint(key, (self.config.batch_size,), 0, data.rewards.shape[0])


class BC(_OfflineAgent):
    """Behaviour cloning of every action of the dataset."""

    def __init__(self, config: BCConfig, env: ContextualEnv):
        super().__init__(config, env)
        self.optimizer = optax.adam(config.lr)

    def init(self, rng: jax.Array, data: Transitions) -> OfflineState:
        k_pi, rng = jax.random.split(rng)
        params = {"pi": self.policy.init(k_pi, data.obs[:1])}
        return OfflineState(params, (), self.optimizer.init(params), rng,
                            jnp.zeros((), jnp.int32))

    def update(self, state: OfflineState, data: Transitions, rewards=None):
        del rewards  # BC ignores rewards
        rng, k = jax.random.split(state.rng)
        idx = self._rows(k, data)

        def loss_fn(params):
            logp = self.policy.apply(params["pi"], data.obs[idx]).log_prob(data.actions[idx])
            return bc_loss(logp)

        (loss, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
        state, norms = apply_gradients(state.replace(rng=rng), grads, self.optimizer, loss=loss,
                                       keep="params")
        finite = norms.pop("finite")
        return state, {"bc_loss": loss, **metrics, **norms,
                       "nonfinite": (~finite).astype(jnp.int32)}


class IQL(_OfflineAgent):
    """Implicit Q-learning (needs "next_observations", as `envs.offline.collect` writes)."""

    def __init__(self, config: IQLConfig, env: ContextualEnv):
        super().__init__(config, env)
        self.q_net = TwinQ(num_actions=env.num_actions, discrete=env.discrete,
                           hidden=config.hidden)
        self.v_net = ValueNet(hidden=config.hidden)
        actor_lr = optax.cosine_decay_schedule(config.lr, config.steps)
        self.optimizers = {"pi": optax.adam(actor_lr), "q": optax.adam(config.lr),
                           "v": optax.adam(config.lr)}

    def prepare(self, data) -> Transitions:
        out = super().prepare(data)
        if out.next_obs is None:
            raise ValueError("offline dataset is missing field 'next_observations' (IQL needs "
                             "s'); envs.offline.collect and load_tfds_d4rl write it")
        return out

    def init(self, rng: jax.Array, data: Transitions) -> OfflineState:
        k_pi, k_q, k_v, rng = jax.random.split(rng, 4)
        obs, act = data.obs[:1], data.actions[:1]
        params = {"pi": self.policy.init(k_pi, obs), "q": self.q_net.init(k_q, obs, act),
                  "v": self.v_net.init(k_v, obs)}
        opt_state = {k: self.optimizers[k].init(params[k]) for k in params}
        return OfflineState(params, params["q"], opt_state, rng, jnp.zeros((), jnp.int32))

    def _step(self, name, loss_fn, params, opt_state, step):
        """`apply_gradients` to `params[name]` alone: the new dicts, the loss, its aux outputs
        (with the gradient norm) and whether the update was applied."""
        (loss, aux), grads = jax.value_and_grad(loss_fn, has_aux=True)(params[name])
        part, norms = apply_gradients(ParamState(step, params[name], opt_state[name]), grads,
                                      self.optimizers[name], loss=loss, keep="params")
        return ({**params, name: part.params}, {**opt_state, name: part.opt_state}, loss,
                {**aux, f"{name}_grad_norm": norms["grad_norm"]}, norms["finite"])

    def update(self, state: OfflineState, data: Transitions, rewards: jax.Array):
        """One IQL step (V, Q, pi updates and the target) on rewards [N], already normalised."""
        c = self.config
        rng, k = jax.random.split(state.rng)
        idx = self._rows(k, data)
        obs, act, next_obs = data.obs[idx], data.actions[idx], data.next_obs[idx]
        q_hat = jnp.minimum(*self.q_net.apply(state.target_q, obs, act))  # [B]
        params, opt_state = state.params, state.opt_state

        def v_loss(p):
            v = self.v_net.apply(p, obs)
            return iql_value_loss(q_hat, v, c.expectile), {"v_mean": v.mean()}

        params, opt_state, lv, v_aux, v_ok = self._step("v", v_loss, params, opt_state,
                                                        state.step)
        next_v = self.v_net.apply(params["v"], next_obs)

        def q_loss(p):
            q1, q2 = self.q_net.apply(p, obs, act)
            loss = sum(iql_q_loss(q, rewards[idx], data.done[idx], next_v, c.gamma)
                       for q in (q1, q2))
            return loss, {"q_mean": q1.mean()}

        params, opt_state, lq, q_aux, q_ok = self._step("q", q_loss, params, opt_state,
                                                        state.step)
        v = self.v_net.apply(params["v"], obs)

        def pi_loss(p):
            logp = self.policy.apply(p, obs).log_prob(act)
            return awr_policy_loss(logp, q_hat, v, c.beta, c.max_weight)

        params, opt_state, lp, pi_aux, pi_ok = self._step("pi", pi_loss, params, opt_state,
                                                          state.step)
        target_q = optax.incremental_update(params["q"], state.target_q, c.polyak)
        refused = sum((~ok).astype(jnp.int32) for ok in (v_ok, q_ok, pi_ok))
        metrics = {"v_loss": lv, "q_loss": lq, "pi_loss": lp, **v_aux, **q_aux, **pi_aux,
                   "nonfinite": refused}
        return OfflineState(params, target_q, opt_state, rng, state.step + 1), metrics


def _make_train(agent, steps: int, rewards_of) -> TrainAndAgent:
    def train(rng: jax.Array, data: Transitions, rewards: jax.Array | None = None):
        k_init, k_eval = jax.random.split(rng)
        r = rewards_of(data, rewards)
        state = agent.init(k_init, data)
        state, metrics = jax.lax.scan(lambda s, _: agent.update(s, data, r), state, None, steps)
        metrics["eval_return"] = agent.evaluate(state.params, k_eval)
        return state, metrics

    return TrainAndAgent(train, agent)


def make_train(config: IQLConfig, env: ContextualEnv) -> TrainAndAgent:
    """IQL: `(train, iql)` with `train(rng, data, rewards=None) -> (OfflineState, metrics)`;
    `data` is `iql.prepare(dataset)`, metrics are stacked over steps, plus "eval_return".
    `rewards` [N] replaces the dataset's rewards (before normalisation)."""
    agent = IQL(config, env)

    def rewards_of(data: Transitions, rewards):
        r = data.rewards if rewards is None else jnp.asarray(rewards, jnp.float32)
        if r.shape != data.rewards.shape:
            raise ValueError(f"rewards must have shape {data.rewards.shape} (one per dataset "
                             f"row), got {r.shape}")
        return normalize_rewards(r, config.reward_normalization)

    return _make_train(agent, config.steps, rewards_of)


def make_train_bc(config: BCConfig, env: ContextualEnv) -> TrainAndAgent:
    """BC: `(train, bc)` with `train(rng, data) -> (OfflineState, metrics)`; `data` is
    `bc.prepare(dataset)`, metrics are stacked over steps, plus "eval_return"."""
    return _make_train(BC(config, env), config.steps, lambda data, rewards: None)


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
