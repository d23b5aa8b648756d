"""Two PPO baselines for `bench_ppo.py`, with the same network and hyperparameters as ours.

- `make_single_file_train(cfg)`: a single-file PPO written the way PureJaxRL's `ppo.py` is (one
  closure, gymnax's own `env.step`, everything inlined, episode statistics kept in the carry). It
  is our own code in that style, not a copy; it measures what our layering (contextual wrapper,
  importable loss/GAE/network, curriculum hooks) costs.
- `PythonLoopPPO(cfg)`: the same algorithm driven from Python: every environment step, the GAE
  pass and every minibatch update is a separately jitted call.

Both treat truncation as termination (as PureJaxRL does); on CartPole this changes nothing about
the cost.
"""

from __future__ import annotations

import gymnax
import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxrl_suite.algorithms.ppo import PPOConfig
from jaxrl_suite.losses.ppo import gae, ppo_loss
from jaxrl_suite.models.actor_critic import ActorCritic


def _optimizer(cfg: PPOConfig):
    def schedule(count):
        frac = 1.0 - (count // (cfg.num_minibatches * cfg.update_epochs)) / cfg.num_updates
        return cfg.lr * frac

    lr = schedule if cfg.anneal_lr else cfg.lr
    return optax.chain(optax.clip_by_global_norm(cfg.max_grad_norm), optax.adam(lr, eps=1e-5))


def make_single_file_train(cfg: PPOConfig):
    """PureJaxRL-style `train(rng) -> (params, mean episode return per iteration)`."""
    env, env_params = gymnax.make(cfg.env)
    n_actions = env.action_space(env_params).n
    net = ActorCritic(n_actions, hidden=cfg.hidden, activation=cfg.activation)
    tx = _optimizer(cfg)
    batch = cfg.num_envs * cfg.num_steps

    def train(rng):
        rng, k_net, k_reset = jax.random.split(rng, 3)
        obs_dim = env.observation_space(env_params).shape[0]
        params = net.init(k_net, jnp.zeros((obs_dim,)))
        opt_state = tx.init(params)
        obs, env_state = jax.vmap(env.reset, in_axes=(0, None))(
            jax.random.split(k_reset, cfg.num_envs), env_params
        )
        ep_ret = jnp.zeros((cfg.num_envs,))

        def update(carry, _):
            params, opt_state, env_state, obs, ep_ret, rng = carry

            def step(c, _):
                env_state, obs, ep_ret, rng = c
                rng, k_a, k_e = jax.random.split(rng, 3)
                logits, value = _logits_value(net, params, obs)
                action = jax.random.categorical(k_a, logits)
                logp = jnp.take_along_axis(jax.nn.log_softmax(logits), action[:, None], 1)[:, 0]
                obs2, env_state2, reward, term, trunc, _ = jax.vmap(
                    env.step, in_axes=(0, 0, 0, None)
                )(jax.random.split(k_e, cfg.num_envs), env_state, action, env_params)
                done = term | trunc
                ep_ret = ep_ret + reward
                out = (obs, action, logp, value, reward, done, jnp.where(done, ep_ret, 0.0))
                return (env_state2, obs2, jnp.where(done, 0.0, ep_ret), rng), out

            (env_state, obs, ep_ret, rng), traj = jax.lax.scan(
                step, (env_state, obs, ep_ret, rng), None, cfg.num_steps
            )
            t_obs, t_act, t_logp, t_val, t_rew, t_done, t_fin = traj
            _, last_val = _logits_value(net, params, obs)
            next_val = jnp.concatenate([t_val[1:], last_val[None]], 0)
            adv, tgt = gae(t_rew, t_val, next_val, t_done, t_done, cfg.gamma, cfg.gae_lambda)
            flat = jax.tree.map(
                lambda x: x.reshape((batch, *x.shape[2:])), (t_obs, t_act, t_logp, t_val, adv, tgt)
            )

            def loss_fn(p, mb):
                return _minibatch_loss(net, cfg, p, mb)

            def epoch(c, _):
                params, opt_state, rng = c
                rng, k = jax.random.split(rng)
                perm = jax.random.permutation(k, batch)
                mbs = jax.tree.map(
                    lambda x: x[perm].reshape((cfg.num_minibatches, -1, *x.shape[1:])), flat
                )

                def mb_step(c2, mb):
                    p, s = c2
                    g = jax.grad(loss_fn)(p, mb)
                    u, s = tx.update(g, s, p)
                    return (optax.apply_updates(p, u), s), None

                (params, opt_state), _ = jax.lax.scan(mb_step, (params, opt_state), mbs)
                return (params, opt_state, rng), None

            (params, opt_state, rng), _ = jax.lax.scan(
                epoch, (params, opt_state, rng), None, cfg.update_epochs
            )
            ret = t_fin.sum() / jnp.maximum(t_done.sum(), 1)
            return (params, opt_state, env_state, obs, ep_ret, rng), ret

        carry = (params, opt_state, env_state, obs, ep_ret, rng)
        (params, *_), returns = jax.lax.scan(update, carry, None, cfg.num_updates)
        return params, returns

    return train


def _logits_value(net, params, obs):
    dist, value = net.apply(params, obs)
    return dist.logits, value


def _minibatch_loss(net, cfg: PPOConfig, params, mb):
    obs, action, logp_old, v_old, adv, targets = mb
    logits, v = _logits_value(net, params, obs)
    logp_all = jax.nn.log_softmax(logits)
    logp = jnp.take_along_axis(logp_all, action[:, None], 1)[:, 0]
    ent = -(jnp.exp(logp_all) * logp_all).sum(-1)
    return ppo_loss(logp, logp_old, adv, v, v_old, targets, ent, clip_eps=cfg.clip_eps,
                    vf_coef=cfg.vf_coef, ent_coef=cfg.ent_coef)[0]


class PythonLoopPPO:
    """The same PPO, stepped from Python: one jitted call per env step and per minibatch."""

    def __init__(self, cfg: PPOConfig):
        self.cfg = cfg
        self.env, self.env_params = gymnax.make(cfg.env)
        n_actions = self.env.action_space(self.env_params).n
        self.net = ActorCritic(n_actions, hidden=cfg.hidden, activation=cfg.activation)
        self.tx = _optimizer(cfg)
        env, net, ep = self.env, self.net, self.env_params

        @jax.jit
        def act_and_step(params, env_state, obs, key):
            k_a, k_e = jax.random.split(key)
            logits, value = _logits_value(net, params, obs)
            action = jax.random.categorical(k_a, logits)
            logp = jnp.take_along_axis(jax.nn.log_softmax(logits), action[:, None], 1)[:, 0]
            obs2, env_state2, reward, term, trunc, _ = jax.vmap(env.step, in_axes=(0, 0, 0, None))(
                jax.random.split(k_e, obs.shape[0]), env_state, action, ep
            )
            return env_state2, obs2, (obs, action, logp, value, reward, term | trunc)

        @jax.jit
        def advantages(params, traj, last_obs):
            t_obs, t_act, t_logp, t_val, t_rew, t_done = traj
            _, last_val = _logits_value(net, params, last_obs)
            next_val = jnp.concatenate([t_val[1:], last_val[None]], 0)
            return gae(t_rew, t_val, next_val, t_done, t_done, cfg.gamma, cfg.gae_lambda)

        @jax.jit
        def minibatch_update(params, opt_state, mb):
            g = jax.grad(_minibatch_loss, argnums=2)(net, cfg, params, mb)
            u, opt_state = self.tx.update(g, opt_state, params)
            return optax.apply_updates(params, u), opt_state

        self._act_and_step = act_and_step
        self._advantages = advantages
        self._minibatch_update = minibatch_update

    def train(self, seed: int, num_updates: int | None = None):
        """Runs `num_updates` iterations (default: the config's); returns the final params."""
        cfg = self.cfg
        rng = jax.random.key(seed)
        rng, k_net, k_reset = jax.random.split(rng, 3)
        obs_dim = self.env.observation_space(self.env_params).shape[0]
        params = self.net.init(k_net, jnp.zeros((obs_dim,)))
        opt_state = self.tx.init(params)
        obs, env_state = jax.vmap(self.env.reset, in_axes=(0, None))(
            jax.random.split(k_reset, cfg.num_envs), self.env_params
        )
        batch = cfg.num_envs * cfg.num_steps
        np_rng = np.random.default_rng(seed)
        for _ in range(num_updates or cfg.num_updates):
            steps = []
            for _ in range(cfg.num_steps):
                rng, k = jax.random.split(rng)
                env_state, obs, out = self._act_and_step(params, env_state, obs, k)
                steps.append(out)
            traj = jax.tree.map(lambda *xs: jnp.stack(xs), *steps)
            adv, tgt = self._advantages(params, traj, obs)
            flat = jax.tree.map(
                lambda x: x.reshape((batch, *x.shape[2:])), (*traj[:4], adv, tgt)
            )
            for _ in range(cfg.update_epochs):
                perm = np_rng.permutation(batch)
                for idx in np.split(perm, cfg.num_minibatches):
                    mb = jax.tree.map(lambda x, i=idx: x[i], flat)
                    params, opt_state = self._minibatch_update(params, opt_state, mb)
        jax.block_until_ready(params)
        return params
