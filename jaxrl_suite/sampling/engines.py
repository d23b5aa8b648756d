"""The rollout engines behind one registry, chosen in one place (`make_engine`).

A GRPO rollout is drawn by a `Sampler` (`sampling.base`); which one is a config choice,
`RolloutConfig.sampler` (the `grpo.sampler` key), with the options only that engine takes:

    "static"       KVCacheSampler: every row of the rollout decoded at once (kv_cache.py);
    "continuous"   ContinuousSampler: `slots` KV-cache rows; refill "continuous" (a finished
                   row's slot takes the next queued row at once) or "rounds" (micro sampling
                   groups); rows queued by `schedule`: "fifo" | "sjf" | "lpt" on predicted
                   lengths (continuous.py, schedule.py);
    "speculative"  SpeculativeSampler: a drafter LM (drafter_layers x drafter_d_model) proposes
                   draft_k tokens (None: tuned online), the policy verifies them; the drafter is
                   distilled from the policy on each rollout (drafter_steps KD steps at
                   drafter_lr, 0 = frozen; reward-weighted with drafter_reward_tau)
                   (speculative.py);
    "diffusion"    DiffusionSampler: a masked-diffusion LM unmasks the completion in `steps`
                   steps (diffusion.py; options from a DiffusionStudy's `diffusion` section).

All take the same per-sequence keys, so a rollout's completions do not depend on the engine's
batching. `ENGINES` maps each name to its builder `(model, config, tokenizer, **options) ->
Sampler`; a new engine is one function and a registry line (its options in `ENGINE_FIELDS`).
`algorithms.grpo_config.rollout_config` builds the `RolloutConfig` of a `GRPOConfig`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_suite.core.config import ConfigError, Count, NonNegative, NonNegativeInt, Positive
from jaxrl_suite.core.parallel import data_sharding, host_local, shard_batch
from jaxrl_suite.core.registry import Registry
from jaxrl_suite.models.diffusion_lm import DiffusionLM
from jaxrl_suite.models.lm import CausalLM, LMConfig
from jaxrl_suite.sampling.base import GenerateOutput, Sampler
from jaxrl_suite.sampling.continuous import ContinuousSampler
from jaxrl_suite.sampling.diffusion import DiffusionSampler
from jaxrl_suite.sampling.kv_cache import KVCacheSampler
from jaxrl_suite.sampling.schedule import ORDERS, REFILLS

DRAFT_KS = (0, 1, 2, 4, 8)  # the draft lengths the speculative sampler chooses among

ENGINES: Registry[Callable[..., Sampler]] = Registry("rollout engine")
# The RolloutConfig fields that only one engine takes (set on another engine: a config error).
ENGINE_FIELDS = {
    "continuous": ("slots", "refill", "schedule"),
    "speculative": ("draft_k", "drafter_layers", "drafter_d_model", "drafter_lr",
                    "drafter_steps", "drafter_reward_tau"),
}


@dataclasses.dataclass(frozen=True)
class EngineOptions:
    """The rollout engine and the options only one engine takes: a config section of its own
    that `GRPOConfig` inherits, so its keys stay `grpo.sampler`, `grpo.slots`, ... (the
    engines in the module docstring)."""

    sampler: str = "static"  # the engine, a name in ENGINES
    slots: NonNegativeInt = 0  # continuous: KV-cache rows
    refill: str = "continuous"  # continuous: "continuous" | "rounds"
    schedule: str = "sjf"  # continuous: queue order on predicted lengths
    draft_k: Count | None = None  # speculative: draft length (None: tuned online)
    drafter_layers: Count = 1  # speculative: the drafter's blocks
    drafter_d_model: Count = 64  # speculative: the drafter's width
    drafter_lr: NonNegative = 1e-3  # speculative: the drafter's distillation lr
    drafter_steps: NonNegativeInt = 1  # speculative: KD steps per rollout (0: frozen)
    drafter_reward_tau: Positive | None = None  # speculative: reward-weighted KD temperature


@dataclasses.dataclass(frozen=True)
class RolloutConfig(EngineOptions):
    """A rollout engine, its options and the sampling settings; the names are the `grpo.`
    config keys that set them (`algorithms.grpo_config.rollout_config`), and the one-line
    errors name those keys."""

    max_new_tokens: int = 24
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    rollout_micro_batch: int = 0  # rows per call of a batch engine (the trainer chunks)

    def __post_init__(self):
        if self.sampler not in ENGINES:
            raise ValueError(f"grpo.sampler must be one of {list(ENGINES.names())}, got "
                             f"{self.sampler!r}")
        defaults = {f.name: f.default for f in dataclasses.fields(self)}
        for engine, names in ENGINE_FIELDS.items():
            for name in names:
                if self.sampler != engine and getattr(self, name) != defaults[name]:
                    raise ValueError(f"grpo.{name} applies to grpo.sampler={engine!r} only "
                                     f"(grpo.sampler is {self.sampler!r})")
        if self.sampler == "continuous":
            if self.slots <= 0:
                raise ValueError(f"grpo.sampler='continuous' needs grpo.slots > 0 (KV-cache "
                                 f"rows), got {self.slots}")
            if self.rollout_micro_batch:
                raise ValueError("grpo.rollout_micro_batch does not apply to "
                                 "grpo.sampler='continuous': its grpo.slots bound the rows")
        if self.refill not in REFILLS:
            raise ValueError(f"grpo.refill must be one of {list(REFILLS)}, got {self.refill!r}")
        if self.schedule not in ORDERS:
            raise ValueError(f"grpo.schedule must be one of {list(ORDERS)}, got "
                             f"{self.schedule!r}")
        if self.draft_k is not None and self.draft_k not in DRAFT_KS:
            raise ValueError(f"grpo.draft_k must be null (adaptive) or one of {list(DRAFT_KS)}, "
                             f"got {self.draft_k}")


def _settings(c: RolloutConfig, tokenizer) -> dict:
    return dict(max_new_tokens=c.max_new_tokens, eos_id=tokenizer.eos_id,
                pad_id=tokenizer.pad_id, temperature=c.temperature, top_k=c.top_k, top_p=c.top_p)


@ENGINES.register("static")
def static_engine(model: CausalLM, c: RolloutConfig, tokenizer, *, shared: Sampler | None = None,
                  **_) -> Sampler:
    """A `KVCacheSampler` with the config's settings, or `shared`, an equal one built before
    (a study shares one per setting, so each compiles once)."""
    return shared if shared is not None else KVCacheSampler(model, **_settings(c, tokenizer))


@ENGINES.register("continuous")
def continuous_engine(model: CausalLM, c: RolloutConfig, tokenizer, **_) -> Sampler:
    """A `ContinuousSampler` over grpo.slots KV-cache rows."""
    return ContinuousSampler(model, slots=c.slots, refill=c.refill, order=c.schedule,
                             **_settings(c, tokenizer))


def drafter_config(model_config: LMConfig, c: RolloutConfig) -> LMConfig:
    """The speculative sampler's drafter: the policy's tokenizer and options, with
    grpo.drafter_layers blocks of width grpo.drafter_d_model (heads of 32, d_ff = 4 x width)."""
    heads = max(1, c.drafter_d_model // 32)
    return dataclasses.replace(
        model_config, n_layers=c.drafter_layers, d_model=c.drafter_d_model, n_heads=heads,
        n_kv_heads=heads, head_dim=None, d_ff=4 * c.drafter_d_model, scan_layers=False)


@ENGINES.register("speculative")
def speculative_engine(model: CausalLM, c: RolloutConfig, tokenizer, *, drafter_params=None,
                       rng: jax.Array | None = None, **_) -> Sampler:
    """A `SpeculativeSampler` whose drafter (`drafter_config`) starts from `drafter_params`
    (default: a random drafter from `rng`, which the per-rollout distillation then trains)."""
    from jaxrl_suite.sampling.speculative import SpeculativeSampler

    drafter = CausalLM(drafter_config(model.config, c))
    if drafter_params is None:
        rng = jax.random.key(0) if rng is None else rng
        drafter_params = drafter.init(rng, jnp.zeros((1, 4), jnp.int32))
    return SpeculativeSampler(
        model, drafter, drafter_params, draft_k="auto" if c.draft_k is None else c.draft_k,
        k_choices=DRAFT_KS, distill_lr=c.drafter_lr, distill_steps=c.drafter_steps,
        reward_tau=c.drafter_reward_tau, **_settings(c, tokenizer))


def sample_rollout(sampler: Sampler, params, encoded, placed, key: jax.Array, *, mesh,
                   micro: int = 0, first_row: int = 0) -> GenerateOutput:
    """`sampler`'s completions of this process's prompt rows (`encoded`: their host arrays
    (ids, mask); `placed`: the same on the mesh), `micro` global rows per call
    (grpo.rollout_micro_batch; 0: all at once; one compiled program), reassembled and placed
    like the prompts. Row i is sequence first_row + i (this process's first global row), so its
    key, and its completion, do not depend on the chunking."""
    chunk = micro // jax.process_count()
    rows = len(encoded[0])
    ids = np.arange(first_row, first_row + rows, dtype=np.int32)
    if not micro or chunk >= rows:
        out = sampler(params, *placed, key, seq_ids=shard_batch(ids, mesh))
        # rows split over the batch axes, like the prompts (an engine that scatters its rows,
        # the continuous one, returns them replicated)
        return GenerateOutput(*jax.device_put(tuple(out), data_sharding(mesh)))
    if rows % chunk:
        raise ValueError(f"grpo.rollout_micro_batch={micro} does not divide the "
                         f"{rows * jax.process_count()} rows of a rollout")
    outs = []
    for start in range(0, rows, chunk):
        p, pm, i = shard_batch(tuple(x[start : start + chunk] for x in (*encoded, ids)), mesh)
        out = sampler(params, p, pm, key, seq_ids=i)
        outs.append([host_local(x) for x in out])
    return GenerateOutput(*shard_batch(
        tuple(np.concatenate(x) for x in zip(*outs, strict=True)), mesh))


@ENGINES.register("diffusion")
def diffusion_engine(model, c: RolloutConfig, tokenizer, *, steps: int = 40,
                     order: str = "entropy", block_size: int = 0, greedy: bool = False,
                     **_) -> Sampler:
    """A `DiffusionSampler` of a masked-diffusion LM (`models.diffusion_lm.DiffusionLM`):
    `steps` unmasking steps in `order`, semi-autoregressive blocks of `block_size` (0: one), at
    the config's temperature and top_p (a DiffusionStudy passes its `diffusion` section)."""
    if not isinstance(model, DiffusionLM):  # a config the user wrote: one line, no traceback
        raise ConfigError(f"config field 'grpo.sampler': 'diffusion' needs a masked-diffusion "
                          f"LM (diffucoder_coupled_grpo's), this model is a "
                          f"{type(model).__name__}")
    if c.top_k:
        raise ConfigError("config field 'grpo.top_k' does not apply to a diffusion LM's "
                          "sampler: set 0")
    return DiffusionSampler(model, max_new_tokens=c.max_new_tokens, steps=steps,
                            eos_id=tokenizer.eos_id, pad_id=tokenizer.pad_id, order=order,
                            block_size=block_size, temperature=c.temperature, top_p=c.top_p,
                            greedy=greedy)


def make_engine(model: CausalLM, c: RolloutConfig, tokenizer, **options) -> Sampler:
    """The rollout `Sampler` that `c.sampler` names (`ENGINES`), with the config's options.
    `options` go to its builder where it takes them: `shared` (static), `drafter_params` and
    `rng` (speculative), `steps`, `order`, `block_size`, `greedy` (diffusion)."""
    return ENGINES.get(c.sampler)(model, c, tokenizer, **options)


__all__ = ["DRAFT_KS", "ENGINES", "ENGINE_FIELDS", "EngineOptions", "RolloutConfig",
           "continuous_engine", "diffusion_engine", "drafter_config", "make_engine",
           "sample_rollout",
           "speculative_engine", "static_engine"]
