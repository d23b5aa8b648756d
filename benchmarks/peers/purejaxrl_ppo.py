"""The peer of `bench_ppo.py`: PPO in the structure of PureJaxRL's `ppo.py` (Lu et al. 2022,
luchris429/purejaxrl), written here against gymnax, flax and optax alone. Nothing of
jaxrl_suite is imported (no network, loss, GAE or wrapper of ours), and none of PureJaxRL's code
is copied: what it shares with PureJaxRL is the layout a PureJaxRL user writes.

    python benchmarks/bench_ppo.py --peer purejaxrl   # ours and this alternately, with ratios

The layout:
- the environment goes through two wrappers, as in PureJaxRL: a flattening wrapper and a log
  wrapper whose state carries the running and the last finished episode's return (the episode
  statistics live in the environment state, not in the training carry);
- a Flax actor-critic with separate actor and critic MLPs, orthogonal initialisation (sqrt 2,
  0.01 for the policy head, 1.0 for the value head);
- `make_train(config) -> train(rng)`: one `lax.scan` over updates, each a `lax.scan` over
  environment steps, a reverse `lax.scan` for GAE, then `update_epochs` x `num_minibatches`
  Adam steps on shuffled minibatches of the clipped PPO loss with a clipped value loss and an
  entropy bonus; the learning rate anneals linearly.

`make_train(cfg)` takes our `PPOConfig` only as a bag of the same hyperparameters (so the two
runs are configured identically); `train(rng)` returns (params, per update the return of the last
finished episode, averaged over steps and environments).
"""

from __future__ import annotations

from typing import NamedTuple

import flax.linen as nn
import gymnax
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax.linen.initializers import constant, orthogonal


class _Flatten:
    """Observations flattened to a vector; `step` returns gymnax 0.x's five values."""

    def __init__(self, env):
        self.env = env

    def __getattr__(self, name):
        return getattr(self.env, name)

    def observation_space(self, params):
        return gymnax.environments.spaces.Box(
            -jnp.inf, jnp.inf, (int(np.prod(self.env.observation_space(params).shape)),))

    def reset(self, key, params):
        obs, state = self.env.reset(key, params)
        return obs.reshape(-1), state

    def step(self, key, state, action, params):
        # gymnax 1.0 returns terminated and truncated apart; done is either (PureJaxRL's done)
        obs, state, reward, terminated, truncated, info = self.env.step(key, state, action,
                                                                        params)
        return obs.reshape(-1), state, reward, terminated | truncated, info


class _LogState(NamedTuple):
    env_state: object
    episode_return: jax.Array
    returned_episode_return: jax.Array


class _Log:
    """The running episode return in the environment state, and the last finished episode's
    return in `info` with a `returned_episode` flag."""

    def __init__(self, env):
        self.env = env

    def __getattr__(self, name):
        return getattr(self.env, name)

    def reset(self, key, params):
        obs, state = self.env.reset(key, params)
        return obs, _LogState(state, jnp.float32(0.0), jnp.float32(0.0))

    def step(self, key, state, action, params):
        obs, env_state, reward, done, info = self.env.step(key, state.env_state, action, params)
        ret = state.episode_return + reward
        state = _LogState(env_state, ret * (1 - done),
                          jnp.where(done, ret, state.returned_episode_return))
        info = dict(info, returned_episode_return=state.returned_episode_return,
                    returned_episode=done)
        return obs, state, reward, done, info


class ActorCritic(nn.Module):
    action_dim: int
    hidden: tuple[int, ...] = (64, 64)
    activation: str = "tanh"

    @nn.compact
    def __call__(self, x):
        act = {"tanh": nn.tanh, "relu": nn.relu, "gelu": nn.gelu}[self.activation]
        a = x
        for width in self.hidden:
            a = act(nn.Dense(width, kernel_init=orthogonal(np.sqrt(2)),
                             bias_init=constant(0.0))(a))
        logits = nn.Dense(self.action_dim, kernel_init=orthogonal(0.01),
                          bias_init=constant(0.0))(a)
        c = x
        for width in self.hidden:
            c = act(nn.Dense(width, kernel_init=orthogonal(np.sqrt(2)),
                             bias_init=constant(0.0))(c))
        value = nn.Dense(1, kernel_init=orthogonal(1.0), bias_init=constant(0.0))(c)
        return logits, value[..., 0]


class Transition(NamedTuple):
    done: jax.Array
    action: jax.Array
    value: jax.Array
    reward: jax.Array
    log_prob: jax.Array
    obs: jax.Array
    info: dict


