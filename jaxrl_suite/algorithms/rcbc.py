"""Return-conditioned behaviour cloning (offline) for sequence policies: ELMUR, a transformer
without memory, and a GRU.

This is the offline training of RATE and ELMUR (Cherepanov et al., arXiv 2306.09459 and
2510.07151), which is Decision Transformer's recipe (Chen et al., "Decision Transformer:
Reinforcement Learning via Sequence Modeling", NeurIPS 2021): a sequence model reads, at every
step t, the observation, the return-to-go and the previous action, and is trained to predict the
action the data took:

    x_t  = [o_t,  R_t / return_scale,  onehot(a_{t-1})]        (onehot(a_{-1}) = 0)
    R_t  = sum_{t' >= t} r_{t'}                                (return-to-go, gamma = 1)
    L(theta) = - sum_{b,t} m_{b,t} log pi_theta(a_{b,t} | x_{b,<=t}) / sum_{b,t} m_{b,t}

with m the mask of real (not padded) steps. At evaluation the policy is conditioned on a target
return R_0 (the task's best return) and R_{t+1} = R_t - r_t, as in Decision Transformer.

One token per step (Decision Transformer interleaves three: return, state, action); the authors'
T-Maze runs use state tokens only ("sequence-format s"). We keep the return and the previous
action in the one token so that the same code is return-conditioned on every task.

The data are collected inside `train` from a scripted behaviour policy, made noisy per episode
(with probability eps ~ U[0, eps_max] each action is uniform) so that the dataset holds returns of
several qualities for the conditioning to separate. `make_train(config, policy_config, task) ->
(train, policy)`: `train(rng)` runs data collection, all updates and nothing else in one XLA
program, so `jax.vmap(train)(keys)` is a seed sweep. (The dataset is a function of the seed, made
inside `train`, so no dataset is closed over.) Each update goes through
`core.train.apply_gradients`, which refuses a non-finite one (the run then halts at its last
finite parameters); "nonfinite" counts them. `evaluate` acts online, step by step, with O(1)
work per step (`SeqPolicy.step`; for ELMUR `models.elmur.inference_step`), so a 10^6-step
episode runs in constant memory.

Architectures (`PolicyConfig.arch`):
- ``elmur``: `models.elmur.ELMUR`, trained over whole trajectories with `scan_segments`.
- ``transformer``: the same model with memory read and write switched off, i.e. a causal
  transformer whose context is the current segment only.
- ``gru``: a GRU (`flax.linen.GRUCell`) over the same tokens.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable, Sequence
from typing import Any, Literal

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxrl_suite.algorithms.ppo import seed_keys
from jaxrl_suite.core.config import (
    Count,
    NonNegative,
    NonNegativeInt,
    Positive,
    Probability,
    check_fields,
)
from jaxrl_suite.core.parallel import place_seeds
from jaxrl_suite.core.registry import Registry
from jaxrl_suite.core.train import TrainAndAgent, apply_gradients, init_param_state
from jaxrl_suite.envs import tmaze
from jaxrl_suite.envs.popgym import make_popgym
from jaxrl_suite.models.actor_critic import orthogonal
from jaxrl_suite.models.elmur import (
    ELMUR,
    ELMURConfig,
    inference_step,
    init_memory,
    init_step_state,
    scan_segments,
)

ARCHS = ("elmur", "transformer", "gru")  # the entries of SEQUENCE_CORES


@dataclasses.dataclass(frozen=True)
class PolicyConfig:
    arch: Literal["elmur", "transformer", "gru"] = "elmur"
    elmur: ELMURConfig = dataclasses.field(default_factory=ELMURConfig)  # also the transformer's
    gru_hidden: int = 64


@dataclasses.dataclass(frozen=True)
class RCBCConfig:
    """Dataset and optimiser settings of return-conditioned behaviour cloning."""

    num_episodes: Count = 1024  # trajectories collected from the behaviour policy
    eps_max: Probability = 0.0  # per-episode random-action probability ~ U[0, eps_max]
    batch_size: Count = 64  # trajectories per update
    num_updates: Count = 2000
    lr: NonNegative = 3e-4  # peak AdamW learning rate
    warmup: NonNegativeInt = 100  # linear warm-up updates (0 = none)
    weight_decay: NonNegative = 1e-4  # AdamW weight decay
    max_grad_norm: Positive = 1.0  # global-norm gradient clipping
    return_scale: Positive = 1.0  # the return-to-go enters the token divided by this
    log_every: Count = 50  # the loss is averaged over blocks of this many updates

    def __post_init__(self):
        check_fields(self, "rcbc.")  # the Ranges declared above
        if self.num_updates % self.log_every:
            raise ValueError(
                f"rcbc.num_updates={self.num_updates} must be a multiple of "
                f"rcbc.log_every={self.log_every}"
            )


@dataclasses.dataclass(frozen=True)
class OfflineTask:
    """An environment plus the scripted behaviour policy that makes its dataset.

    `sample_params(key)` gives each collected episode its env params (e.g. a corridor length);
    `init_memory(first_obs)` and `act(key, obs, env_state, memory, env_params) -> (action,
    memory)` are the behaviour policy (it may read the env state: it is an oracle); `horizon` is
    the padded trajectory length, a multiple of the segment length for the transformers.
    """

    env: Any
    sample_params: Callable[[jax.Array], Any]
    init_memory: Callable[[jax.Array], Any]
    act: Callable[..., tuple[jax.Array, Any]]
    horizon: int
    obs_dim: int
    num_actions: int


def token_dim(task: OfflineTask) -> int:
    return task.obs_dim + 1 + task.num_actions


def make_tokens(obs, rtg, prev_action, num_actions: int, return_scale: float):
    """[o_t, R_t / return_scale, onehot(a_{t-1})] (prev_action < 0 means none: zeros)."""
    onehot = jax.nn.one_hot(prev_action, num_actions) * (prev_action >= 0)[..., None]
    return jnp.concatenate([obs, (rtg / return_scale)[..., None], onehot], axis=-1)


# -- policies ------------------------------------------------------------------------------------


class GRUCore:
    """A GRU cell run over the tokens one at a time (width `gru_hidden`, segment length 1)."""

    segment_len = 1

    def __init__(self, cfg: PolicyConfig):
        self.width = cfg.gru_hidden
        # Gram-Schmidt orthogonal init: flax's default (LAPACK QR) can deadlock XLA:CPU when
        # vmapped over seeds (see models.actor_critic.orthogonal).
        self.module = nn.GRUCell(features=cfg.gru_hidden, recurrent_kernel_init=orthogonal())

    def init(self, key: jax.Array, memory_key: jax.Array):
        del memory_key
        return self.module.init(key, jnp.zeros((1, self.width)), jnp.zeros((1, self.width)))

    def sequence(self, params, h: jax.Array, key: jax.Array) -> jax.Array:
        """[B, T, W] -> [B, T, W], teacher-forced (key unused)."""
        cell = lambda c, h_t: self.module.apply(params, c, h_t)
        _, out = jax.lax.scan(cell, jnp.zeros((h.shape[0], self.width)), jnp.swapaxes(h, 0, 1))
        return jnp.swapaxes(out, 0, 1)

    def init_carry(self, key: jax.Array, batch: int):
        return jnp.zeros((batch, self.width))

    def step(self, params, carry, h_t: jax.Array):
        """One token [B, W] -> (out [B, W], carry)."""
        carry, out = self.module.apply(params, carry, h_t)
        return out, carry


class ELMURCore:
    """ELMUR over segments (`models.elmur`); without its memory it is the plain segment-level
    transformer baseline."""

    def __init__(self, cfg: PolicyConfig, *, memory: bool = True):
        ecfg = cfg.elmur if memory else dataclasses.replace(cfg.elmur, use_read=False,
                                                            use_write=False)
        self.config, self.width, self.segment_len = ecfg, ecfg.d_model, ecfg.segment_len
        self.module = ELMUR(ecfg)

    def init(self, key: jax.Array, memory_key: jax.Array):
        x = jnp.zeros((1, self.segment_len, self.width))
        return self.module.init(key, x, init_memory(self.config, memory_key, 1), 0)

    def sequence(self, params, h: jax.Array, key: jax.Array) -> jax.Array:
        """[B, T, W] -> [B, T, W], teacher-forced (key: the initial memory)."""
        out, _ = scan_segments(self.module, params, h, init_memory(self.config, key, h.shape[0]))
        return out

    def init_carry(self, key: jax.Array, batch: int):
        return init_step_state(self.config, key, batch)

    def step(self, params, carry, h_t: jax.Array):
        return inference_step(self.module, params, carry, h_t)


# policy.arch -> the sequence core of `SeqPolicy`
SEQUENCE_CORES: Registry[type] = Registry("policy.arch")
SEQUENCE_CORES.register("elmur", ELMURCore)
SEQUENCE_CORES.register("transformer", functools.partial(ELMURCore, memory=False))
SEQUENCE_CORES.register("gru", GRUCore)


class SeqPolicy:
    """Embedding -> sequence core (`SEQUENCE_CORES[cfg.arch]`) -> action logits, with a
    teacher-forced `logits` for training and an O(1) `step` for acting. Parameters are
    {"embed", "core", "head"}."""

    def __init__(self, cfg: PolicyConfig, in_dim: int, num_actions: int):
        if cfg.arch not in SEQUENCE_CORES:
            raise ValueError(f"policy.arch must be one of {SEQUENCE_CORES.names()}, got "
                             f"{cfg.arch!r}")
        self.cfg, self.in_dim, self.num_actions = cfg, in_dim, num_actions
        self.core = SEQUENCE_CORES.get(cfg.arch)(cfg)
        self.width = self.core.width
        self.embed = nn.Dense(self.width)
        self.head = nn.Dense(num_actions)

    @property
    def segment_len(self) -> int:
        return self.core.segment_len

    def init(self, key: jax.Array) -> dict:
        k_e, k_c, k_h, k_m = jax.random.split(key, 4)
        embed = self.embed.init(k_e, jnp.zeros((1, self.in_dim)))
        head = self.head.init(k_h, jnp.zeros((1, self.width)))
        return {"embed": embed, "core": self.core.init(k_c, k_m), "head": head}

    def logits(self, params: dict, x: jax.Array, key: jax.Array) -> jax.Array:
        """Teacher-forced logits [B, T, A] for tokens [B, T, in_dim] (key: initial memory)."""
        h = self.embed.apply(params["embed"], x)
        return self.head.apply(params["head"], self.core.sequence(params["core"], h, key))

    def init_carry(self, key: jax.Array, batch: int):
        return self.core.init_carry(key, batch)

    def step(self, params: dict, carry, x_t: jax.Array):
        """One token per sequence [B, in_dim] -> (logits [B, A], carry); O(1) in the time."""
        out, carry = self.core.step(params["core"], carry, self.embed.apply(params["embed"], x_t))
        return self.head.apply(params["head"], out), carry


def bc_loss(logits: jax.Array, actions: jax.Array, mask: jax.Array):
    """Masked mean negative log-likelihood and accuracy of the data's actions.

    -sum m log softmax(logits)[a] / sum m, over [B, T] (module docstring)."""
    logp = jax.nn.log_softmax(logits)
    nll = -jnp.take_along_axis(logp, actions[..., None], axis=-1)[..., 0]
    denom = jnp.maximum(mask.sum(), 1.0)
    acc = ((logits.argmax(-1) == actions) * mask).sum() / denom
    return (nll * mask).sum() / denom, acc


# -- data ----------------------------------------------------------------------------------------


def collect(task: OfflineTask, key: jax.Array, num_episodes: int, eps_max: float) -> dict:
    """Rolls the (noisy) behaviour policy for `task.horizon` steps per episode.

    Returns obs [N, T, O], action [N, T] int32, reward [N, T], mask [N, T] (1 up to and including
    the step that ends the episode) and return [N]."""
    env, n_act = task.env, task.num_actions

    def episode(k):
        k_p, k_r, k_e, k_s = jax.random.split(k, 4)
        env_params = task.sample_params(k_p)
        obs, state = env.reset(k_r, env_params)
        eps = jax.random.uniform(k_e) * eps_max

        def body(carry, k_t):
            obs, state, mem, alive = carry
            k_a, k_u, k_c, k_step = jax.random.split(k_t, 4)
            a, mem = task.act(k_a, obs, state, mem, env_params)
            a = jnp.where(jax.random.bernoulli(k_c, eps), jax.random.randint(k_u, (), 0, n_act), a)
            obs2, state2, r, term, trunc, _ = env.step(k_step, state, a, env_params)
            out = (obs, a.astype(jnp.int32), r * alive, alive.astype(jnp.float32))
            return (obs2, state2, mem, alive & ~(term | trunc)), out

        init = (obs, state, task.init_memory(obs), jnp.array(True))
        _, (o, a, r, m) = jax.lax.scan(body, init, jax.random.split(k_s, task.horizon))
        return {"obs": o, "action": a, "reward": r, "mask": m, "return": r.sum()}

    return jax.vmap(episode)(jax.random.split(key, num_episodes))


def dataset_tokens(data: dict, num_actions: int, return_scale: float) -> jax.Array:
    """Tokens [N, T, token_dim] of a collected dataset (return-to-go from the rewards)."""
    rtg = jnp.flip(jnp.cumsum(jnp.flip(data["reward"], -1), -1), -1)
    prev = jnp.concatenate(
        [jnp.full(data["action"].shape[:-1] + (1,), -1, jnp.int32), data["action"][..., :-1]], -1
    )
    return make_tokens(data["obs"], rtg, prev, num_actions, return_scale)


# -- training ------------------------------------------------------------------------------------


def make_train(config: RCBCConfig, policy_cfg: PolicyConfig, task: OfflineTask) -> TrainAndAgent:
    """`(train, policy)`: `train(rng) -> (params, metrics)` collects the dataset, then runs
    `num_updates` Adam steps on random minibatches of whole trajectories; one XLA program,
    vmappable over `rng`. `policy` is the `SeqPolicy` the params are for.

    metrics: loss and accuracy averaged over blocks of `log_every` updates ([num_updates //
    log_every]), "nonfinite" (updates skipped per block) and the dataset's mean return."""
    policy = SeqPolicy(policy_cfg, token_dim(task), task.num_actions)
    if task.horizon % policy.segment_len:
        raise ValueError(
            f"task horizon {task.horizon} must be a multiple of the segment length "
            f"{policy.segment_len}"
        )
    sched = optax.warmup_cosine_decay_schedule(
        0.0, config.lr, min(config.warmup, config.num_updates - 1), config.num_updates
    )
    opt = optax.chain(
        optax.clip_by_global_norm(config.max_grad_norm),
        optax.adamw(sched, weight_decay=config.weight_decay),
    )

    def loss_fn(params, x, a, m, key):
        return bc_loss(policy.logits(params, x, key), a, m)

    def train(rng):
        k_data, k_init, k_train = jax.random.split(rng, 3)
        data = collect(task, k_data, config.num_episodes, config.eps_max)
        tokens = dataset_tokens(data, task.num_actions, config.return_scale)
        state = init_param_state(policy.init(k_init), opt)

        def update(state, k):
            k_idx, k_mem = jax.random.split(k)
            idx = jax.random.randint(k_idx, (config.batch_size,), 0, config.num_episodes)
            (loss, acc), grads = jax.value_and_grad(loss_fn, has_aux=True)(
                state.params, tokens[idx], data["action"][idx], data["mask"][idx], k_mem
            )
            state, norms = apply_gradients(state, grads, opt, loss=loss, keep="params")
            return state, (loss, acc, ~norms["finite"])

        keys = jax.random.split(k_train, config.num_updates)
        state, (loss, acc, skipped) = jax.lax.scan(update, state, keys)
        blocks = lambda v: v.reshape(-1, config.log_every)
        metrics = {"loss": blocks(loss).mean(-1), "accuracy": blocks(acc).mean(-1),
                   "nonfinite": blocks(skipped).sum(-1), "data_return": data["return"].mean()}
        return state.params, metrics

    return TrainAndAgent(train, policy)


