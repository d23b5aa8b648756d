"""GRPO as one XLA program: sample, verify, advantages and update in one `lax.scan` over steps.

PureJaxRL's shape (`make_train(config) -> train(rng)`) for RL of a language model: with a task
whose answers can be checked from tokens (`Task.token_verifier`, `rewards.jax_verify`), a GRPO
step never leaves the device, so

    train = make_grpo_train(config, task, model=model, tokenizer=tok, prompt_len=6)
    state, metrics = jax.jit(jax.vmap(train))(keys, params)        # S seeds, one program

runs a seed sweep as one program (the seed axis sharded over a mesh's data axis with
`GRPOProgram.sweep`). It is the host loop's algorithm (`GRPOTrainer.step`), step for step:

  1. the step's key fold_in(rng, step); its prompts rows [step * pool, (step + 1) * pool) of a
     device-resident prompt table: the training split in the order `GRPOTrainer.batch` reads it
     (pool = prompts_per_step, x max_draws with dynamic sampling);
  2. G completions per prompt from the static KV-cache engine (`KVCacheSampler.generate`, the
     same per-sequence keys: sequence i*G+j of a draw), scored by the task's JAX verifier:
     reward = score + format_weight * format;
  3. with grpo.dynamic_sampling, DAPO's draws (draw d with fold_in(key, d), d >= 1) in a
     `lax.while_loop` until prompts_per_step groups with unequal rewards are drawn or max_draws
     are spent, then `dynamic_sampling.select_groups`'s choice (informative groups in draw
     order, then all-equal ones with their loss mask zeroed);
  4. the configured advantages, reference log-probs when beta > 0 (`GRPOTrainer.logp_fn`),
     and the trainer's pure update (`GRPOTrainer.update_fn`: mu inner steps of
     `losses.objective.grpo_objective`).

The float hyperparameters in `HPARAMS` (lr, beta, clip_eps) may be traced: `train(rng,
params, program.hparams(lr=...))`, and `sweep_grid(keys, params, {"lr": [...], "beta": [...]})`
runs seeds x a grid as one program (`ppo.sweep`'s shape).

Metrics are arrays per step (the host loop's names: reward, reward_std, zero_std_frac, accuracy,
length, tokens, the update's loss / kl / entropy / norms, and kept_frac / draws / filled with
dynamic sampling). `evaluate(params)` is held-out greedy accuracy as a jitted function of the
params. Tested equal to the host loop (tests/algorithms/test_grpo_ondevice.py).

Not on device (refused with a one-line error naming the key): other rollout engines, a rollout
dtype, TIS, SIREN, the collapse guard, carrying the SFT optimizer's moments, a log-prob scorer,
images, and tasks without a token verifier.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from jaxrl_suite.algorithms.dynamic_sampling import informative_groups
from jaxrl_suite.algorithms.grpo import UNSET_ANCHOR, GRPOBatch, GRPOTrainer, GRPOTrainState
from jaxrl_suite.algorithms.grpo_config import GRPOConfig, grpo_optimizer, objective_hparams
from jaxrl_suite.core.parallel import gradient_compiler_options, make_mesh
from jaxrl_suite.core.train import init_train_state
from jaxrl_suite.envs.text import Example, Task
from jaxrl_suite.losses import ADVANTAGES
from jaxrl_suite.models.sequence import SeqBatch

HPARAMS = ("lr", "beta", "clip_eps")  # the float hyperparameters a program may trace


class PromptTable(NamedTuple):
    """Encoded prompts and what their verifier needs, rows on the leading axis:
    prompt [R, P] int32 (left-padded), mask [R, P] bool, gold a pytree of [R, ...] arrays."""

    prompt: jax.Array
    mask: jax.Array
    gold: Any


def prompt_table(trainer: GRPOTrainer, examples: Sequence[Example], verifier) -> PromptTable:
    """The device-resident table of `examples` (encoded on the host once)."""
    ids, mask = trainer.encode_prompts(examples)
    return PromptTable(jnp.asarray(ids, jnp.int32), jnp.asarray(mask, bool),
                       jax.tree.map(jnp.asarray, verifier.gold(examples)))


def _rows(table: PromptTable, start, n: int) -> PromptTable:
    return jax.tree.map(lambda x: jax.lax.dynamic_slice_in_dim(x, start, n), table)


def check_on_device(c: GRPOConfig) -> None:
    """One-line errors for the GRPO options the on-device program does not run (module
    docstring)."""
    for key, off in (("rollout.engine", "static"), ("rollout.dtype", None), ("tis", False),
                     ("collapse_entropy", 0.0), ("carry_optimizer", False)):
        value = functools.reduce(getattr, key.split("."), c)
        if value != off:
            raise ValueError(f"grpo.{key}={value!r} is not run on device (grpo_ondevice): "
                             f"set it to {off!r}")
    if c.entropy_reg == "siren":
        raise ValueError("grpo.entropy_reg='siren' is not run on device (grpo_ondevice)")


class GRPOProgram:
    """GRPO over `steps` steps of `trainer`'s config as pure, jittable functions (module
    docstring): `init(rng, params)`, `run(state, num_steps)`, `train(rng, params)`,
    `evaluate(params)`, and `sweep(keys, params)`, S seeds vmapped in one compiled program."""

    def __init__(self, trainer: GRPOTrainer, *, steps: int | None = None,
                 eval_examples: Sequence[Example] = ()):
        c = trainer.config
        check_on_device(c)
        if trainer.scorer is not None:
            raise ValueError("a GRPOTrainer with a log-prob scorer is not run on device")
        self.verifier = trainer.task.token_verifier(trainer.tokenizer)
        if self.verifier is None:
            raise ValueError(f"task {trainer.task.name!r} has no token verifier "
                             f"(Task.token_verifier): GRPO on device needs one")
        self.trainer, self.config = trainer, c
        self.steps = c.steps if steps is None else steps
        self.draws = c.max_draws if c.dynamic_sampling else 1
        self.pool = c.prompts_per_step * self.draws
        self.table = prompt_table(trainer, trainer.task.examples(
            "train", 0, self.steps * self.pool), self.verifier)
        self.eval_table = prompt_table(trainer, eval_examples, self.verifier) \
            if eval_examples else None
        self.sampler = trainer.sampler
        self._sweeps: dict = {}
        self._runs: dict = {}
        self.advantage = ADVANTAGES.get(c.advantage)

    # ---- traced hyperparameters ----
    def hparams(self, **overrides) -> dict[str, jax.Array]:
        """The traced float hyperparameters (`HPARAMS`): the config's values with `overrides`
        ([] float32 each; a grid's values under vmap).

        Raises:
          ValueError: for a name outside HPARAMS, or beta with grpo.beta = 0 in the config (its
            reference log-probs are only computed with beta > 0).
        """
        unknown = set(overrides) - set(HPARAMS)
        if unknown:
            raise ValueError(f"unknown GRPO hyperparameter(s) {sorted(unknown)}; traced ones are "
                             f"{list(HPARAMS)} (loop over the others in Python)")
        if "beta" in overrides and self.config.beta == 0:
            raise ValueError("a traced grpo.beta needs grpo.beta > 0 in the config (the "
                             "reference log-probs are computed only then)")
        values = {k: getattr(self.config, k) for k in HPARAMS} | overrides
        return {k: jnp.asarray(v, jnp.float32) for k, v in values.items()}

    def _update(self, hp: dict | None):
        """The trainer's update, or the same update at traced `hp` (`GRPOTrainer.make_update`
        with `grpo_optimizer` at hp["lr"] and the objective at hp's beta and clip_eps)."""
        if hp is None:
            return self.trainer.update_fn
        c = self.config  # with beta = 0 the KL term stays out (no reference log-probs)
        return self.trainer.make_update(
            grpo_optimizer(c, hp["lr"]),
            dataclasses.replace(objective_hparams(c), beta=hp["beta"] if c.beta > 0 else 0.0,
                                clip_eps=hp["clip_eps"]))

    # ---- the program ----
    def init(self, rng: jax.Array, params) -> GRPOTrainState:
        """The initial state from `params` (fresh AdamW), as `GRPOTrainer.init_state` makes it
        without a mesh: pure, so it runs inside `train` and under vmap."""
        c = self.config
        base = init_train_state(params, self.trainer.optimizer, rng,
                                trainable=self.trainer.trainable)
        anchor = UNSET_ANCHOR if c.siren_anchor is None else c.siren_anchor
        return GRPOTrainState(**{f.name: getattr(base, f.name) for f in dataclasses.fields(base)},
                              anchor=jnp.asarray(anchor, jnp.float32))

    def draw(self, params, key: jax.Array, rows: PromptTable):
        """One rollout of B prompts: (SeqBatch [B*G rows], old log-probs [B*G, N], rewards
        [B, G], correct [B*G] bool)."""
        c = self.config
        g = c.group_size
        prompt = jnp.repeat(rows.prompt, g, axis=0)  # prompt i -> rows [iG, (i+1)G)
        mask = jnp.repeat(rows.mask, g, axis=0)
        out = self.sampler.generate(params, prompt, mask, key,
                                    jnp.arange(prompt.shape[0], dtype=jnp.int32),
                                    early_exit=False)  # vmapped: no per-seed loop step
        gold = jax.tree.map(lambda x: jnp.repeat(x, g, axis=0), rows.gold)
        scores, fmt = self.verifier(out.tokens, out.mask, gold)
        rewards = scores + c.format_weight * fmt
        seq = SeqBatch(prompt, mask, out.tokens, out.mask)
        return seq, out.logprobs, rewards.reshape(-1, g), scores == 1.0

    def rollout(self, params, key: jax.Array, pool: PromptTable):
        """This step's rollout from its prompt pool: one draw, or DAPO's dynamic sampling.
        Returns (SeqBatch, old log-probs, rewards [B, G], metrics)."""
        c = self.config
        b = c.prompts_per_step
        if not c.dynamic_sampling:
            seq, logp, rewards, correct = self.draw(params, key, pool)
            return seq, logp, rewards, {"accuracy": jnp.mean(correct),
                                        "length": jnp.mean(jnp.sum(seq.completion_mask, 1))}
        d_max, g, n = self.draws, c.group_size, c.max_new_tokens

        def body(carry):
            d, bufs, _ = carry
            k = jax.lax.cond(d == 0, lambda: key, lambda: jax.random.fold_in(key, d))
            seq, logp, rewards, correct = self.draw(params, k, _rows(pool, d * b, b))
            new = (seq.completion, seq.completion_mask, logp, rewards, correct)
            bufs = tuple(jax.lax.dynamic_update_index_in_dim(buf, x, d, 0)
                         for buf, x in zip(bufs, new, strict=True))
            drawn = jnp.arange(d_max) <= d
            found = jnp.sum(informative_groups(bufs[3]) & drawn[:, None])
            return d + 1, bufs, found

        bufs = (jnp.zeros((d_max, b * g, n), jnp.int32), jnp.zeros((d_max, b * g, n)),
                jnp.zeros((d_max, b * g, n)), jnp.zeros((d_max, b, g)),
                jnp.zeros((d_max, b * g), bool))
        drawn, bufs, _ = jax.lax.while_loop(  # until B informative groups or D draws
            lambda carry: (carry[0] < d_max) & (carry[2] < b), body,
            (jnp.int32(0), bufs, jnp.int32(0)))
        tokens, cmask, logp, rewards, correct = bufs
        live = jnp.arange(d_max)[:, None] < drawn  # [D, 1] the draws made
        informative = (informative_groups(rewards) & live).reshape(-1)  # [D*B] in draw order
        idx = jnp.arange(d_max * b)
        spare = jnp.broadcast_to(live, (d_max, b)).reshape(-1) & ~informative
        chosen = jnp.argsort(jnp.where(informative, idx, jnp.where(
            spare, d_max * b + idx, 2 * d_max * b + idx)))[:b]  # `select_groups`'s choice
        filled = jnp.minimum(jnp.sum(informative), b)

        def pick(x):  # [D, B*G, ...] -> the chosen groups' rows [B*G, ...]
            x = x.reshape(d_max * b, g, *x.shape[2:])[chosen]
            return x.reshape(b * g, *x.shape[2:])

        keep = jnp.repeat(jnp.arange(b) < filled, g)[:, None]
        prompt = jnp.repeat(pool.prompt[chosen], g, axis=0)
        pmask = jnp.repeat(pool.mask[chosen], g, axis=0)
        comp_mask = pick(cmask)
        seq = SeqBatch(prompt, pmask, pick(tokens), comp_mask, comp_mask * keep)
        chosen_rewards = rewards.reshape(d_max * b, g)[chosen]  # [B, G]
        std = jnp.std(rewards, axis=2)  # [D, B]
        groups = live * jnp.ones((1, b))
        n_groups = jnp.sum(groups)
        per_draw = jnp.sum(cmask, axis=2)  # [D, B*G] lengths
        metrics = {
            "kept_frac": jnp.sum((std > 0) * groups) / n_groups,
            "draws": drawn.astype(jnp.float32), "filled": filled / b,
            "reward": jnp.sum(jnp.mean(rewards, 2) * groups) / n_groups,
            "reward_std": jnp.sum(std * groups) / n_groups,
            "zero_std_frac": jnp.sum((std == 0) * groups) / n_groups,
            "accuracy": jnp.sum(jnp.mean(correct, 1) * live[:, 0]) / drawn,
            "length": jnp.sum(jnp.mean(per_draw, 1) * live[:, 0]) / drawn,
            "tokens": jnp.sum(per_draw * live)}
        return seq, pick(logp), chosen_rewards, metrics

    def step(self, state: GRPOTrainState, _=None, hparams: dict | None = None
             ) -> tuple[GRPOTrainState, dict]:
        """One GRPO iteration (`GRPOTrainer.step`): the state's step picks the key and the
        prompts; `hparams` (`hparams()`) replaces the config's traced values. Pure: (state,
        metrics of arrays)."""
        c, trainer = self.config, self.trainer
        key = jax.random.fold_in(jax.random.wrap_key_data(state.rng), state.step)
        pool = _rows(self.table, state.step * self.pool, self.pool)
        seq, old_logp, rewards, info = self.rollout(state.params, key, pool)
        advantages = c.advantage_sign * self.advantage(
            rewards, scale=c.adv_scale, eps=c.adv_eps).reshape(-1)
        ref_logp = trainer.logp_fn(trainer.ref_params, seq) if c.beta > 0 else None
        new, metrics = self._update(hparams)(state, GRPOBatch(seq, old_logp, ref_logp,
                                                              advantages))
        std = jnp.std(rewards, axis=1)
        metrics.update(reward=jnp.mean(rewards), reward_std=jnp.mean(std),
                       reward_var=jnp.mean(std ** 2), zero_std_frac=jnp.mean(std == 0),
                       tokens=jnp.sum(seq.completion_mask))
        metrics.update(info)  # the pool's figures with dynamic sampling, as the host loop
        return new, jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), metrics)

    def run(self, state: GRPOTrainState, num_steps: int, hparams: dict | None = None
            ) -> tuple[GRPOTrainState, dict]:
        """`num_steps` steps from `state.step` in one `lax.scan`; metrics [num_steps] each.
        Pure; the prompt table must reach the last step (`steps`)."""
        return jax.lax.scan(functools.partial(self.step, hparams=hparams), state, None,
                            length=num_steps)

    def train(self, rng: jax.Array, params, hparams: dict | None = None
              ) -> tuple[GRPOTrainState, dict]:
        """`init` then all `steps` steps: the whole GRPO run as one function of (rng, params
        [, traced hyperparameters])."""
        return self.run(self.init(rng, params), self.steps, hparams)

    def sweep_grid(self, keys: jax.Array, params, grid: Mapping[str, Sequence[float]]):
        """Seeds x a grid of traced hyperparameters (`HPARAMS`) from shared `params`, in one
        jitted program (vmapped over the grid, then the seeds; `ppo.sweep`'s shape). Returns
        (points, states, metrics): points[g] the g-th grid point (the cartesian product in
        `grid`'s key order), every leaf [G, S, ...]."""
        names = list(grid)
        points = [dict(zip(names, map(float, values), strict=True))
                  for values in itertools.product(*(grid[n] for n in names))]
        hp = jax.tree.map(lambda *x: jnp.stack(x), *[self.hparams(**p) for p in points])
        over_seeds = jax.vmap(self.train, in_axes=(0, None, None))  # params: an argument, not
        fn = jax.jit(jax.vmap(over_seeds, in_axes=(None, None, 0)),  # a constant of the program
                     compiler_options=gradient_compiler_options())
        return (points, *fn(keys, params, hp))

    def evaluate(self, params) -> jax.Array:
        """Held-out greedy accuracy ([] float32) on `eval_examples`: the share whose greedy
        completion scores 1 (`LMRunner.evaluate`), as a pure function of the params."""
        if self.eval_table is None:
            raise ValueError("GRPOProgram.evaluate needs eval_examples")
        t = self.eval_table
        out = self.trainer.greedy_sampler.generate(
            params, t.prompt, t.mask, jax.random.key(0),
            jnp.arange(t.prompt.shape[0], dtype=jnp.int32), early_exit=False)
        scores, _ = self.verifier(out.tokens, out.mask, t.gold)
        return jnp.mean(scores == 1.0)

    def sweep(self, keys: jax.Array, params, *, mesh=None, params_axis: int | None = 0,
              batch: int | None = None):
        """`train` of S seeds as one jitted program (`sweep_fn`): keys [S]; params stacked
        [S, ...] (params_axis=0) or shared (None). Returns (states, metrics), stacked [S, ...]."""
        return self.sweep_fn(params_axis=params_axis, batch=batch, mesh=mesh)(keys, params)

    def sweep_fn(self, *, params_axis: int | None = 0, batch: int | None = None, mesh=None):
        """The jitted S-seed program `(keys, params) -> (states, metrics)`: `jax.vmap` of
        `train` over all S seeds (batch=None), or `batch` seeds vmapped at a time and the
        chunks one after another (`lax.map`; batch=1: the seeds in sequence, no batched
        matmuls). With `mesh`, the seed axis is split over its data axis (S a multiple of its
        size). Compiled with `gradient_compiler_options` (XLA:CPU's dot fusion: the update is
        faster, generation a little slower, the program faster overall). One per setting."""
        key = (params_axis, batch, mesh)
        if key not in self._sweeps:
            def fn(k, p):
                if batch is None:
                    return jax.vmap(self.train, in_axes=(0, params_axis))(k, p)
                if params_axis is None:
                    return jax.lax.map(lambda kk: self.train(kk, p), k, batch_size=batch)
                return jax.lax.map(lambda kp: self.train(*kp), (k, p), batch_size=batch)

            options = {"compiler_options": gradient_compiler_options()}
            if mesh is not None:
                spec = jax.sharding.PartitionSpec
                seeds = jax.sharding.NamedSharding(mesh, spec("data"))
                options["in_shardings"] = (seeds, seeds if params_axis == 0 else
                                           jax.sharding.NamedSharding(mesh, spec()))
            self._sweeps[key] = jax.jit(fn, **options)
        return self._sweeps[key]

    def run_fn(self, num_steps: int):
        """`run(states, num_steps)` of stacked states [S, ...], vmapped and jitted as
        `sweep_fn` compiles (one program per num_steps): the chunks of a resumable sweep."""
        if num_steps not in self._runs:
            self._runs[num_steps] = jax.jit(
                jax.vmap(lambda s: self.run(s, num_steps)),
                compiler_options=gradient_compiler_options())
        return self._runs[num_steps]

    @functools.cached_property
    def train_jit(self):
        """`train` jitted as `sweep_fn` compiles it (one seed)."""
        return jax.jit(self.train, compiler_options=gradient_compiler_options())


def make_grpo_train(config: GRPOConfig, task: Task, *, model, tokenizer, prompt_len: int,
                    mesh=None, ref_params=None, steps: int | None = None):
    """`train(rng, params) -> (state, metrics)`: GRPO of `config` on `task` from `params` as
    one pure function (`GRPOProgram.train`), so `jax.jit(jax.vmap(train))(keys, params)` is a
    seed sweep. Builds the `GRPOTrainer` (on `mesh`, default one device) whose update it runs."""
    mesh = make_mesh(1) if mesh is None else mesh
    trainer = GRPOTrainer(model, tokenizer, task, config, mesh=mesh, prompt_len=prompt_len,
                          ref_params=ref_params)
    return GRPOProgram(trainer, steps=steps).train


__all__ = ["HPARAMS", "GRPOProgram", "PromptTable", "check_on_device", "make_grpo_train",
           "prompt_table"]