def make_train(cfg):
    env, env_params = gymnax.make(cfg.env)
    env = _Log(_Flatten(env))
    n_actions = env.action_space(env_params).n
    batch = cfg.num_envs * cfg.num_steps
    minibatch = batch // cfg.num_minibatches

    def linear_schedule(count):
        frac = 1.0 - (count // (cfg.num_minibatches * cfg.update_epochs)) / cfg.num_updates
        return cfg.lr * frac

    network = ActorCritic(n_actions, tuple(cfg.hidden), cfg.activation)

    def init(rng):
        rng, k_init = jax.random.split(rng)
        return rng, network.init(k_init, jnp.zeros(env.observation_space(env_params).shape))

    def train(rng):
        return run(*init(rng))

    def run(rng, params):
        tx = optax.chain(optax.clip_by_global_norm(cfg.max_grad_norm),
                         optax.adam(linear_schedule if cfg.anneal_lr else cfg.lr, eps=1e-5))
        opt_state = tx.init(params)
        rng, k_reset = jax.random.split(rng)
        obs, env_state = jax.vmap(env.reset, in_axes=(0, None))(
            jax.random.split(k_reset, cfg.num_envs), env_params)

        def update_step(runner, _):
            def env_step(runner, _):
                params, opt_state, env_state, last_obs, rng = runner
                rng, k_act, k_step = jax.random.split(rng, 3)
                logits, value = network.apply(params, last_obs)
                action = jax.random.categorical(k_act, logits)
                log_prob = jnp.take_along_axis(jax.nn.log_softmax(logits), action[:, None],
                                               -1)[:, 0]
                obs, env_state, reward, done, info = jax.vmap(
                    env.step, in_axes=(0, 0, 0, None))(
                    jax.random.split(k_step, cfg.num_envs), env_state, action, env_params)
                t = Transition(done, action, value, reward, log_prob, last_obs, info)
                return (params, opt_state, env_state, obs, rng), t

            runner, traj = jax.lax.scan(env_step, runner, None, cfg.num_steps)
            params, opt_state, env_state, last_obs, rng = runner
            _, last_val = network.apply(params, last_obs)

            def gae_step(carry, t):
                gae, next_value = carry
                delta = t.reward + cfg.gamma * next_value * (1 - t.done) - t.value
                gae = delta + cfg.gamma * cfg.gae_lambda * (1 - t.done) * gae
                return (gae, t.value), gae

            _, advantages = jax.lax.scan(gae_step, (jnp.zeros_like(last_val), last_val), traj,
                                         reverse=True, unroll=16)
            targets = advantages + traj.value

            def epoch(carry, _):
                params, opt_state, rng = carry

                def loss_fn(params, t, gae, target):
                    logits, value = network.apply(params, t.obs)
                    logp_all = jax.nn.log_softmax(logits)
                    log_prob = jnp.take_along_axis(logp_all, t.action[:, None], -1)[:, 0]
                    v_clipped = t.value + (value - t.value).clip(-cfg.clip_eps, cfg.clip_eps)
                    v_loss = 0.5 * jnp.maximum(jnp.square(value - target),
                                               jnp.square(v_clipped - target)).mean()
                    ratio = jnp.exp(log_prob - t.log_prob)
                    gae = (gae - gae.mean()) / (gae.std() + 1e-8)
                    pg = -jnp.minimum(ratio * gae, jnp.clip(ratio, 1 - cfg.clip_eps,
                                                            1 + cfg.clip_eps) * gae).mean()
                    entropy = -(jnp.exp(logp_all) * logp_all).sum(-1).mean()
                    return pg + cfg.vf_coef * v_loss - cfg.ent_coef * entropy

                def minibatch_step(carry, mb):
                    params, opt_state = carry
                    grads = jax.grad(loss_fn)(params, *mb)
                    updates, opt_state = tx.update(grads, opt_state, params)
                    return (optax.apply_updates(params, updates), opt_state), None

                rng, k_perm = jax.random.split(rng)
                perm = jax.random.permutation(k_perm, batch)
                data = jax.tree.map(lambda x: x.reshape((batch, *x.shape[2:])),
                                    (traj, advantages, targets))
                data = jax.tree.map(lambda x: jnp.take(x, perm, axis=0).reshape(
                    (cfg.num_minibatches, minibatch, *x.shape[1:])), data)
                (params, opt_state), _ = jax.lax.scan(minibatch_step, (params, opt_state), data)
                return (params, opt_state, rng), None

            (params, opt_state, rng), _ = jax.lax.scan(epoch, (params, opt_state, rng), None,
                                                       cfg.update_epochs)
            # the last finished episode's return, averaged over the steps and environments
            metric = traj.info["returned_episode_return"].mean()
            return (params, opt_state, env_state, last_obs, rng), metric

        runner = (params, opt_state, env_state, obs, rng)
        (params, *_), metrics = jax.lax.scan(update_step, runner, None, cfg.num_updates)
        return params, metrics

    # A seed sweep vmaps `run` over params initialised per seed: flax's orthogonal initializer
    # calls LAPACK's QR, and two batched QRs running at once on XLA:CPU's thread pool can
    # deadlock a 2-core machine (jaxlib 0.10; seen in `bench_ppo.py --peer purejaxrl`). The
    # initialisation is outside the timed program either way.
    train.init, train.run = init, run
    return train