# -- evaluation ----------------------------------------------------------------------------------


def evaluate(
    policy: SeqPolicy,
    params: dict,
    env,
    env_params,
    key: jax.Array,
    num_episodes: int,
    max_steps,
    target_return: float,
    return_scale: float = 1.0,
    greedy: bool = True,
) -> dict:
    """Acts online in `num_episodes` parallel episodes until each ends or `max_steps` (may be a
    traced int: one compilation serves every corridor length) have passed.

    The policy sees R_t = target_return - (rewards so far). Returns per-episode `return`,
    `success` (any step with info["success"], False when the env has none) and `length`."""
    n_act = policy.num_actions
    k_reset, k_carry, k_loop = jax.random.split(key, 3)
    obs, state = jax.vmap(env.reset, in_axes=(0, None))(
        jax.random.split(k_reset, num_episodes), env_params
    )
    zeros = jnp.zeros((num_episodes,))
    init = dict(
        t=jnp.zeros((), jnp.int32), key=k_loop, obs=obs, state=state,
        carry=policy.init_carry(k_carry, num_episodes),
        prev=jnp.full((num_episodes,), -1, jnp.int32), rtg=zeros + target_return,
        ret=zeros, success=jnp.zeros((num_episodes,), bool), length=zeros.astype(jnp.int32),
        alive=jnp.ones((num_episodes,), bool),
    )

    def cond(c):
        return (c["t"] < max_steps) & c["alive"].any()

    def body(c):
        key, k_act, k_step = jax.random.split(c["key"], 3)
        x = make_tokens(c["obs"], c["rtg"], c["prev"], n_act, return_scale)
        logits, carry = policy.step(params, c["carry"], x)
        if greedy:
            a = logits.argmax(-1).astype(jnp.int32)
        else:
            a = jax.random.categorical(k_act, logits).astype(jnp.int32)
        obs, state, r, term, trunc, info = jax.vmap(env.step, in_axes=(0, 0, 0, None))(
            jax.random.split(k_step, num_episodes), c["state"], a, env_params
        )
        alive = c["alive"]
        r = jnp.where(alive, r, 0.0)
        success = c["success"] | (alive & info.get("success", jnp.zeros_like(alive)))
        return dict(
            t=c["t"] + 1, key=key, obs=obs, state=state, carry=carry, prev=a,
            rtg=c["rtg"] - r, ret=c["ret"] + r, success=success,
            length=c["length"] + alive.astype(jnp.int32), alive=alive & ~(term | trunc),
        )

    out = jax.lax.while_loop(cond, body, init)
    return {"return": out["ret"], "success": out["success"], "length": out["length"]}


