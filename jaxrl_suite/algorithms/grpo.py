"""GRPO for a causal LM on a verifiable text task, from an SFT start (`algorithms.sft`).

GRPO and SFT share one sequence layout and one generic train step (`core.train.make_train_step`):

    [ prompt, left-padded to P | completion, right-padded to N ]      tokens  [B, P+N]

so the logits that predict completion token j sit at position P-1+j. The heavy parts (generation,
log-probs, the update) are jitted once for their fixed shapes; rewards are Python callables on
decoded text and run on the host between the jitted calls.

GRPO step (DeepSeekMath, arXiv 2402.03300; docs/layout.md draws it):
  1. G completions per prompt from the rollout engine (`grpo.rollout.engine`,
     `sampling.engines`), which also returns their log-probs; those are the old log-probs of the
     ratio (nothing is recomputed for them);
  2. rewards from the task's verifier, then advantages (`grpo.advantage`, `losses.ADVANTAGES`);
  3. reference log-probs from the frozen reference params (only when beta > 0);
  4. mu inner updates of GRPO's objective (`losses.objective.grpo_objective`: the policy loss
     `grpo.policy_loss` plus the entropy regulariser `grpo.entropy_reg`) against the stored old
     log-probs, as one jitted `lax.scan`.
The config and the typed parts built from it are `algorithms.grpo_config`.

Memory (issue 17; the `grpo.memory` section, all off by default): the rollout is sampled
`grpo.memory.rollout_micro_batch` rows per call, optionally in another compute dtype
(`grpo.rollout.dtype`, e.g. a bf16 rollout of a float32 model, corrected by truncated importance
sampling: `tis`, `losses.policy.tis_weight`, old log-probs then recomputed by the trainer);
log-probs are recomputed `logprob_micro_batch` rows at a time; gradients are accumulated over
`train_micro_batch`-row micro-batches (`core.train.make_train_step`); and `logprob_chunk`
projects the hidden states to logits a few positions at a time (`losses.chunked`), so the
[B, N, V] logits never exist.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import time
from collections.abc import Sequence
from typing import Any, NamedTuple

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_suite.algorithms.dynamic_sampling import dynamic_rollout
from jaxrl_suite.algorithms.grpo_config import (
    GRPOConfig,
    check_scorer_config,
    grpo_optimizer,
    objective_hparams,
    rollout_config,
)
from jaxrl_suite.algorithms.sft import LMTrainer
from jaxrl_suite.core.parallel import (
    batch_shards,
    gather_rows,
    gradient_compiler_options,
    host_local,
    jit_on_mesh,
    print0,
    process_rows,
    shard_batch,
)
from jaxrl_suite.core.train import (
    TrainState,
    carry_adam_moments,
    init_train_state,
    keep_finite,
    make_train_step,
    map_rows,
)
from jaxrl_suite.envs.text import Example, format_reward
from jaxrl_suite.envs.text.base import verdict_metrics
from jaxrl_suite.losses import (
    ADVANTAGES,
    REGULARIZERS,
    token_entropy,
    token_logprobs,
)
from jaxrl_suite.losses.chunked import logprobs_and_entropy
from jaxrl_suite.losses.objective import (
    TOKEN_MEAN_LOSS_TYPES,
    ObjectiveBatch,
    ObjectiveHParams,
    TokenStats,
    grpo_objective,
)
from jaxrl_suite.losses.siren import (
    as_regularizer,
    siren_from_entropies,
    siren_regularizer,
    top_p_entropy,
)
from jaxrl_suite.models import CausalLM
from jaxrl_suite.models.sequence import (
    SeqBatch,
    completion_embeddings,
    completion_logits,
    completion_token_map,
)
from jaxrl_suite.models.sharding import shard_tree
from jaxrl_suite.sampling import LearningSampler, Sampler, repeat_each
from jaxrl_suite.sampling.engines import make_engine, sample_rollout


class GRPOBatch(NamedTuple):
    seq: SeqBatch
    old_logp: jax.Array  # [B*G, N] sampler log-probs
    ref_logp: jax.Array | None  # [B*G, N] reference log-probs (None when beta == 0)
    advantages: jax.Array  # [B*G]
    # [B*G, N] the sampler's log-probs when grpo.tis is on (old_logp then holds the trainer's
    # recomputed ones); None otherwise.
    sampler_logp: jax.Array | None = None
    # With a stochastic log-prob scorer (a diffusion LM's, `GRPOTrainer(scorer=)`): [mu, 2]
    # uint32 key data, one mask seed per inner iteration; old_logp / ref_logp are then
    # [mu, B*G, N], the estimates under that iteration's masks (old_logp None when mu = 1:
    # the current estimate, detached, as the authors do).
    mask_keys: jax.Array | None = None
    # [B*G, N] non-negative per-token weights of the pg term's mask (e.g. from a task;
    # `losses.grpo.grpo_loss`'s token_weights): a zero weight drops the token from the pg term.
    # None: all 1 (`GRPOTrainer.update(..., token_weights=)`).
    token_weights: jax.Array | None = None


# An entropy is >= 0, so -1 marks "no anchor" (not NaN: a multi-host `device_put` checks that
# every process passes the same value, and NaN != NaN).
UNSET_ANCHOR = -1.0


@flax.struct.dataclass
class GRPOTrainState(TrainState):
    """The GRPO train state: `TrainState` plus SIREN's anchor, what the rollout engine has
    learned and the reward-hacking guard's verdict, all checkpointed with it, so a resumed run
    continues exactly where the saved one stood.

    `step` counts GRPO iterations (one `GRPOTrainer.update`, whatever `mu`). `sampler` is
    host-side (not placed on the mesh); it and `collapsed` stay out of the jitted update."""

    anchor: jax.Array  # float32 scalar: SIREN's target entropy (>= 0); UNSET_ANCHOR = not set
    # The rollout engine's `learning_state` (`sampling.base.LearningSampler`: the continuous
    # engine's length table, the speculative drafter and its Adam state); None: it learns none.
    sampler: Any = None
    # bool scalar, placed like `step`: the last verdict of the reward-hacking guard
    # (grpo.collapse_entropy), so its warning comes once when a collapse starts, resumed or not.
    collapsed: Any = None


class GRPOTrainer(LMTrainer):
    """GRPO: sample G completions per prompt, score them, update the configured policy loss on
    their advantages (`GRPOConfig.policy_loss`, `advantage`, `entropy_reg`).

    The token log-probs of the ratio and the KL are the causal LM's exact ones, unless a
    `scorer` replaces them: `scorer(params, seq, key) -> [B*G, N]` estimates them (a masked-
    diffusion LM's `algorithms.diffusion.DiffusionScorer`: coupled, single-mask or full-mask
    estimates, `losses.coupled_grpo`). With a scorer, each GRPO step draws mu mask seeds from
    the state's RNG, one per inner iteration, and the old (when mu > 1), reference and current
    log-probs of that iteration share it (DiffuCoder's `mask_seeds`); the sampler's log-probs
    are not used, and the estimates are of the model at temperature 1 whatever
    grpo.temperature samples the rollouts at (as the authors' trainer)."""

    def __init__(self, model, tokenizer, task, config: GRPOConfig, *, mesh, prompt_len,
                 ref_params=None, sampler: Sampler | None = None,
                 greedy_sampler: Sampler | None = None, eval_sampler: Sampler | None = None,
                 scorer=None):
        """`sampler` draws the rollouts (default: a `KVCacheSampler` with the config's
        temperature, top_k and top_p); greedy_sampler / eval_sampler as in `LMTrainer`;
        `scorer` as in the class docstring."""
        super().__init__(model, tokenizer, task, mesh=mesh, prompt_len=prompt_len,
                         max_new_tokens=config.max_new_tokens, greedy_sampler=greedy_sampler,
                         eval_sampler=eval_sampler)
        if config.beta > 0 and ref_params is None:
            raise ValueError("grpo.beta > 0 needs reference params (ref_params)")
        if scorer is not None:
            check_scorer_config(config, sampler)
        self.config, self.scorer = config, scorer
        self.ref_params = None if ref_params is None else shard_tree(ref_params, mesh)
        self.optimizer = grpo_optimizer(config)
        c = config
        rows = c.prompts_per_step * c.group_size
        c.memory.check_rows(rows, shards=batch_shards(mesh))
        # The rollout's model: the same params, computed in grpo.rollout.dtype when it is set.
        dtype = c.rollout.dtype
        self.sampler_model = model if dtype in (None, model.config.dtype) else CausalLM(
            dataclasses.replace(model.config, dtype=dtype))
        self.sampler = sampler or make_engine(self.sampler_model, rollout_config(c),
                                              tokenizer)
        if c.rollout.engine == "continuous" and c.rollout.slots % batch_shards(mesh):
            raise ValueError(f"grpo.rollout.slots={c.rollout.slots} is not a multiple of the "
                             f"{batch_shards(mesh)} batch shards of the mesh (data x fsdp)")
        regularizer = as_regularizer(REGULARIZERS.get(c.entropy_reg))
        top_p = "top_p_entropy" in regularizer.needs  # chunked: the top-p entropy per chunk

        def logp_fn(params, seq: SeqBatch):
            logits = completion_logits(model, params, seq) / c.temperature
            return logits, token_logprobs(logits, seq.completion)

        def chunked(fn, params, seq: SeqBatch):
            return completion_token_map(fn, model, params, seq, chunk=c.memory.logprob_chunk,
                                        temperature=c.temperature)

        def token_stats(logits, targets):  # one block: log-probs, entropy (, top-p entropy)
            logp, ent = logprobs_and_entropy(logits, targets)
            return (logp, ent, top_p_entropy(logits, p=c.siren_top_p)) if top_p else (logp, ent)

        def seq_logp(params, seq: SeqBatch):  # [rows, N], no logits kept
            if scorer is not None:  # one estimate under a fixed mask seed
                return scorer(params, seq, jax.random.key(0))
            if c.memory.logprob_chunk:
                return chunked(token_logprobs, params, seq)
            return logp_fn(params, seq)[1]

        def model_stats(params, seq: SeqBatch) -> TokenStats:  # the objective's statistics
            if c.memory.logprob_chunk:
                logp, ent, *h_p = chunked(token_stats, params, seq)
                return TokenStats(logp, ent, top_p_entropy=h_p[0] if top_p else None)
            logits, logp = logp_fn(params, seq)
            return TokenStats(logp, token_entropy(logits), logits=logits)

        advantage = ADVANTAGES.get(c.advantage)

        def make_update(optimizer=None, hp: ObjectiveHParams | None = None):
            """The pure update (state, GRPOBatch) -> (state, metrics) with `optimizer` (default
            the trainer's) and the objective's hyperparameters `hp` (default the config's,
            `objective_hparams`); their float values may be traced (`algorithms.grpo_ondevice`
            sweeps learning rates and betas in one program). The optimizer state's structure
            must be the trainer's."""
            optimizer = self.optimizer if optimizer is None else optimizer
            hp = objective_hparams(c) if hp is None else hp
            k = hp.micro_batches
            token_mean_loss = c.loss_type in TOKEN_MEAN_LOSS_TYPES

            def loss_fn(params, inputs: tuple):
                # anchor: [] SIREN's target entropy, from the train state; with micro-batches,
                # n_tokens: [] the valid tokens of the whole batch
                batch, anchor = inputs[:2]
                if scorer is not None:  # estimated log-probs under this iteration's mask seed
                    stats = TokenStats(scorer(params, batch.seq,
                                              jax.random.wrap_key_data(batch.mask_keys)))
                else:
                    stats = model_stats(params, batch.seq)
                return grpo_objective(stats, ObjectiveBatch(
                    batch.seq.train_mask, batch.old_logp, batch.ref_logp, batch.advantages,
                    batch.sampler_logp, batch.token_weights, anchor,
                    inputs[2] if k > 1 else None), hp)

            # Micro-batch weights: 1 for a mean over rows (grpo, dr_grpo), the token count for a
            # token mean (dapo, bnpo); see core.train.make_train_step.
            train_step = make_train_step(
                loss_fn, optimizer, micro_batches=k, trainable=self.trainable,
                weight_fn=(lambda inputs: jnp.sum(inputs[0].seq.train_mask > 0))
                if token_mean_loss else None)

            def update(state: GRPOTrainState, batch: GRPOBatch):
                """The mu inner steps on one batch as one scan, metrics averaged over them; all or
                nothing under the non-finite guard, and `step` advances by one."""
                extra = () if k == 1 else (
                    jnp.sum(batch.seq.train_mask > 0).astype(jnp.float32),)
                if batch.mask_keys is None:
                    new, metrics = jax.lax.scan(
                        lambda s, _: train_step(s, (batch, s.anchor, *extra)), state, None,
                        length=c.mu)  # metrics: [mu] each
                else:  # inner iteration i: mask seed i and the old / ref estimates under it
                    def inner(s, xs):
                        key, old, ref = xs
                        b = batch._replace(mask_keys=key, old_logp=old, ref_logp=ref)
                        return train_step(s, (b, s.anchor, *extra))

                    new, metrics = jax.lax.scan(
                        inner, state, (batch.mask_keys, batch.old_logp, batch.ref_logp))
                finite = jnp.all(metrics.pop("finite"))
                metrics = jax.tree.map(lambda x: jnp.mean(x, axis=0), metrics)
                new = keep_finite(new.replace(step=state.step + 1), state, finite)
                return new, dict(metrics, finite=finite)

            return update

        self.make_update = make_update
        self.update_fn = make_update()  # pure (state, GRPOBatch) -> (state, metrics)
        if scorer is not None:
            def mask_keys(state: GRPOTrainState):  # [mu, 2]: this step's mask seeds
                key = jax.random.fold_in(jax.random.wrap_key_data(state.rng), state.step)
                return jax.random.key_data(jax.random.split(jax.random.fold_in(key, 1), c.mu))

            self._mask_keys = jax.jit(mask_keys)
            # [mu, rows, N]: the estimates under each mask seed, no gradient
            self._score = jit_on_mesh(lambda p, seq, keys: jax.lax.map(
                lambda k: scorer(p, seq, jax.random.wrap_key_data(k)), keys))
        self._update = jit_on_mesh(self.update_fn, keep_placement=True,
                                   compiler_options=gradient_compiler_options())
        # Log-probs of the completions (reference; the trainer's old ones under TIS), no
        # gradient, grpo.memory.logprob_micro_batch rows at a time.
        # pure (params, SeqBatch) -> [rows, N], e.g. inside another program
        self.logp_fn = lambda p, seq: map_rows(functools.partial(seq_logp, p), seq,
                                               c.memory.logprob_micro_batch)
        self._logp = jit_on_mesh(self.logp_fn)

        def siren_entropy(p, seq: SeqBatch):
            if c.memory.logprob_chunk:
                _, ent, h_p = chunked(token_stats, p, seq)
                return siren_from_entropies(h_p, ent, seq.train_mask,
                                            quantile=c.siren_quantile, anchor=0.0,
                                            coef=0.0)[1]["siren_entropy"]
            return siren_regularizer(logp_fn(p, seq)[0], seq.train_mask,
                                     top_p=c.siren_top_p, quantile=c.siren_quantile,
                                     anchor=0.0, coef=0.0)[1]["siren_entropy"]

        self._siren_entropy = jit_on_mesh(siren_entropy)
        self._advantages = jax.jit(
            lambda r: c.advantage_sign * advantage(r, scale=c.adv_scale, eps=c.adv_eps
                                                   ).reshape(-1))
        self._embed = jit_on_mesh(functools.partial(completion_embeddings, model))

    def init_state(self, params, rng, *, anchor: float | None = None,
                   sft_opt_state=None) -> GRPOTrainState:
        """The initial state. `anchor` is SIREN's target entropy (default `grpo.siren_anchor`).
        With `entropy_reg="siren"` and neither set, it is measured as the paper anchors it: H_bar
        of the initial policy `params` on the first batch (`measure_anchor(state,
        batch(0))`). Otherwise unused, it is `UNSET_ANCHOR`.

        `sft_opt_state`: the optimizer state of the SFT that produced `params`; with
        grpo.carry_optimizer its Adam moments start this state's (`carry_adam_moments`).

        A learning rollout engine starts afresh (`init_learning_state`): the state carries what
        it learns from here on (`use_sampler_state`)."""
        c = self.config
        if c.carry_optimizer and sft_opt_state is None:
            raise ValueError("grpo.carry_optimizer needs the SFT optimizer state: "
                             "init_state(..., sft_opt_state=sft_state.opt_state)")
        anchor = c.siren_anchor if anchor is None else anchor
        base = init_train_state(params, self.optimizer, rng, trainable=self.trainable)
        if c.carry_optimizer:
            base = base.replace(opt_state=carry_adam_moments(base.opt_state, sft_opt_state))
        state = GRPOTrainState(
            **{f.name: getattr(base, f.name) for f in dataclasses.fields(base)},
            anchor=jnp.asarray(UNSET_ANCHOR if anchor is None else anchor, jnp.float32),
            sampler=(self.sampler.init_learning_state()
                     if isinstance(self.sampler, LearningSampler) else None),
            collapsed=jnp.asarray(False),
        )
        self.use_sampler_state(state)
        if anchor is None and c.entropy_reg == "siren":
            measured = self.measure_anchor(state, self.batch(0)[: c.prompts_per_step])
            state = state.replace(anchor=jnp.asarray(measured, jnp.float32),
                                  sampler=self._sampler_state())  # the engine saw that rollout
        return self.place_state(state.replace(sampler=None)).replace(
            sampler=state.sampler)  # host-side: not placed

    def use_sampler_state(self, state: GRPOTrainState) -> None:
        """Set the rollout engine's learning state to `state`'s (`GRPOTrainState.sampler`; a
        no-op for an engine that learns nothing). A step calls it before its rollout, and
        the update stores the engine's new state back, so the train state, not the sampler,
        carries what the engine has learned: a resumed run, or a new run on the same trainer,
        continues from its own."""
        if state.sampler is not None:
            self.sampler.learning_state = state.sampler

    def _sampler_state(self):
        """The rollout engine's learning state now (None for an engine that learns nothing)."""
        return self.sampler.learning_state if isinstance(self.sampler, LearningSampler) else None

    def batch(self, cursor: int) -> list[Example]:
        """The prompts of one step: prompts_per_step, or max_draws times as many with
        grpo.dynamic_sampling (the pool `step` draws its rollouts from, in order)."""
        c = self.config
        n = c.prompts_per_step * (c.max_draws if c.dynamic_sampling else 1)
        return self.task.examples("train", cursor, n)

    def rollout(self, state: TrainState, examples: Sequence[Example], *,
                group_size: int | None = None, key: jax.Array | None = None):
        """Sample G completions per prompt and score them.

        Each process samples and scores its own prompts (`process_rows`); the rewards of all
        processes are gathered, so `rewards` and `info` describe the whole global batch.
        `group_size` overrides G (e.g. 1 for the later turns of a multi-turn episode) and `key`
        the sampling key (default: the state's RNG folded with its step).
        Returns (SeqBatch [B*G rows], old_logp [B*G, N], rewards [B, G], info); info's
        `correct` [B, G] is each rollout's verdict (1.0 when the verifier scores it 1).
        """
        c = self.config
        g = c.group_size if group_size is None else group_size
        rows = process_rows(len(examples))
        local = examples[rows]
        group = repeat_each(local, g)  # prompt i -> rows [iG, (i+1)G)
        encoded = self.prompt_inputs(group)  # host arrays [rows, P]: this process's rows
        prompt, prompt_mask, images = placed = shard_batch(encoded, self.mesh)
        if key is None:
            key = jax.random.fold_in(jax.random.wrap_key_data(state.rng), state.step)
        # global row = prompt index * G + sample index: the sequence's id for its keys
        out = sample_rollout(self.sampler, state.params, encoded, placed, key,
                             mesh=self.mesh, micro=c.memory.rollout_micro_batch,
                             first_row=(rows.start or 0) * g)
        mask = host_local(out.mask)
        texts = self.tokenizer.decode_batch(host_local(out.tokens), mask)
        verdicts = self.task.verify_batch(texts, group)
        # the task's designed reward where it has one, else correctness + format
        designed = verdicts.rewards or [None] * len(texts)
        per_row = gather_rows(np.array([  # [B*G, 3]: reward, correct, length
            [s + c.format_weight * format_reward(t) if r is None else r, s == 1.0, m.sum()]
            for s, r, t, m in zip(verdicts.scores, designed, texts, mask, strict=True)
        ], np.float32))
        rewards = per_row[:, 0].reshape(len(examples), g)
        seq = SeqBatch(prompt, prompt_mask, out.tokens, out.mask, images=images)
        info = {"accuracy": float(per_row[:, 1].mean()), "length": float(per_row[:, 2].mean()),
                "tokens": int(per_row[:, 2].sum()), "correct": per_row[:, 1].reshape(rewards.shape)}
        if jax.process_count() == 1:  # this process's rows (the whole batch on one host)
            info.update(verdict_metrics(verdicts))
        return seq, out.logprobs, rewards, info

    def measure_anchor(self, state: TrainState, examples: Sequence[Example]) -> float:
        """SIREN's anchor: H_bar (top-p entropy of the peak-entropy tokens) of the policy in
        `state` on one rollout of `examples` (sampled with the state's key). `init_state`
        measures it on the initial policy's first batch unless given one; the trainer keeps
        nothing, the anchor is checkpointed with the state."""
        seq, _, _, _ = self.rollout(state, examples)
        return float(self._siren_entropy(state.params, seq))

    def step(self, state: GRPOTrainState,
             examples: Sequence[Example]) -> tuple[GRPOTrainState, dict]:
        """One GRPO iteration on `examples`: `rollout` (`dynamic_rollout` with
        grpo.dynamic_sampling), then `update` with the configured advantages; the rollout
        engine continues from `state`'s learning state (`use_sampler_state`)."""
        self.use_sampler_state(state)
        t0 = time.perf_counter()
        if self.config.dynamic_sampling:
            seq, old_logp, rewards, info, pool = self.dynamic_rollout(state, examples)
        else:
            seq, old_logp, rewards, info = self.rollout(state, examples)
            pool = {}
        info = dict(info, gen_time=time.perf_counter() - t0)
        state, metrics = self.update(state, seq, old_logp, rewards, info, t0=t0)
        state, engine = self.sampler_metrics(state, seq, rewards)
        return state, {**metrics, **pool, **engine}

    def dynamic_rollout(self, state: GRPOTrainState, examples: Sequence[Example]):
        """DAPO's dynamic sampling (`algorithms.dynamic_sampling.dynamic_rollout`) over the pool
        `examples` (`batch`'s max_draws x B prompts), B prompts a `rollout` from the step's key:
        `rollout`'s four outputs for the B kept groups, and the pool's metrics."""
        key = jax.random.fold_in(jax.random.wrap_key_data(state.rng), state.step)
        return dynamic_rollout(lambda ex, k: self.rollout(state, ex, key=k), examples, key,
                               b=self.config.prompts_per_step, g=self.config.group_size,
                               mesh=self.mesh)

    def sampler_metrics(self, state: GRPOTrainState, seq: SeqBatch, rewards: np.ndarray
                        ) -> tuple[GRPOTrainState, dict]:
        """(state, the rollout engine's numbers for the metrics log: "rollout_" + its
        `last_stats`: decode steps, acceptance rate, draft length, ...). A sampler with `learn`
        (the speculative sampler's drafter) first learns from this rollout and the updated
        policy `state.params` (`learn(params, seq, rewards)`, its metrics prefixed "drafter_");
        the returned state holds what it learned."""
        out = {}
        if hasattr(self.sampler, "learn"):
            t0 = time.perf_counter()
            learned = self.sampler.learn(state.params, seq, rewards)
            out.update({k if k.startswith("drafter_") else f"drafter_{k}": float(v)
                        for k, v in learned.items()}, drafter_time=time.perf_counter() - t0)
        stats = getattr(self.sampler, "last_stats", {})
        out.update({f"rollout_{k}": float(v) for k, v in stats.items()
                    if isinstance(v, int | float | np.number)})
        return state.replace(sampler=self._sampler_state()), out

    def update(self, state: GRPOTrainState, seq: SeqBatch, old_logp, rewards: np.ndarray,
               info: dict, *, advantages: np.ndarray | None = None,
               t0: float | None = None, behaviour_logp=None,
               token_weights=None) -> tuple[GRPOTrainState, dict]:
        """The `mu` policy updates on a rollout (`rollout`'s outputs), one jitted scan; the
        metrics are their means (`finite`: all of them). `advantages` [B*G] replaces the
        configured ones (e.g. after ExIt's diversity bonus); `t0` is when the rollout started
        (for the throughput metrics). `behaviour_logp` [B*G, N]: the log-probs of the
        parameters that generated each token when they are older than `old_logp`'s (an
        off-policy rollout, algorithms/agent.py); each token's pg term is then weighted by
        the truncated importance weight min(exp(old_logp - behaviour_logp), grpo.tis_cap).
        `token_weights` [B*G, N] (the global batch, like `advantages`): non-negative weights of
        each token's pg term (`GRPOBatch.token_weights`; a zero weight drops the token from the
        pg term's numerator and denominator); None: all 1."""
        if self.config.entropy_reg == "siren" and float(state.anchor) == UNSET_ANCHOR:
            raise ValueError("grpo.entropy_reg='siren' needs an anchor: set grpo.siren_anchor or "
                             "pass GRPOTrainer.init_state(..., anchor=measure_anchor(...))")
        t0 = time.perf_counter() if t0 is None else t0
        if advantages is None:
            advantages = self.group_advantages(rewards)  # [B*G], the same on every process
        advantages = shard_batch(np.asarray(advantages, np.float32)[
            process_rows(advantages.shape[0])], self.mesh)
        if token_weights is not None:
            token_weights = shard_batch(np.asarray(token_weights, np.float32)[
                process_rows(token_weights.shape[0])], self.mesh)
        if self.scorer is not None:
            if behaviour_logp is not None:
                raise ValueError("behaviour_logp (off-policy rollouts) does not apply to a "
                                 "GRPOTrainer with a scorer")
            keys = self._mask_keys(state)
            batch = GRPOBatch(
                seq, self._score(state.params, seq, keys) if self.config.mu > 1 else None,
                self._score(self.ref_params, seq, keys) if self.config.beta > 0 else None,
                advantages, mask_keys=keys, token_weights=token_weights)
            return self._finish_update(state, batch, rewards, info, t0)
        ref_logp = self._logp(self.ref_params, seq) if self.config.beta > 0 else None
        if self.config.tis:  # the trainer's own old log-probs; the sampler's weigh the tokens
            batch = GRPOBatch(seq, self._logp(state.params, seq), ref_logp, advantages,
                              sampler_logp=old_logp, token_weights=token_weights)
        elif behaviour_logp is not None:
            batch = GRPOBatch(seq, old_logp, ref_logp, advantages, sampler_logp=behaviour_logp,
                              token_weights=token_weights)
        else:
            batch = GRPOBatch(seq, old_logp, ref_logp, advantages, token_weights=token_weights)
        return self._finish_update(state, batch, rewards, info, t0)

    def _finish_update(self, state, batch: GRPOBatch, rewards, info, t0):
        """The jitted update on `batch`, and the step's metrics. The new state holds the
        rollout engine's learning state as the rollout left it, and the guard's verdict."""
        verdict = state.collapsed
        collapsed = verdict is not None and bool(verdict)
        state, metrics = self._update(state.replace(sampler=None, collapsed=None), batch)
        state = state.replace(sampler=self._sampler_state(), collapsed=verdict)
        metrics = {k: float(v) for k, v in metrics.items()}
        dt = time.perf_counter() - t0
        t_gen = info.get("gen_time", 0.0)
        std = rewards.std(axis=1)
        metrics.update(
            reward=float(rewards.mean()), reward_std=float(std.mean()),
            reward_var=float(np.mean(std ** 2)),
            zero_std_frac=float(np.mean(std == 0)), accuracy=info["accuracy"],
            length=info["length"], tokens=float(info["tokens"]),
            tokens_per_s=info["tokens"] / dt, gen_time=t_gen, update_time=dt - t_gen,
        )
        metrics.update({k: v for k, v in info.items() if k.startswith(("outcome_", "reward_"))})
        threshold = self.config.collapse_entropy
        if threshold > 0 and "outcome_entropy" in info:  # the reward-hacking guard
            metrics["collapse"] = float(info["outcome_entropy"] < threshold)
            if metrics["collapse"] and not collapsed:  # warn when it starts
                print0(f"WARNING: step {int(state.step)}: the entropy of the predicted classes "
                       f"over the batch is {info['outcome_entropy']:.3f} bits, below "
                       f"grpo.collapse_entropy={threshold} (policy collapse / reward hacking?)")
            now = np.asarray(bool(metrics["collapse"]))  # placed as it was: one update program
            state = state.replace(collapsed=jnp.asarray(now) if verdict is None else
                                  jax.device_put(now, verdict.sharding))
        return state, metrics

    def completion_logprobs(self, params, seq: SeqBatch) -> jax.Array:
        """Log-probs [rows, N] of `seq`'s completion tokens under `params` at the sampling
        temperature (no gradient; grpo.memory.logprob_micro_batch rows at a time)."""
        return self._logp(params, seq)

    def group_advantages(self, rewards: np.ndarray) -> np.ndarray:
        """The configured advantages (`grpo.advantage`, times grpo.advantage_sign) of rewards
        [B, G], flattened to [B*G]."""
        return np.asarray(self._advantages(rewards))

    def negated(self) -> GRPOTrainer:
        """The negated-advantage control on this trainer's compiled programs: a shallow copy
        with grpo.advantage_sign flipped (its `group_advantages` are -1 times this one's), so
        the control compiles nothing new."""
        other = copy.copy(self)
        other.config = dataclasses.replace(self.config,
                                           advantage_sign=-self.config.advantage_sign)
        other._advantages = lambda r: -self._advantages(r)
        return other

    def completion_embeddings(self, params, seq: SeqBatch) -> jax.Array:
        """The policy's mean-pooled final hidden states over each completion: [B*G, D]."""
        return self._embed(params, seq)
