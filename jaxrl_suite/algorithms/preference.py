"""Offline preference optimisation of a causal LM on pairs of completions: DPO and ORPO.

ReST-RL (Zhoubian, Zhang and Tang 2025, arXiv 2508.19576) compares its ReST-GRPO with ReST-DPO:
the policy samples n completions per problem and DPO trains on (best, worst) pairs of those same
samples. This trainer takes the pairs (`PreferencePair`: a prompt's `Example` and two decoded
completions of it); building them (sampling, scoring, picking) is the caller's job.

Each pair becomes two rows in the shared layout of `algorithms.grpo` (the prompt left-padded to
P, the completion + EOS right-padded to N), and one jitted update computes

    log pi(y | x)     token log-probs of chosen and rejected, one forward over the 2B rows
    log pi_ref(y | x) the same under the frozen reference params (DPO only), in the same jitted
                      program, under `jax.lax.stop_gradient`
    loss              `losses.dpo_loss` (Rafailov et al. 2023, arXiv 2305.18290), or
                      `losses.orpo_loss` (Hong et al. 2024, arXiv 2403.07691; no reference)

then one AdamW step (`core.train.make_train_step`). The two rows of a pair are interleaved
(rows 2i and 2i+1) so that each data shard holds both rows of its pairs. The loss is picked by
name from `PREFERENCE_LOSSES` (`PreferenceConfig.loss`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_suite.algorithms.sft import LMTrainer
from jaxrl_suite.core.config import Count, NonNegative, NonNegativeInt, Positive, check_fields
from jaxrl_suite.core.parallel import batch_shards, jit_on_mesh, process_rows, shard_batch
from jaxrl_suite.core.registry import Registry
from jaxrl_suite.core.train import TrainState, init_train_state, make_optimizer, make_train_step
from jaxrl_suite.envs.text import Example, Task
from jaxrl_suite.envs.text.tokenizer import Tokenizer
from jaxrl_suite.losses import dpo_loss, orpo_loss, token_logprobs
from jaxrl_suite.models import CausalLM
from jaxrl_suite.models.sequence import SeqBatch, completion_logits, completion_token_map
from jaxrl_suite.models.sharding import shard_tree
from jaxrl_suite.sampling import Sampler


class PairLoss(NamedTuple):
    """A preference loss on token log-probs: `fn(chosen_logp, chosen_mask, rejected_logp,
    rejected_mask, ref_chosen_logp, ref_rejected_logp, config) -> (loss, metrics)` (all [B, N];
    the reference ones None when `needs_reference` is False)."""

    fn: Callable
    needs_reference: bool


PREFERENCE_LOSSES: Registry[PairLoss] = Registry("preference loss")
PREFERENCE_LOSSES.register("dpo", PairLoss(
    lambda cw, mw, cl, ml, rw, rl, c: dpo_loss(cw, mw, cl, ml, rw, rl, beta=c.beta), True))
PREFERENCE_LOSSES.register("orpo", PairLoss(
    lambda cw, mw, cl, ml, rw, rl, c: orpo_loss(cw, mw, cl, ml, lam=c.lam), False))


@dataclasses.dataclass(frozen=True)
class PreferenceConfig:
    loss: str = "dpo"  # by name in PREFERENCE_LOSSES: "dpo" (needs ref_params) or "orpo"
    beta: Positive = 0.1  # DPO's KL strength beta (the paper's and TRL's 0.1)
    lam: Positive = 0.1  # ORPO's odds-ratio weight lambda (TRL's default)
    lr: Positive = 1e-5  # AdamW learning rate, constant after warm-up (DPO paper: 1e-6 at 7B)
    batch_size: Count = 16  # pairs per update (2 x batch_size rows)
    steps: Count = 100  # updates
    warmup_steps: NonNegativeInt = 0  # linear warm-up steps
    weight_decay: NonNegative = 0.0  # AdamW weight decay
    max_grad_norm: Positive = 1.0  # global-norm gradient clipping
    # Positions per chunk of the output projection (0 = the full [2B, N, V] logits; see
    # losses/chunked.py), as SFTConfig.logprob_chunk.
    logprob_chunk: NonNegativeInt = 0

    def __post_init__(self):
        check_fields(self, "preference.")  # the Ranges declared above
        if self.loss not in PREFERENCE_LOSSES:
            raise ValueError(f"preference.loss must be one of {PREFERENCE_LOSSES.names()}, "
                             f"got {self.loss!r}")


class PreferencePair(NamedTuple):
    """Two decoded completions of one prompt, `chosen` preferred over `rejected`."""

    example: Example
    chosen: str
    rejected: str


class PreferenceBatch(NamedTuple):
    """A batch of B pairs as host or device arrays (leading axis = pairs, sharded over data)."""

    chosen: SeqBatch  # [B, P] prompts, [B, N] chosen completions
    rejected: SeqBatch  # the same prompts, [B, N] rejected completions


class PreferenceTrainer(LMTrainer):
    """DPO or ORPO (`PreferenceConfig.loss`) on pairs of completions of the same prompt.

    `pairs` (optional) is the training set: `batch(cursor)` then serves batch_size of them,
    cyclically from index `cursor`, so `algorithms.loop.fit_resumable` can drive and resume
    the trainer. DPO needs `ref_params` (the frozen reference policy, usually the initial
    params); ORPO uses none (ref_params is then ignored).
    """

    def __init__(
        self, model: CausalLM, tokenizer: Tokenizer, task: Task, config: PreferenceConfig, *,
        mesh, prompt_len: int, max_new_tokens: int, ref_params=None,
        pairs: Sequence[PreferencePair] | None = None, greedy_sampler: Sampler | None = None,
        eval_sampler: Sampler | None = None,
    ):
        pair_loss = PREFERENCE_LOSSES.get(config.loss)
        if pair_loss.needs_reference and ref_params is None:
            raise ValueError(f"preference.loss={config.loss!r} needs reference params "
                             "(ref_params)")
        if pairs is not None and not pairs:
            raise ValueError("pairs must hold at least one PreferencePair (or be None)")
        super().__init__(model, tokenizer, task, mesh=mesh, prompt_len=prompt_len,
                         max_new_tokens=max_new_tokens, greedy_sampler=greedy_sampler,
                         eval_sampler=eval_sampler)
        if config.batch_size % batch_shards(mesh):
            raise ValueError(f"preference.batch_size={config.batch_size} is not a multiple of "
                             f"the {batch_shards(mesh)} batch shards of the mesh (data x fsdp)")
        self.config = config
        self.pairs = None if pairs is None else list(pairs)
        self.ref_params = (shard_tree(ref_params, mesh) if pair_loss.needs_reference
                           else None)
        self.optimizer = make_optimizer(
            config.lr, warmup_steps=config.warmup_steps, weight_decay=config.weight_decay,
            max_grad_norm=config.max_grad_norm,
        )
        c = config

        def seq_logp(params, seq: SeqBatch):  # [rows, N]
            if c.logprob_chunk:
                return completion_token_map(token_logprobs, model, params, seq,
                                            chunk=c.logprob_chunk)
            return token_logprobs(completion_logits(model, params, seq), seq.completion)

        def pair_logp(params, batch: PreferenceBatch):
            """Token log-probs of (chosen, rejected), [B, N] each, from one forward over the
            2B rows, interleaved (row 2i chosen, 2i+1 rejected) to keep pairs on one shard."""
            rows = jax.tree.map(lambda w, lo: jnp.stack([w, lo], axis=1).reshape(
                -1, *w.shape[1:]), batch.chosen, batch.rejected)  # [2B, ...]
            logp = seq_logp(params, rows).reshape(-1, 2, rows.completion.shape[1])  # [B, 2, N]
            return logp[:, 0], logp[:, 1]

        def loss_fn(params, inputs: tuple):
            batch, ref_params = inputs  # ref_params: None unless the loss needs a reference
            chosen_logp, rejected_logp = pair_logp(params, batch)  # [B, N] each
            ref_chosen = ref_rejected = None
            if pair_loss.needs_reference:
                ref_chosen, ref_rejected = jax.lax.stop_gradient(pair_logp(ref_params, batch))
            chosen_mask = batch.chosen.completion_mask  # [B, N]
            rejected_mask = batch.rejected.completion_mask  # [B, N]
            loss, metrics = pair_loss.fn(chosen_logp, chosen_mask, rejected_logp, rejected_mask,
                                         ref_chosen, ref_rejected, c)
            sg = jax.lax.stop_gradient
            # mean sequence log-probs log pi(y_w), log pi(y_l); completion tokens of both rows
            metrics = dict(
                metrics,
                chosen_logp=sg(jnp.mean(jnp.sum(chosen_logp * chosen_mask, axis=-1))),
                rejected_logp=sg(jnp.mean(jnp.sum(rejected_logp * rejected_mask, axis=-1))),
                tokens=jnp.sum(chosen_mask) + jnp.sum(rejected_mask),
            )
            return loss, metrics

        train_step = make_train_step(loss_fn, self.optimizer, trainable=self.trainable)
        self.loss_fn = loss_fn  # pure (params, (PreferenceBatch, ref_params)) -> (loss, metrics)
        self._update = jit_on_mesh(
            lambda state, batch, ref: train_step(state, (batch, ref)), keep_placement=True)

    def _encode_completions(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """[B, N] int32 ids of `text + EOS`, right-padded, and their float32 mask. A sampled
        completion that filled all N tokens without an EOS (cut at max_new_tokens) keeps its
        N tokens and no EOS: the sequence the sampler produced."""
        n, tok = self.max_new_tokens, self.tokenizer
        ids = np.full((len(texts), n), tok.pad_id, np.int32)
        mask = np.zeros((len(texts), n), np.float32)
        for row, text in enumerate(texts):
            tokens = tok.encode(text)
            tokens = tokens[:n] if len(tokens) >= n else tokens + [tok.eos_id]
            ids[row, : len(tokens)] = tokens
            mask[row, : len(tokens)] = 1.0
        return ids, mask

    def pair_batch(self, pairs: Sequence[PreferencePair]) -> PreferenceBatch:
        """Host arrays of `pairs`: (chosen, rejected) `SeqBatch`es over the same prompts."""
        prompt, prompt_mask = self.encode_prompts([p.example for p in pairs])  # [B, P]
        return PreferenceBatch(
            SeqBatch(prompt, prompt_mask, *self._encode_completions([p.chosen for p in pairs])),
            SeqBatch(prompt, prompt_mask, *self._encode_completions([p.rejected for p in pairs])),
        )

    def init_state(self, params, rng) -> TrainState:
        return self.place_state(init_train_state(params, self.optimizer, rng,
                                                 trainable=self.trainable))

    def batch(self, cursor: int) -> list[PreferencePair]:
        """batch_size pairs of the training set, cyclically from index `cursor`."""
        if self.pairs is None:
            raise ValueError("PreferenceTrainer.batch needs the training pairs: pass pairs= to "
                             "the constructor (or call step with your own pairs)")
        n = len(self.pairs)
        return [self.pairs[(cursor + i) % n] for i in range(self.config.batch_size)]

    def step(self, state: TrainState,
             pairs: Sequence[PreferencePair]) -> tuple[TrainState, dict]:
        """One update on `pairs` (the global batch; this process encodes its own rows)."""
        local = pairs[process_rows(len(pairs))]
        batch = shard_batch(self.pair_batch(local), self.mesh)
        return self._update(state, batch, self.ref_params)


__all__ = [
    "PREFERENCE_LOSSES",
    "PairLoss",
    "PreferenceBatch",
    "PreferenceConfig",
    "PreferencePair",
    "PreferenceTrainer",
]