# -- seeds ---------------------------------------------------------------------------------------


def train_seeds(config: RCBCConfig, policy_cfg: PolicyConfig, task: OfflineTask,
                seeds: int | Sequence[int],
                mesh=None):
    """Seeds 0..seeds-1 in one `jit(vmap(train))`: stacked params [S, ...] and metrics [S, ...].
    With a `mesh` the seeds are split over its devices (`core.parallel.place_seeds`)."""
    keys = place_seeds(seed_keys(seeds), mesh)
    train, _ = make_train(config, policy_cfg, task)
    return jax.jit(jax.vmap(train))(keys)


def fit_seeds(config: RCBCConfig, policy_cfg: PolicyConfig, task: OfflineTask,
              seeds: Sequence[int], logger, mesh=None):
    """`train_seeds`, timed, with its training curve logged: block b (every `log_every`
    updates) as `{"step": b + 1, "update", "loss", "accuracy"}`, means over the seeds, to
    `logger` (a `core.metrics.MetricsLogger`, left open). Returns (params, metrics, seconds)."""
    t0 = time.perf_counter()
    params, metrics = jax.block_until_ready(train_seeds(config, policy_cfg, task, seeds, mesh))
    seconds = time.perf_counter() - t0
    loss, acc = np.asarray(metrics["loss"]), np.asarray(metrics["accuracy"])  # [S, blocks]
    for b in range(loss.shape[1]):
        logger.log({"step": b + 1, "update": (b + 1) * config.log_every,
                    "loss": float(loss[:, b].mean()), "accuracy": float(acc[:, b].mean())})
    return params, metrics, seconds


