"""PPO for (contextual) gymnax environments, jitted end to end in the PureJaxRL style.

    train, ppo = make_train(PPOConfig(env="CartPole-v1"))           # ppo: the `PPO` agent
    runner, metrics = jax.jit(train)(jax.random.key(0))              # one seed
    runner, metrics = jax.jit(jax.vmap(train))(jax.random.split(key, 8))   # a seed sweep

One training iteration (`PPO.update`) is: draw the rollout batch's contexts from the curriculum ->
`lax.scan` over `num_steps` vmapped environment steps -> GAE (`losses.ppo.gae`) -> `lax.scan`
over `update_epochs` x `num_minibatches` clipped-surrogate steps (`losses.ppo.ppo_loss`, each
applied by `core.train.apply_gradients`, which refuses a non-finite update: see there) ->
curriculum update with the critic's V(s0 | c). `train(rng)` is `init` followed by a `lax.scan`
over all iterations, so the whole run is one XLA program and `jax.vmap(train)` runs seeds side
by side. `sweep` vmaps over seeds and a grid of float hyperparameters in one program, and can
split the seed axis over a device mesh.

Contexts: each environment's episode keeps the context it was reset with (it lives in the env
state, see `envs.contextual`); when an episode ends, the environment resets into the context the
current rollout batch drew for it. With no curriculum and `context_sampler="default"`, every
episode uses the environment's default physics.

Differences from PureJaxRL's `ppo.py`, all deliberate: the return bootstraps through time-limit
truncation from `info["final_observation"]` (PureJaxRL treats truncation as termination), the loss,
GAE and network are importable functions with tests, and the float hyperparameters are traced
values so that a grid over them needs one compilation.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxrl_suite.core.checkpoint import Checkpointer
from jaxrl_suite.core.config import (
    Count,
    NonNegative,
    NonNegativeInt,
    Positive,
    Probability,
    check_fields,
)
from jaxrl_suite.core.parallel import place_seeds, print0
from jaxrl_suite.core.signals import Terminated, sigterm_received
from jaxrl_suite.core.train import ParamState, TrainAndAgent, apply_gradients
from jaxrl_suite.envs import contextual
from jaxrl_suite.envs.offline import evaluate_policy
from jaxrl_suite.losses.ppo import gae, ppo_loss
from jaxrl_suite.models.actor_critic import ActorCritic, Categorical, DiagGaussian

# Float hyperparameters that `train(rng, hparams)` takes as traced values (vmappable in `sweep`).
HPARAMS = ("lr", "gamma", "gae_lambda", "clip_eps", "ent_coef", "vf_coef", "max_grad_norm")


@dataclasses.dataclass(frozen=True)
class PPOConfig:
    """PPO settings; the defaults are PureJaxRL's CartPole-v1 settings."""

    env: str = "CartPole-v1"  # one of envs.contextual.ENV_NAMES
    num_envs: Count = 4  # parallel environments per seed
    num_steps: Count = 128  # rollout length per iteration
    total_timesteps: Count = 500_000  # environment steps per seed
    update_epochs: Count = 4
    num_minibatches: Count = 4
    lr: NonNegative = 2.5e-4  # Adam learning rate
    anneal_lr: bool = True  # linear decay to 0 over the run
    gamma: Probability = 0.99  # discount factor
    gae_lambda: Probability = 0.95  # GAE lambda
    clip_eps: NonNegative = 0.2  # ratio clip range
    ent_coef: NonNegative = 0.01  # weight of the entropy bonus
    vf_coef: NonNegative = 0.5  # weight of the value loss
    max_grad_norm: Positive = 0.5  # global-norm gradient clipping
    clip_value: bool = True
    normalize_advantages: bool = True
    hidden: tuple[Count, ...] = (64, 64)  # MLP widths
    activation: Literal["tanh", "relu", "gelu"] = "tanh"
    context_features: tuple[str, ...] = ()  # the context features that vary (curriculum vectors)
    visible_features: tuple[str, ...] = ()  # features appended to the observation (CARL visible)
    context_sampler: Literal["default", "uniform", "gaussian"] = "default"  # without a curriculum
    # relative width (uniform) or sigma (gaussian) around the default
    context_width: NonNegative = 0.0
    value_resets: Count = 4  # initial states averaged into V(s0 | c) for the curriculum
    # evaluate on the eval contexts every this many iterations (0 = never)
    eval_every: NonNegativeInt = 0
    eval_episodes: Count = 1  # episodes per eval context
    eval_deterministic: bool = True  # evaluate the policy's mode instead of samples
    # Also log grad_norm and param_norm (update_norm is always logged): ~4 % of an iteration on
    # a CPU at the CartPole sizes (`core.train.apply_gradients(norms=...)`).
    log_norms: bool = False

    def __post_init__(self):
        check_fields(self, "ppo.")  # the Ranges declared above
        if self.num_updates < 1:
            raise ValueError(
                f"total_timesteps={self.total_timesteps} is less than one iteration "
                f"(num_envs * num_steps = {self.num_envs * self.num_steps})"
            )
        if (self.num_envs * self.num_steps) % self.num_minibatches:
            raise ValueError(
                f"num_minibatches={self.num_minibatches} must divide num_envs * num_steps = "
                f"{self.num_envs * self.num_steps}"
            )
        if self.eval_every and self.num_updates % self.eval_every:
            raise ValueError(
                f"eval_every={self.eval_every} must divide the {self.num_updates} iterations"
            )
        if self.context_sampler != "default" and not self.context_features:
            raise ValueError(f"context_sampler='{self.context_sampler}' needs context_features")

    @property
    def num_updates(self) -> int:
        return self.total_timesteps // (self.num_envs * self.num_steps)

    def hparams(self, **overrides) -> dict[str, jax.Array]:
        """The traced float hyperparameters, with `overrides` applied (unknown names rejected)."""
        unknown = set(overrides) - set(HPARAMS)
        if unknown:
            raise ValueError(
                f"unknown PPO hyperparameter(s) {sorted(unknown)}; traced ones are {list(HPARAMS)}"
            )
        values = {k: getattr(self, k) for k in HPARAMS} | overrides
        return {k: jnp.asarray(v, jnp.float32) for k, v in values.items()}


