"""Training a masked-diffusion LM with the LM kit: its SFT objective, its RL log-prob scorer,
and `DiffusionStudy`, the `LMStudy` whose model is a `DiffusionLM`.

    objective = masked_diffusion_objective(model, eos_id)      # SFTTrainer(objective=...)
    scorer = DiffusionScorer(model, eos_id, "coupled")          # GRPOTrainer(scorer=...)
    logp = scorer(params, seq, key)                             # [B, N] token estimates

Nothing here forks a trainer: `SFTTrainer` and `GRPOTrainer` take the objective and the scorer
as parts, and `DiffusionStudy` swaps the model, the samplers (`sampling.diffusion`) and these
two parts into the study kit.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Annotated

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_suite.algorithms.grpo import GRPOTrainer
from jaxrl_suite.algorithms.grpo_config import GRPOConfig
from jaxrl_suite.algorithms.lm_study import LMStudy
from jaxrl_suite.algorithms.sft import SFTTrainer
from jaxrl_suite.core.config import (
    ConfigError,
    Count,
    NonNegativeInt,
    Range,
    check_fields,
)
from jaxrl_suite.core.parallel import shard_batch
from jaxrl_suite.envs.text import Task
from jaxrl_suite.losses.common import token_logprobs
from jaxrl_suite.losses.coupled_grpo import ESTIMATORS
from jaxrl_suite.losses.diffusion import fill_after_eos, mask_completion, masked_diffusion_loss
from jaxrl_suite.models.diffusion_lm import DiffusionLM, check_mask_token, completion_logits
from jaxrl_suite.models.sequence import SeqBatch
from jaxrl_suite.sampling.diffusion import (
    ORDERS,
    DiffusionSampler,
    global_arness,
    local_arness,
    transfer_schedule,
)
from jaxrl_suite.sampling.engines import RolloutConfig, make_engine
from jaxrl_suite.sampling.runner import map_batches


def masked_diffusion_objective(model: DiffusionLM, eos_id: int, *, eps: float = 1e-3):
    """The SFT objective of a diffusion LM: `objective(params, seq, key) -> (loss, metrics)`,
    the masked-diffusion loss (`losses.diffusion`) of one corruption of the solutions (filled
    with EOS after their end; every completion position is a target, the prompt never masked)."""
    mask_id = model.mask_token

    def objective(params, seq: SeqBatch, key):
        targets = fill_after_eos(seq.completion, seq.completion_mask, eos_id)
        noisy, masked, t = mask_completion(key, targets, mask_id, eps=eps)
        logits = completion_logits(model, params, seq.prompt, seq.prompt_mask, noisy)
        return masked_diffusion_loss(logits, targets, masked, t)

    return objective


class DiffusionScorer:
    """Per-token log-prob estimates of a diffusion LM's completions, by a named estimator of
    `losses.coupled_grpo.ESTIMATORS` ("coupled", "single", "full").

    `scorer(params, seq, key) -> [B, N]`: the completion (filled with EOS after its end, as the
    model generated it) is corrupted `passes` ways with `key`, the model runs once on all the
    copies ([passes * B] rows), and the estimator combines the clean tokens' log-probs. Pure
    and jit-compatible; the same key gives the same masks."""

    def __init__(self, model: DiffusionLM, eos_id: int, estimator: str = "coupled"):
        self.model, self.eos_id, self.name = model, eos_id, estimator
        self.estimator = ESTIMATORS.get(estimator)
        self.stochastic = self.estimator.stochastic

    @property
    def passes(self) -> int:
        """Forward passes (corrupted copies) per estimate."""
        return self.estimator.passes

    def __call__(self, params, seq: SeqBatch, key) -> jax.Array:
        targets = fill_after_eos(seq.completion, seq.completion_mask, self.eos_id)  # [B, N]
        noisy, aux = self.estimator.noise(key, targets, self.model.mask_token)  # [K, B, N]
        k, b, n = noisy.shape
        tile = lambda x: jnp.tile(x, (k, 1))
        logits = completion_logits(self.model, params, tile(seq.prompt), tile(seq.prompt_mask),
                                   noisy.reshape(k * b, n))  # [K*B, N, V]
        logp = token_logprobs(logits, tile(targets)).reshape(k, b, n)
        return self.estimator.combine(logp, aux)

    def __repr__(self) -> str:
        return f"DiffusionScorer({self.name!r}, passes={self.passes})"


@functools.partial(jax.jit, static_argnames=("scorer", "draws", "repeats"))
def _all_draws(params, seq: SeqBatch, key, *, scorer, draws: int, repeats: int):
    def one(k):
        est = jax.lax.map(lambda kk: jnp.sum(scorer(params, seq, kk) * seq.train_mask, -1),
                          jax.random.split(k, repeats))
        return jnp.mean(est, axis=0)

    return jax.lax.map(one, jax.vmap(lambda d: jax.random.fold_in(key, d))(jnp.arange(draws)))


def sequence_estimates(scorer: DiffusionScorer, params, seq: SeqBatch, key, *, draws: int,
                       repeats: int = 1) -> np.ndarray:
    """[draws, B] float64 sequence-level estimates sum_i mask_i logp_i of each completion, each
    the mean of `repeats` independent estimates (so a draw costs repeats * passes forwards),
    draw d with key fold_in(key, d). Their variance over draws, at equal forward passes, is the
    estimator variance that coupled sampling lowers (DiffuCoder, sec. 4). The estimators are not
    on one scale: a coupled token term averages about (log p_full + 2 log p) / 2, the authors'
    weighting (see `losses.coupled_grpo`), single and full about log p."""
    return np.asarray(_all_draws(params, seq, key, scorer=scorer, draws=draws,
                                 repeats=repeats), np.float64)


def estimator_variance(scorers: dict[str, DiffusionScorer], params, seq: SeqBatch, key, *,
                       draws: int, passes: int) -> dict[str, dict]:
    """Per estimator, at `passes` forward passes per estimate (passes // its passes repeats,
    averaged; a deterministic estimator is computed once): the variance over `draws` mask draws
    of each completion's sequence log-prob estimate, averaged over the completions
    (`variance`), and the mean estimate (`mean`)."""
    out = {}
    for name, scorer in scorers.items():
        if passes % scorer.passes:
            raise ValueError(f"{passes} forward passes is not a multiple of estimator "
                             f"{name!r}'s {scorer.passes}")
        repeats = passes // scorer.passes if scorer.stochastic else 1  # same value each time
        est = sequence_estimates(scorer, params, seq, key, draws=draws,
                                 repeats=repeats)  # [draws, B]
        out[name] = {"variance": float(est.var(axis=0, ddof=1).mean()),
                     "mean": float(est.mean()), "passes": passes}
    return out


@dataclasses.dataclass(frozen=True)
class DiffusionConfig:
    """How a diffusion LM decodes and how RL estimates its log-probs."""

    steps: Count = 40  # decoding steps for max_new_tokens positions (tokens per step = N / steps)
    order: str = "entropy"  # unmasking order: confidence | entropy | random
    # semi-autoregressive blocks (0 = one block, the whole completion)
    block_size: NonNegativeInt = 0
    estimator: str = "coupled"  # the RL log-prob estimator (losses.coupled_grpo.ESTIMATORS)
    mask_eps: Annotated[float, Range(gt=0, lt=1)] = 1e-3  # the SFT objective's floor on t
    shift: bool = False  # position i - 1 predicts token i (DiffusionLM.shift; Dream/DiffuCoder)

    def __post_init__(self):
        check_fields(self, "diffusion.")  # the Ranges declared above
        if self.order not in ORDERS:
            raise ValueError(f"diffusion.order must be one of {list(ORDERS)}, got {self.order!r}")
        if self.estimator not in ESTIMATORS:
            raise ValueError(f"diffusion.estimator must be one of {list(ESTIMATORS)}, got "
                             f"{self.estimator!r}")


class DiffusionStudy(LMStudy):
    """An `LMStudy` of a masked-diffusion LM: `build_lm` makes a `DiffusionLM` (same sizes,
    same parameter tree as the causal model), the samplers are `DiffusionSampler`s with the
    config's `diffusion` section, SFT trains the masked-diffusion objective, and GRPO trainers
    estimate log-probs with a `DiffusionScorer` (`grpo_trainer(..., estimator=)`)."""

    model_class = DiffusionLM

    def __init__(self, name: str, cfg, opts, *, variants, task: Task | None = None,
                 write_config: bool = True):
        self.model_class = functools.partial(DiffusionLM, shift=cfg.diffusion.shift)
        super().__init__(name, cfg, opts, variants=variants, task=task,
                         write_config=write_config)
        d = cfg.diffusion
        try:
            check_mask_token(self.lm.model, self.lm.tokenizer)
            transfer_schedule(cfg.grpo.max_new_tokens, d.steps, d.block_size)
        except ValueError as e:
            raise ConfigError(f"config section 'diffusion': {e}") from None

    def sampler(self, *, greedy: bool = False, top_k: int = 0, temperature: float = 1.0,
                top_p: float = 1.0, order: str | None = None) -> DiffusionSampler:
        """The study's diffusion sampler for these settings (one compiled program each);
        `order` defaults to diffusion.order. top_k is not supported (must be 0)."""
        if top_k:
            raise ConfigError("grpo.top_k does not apply to a diffusion LM's sampler: set 0")
        d = self.cfg.diffusion
        order = order or d.order
        key = ("diffusion", greedy, temperature, top_p, order)
        if key not in self._samplers:
            rc = RolloutConfig(engine="diffusion", max_new_tokens=self.cfg.grpo.max_new_tokens,
                               temperature=temperature, top_p=top_p)
            self._samplers[key] = make_engine(self.lm.model, rc, self.lm.tokenizer,
                                              steps=d.steps, order=order,
                                              block_size=d.block_size, greedy=greedy)
        return self._samplers[key]

    def decode_orders(self, params, examples, *, temperature: float = 1.0, greedy: bool = False,
                      key=None) -> tuple[np.ndarray, np.ndarray]:
        """Decode `examples` (fixed batches of eval.batch_size rows, one compiled program,
        `sampling.map_batches`; batch b keyed fold_in(key, b)) and return (order [n, N]: each
        position's unmasking rank, completion mask [n, N])."""
        sampler = self.sampler(greedy=greedy)
        trainer = self.lm_trainer()
        key = jax.random.PRNGKey(self.start_seed + 2) if key is None else key

        def run(local, b):
            prompt, prompt_mask = shard_batch(trainer.encode_prompts(local), trainer.mesh)
            out, order = sampler.decode(params, prompt, prompt_mask, jax.random.fold_in(key, b),
                                        temperature=temperature)
            return order, out.mask

        return map_batches(run, examples, batch_size=self.cfg.eval.batch_size, mesh=trainer.mesh)

    def arness(self, params, examples, *, ks=(1,), temperature: float = 1.0,
               greedy: bool = False) -> dict:
        """Local and global AR-ness@k (`sampling.diffusion`) of decoding `examples`:
        {"local@k": ..., "global@k": ...} for k in ks."""
        order, _ = self.decode_orders(params, examples, temperature=temperature, greedy=greedy)
        out = {}
        for k in ks:
            out[f"local@{k}"] = local_arness(order, k)
            out[f"global@{k}"] = global_arness(order, k)
        return out

    def sft_trainer(self, task: Task | None = None) -> SFTTrainer:
        c = self.cfg
        return SFTTrainer(self.lm.model, self.lm.tokenizer, task or self.lm.task, c.sft,
                          mesh=self.lm.mesh, prompt_len=c.task.prompt_len,
                          max_new_tokens=c.grpo.max_new_tokens, **self._eval_samplers(),
                          objective=masked_diffusion_objective(
                              self.lm.model, self.lm.tokenizer.eos_id, eps=c.diffusion.mask_eps))

    def scorer(self, estimator: str | None = None) -> DiffusionScorer:
        """The log-prob scorer of `estimator` (default diffusion.estimator)."""
        return DiffusionScorer(self.lm.model, self.lm.tokenizer.eos_id,
                               estimator or self.cfg.diffusion.estimator)

    def grpo_trainer(self, config: GRPOConfig, ref_params, task: Task | None = None, *,
                     estimator: str | None = None, prompt_len: int | None = None,
                     drafter_params=None) -> GRPOTrainer:
        """A GRPO trainer whose rollouts are diffusion decodes (at the config's temperature and
        top_p) and whose log-probs are `estimator`'s (default diffusion.estimator)."""
        if drafter_params is not None or config.rollout.engine != "static":
            raise ConfigError("grpo.rollout.engine must be 'static' for a diffusion LM")
        rollout = self.sampler(temperature=config.temperature, top_p=config.top_p)
        return GRPOTrainer(self.lm.model, self.lm.tokenizer, task or self.lm.task, config,
                           mesh=self.lm.mesh, prompt_len=prompt_len or self.cfg.task.prompt_len,
                           ref_params=ref_params, sampler=rollout, scorer=self.scorer(estimator),
                           **self._eval_samplers())


__all__ = ["DiffusionConfig", "DiffusionScorer", "DiffusionStudy", "estimator_variance",
           "masked_diffusion_objective", "sequence_estimates"]
