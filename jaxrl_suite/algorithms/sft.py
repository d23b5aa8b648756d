"""Supervised fine-tuning of a causal LM on a verifiable text task, and the base of every LM
trainer.

`LMTrainer` is `sampling.LMRunner` (encoding, completion, scoring, evaluation; the
`models.sequence.SeqBatch` layout of left-padded prompts and right-padded completions) plus what
a trainer needs: the trainable params (a LoRA model's adapters) and the state's placement on the
mesh. `SFTTrainer` trains with teacher forcing on the task's solutions (`losses.sft`), one jitted
generic train step (`core.train.make_train_step`, with gradient micro-batches and chunked
log-probs for memory), or with another supervised objective of the same data (a diffusion LM's).
GRPO (`algorithms.grpo`) starts from its checkpoints.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import jax
import jax.numpy as jnp

from jaxrl_suite.core.config import (
    Count,
    NonNegative,
    NonNegativeInt,
    Positive,
    UnitInterval,
    check_divides,
    check_fields,
)
from jaxrl_suite.core.parallel import (
    batch_shards,
    gradient_compiler_options,
    jit_on_mesh,
    process_rows,
    shard_batch,
)
from jaxrl_suite.core.train import (
    TrainState,
    init_train_state,
    make_optimizer,
    make_train_step,
    micro_batch_count,
)
from jaxrl_suite.envs.text import Example, Task
from jaxrl_suite.envs.text.tokenizer import Tokenizer
from jaxrl_suite.losses import token_logprobs
from jaxrl_suite.losses.sft import sft_loss
from jaxrl_suite.models import CausalLM
from jaxrl_suite.models.lora import trainable_of
from jaxrl_suite.models.sequence import SeqBatch, completion_logits, completion_token_map
from jaxrl_suite.models.sharding import shard_tree
from jaxrl_suite.sampling import LMRunner, Sampler

# The first training-split index of the validation problems (`SFTConfig.stop_accuracy`): far
# beyond any data cursor of a run, so a generated task's validation problems are fresh draws of
# the training distribution (a small task's may repeat training problems; none is held out).
VALIDATION_START = 10**7


@dataclasses.dataclass(frozen=True)
class SFTConfig:
    steps: Count = 300  # teacher-forcing updates on task solutions
    batch_size: Count = 64  # examples per update
    lr: NonNegative = 1e-3  # peak AdamW learning rate (warm-up, then cosine to 10%)
    warmup_steps: NonNegativeInt = 20  # linear warm-up steps
    schedule_steps: Count | None = None  # cosine decay horizon (None = steps; larger = stop early)
    weight_decay: NonNegative = 0.0  # AdamW weight decay
    max_grad_norm: Positive = 1.0  # global-norm gradient clipping
    # Memory (issue 17): rows per gradient micro-batch (0 = the whole batch; gradients are
    # accumulated over batch_size / train_micro_batch micro-batches, same update), and positions
    # per chunk of the output projection (0 = the full [B, T, V] logits; see losses/chunked.py).
    train_micro_batch: NonNegativeInt = 0
    logprob_chunk: NonNegativeInt = 0
    # Early stopping on a validation set (for an RL start that is competent but leaves headroom):
    # every stop_every steps, greedy accuracy on stop_examples training-split problems drawn far
    # beyond the SFT's data cursor (`VALIDATION_START`; never the held-out split); SFT ends at the
    # first check that reaches stop_accuracy (None = off: `steps` steps), at most `steps` steps.
    stop_accuracy: UnitInterval | None = None
    stop_every: Count = 10
    stop_examples: Count = 256

    def __post_init__(self):
        check_fields(self, "sft.")  # the Ranges declared above
        check_divides(self, "sft", self.batch_size, "train_micro_batch")


class LMTrainer(LMRunner):
    """`sampling.LMRunner` (encoding, completion, scoring, evaluation) plus what the SFT and
    GRPO stages train with: the trainable params and the state's placement on the mesh."""

    def __init__(self, model: CausalLM, tokenizer: Tokenizer, task: Task, **kwargs):
        """`LMRunner`'s arguments (mesh, prompt_len, max_new_tokens, samplers)."""
        super().__init__(model, tokenizer, task, **kwargs)
        # A LoRA model (models.lora.apply_lora) trains its adapters alone: the base is frozen
        # (no gradient, no optimizer state) and checkpoints hold the adapters (`Checkpointer`).
        self.trainable = trainable_of(model)

    def place_state(self, state):
        """The state on the mesh: params and optimizer state sharded by `models.sharding`'s
        rules (over fsdp and tensor), replicated over data."""
        return shard_tree(state, self.mesh)