@flax.struct.dataclass
class RunnerState:
    params: Any
    opt_state: Any
    env_state: Any
    obs: jax.Array  # [num_envs, obs_dim]
    episode_return: jax.Array  # [num_envs] return so far of each running episode
    curriculum: Any  # curriculum state (() without a curriculum)
    rng: jax.Array
    step: jax.Array  # int32 training iterations done


class Transition(flax.struct.PyTreeNode):
    obs: jax.Array
    action: jax.Array
    logp: jax.Array
    value: jax.Array
    reward: jax.Array
    terminated: jax.Array
    done: jax.Array
    final_obs: jax.Array
    finished_return: jax.Array


@dataclasses.dataclass(frozen=True)
class SamplerCurriculum:
    """Adapter: a fixed context sampler (`envs.contextual.*_sampler`) as a no-op curriculum."""

    sampler: Callable[[jax.Array, int], jax.Array]

    def init(self, key):
        return ()

    def sample(self, state, key, n):
        return self.sampler(key, n)

    def update(self, state, key, value_fn):
        return state

    def metrics(self, state):
        return {}


class PPO:
    """The pieces of one PPO run; `make_train` composes them into `train(rng)`.

    Args:
      config: a `PPOConfig`.
      curriculum: an object with `init / sample / update / metrics` (see `jaxrl_suite.curricula`)
        over context vectors of `config.context_features`; None uses `config.context_sampler`.
      eval_contexts: [M, F] contexts (over `config.context_features`) evaluated every
        `config.eval_every` iterations; None evaluates the default context.
    """

    def __init__(self, config: PPOConfig, curriculum=None, eval_contexts=None):
        self.config = config
        self.env, self.default_params = contextual.make_contextual(
            config.env, visible_features=config.visible_features
        )
        self.features = tuple(config.context_features)
        space = contextual.CONTEXT_SPACES[config.env]
        for name in self.features:
            if name not in space:
                raise ValueError(
                    f"context_features: '{name}' is not a context feature of {config.env} "
                    f"(valid: {list(space)})"
                )
        if curriculum is None and config.context_sampler != "default":
            make = {
                "uniform": contextual.uniform_sampler,
                "gaussian": contextual.gaussian_sampler,
            }[config.context_sampler]
            curriculum = SamplerCurriculum(make(config.env, self.features, config.context_width))
        if curriculum is not None and not self.features:
            raise ValueError("a curriculum needs config.context_features to name its features")
        self.curriculum = curriculum
        if eval_contexts is not None:
            eval_contexts = jnp.asarray(eval_contexts, jnp.float32)
            if eval_contexts.ndim != 2 or eval_contexts.shape[1] != len(self.features):
                raise ValueError(
                    f"eval_contexts must be [M, {len(self.features)}] over {self.features}, "
                    f"got shape {eval_contexts.shape}"
                )
        self.eval_contexts = eval_contexts
        if eval_contexts is not None:
            self._check_contexts(eval_contexts, "eval_contexts")
        if getattr(curriculum, "instances", None) is not None:
            self._check_contexts(curriculum.instances, "curriculum instances")
        self.network = ActorCritic(
            action_dim=self.env.num_actions,
            discrete=self.env.discrete,
            hidden=tuple(config.hidden),
            activation=config.activation,
        )
        # Batched params (one context per env) only when contexts vary; otherwise broadcast.
        self._params_axis = 0 if curriculum is not None else None

    # -- contexts -------------------------------------------------------------------------------
    def _check_contexts(self, rows, what: str) -> None:
        """Concrete context rows must lie within the features' bounds (one-line ContextError)."""
        rows = np.asarray(rows, np.float32)
        if rows.ndim != 2 or rows.shape[1] != len(self.features):
            raise ValueError(
                f"{what} must be [N, {len(self.features)}] over {self.features}, got {rows.shape}"
            )
        for row in rows:
            try:
                contextual.with_context(
                    self.default_params, **dict(zip(self.features, row.tolist(), strict=True))
                )
            except contextual.ContextError as e:
                raise contextual.ContextError(f"{what}: {e}") from None

    def params_for(self, contexts: jax.Array):
        """EnvParams for [n, F] context vectors (batched along the leading axis)."""
        return jax.vmap(
            lambda c: contextual.params_from_vector(self.default_params, self.features, c)
        )(contexts)

    def _episode_params(self, cstate, key):
        if self.curriculum is None:
            return self.default_params
        return self.params_for(self.curriculum.sample(cstate, key, self.config.num_envs))

    def _pin_context(self, state: contextual.ContextualState) -> contextual.ContextualState:
        """Without a curriculum every episode runs in the default context: `state` with its
        context replaced by the default params as constants (the same values), so that inside
        the rollout loop XLA folds the auto-reset's per-step select over them away."""
        if self._params_axis is not None:
            return state
        pin = lambda d, x: jnp.broadcast_to(jnp.asarray(d, x.dtype), x.shape)
        return state.replace(params=jax.tree.map(pin, self.default_params, state.params))

    def _env_action(self, action):
        if self.env.discrete:
            return action
        return jnp.clip(action, self.env.action_low, self.env.action_high)

    # -- optimiser ------------------------------------------------------------------------------
    def optimizer(self, hp: Mapping[str, jax.Array]) -> optax.GradientTransformation:
        cfg = self.config
        per_iteration = cfg.num_minibatches * cfg.update_epochs

        def lr(count):
            if not cfg.anneal_lr:
                return hp["lr"]
            return hp["lr"] * (1.0 - (count // per_iteration) / cfg.num_updates)

        return optax.chain(
            optax.clip_by_global_norm(hp["max_grad_norm"]),
            optax.scale_by_adam(eps=1e-5),
            optax.scale_by_learning_rate(lr),
        )

    # -- init / update --------------------------------------------------------------------------
    def init(self, rng: jax.Array, hp: Mapping[str, jax.Array]) -> RunnerState:
        cfg = self.config
        rng, k_net, k_reset, k_ctx, k_cur = jax.random.split(rng, 5)
        params = self.network.init(k_net, jnp.zeros((self.env.obs_dim,), jnp.float32))
        cstate = self.curriculum.init(k_cur) if self.curriculum is not None else ()
        env_params = self._episode_params(cstate, k_ctx)
        obs, env_state = jax.vmap(self.env.reset, in_axes=(0, self._params_axis))(
            jax.random.split(k_reset, cfg.num_envs), env_params
        )
        return RunnerState(
            params=params,
            opt_state=self.optimizer(hp).init(params),
            env_state=env_state,
            obs=obs,
            episode_return=jnp.zeros((cfg.num_envs,), jnp.float32),
            curriculum=cstate,
            rng=rng,
            step=jnp.zeros((), jnp.int32),
        )

    def value_fn(self, params, key) -> Callable[[jax.Array], jax.Array]:
        """contexts [m, F] -> critic V(s0 | c), averaged over `value_resets` initial states."""
        keys = jax.random.split(key, self.config.value_resets)

        def one(context):
            env_params = contextual.params_from_vector(self.default_params, self.features, context)
            obs0, _ = jax.vmap(self.env.reset, in_axes=(0, None))(keys, env_params)
            _, v = self.network.apply(params, obs0)
            return v.mean()

        return jax.vmap(one)

    def _next_values(self, params, traj: Transition) -> jax.Array:
        """V(s'_t) [T, N] for GAE, with a critic pass over only the rows that need one.

        Where step t did not end its episode, s'_t is s_{t+1} and V(s'_t) is the rollout's own
        `value[t + 1]`; where it was terminated, GAE multiplies V(s'_t) by 0. Only truncated
        steps (V of their final observation) and the last step need the critic. An episode is
        truncated after `max_steps_in_episode` steps and restarts at time 0, so an environment
        truncates at most ceil(T / max_steps) times in T steps: those rows and the last step's
        are gathered into one fixed-size batch of N * (ceil(T / max_steps) + 1) rows (padded)
        instead of a pass over all T * N final observations.
        """
        T, N = traj.reward.shape
        max_steps = int(self.default_params.max_steps_in_episode)
        size = N * (-(-T // max_steps) + 1)
        need = (traj.done & ~traj.terminated) | (jnp.arange(T) == T - 1)[:, None]
        (idx,) = jnp.nonzero(need.reshape(-1), size=size, fill_value=T * N)
        rows = traj.final_obs.reshape(T * N, -1).at[idx].get(mode="fill", fill_value=0.0)
        _, v = self.network.apply(params, rows)
        shifted = jnp.concatenate([traj.value[1:], jnp.zeros_like(traj.value[:1])])
        return shifted.reshape(-1).at[idx].set(v, mode="drop").reshape(T, N)

    def update(self, runner: RunnerState, hp: Mapping[str, jax.Array]):
        """One PPO iteration: rollout, GAE, epochs x minibatches, curriculum update."""
        cfg, env, net = self.config, self.env, self.network
        tx = self.optimizer(hp)
        rng, k_ctx, k_roll, k_epochs, k_val, k_cur = jax.random.split(runner.rng, 6)
        env_params = self._episode_params(runner.curriculum, k_ctx)
        # Every random number of the rollout is drawn here, in batched calls, before the time
        # loop: on CPU each small `jax.random` call inside the scan body is a loop of its own.
        k_noise, k_step, k_reset = jax.random.split(k_roll, 3)
        T, N = cfg.num_steps, cfg.num_envs
        dist_cls = Categorical if env.discrete else DiagGaussian
        noise = dist_cls.noise(k_noise, (T, N, env.num_actions))
        step_keys = jax.random.split(k_step, (T, N))
        resets = jax.vmap(jax.vmap(env.reset, in_axes=(0, self._params_axis)), in_axes=(0, None))(
            jax.random.split(k_reset, (T, N)), env_params
        )  # the episode each env would start if step t ended its current one
        v_step = jax.vmap(env.step, in_axes=(0, 0, 0, None, 0))

        def env_step(carry, xs):
            env_state, obs, ep_ret = carry
            keys, eps, reset = xs
            env_state, reset = self._pin_context(env_state), (reset[0], self._pin_context(reset[1]))
            dist, value = net.apply(runner.params, obs)
            action = dist.sample_from(eps)
            logp = dist.log_prob(action)
            obs2, env_state2, reward, term, trunc, info = v_step(
                keys, env_state, self._env_action(action), None, reset
            )
            done = jnp.logical_or(term, trunc)
            ep_ret = ep_ret + reward
            transition = Transition(
                obs=obs, action=action, logp=logp, value=value, reward=reward,
                terminated=term, done=done, final_obs=info["final_observation"],
                finished_return=jnp.where(done, ep_ret, 0.0),
            )
            return (env_state2, obs2, jnp.where(done, 0.0, ep_ret)), transition

        (env_state, obs, ep_ret), traj = jax.lax.scan(
            env_step,
            (runner.env_state, runner.obs, runner.episode_return),
            (step_keys, noise, resets),
        )
        next_values = self._next_values(runner.params, traj)
        adv, targets = gae(
            traj.reward, traj.value, next_values, traj.terminated, traj.done,
            hp["gamma"], hp["gae_lambda"],
        )

        batch_size = cfg.num_steps * cfg.num_envs
        batch = jax.tree.map(
            lambda x: x.reshape((batch_size, *x.shape[2:])),
            (traj.obs, traj.action, traj.logp, traj.value, adv, targets),
        )

        def loss_fn(params, mb):
            obs_b, act_b, logp_old, v_old, adv_b, tgt_b = mb
            dist, value = net.apply(params, obs_b)
            return ppo_loss(
                dist.log_prob(act_b), logp_old, adv_b, value, v_old, tgt_b, dist.entropy(),
                clip_eps=hp["clip_eps"], vf_coef=hp["vf_coef"], ent_coef=hp["ent_coef"],
                clip_value=cfg.clip_value, normalize_advantages=cfg.normalize_advantages,
            )

        def minibatch_step(opt, mb):
            (loss, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(opt.params, mb)
            opt, update_metrics = apply_gradients(opt, grads, tx, loss=loss, keep="params",
                                                  norms=cfg.log_norms)
            return opt, {**metrics, **update_metrics}

        def epoch(carry, key):
            perm = jax.random.permutation(key, batch_size)
            minibatches = jax.tree.map(
                lambda x: x[perm].reshape((cfg.num_minibatches, -1, *x.shape[1:])), batch
            )
            return jax.lax.scan(minibatch_step, carry, minibatches)

        opt = ParamState(jnp.zeros((), jnp.int32), runner.params, runner.opt_state)
        opt, loss_metrics = jax.lax.scan(epoch, opt, jax.random.split(k_epochs, cfg.update_epochs))
        params, opt_state = opt.params, opt.opt_state

        cstate = runner.curriculum
        if self.curriculum is not None:
            cstate = self.curriculum.update(cstate, k_cur, self.value_fn(params, k_val))

        n_done = traj.done.sum()
        finite = loss_metrics.pop("finite")
        metrics = {k: v.mean() for k, v in loss_metrics.items()}
        metrics["nonfinite"] = (~finite).sum()  # minibatch updates skipped (core.train)
        metrics["episode_return"] = jnp.where(
            n_done > 0, traj.finished_return.sum() / jnp.maximum(n_done, 1), jnp.nan
        )
        metrics["episodes"] = n_done
        metrics["env_steps"] = (runner.step + 1) * batch_size
        if self.curriculum is not None:
            extra = self.curriculum.metrics(cstate)
            metrics.update({f"curriculum/{k}": v for k, v in extra.items()})
        runner = RunnerState(
            params=params, opt_state=opt_state, env_state=env_state, obs=obs,
            episode_return=ep_ret, curriculum=cstate, rng=rng, step=runner.step + 1,
        )
        return runner, metrics

    def run(self, runner: RunnerState, hp: Mapping[str, jax.Array], num_iterations: int):
        """`num_iterations` PPO iterations in one `lax.scan`; metrics stacked along axis 0."""
        return jax.lax.scan(lambda r, _: self.update(r, hp), runner, None, num_iterations)

    # -- evaluation -----------------------------------------------------------------------------
    def evaluate(self, params, key: jax.Array, contexts: jax.Array | None = None) -> jax.Array:
        """Mean undiscounted return of full episodes in each context: [M] (or [1] for default).

        Runs `eval_episodes` episodes per context, each for up to the environment's episode limit,
        with the policy's mode (`eval_deterministic`) or samples.
        """
        cfg = self.config
        if contexts is None:
            contexts = self.eval_contexts
        if contexts is None:
            env_params = jax.tree.map(lambda x: jnp.asarray(x)[None], self.default_params)
        else:
            env_params = self.params_for(contexts)
        m = jax.tree.leaves(env_params)[0].shape[0]
        e = cfg.eval_episodes
        # [M * E] episodes: context i repeated E times.
        env_params = jax.tree.map(lambda x: jnp.repeat(x, e, axis=0), env_params)

        def policy(obs, key):
            dist, _ = self.network.apply(params, obs)
            return dist.mode() if cfg.eval_deterministic else dist.sample(key)

        total = evaluate_policy(self.env, policy, key, num_episodes=m * e,
                                env_params=env_params, batched_params=True)
        return total.reshape(m, e).mean(axis=1)


def make_train(config: PPOConfig, curriculum=None, eval_contexts=None) -> TrainAndAgent:
    """`(train, ppo)`: `train(rng, hparams=None) -> (RunnerState, metrics)`, pure and
    jit/vmap-able, and the `PPO` object it runs (networks, `evaluate`, `params_for` ...).

    metrics: a dict of [num_updates] arrays (episode_return, losses, approx_kl, the update norms,
    "nonfinite": minibatch updates skipped as non-finite, curriculum/...),
    and with `config.eval_every`, "eval_returns" [num_updates // eval_every, M] measured after
    every `eval_every` iterations. `hparams` overrides the float hyperparameters in `HPARAMS` with
    (possibly traced) values.
    """
    ppo = PPO(config, curriculum, eval_contexts)

    def train(rng: jax.Array, hparams: Mapping[str, Any] | None = None):
        hp = config.hparams(**dict(hparams or {}))
        rng, k_init = jax.random.split(rng)
        runner = ppo.init(k_init, hp)
        if not config.eval_every:
            return ppo.run(runner, hp, config.num_updates)

        def chunk(carry, key):
            runner, metrics = ppo.run(carry, hp, config.eval_every)
            return runner, (metrics, ppo.evaluate(runner.params, key))

        num_evals = config.num_updates // config.eval_every
        runner, (metrics, evals) = jax.lax.scan(chunk, runner, jax.random.split(rng, num_evals))
        # (train_seeds derives its keys the same way, so both give the same numbers)
        metrics = jax.tree.map(lambda x: x.reshape((-1, *x.shape[2:])), metrics)
        metrics["eval_returns"] = evals
        return runner, metrics

    return TrainAndAgent(train, ppo)


def seed_keys(seeds: int | Sequence[int]) -> jax.Array:
    """`n` -> keys of seeds 0..n-1; a sequence -> one key per given seed."""
    seeds = range(seeds) if isinstance(seeds, int) else seeds
    return jnp.stack([jax.random.key(int(s)) for s in seeds])


def _key_data(runner: RunnerState) -> RunnerState:
    return runner.replace(rng=jax.random.key_data(runner.rng))


def _wrap_key(runner: RunnerState) -> RunnerState:
    return runner.replace(rng=jax.random.wrap_key_data(jnp.asarray(runner.rng)))


def train_seeds(
    config: PPOConfig,
    seeds,
    *,
    curriculum=None,
    eval_contexts=None,
    hparams: Mapping[str, float] | None = None,
    checkpointer=None,
    resume: bool = False,
    mesh=None,
    on_chunk: Callable[[int, int, dict, np.ndarray], None] | None = None,
) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """`jit(vmap(train))` over seeds, run in chunks of `eval_every` iterations, resumable.

    Gives the same numbers as `jax.vmap(make_train(config, ...))(seed_keys(seeds))`, but returns to
    Python after every chunk of `config.eval_every` iterations (the whole run when it is 0): it
    calls `on_chunk(chunk_index, num_chunks, chunk_metrics, chunk_evals)` (for logging and
    progress) and, with a `core.checkpoint.Checkpointer`, saves the vmapped runner state with the
    metrics so far. With `resume=True` a killed run continues from its last saved chunk and ends
    with exactly the metrics of an uninterrupted one.

    Returns (metrics, evals): metrics leaves are [S, num_updates]; evals is
    [S, num_chunks, M] (M = number of eval contexts; empty without `eval_every`).
    """
    ppo = PPO(config, curriculum, eval_contexts)
    hp = config.hparams(**dict(hparams or {}))
    chunk = config.eval_every or config.num_updates
    num_chunks = config.num_updates // chunk

    def start(rng):
        rng, k_init = jax.random.split(rng)
        return ppo.init(k_init, hp), jax.random.split(rng, num_chunks)

    def advance(runner, eval_key):
        runner, metrics = ppo.run(runner, hp, chunk)
        evals = ppo.evaluate(runner.params, eval_key) if config.eval_every else jnp.zeros((0,))
        return runner, metrics, evals

    keys = place_seeds(seed_keys(seeds), mesh)
    runner, eval_keys = jax.jit(jax.vmap(start))(keys)
    step = jax.jit(jax.vmap(advance))
    shapes = jax.eval_shape(step, runner, eval_keys[:, 0])
    n_seeds = keys.shape[0]
    metrics = {k: np.full((n_seeds, config.num_updates), np.nan, np.float32)
               for k in shapes[1]}
    evals = np.full((n_seeds, num_chunks, *shapes[2].shape[1:]), np.nan, np.float32)
    done = 0
    if resume and checkpointer is not None and checkpointer.latest_step() is not None:
        template = {"runner": _key_data(runner), "metrics": metrics, "evals": evals}
        state, meta = checkpointer.restore(template)
        runner = _wrap_key(state["runner"])
        metrics = {k: np.asarray(v) for k, v in state["metrics"].items()}
        evals = np.asarray(state["evals"])
        done = int(meta["chunks_done"])
    for c in range(done, num_chunks):
        runner, chunk_metrics, chunk_evals = step(runner, eval_keys[:, c])
        for k, v in chunk_metrics.items():
            metrics[k][:, c * chunk:(c + 1) * chunk] = np.asarray(v)
        evals[:, c] = np.asarray(chunk_evals)
        if on_chunk is not None:  # before saving: a resumed run redoes (and re-logs) this chunk
            on_chunk(c, num_chunks, {k: np.asarray(v) for k, v in chunk_metrics.items()},
                     np.asarray(chunk_evals))
        if checkpointer is not None:
            checkpointer.save(
                c + 1, {"runner": _key_data(runner), "metrics": metrics, "evals": evals},
                {"chunks_done": c + 1}, force=True,
            )
            if sigterm_received():  # a scheduler's SIGTERM (`core.signals`): chunk saved, stop
                checkpointer.wait()
                raise Terminated(f"chunk {c + 1} of {num_chunks} checkpointed in "
                                 f"{checkpointer.directory}")
    if checkpointer is not None:
        checkpointer.wait()
    return metrics, evals


def fit_unit(study, unit: str, config: PPOConfig, seeds, *,
             record: Callable[[dict, np.ndarray], dict], **kwargs):
    """`train_seeds` as one unit of a `core.study.Study`: checkpointed to
    `study.checkpoint_dir(unit)` after every chunk (so the study's `--resume` continues it), and
    chunk c logged to the unit's metrics.jsonl as {"step": c + 1, "env_steps", "train_return"
    (mean over seeds of the last 10 episodes), **record(chunk_metrics, chunk_evals)}. `kwargs`
    go to `train_seeds` (curriculum, eval_contexts, ...). Returns (metrics, evals)."""
    chunk_steps = (config.eval_every or config.num_updates) * config.num_envs * config.num_steps
    log = study.unit_log(unit)

    def on_chunk(c, n, metrics, evals):
        rec = {"step": c + 1, "env_steps": (c + 1) * chunk_steps,
               "train_return": float(np.nanmean(metrics["episode_return"][:, -10:])),
               **record(metrics, evals)}
        log.log(rec)
        if study.opts.progress:
            print0(f"[{study.name}] {unit}: chunk {c + 1}/{n}, " + ", ".join(
                f"{k} {v:.1f}" for k, v in rec.items() if k not in ("step", "env_steps")))

    ckpt = Checkpointer(study.checkpoint_dir(unit), keep=2)  # 2: a fallback
    try:
        return train_seeds(config, seeds, checkpointer=ckpt, resume=study.opts.resume,
                           on_chunk=on_chunk, **kwargs)
    finally:
        ckpt.close()
        log.close()


def run_seeds(config: PPOConfig, seeds, *, curriculum=None, eval_contexts=None, mesh=None):
    """Train every seed in one `jit(vmap(train))` program; metrics leaves are [S, ...].

    With `mesh` (a `core.parallel.make_mesh()`), the seed axis is split over its devices.
    """
    train, _ = make_train(config, curriculum, eval_contexts)
    _, metrics = jax.jit(jax.vmap(train))(place_seeds(seed_keys(seeds), mesh))
    return metrics


def sweep(
    config: PPOConfig,
    seeds,
    grid: Mapping[str, Sequence[float]],
    *,
    curriculum=None,
    eval_contexts=None,
    mesh=None,
) -> tuple[list[dict[str, float]], dict[str, jax.Array]]:
    """Seeds x a grid of float hyperparameters (`HPARAMS`) in one jitted, doubly vmapped program.

    Returns (points, metrics): `points[g]` is the g-th grid point (the cartesian product of `grid`,
    in its key order) and every metrics leaf is [G, S, ...].
    """
    unknown = set(grid) - set(HPARAMS)
    if unknown:
        raise ValueError(
            f"sweep grid: {sorted(unknown)} cannot be swept in one program; traced "
            f"hyperparameters are {list(HPARAMS)} (loop over structural ones in Python)"
        )
    names = list(grid)
    points = [dict(zip(names, map(float, values), strict=True))
              for values in itertools.product(*(grid[n] for n in names))]
    hp = {n: jnp.asarray([p[n] for p in points], jnp.float32) for n in names}
    train, _ = make_train(config, curriculum, eval_contexts)
    over_seeds = jax.vmap(lambda key, h: train(key, h)[1], in_axes=(0, None))
    over_grid = jax.vmap(over_seeds, in_axes=(None, 0))
    metrics = jax.jit(over_grid)(place_seeds(seed_keys(seeds), mesh), hp)
    return points, metrics


__all__ = [
    "fit_unit",
    "HPARAMS",
    "PPO",
    "PPOConfig",
    "RunnerState",
    "SamplerCurriculum",
    "make_train",
    "run_seeds",
    "seed_keys",
    "sweep",
    "train_seeds",
]
