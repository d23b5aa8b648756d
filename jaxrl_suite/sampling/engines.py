"""The rollout engines behind one registry, chosen in one place (`make_engine`).

A GRPO rollout is drawn by a `Sampler` (`sampling.base`); which one is a config choice, the
`grpo.rollout` section (`EngineOptions`): its `engine` (`grpo.rollout.engine`) and the options
only that engine takes:

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
`RolloutConfig` is what a builder reads: the section's options with the sampling settings
(`grpo.max_new_tokens`, `grpo.temperature`, ...) and `grpo.memory.rollout_micro_batch`;
`algorithms.grpo_config.rollout_config` builds it from a `GRPOConfig`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_suite.core.config import (
    ConfigError,
    Count,
    NonNegative,
    NonNegativeInt,
    Positive,
    check_fields,
)
from jaxrl_suite.core.parallel import data_sharding, host_local, shard_batch
from jaxrl_suite.core.registry import Registry
from jaxrl_suite.models.diffusion_lm import DiffusionLM
from jaxrl_suite.models.lm import CausalLM, LMConfig
from jaxrl_suite.sampling.base import GenerateOutput, Sampler, image_kwargs
from jaxrl_suite.sampling.continuous import ContinuousSampler
from jaxrl_suite.sampling.diffusion import DiffusionSampler
from jaxrl_suite.sampling.kv_cache import KVCacheSampler
from jaxrl_suite.sampling.schedule import ORDERS, REFILLS

DRAFT_KS = (0, 1, 2, 4, 8)  # the draft lengths the speculative sampler chooses among

ENGINES: Registry[Callable[..., Sampler]] = Registry("rollout engine")
# The EngineOptions fields that only one engine takes (set on another engine: a config error).
ENGINE_FIELDS = {
    "continuous": ("slots", "refill", "schedule"),
    "speculative": ("draft_k", "drafter_layers", "drafter_d_model", "drafter_lr",
                    "drafter_steps", "drafter_reward_tau"),
}


SECTION = "grpo.rollout."  # the YAML keys of EngineOptions' fields
DTYPES = (None, "float32", "bfloat16")  # grpo.rollout.dtype


@dataclasses.dataclass(frozen=True)
class EngineOptions:
    """The rollout engine and the options only one engine takes: the `grpo.rollout` section
    of `GRPOConfig` (the engines in the module docstring), checked here with one-line errors
    naming its `grpo.rollout.` keys; an option of one engine set on another is an error."""

    engine: str = "static"  # a name in ENGINES
    slots: NonNegativeInt = 0  # continuous: KV-cache rows
    refill: str = "continuous"  # continuous: "continuous" | "rounds"
    schedule: str = "sjf"  # continuous: queue order on predicted lengths
    draft_k: Count | None = None  # speculative: draft length (None: tuned online)
    drafter_layers: Count = 1  # speculative: the drafter's blocks
    drafter_d_model: Count = 64  # speculative: the drafter's width
    drafter_lr: NonNegative = 1e-3  # speculative: the drafter's distillation lr
    drafter_steps: NonNegativeInt = 1  # speculative: KD steps per rollout (0: frozen)
    drafter_reward_tau: Positive | None = None  # speculative: reward-weighted KD temperature
    # Rollout compute dtype ("float32" | "bfloat16"; None = the model's): the sampler runs a copy
    # of the model in this dtype on the same params, the update keeps the model's dtype.
    dtype: str | None = None

    def __post_init__(self):
        check_fields(self, SECTION, of=EngineOptions)  # the Ranges declared above
        if self.engine not in ENGINES:
            raise ValueError(f"{SECTION}engine must be one of {list(ENGINES.names())}, got "
                             f"{self.engine!r}")
        defaults = {f.name: f.default for f in dataclasses.fields(EngineOptions)}
        for engine, names in ENGINE_FIELDS.items():
            for name in names:
                if self.engine != engine and getattr(self, name) != defaults[name]:
                    raise ValueError(f"{SECTION}{name} applies to {SECTION}engine={engine!r} "
                                     f"only ({SECTION}engine is {self.engine!r})")
        if self.engine == "continuous" and self.slots <= 0:
            raise ValueError(f"{SECTION}engine='continuous' needs {SECTION}slots > 0 (KV-cache "
                             f"rows), got {self.slots}")
        if self.refill not in REFILLS:
            raise ValueError(f"{SECTION}refill must be one of {list(REFILLS)}, got "
                             f"{self.refill!r}")
        if self.schedule not in ORDERS:
            raise ValueError(f"{SECTION}schedule must be one of {list(ORDERS)}, got "
                             f"{self.schedule!r}")
        if self.draft_k is not None and self.draft_k not in DRAFT_KS:
            raise ValueError(f"{SECTION}draft_k must be null (adaptive) or one of "
                             f"{list(DRAFT_KS)}, got {self.draft_k}")
        if self.dtype not in DTYPES:
            raise ValueError(f"{SECTION}dtype must be null, 'float32' or 'bfloat16', got "
                             f"{self.dtype!r}")


@dataclasses.dataclass(frozen=True)
class RolloutConfig(EngineOptions):
    """What an engine's builder reads: the `grpo.rollout` options (inherited), the sampling
    settings (`grpo.max_new_tokens`, `grpo.temperature`, `grpo.top_k`, `grpo.top_p`) and the
    rows per call (`grpo.memory.rollout_micro_batch`); built by
    `algorithms.grpo_config.rollout_config`, its one-line errors name those keys."""

    max_new_tokens: int = 24
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    rollout_micro_batch: int = 0  # rows per call of a batch engine (the trainer chunks)

    def __post_init__(self):
        super().__post_init__()
        if self.engine == "continuous" and self.rollout_micro_batch:
            raise ValueError(f"grpo.memory.rollout_micro_batch does not apply to "
                             f"{SECTION}engine='continuous': its {SECTION}slots bound the rows")


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
    """A `ContinuousSampler` over grpo.rollout.slots KV-cache rows."""
    return ContinuousSampler(model, slots=c.slots, refill=c.refill, order=c.schedule,
                             **_settings(c, tokenizer))


def drafter_config(model_config: LMConfig, c: RolloutConfig) -> LMConfig:
    """The speculative sampler's drafter: the policy's tokenizer and options, with
    grpo.rollout.drafter_layers blocks of width grpo.rollout.drafter_d_model (heads of 32,
    d_ff = 4 x width)."""
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
    (ids, mask[, images]), images a `models.vlm.VisionInputs` or None; `placed`: the same on
    the mesh), `micro` global rows per call (grpo.memory.rollout_micro_batch; 0: all at once;
    one compiled program), reassembled and placed like the prompts. Row i is sequence
    first_row + i (this process's first global row), so its key, and its completion, do not
    depend on the chunking."""
    chunk = micro // jax.process_count()
    rows = len(encoded[0])
    ids = np.arange(first_row, first_row + rows, dtype=np.int32)
    if not micro or chunk >= rows:
        out = sampler(params, *placed[:2], key, seq_ids=shard_batch(ids, mesh),
                      **image_kwargs(placed[2] if len(placed) > 2 else None))
        # rows split over the batch axes, like the prompts (an engine that scatters its rows,
        # the continuous one, returns them replicated)
        return GenerateOutput(*jax.device_put(tuple(out), data_sharding(mesh)))
    if rows % chunk:
        raise ValueError(f"grpo.memory.rollout_micro_batch={micro} does not divide the "
                         f"{rows * jax.process_count()} rows of a rollout")
    outs = []
    for start in range(0, rows, chunk):
        part = jax.tree.map(lambda x, s=slice(start, start + chunk): x[s], (*encoded, ids))
        *prompts, i = shard_batch(part, mesh)
        out = sampler(params, *prompts[:2], key, seq_ids=i,
                      **image_kwargs(prompts[2] if len(prompts) > 2 else None))
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
        raise ConfigError(f"config field 'grpo.rollout.engine': 'diffusion' needs a "
                          f"masked-diffusion LM (diffucoder_coupled_grpo's), this model is a "
                          f"{type(model).__name__}")
    if c.top_k:
        raise ConfigError("config field 'grpo.top_k' does not apply to a diffusion LM's "
                          "sampler: set 0")
    return DiffusionSampler(model, max_new_tokens=c.max_new_tokens, steps=steps,
                            eos_id=tokenizer.eos_id, pad_id=tokenizer.pad_id, order=order,
                            block_size=block_size, temperature=c.temperature, top_p=c.top_p,
                            greedy=greedy)


def make_engine(model: CausalLM, c: RolloutConfig, tokenizer, **options) -> Sampler:
    """The rollout `Sampler` that `c.engine` names (`ENGINES`), with the config's options.
    `options` go to its builder where it takes them: `shared` (static), `drafter_params` and
    `rng` (speculative), `steps`, `order`, `block_size`, `greedy` (diffusion)."""
    return ENGINES.get(c.engine)(model, c, tokenizer, **options)


__all__ = ["DRAFT_KS", "DTYPES", "ENGINES", "ENGINE_FIELDS", "EngineOptions", "RolloutConfig",
           "continuous_engine", "diffusion_engine", "drafter_config", "make_engine",
           "sample_rollout",
           "speculative_engine", "static_engine"]