def evaluate_seeds(policy: SeqPolicy, env, num_episodes: int, target_return: float,
                   return_scale: float = 1.0):
    """Jitted `run(stacked_params, key, env_params, max_steps)`: `evaluate` for every seed's
    params, outputs [S, num_episodes]. `env_params` and `max_steps` are traced, so one
    compilation serves every corridor length."""

    @jax.jit
    def run(params, key, env_params, max_steps):
        keys = jax.random.split(key, jax.tree.leaves(params)[0].shape[0])
        return jax.vmap(
            lambda p, k: evaluate(policy, p, env, env_params, k, num_episodes, max_steps,
                                  target_return, return_scale)
        )(params, keys)

    return run


# -- tasks ---------------------------------------------------------------------------------------

# Full-state linear controller for (Stateless)CartPole: push right iff w . (x, x', theta, theta')
# > 0. Balances all 64 test episodes of the 600-step task (return 1.0); it reads the velocities the
# policy does not see.
CARTPOLE_GAINS = (0.1, 0.5, 10.0, 1.0)


def round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def tmaze_task(min_length: int, max_length: int, segment_len: int) -> OfflineTask:
    """T-Maze with corridor lengths ~ U{min_length..max_length}; RATE's oracle (remember the cue,
    go right, turn to the cue). Horizon: max_length + 2 rounded up to the segment length."""
    if not 1 <= min_length <= max_length:
        raise ValueError(f"need 1 <= min_length <= max_length, got {min_length}, {max_length}")

    def sample_params(k):
        return tmaze.tmaze_params(jax.random.randint(k, (), min_length, max_length + 1))

    return OfflineTask(
        env=tmaze.TMaze(),
        sample_params=sample_params,
        init_memory=tmaze.tmaze_cue,
        act=lambda k, obs, state, cue, p: (tmaze.tmaze_oracle(cue, obs), cue),
        horizon=round_up(max_length + 2, segment_len),
        obs_dim=tmaze.OBS_DIM,
        num_actions=tmaze.NUM_ACTIONS,
    )