class SFTTrainer(LMTrainer):
    """Teacher forcing on the task's solutions: token-level NLL of `solution + EOS`.

    `objective` replaces that loss with another supervised objective of the same data that
    needs randomness, `objective(params, seq, key) -> (loss, metrics)` with a key drawn per
    step from the state's RNG (fold_in(rng, step)); e.g. the masked-diffusion loss of a
    `DiffusionLM` (`algorithms.diffusion.masked_diffusion_objective`). Such an objective is a
    mean over the whole batch, so it takes no gradient micro-batches."""

    def __init__(self, model, tokenizer, task, config: SFTConfig, *, mesh, prompt_len,
                 max_new_tokens, greedy_sampler: Sampler | None = None,
                 eval_sampler: Sampler | None = None, objective=None):
        super().__init__(model, tokenizer, task, mesh=mesh, prompt_len=prompt_len,
                         max_new_tokens=max_new_tokens, greedy_sampler=greedy_sampler,
                         eval_sampler=eval_sampler)
        self.config = config
        if objective is not None and (config.train_micro_batch or config.logprob_chunk):
            raise ValueError("sft.train_micro_batch and sft.logprob_chunk do not apply to a "
                             "custom SFT objective (a diffusion LM's): set them to 0")
        self.optimizer = make_optimizer(
            config.lr, warmup_steps=config.warmup_steps,
            total_steps=config.schedule_steps or config.steps,
            weight_decay=config.weight_decay, max_grad_norm=config.max_grad_norm,
        )

        check_divides(config, "sft", config.batch_size, "train_micro_batch",
                       shards=batch_shards(mesh))

        def loss_fn(params, seq: SeqBatch):
            if config.logprob_chunk:
                logp = completion_token_map(token_logprobs, model, params, seq,
                                            chunk=config.logprob_chunk)
            else:
                logp = token_logprobs(completion_logits(model, params, seq), seq.completion)
            return sft_loss(logp, seq.train_mask)

        if objective is not None:
            step = make_train_step(lambda params, inputs: objective(params, *inputs),
                                   self.optimizer, trainable=self.trainable)

            def keyed(state: TrainState, seq: SeqBatch):
                key = jax.random.fold_in(jax.random.wrap_key_data(state.rng), state.step)
                return step(state, (seq, key))

            self._update = jit_on_mesh(keyed, keep_placement=True,
                                       compiler_options=gradient_compiler_options())
            return
        # sft_loss is a token mean: micro-batches weigh by their token counts.
        self._update = jit_on_mesh(make_train_step(
            loss_fn, self.optimizer,
            micro_batches=micro_batch_count(config.batch_size, config.train_micro_batch),
            weight_fn=lambda seq: jnp.sum(seq.train_mask), sum_metrics=("tokens",),
            trainable=self.trainable,
        ), keep_placement=True, compiler_options=gradient_compiler_options())

    def init_state(self, params, rng) -> TrainState:
        return self.place_state(init_train_state(params, self.optimizer, rng,
                                                 trainable=self.trainable))

    def batch(self, cursor: int) -> list[Example]:
        return self.task.examples("train", cursor, self.config.batch_size)

    def step(self, state: TrainState, examples: Sequence[Example]) -> tuple[TrainState, dict]:
        local = examples[process_rows(len(examples))]  # this process's rows of the global batch
        seq = shard_batch(self.solution_batch(local), self.mesh)
        return self._update(state, seq)


__all__ = ["VALIDATION_START", "LMTrainer", "SFTConfig", "SFTTrainer"]