def popgym_task(name: str, difficulty: str, segment_len: int) -> OfflineTask:
    """A POPGym task with its oracle (card games: `env.oracle_action`; StatelessCartPole: the
    full-state controller `CARTPOLE_GAINS`). Horizon: the episode length rounded up."""
    env, params = make_popgym(name, difficulty)
    if name == "StatelessCartPole":
        w = jnp.asarray(CARTPOLE_GAINS, jnp.float32)

        def act(k, obs, s, mem, p):
            f = w[0] * s.x + w[1] * s.x_dot + w[2] * s.theta + w[3] * s.theta_dot
            return (f > 0).astype(jnp.int32), mem
    else:
        def act(k, obs, s, mem, p):
            return env.oracle_action(s, p), mem

    obs_dim = env.observation_space(params).shape[0]
    return OfflineTask(
        env=env,
        sample_params=lambda k: params,
        init_memory=lambda obs: jnp.zeros(()),
        act=act,
        horizon=round_up(int(params.max_steps_in_episode), segment_len),
        obs_dim=obs_dim,
        num_actions=env.num_actions,
    )


__all__ = [
    "ARCHS",
    "OfflineTask",
    "PolicyConfig",
    "RCBCConfig",
    "SeqPolicy",
    "bc_loss",
    "collect",
    "dataset_tokens",
    "evaluate",
    "evaluate_seeds",
    "fit_seeds",
    "make_tokens",
    "make_train",
    "popgym_task",
    "tmaze_task",
    "train_seeds",
    "token_dim",
]
