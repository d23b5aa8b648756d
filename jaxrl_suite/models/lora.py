"""LoRA adapters on `CausalLM` (Hu et al., "LoRA: Low-Rank Adaptation of Large Language Models",
arXiv:2106.09685), through qwix's `LoraProvider`.

Each targeted projection W [in, out] (a Dense kernel, x @ W) gets two small matrices beside it,
A [in, r] (`kernel_lora_a`, random: he_uniform) and B [r, out] (`kernel_lora_b`, zeros), and
computes

    y = x W + (alpha / r) x A B                      (W frozen; only A and B are trained)

so at initialisation (B = 0) the adapted model is exactly the base model. `merge_lora` folds the
adapters back into the base weights, W' = W + (alpha / r) A B, the same scaling qwix applies
(`LoraProvider.dot_general`: `res + delta * (rule.alpha / rule.rank)`).

    model = apply_lora(CausalLM(cfg), LoraConfig(rank=8, alpha=16.0))
    params = init_lora(model, base_params, key)     # base_params unchanged, adapters added
    base, adapters = split_lora(params)             # and combine_lora(base, adapters)
    merged = merge_lora(params, lora_config)        # base-shaped: CausalLM(cfg).apply(merged, ..)

Targets are the module names q, k, v, o (attention) and gate, up, down (SwiGLU MLP). The
trainers (`algorithms.grpo`) see a LoRA model (`lora_config_of(model)`) and train the adapter
leaves alone (`is_adapter`): the base is frozen, has no gradient and no optimizer state, and
checkpoints hold the adapters only. A scanned model (leaves under `layers` with a leading [L]
axis) gets adapters with the same leading axis, and `merge_lora` broadcasts over it.
"""

from __future__ import annotations

import dataclasses
import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_suite.core.train import merge_params, split_params

TARGETS = ("q", "k", "v", "o", "gate", "up", "down")  # every projection of a block
_ATTN, _MLP = ("q", "k", "v", "o"), ("gate", "up", "down")
ADAPTER_SUFFIXES = ("kernel_lora_a", "kernel_lora_b")


@dataclasses.dataclass(frozen=True)
class LoraConfig:
    """Rank r, scale alpha (the update is (alpha / r) x A B) and targeted module names."""

    rank: int = 8
    alpha: float = 16.0
    targets: tuple[str, ...] = TARGETS

    def __post_init__(self):
        check_lora(self.rank, self.alpha, self.targets, prefix="LoraConfig.", allow_zero=False)

    @property
    def scale(self) -> float:
        """alpha / r, the factor of the low-rank update."""
        return self.alpha / self.rank

    @property
    def module_path(self) -> str:
        """qwix's `module_path` regex (full match on a module's path, e.g. layer_0/attn/q)."""
        parts = []
        for group, names in (("attn", _ATTN), ("mlp", _MLP)):
            chosen = [n for n in names if n in self.targets]
            if chosen:
                parts.append(f"{group}/({'|'.join(chosen)})")
        return f"(.*/)?({'|'.join(parts)})"


def check_lora(rank, alpha, targets, *, prefix: str = "model.lora_", allow_zero: bool = True):
    """One-line `ValueError`s naming the field for a bad rank, alpha or target list."""
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < (0 if allow_zero else 1):
        raise ValueError(f"{prefix}rank must be an integer >= {0 if allow_zero else 1} "
                         f"(0 = LoRA off), got {rank!r}")
    if not alpha > 0:
        raise ValueError(f"{prefix}alpha must be positive, got {alpha!r}")
    targets = tuple(targets)
    bad = [t for t in targets if t not in TARGETS]
    if bad or not targets or len(set(targets)) != len(targets):
        what = f"unknown {bad[0]!r}" if bad else "empty" if not targets else "duplicates"
        raise ValueError(f"{prefix}targets must be distinct names from {', '.join(TARGETS)} "
                         f"({what}), got {list(targets)}")


def apply_lora(model: nn.Module, config: LoraConfig) -> nn.Module:
    """The LoRA-adapted linen module of `model` (a `CausalLM`): same call signature and config,
    with adapters `kernel_lora_a` [in, r] / `kernel_lora_b` [r, out] beside each targeted kernel
    (qwix `apply_lora_to_model` with a `LoraProvider`)."""
    import qwix  # imported here: a second of import time that runs without LoRA do not pay

    if lora_config_of(model) is not None:
        raise ValueError("apply_lora: the model already has LoRA adapters")
    provider = qwix.LoraProvider(module_path=config.module_path, rank=config.rank,
                                 alpha=float(config.alpha))
    adapted = qwix.apply_lora_to_model(model, provider)
    type(adapted)._lora_config = config  # its own class (qwix makes one per call)
    return adapted


def lora_config_of(model) -> LoraConfig | None:
    """The `LoraConfig` a model was adapted with by `apply_lora`, or None for a plain model."""
    return getattr(type(model), "_lora_config", None)


def is_adapter(path: str) -> bool:
    """Whether a leaf's "/"-joined path names a LoRA adapter (the trainable leaves)."""
    return path.endswith(ADAPTER_SUFFIXES)


def trainable_of(model):
    """The trainers' `trainable` predicate for `model`: `is_adapter` for a LoRA model (the base
    is frozen), None (everything trains) otherwise."""
    return is_adapter if lora_config_of(model) is not None else None


def split_lora(params) -> tuple[dict, dict]:
    """(base, adapters): the tree without its adapter leaves, and the adapter leaves alone."""
    adapters, base = split_params(params, is_adapter)
    return base, adapters


def combine_lora(base, adapters) -> dict:
    """The full tree of `base` params and `adapters` (the inverse of `split_lora`)."""
    return merge_params(base, adapters)


def init_lora(model: nn.Module, params, rng: jax.Array) -> dict:
    """`params` (a base `{"params": ...}` tree, values unchanged) plus freshly initialised
    adapters for the LoRA model `model`, as qwix initialises them (A he_uniform from `rng`,
    B = 0). Numpy leaves (a loaded HF checkpoint) come back as jax arrays: qwix finds a kernel by
    its array, and an eager call on a numpy kernel would silently skip its adapter."""
    config = lora_config_of(model)
    if config is None:
        raise ValueError("init_lora: the model has no LoRA adapters (use apply_lora first)")
    base, adapters = split_lora(params)
    if adapters:
        raise ValueError("init_lora: params already hold LoRA adapters")
    base = jax.tree.map(jnp.asarray, base)
    # Running the model once with a mutable "params" collection creates only the missing leaves.
    _, variables = model.apply(base, jnp.zeros((1, 1), jnp.int32), rngs={"params": rng},
                               mutable=["params"])
    adapters = split_lora(variables)[1]
    want = [k for k in _flatten(base) if k.endswith("/kernel")
            and re.fullmatch(config.module_path, k.split("/", 1)[1].rsplit("/", 1)[0])]
    missing = [k for k in want if k + "_lora_a" not in _flatten(adapters)]
    if missing or not want:
        raise ValueError(f"init_lora: no adapter was created for '{(missing or ['any'])[0]}' "
                         f"(lora_targets={list(config.targets)})")
    return combine_lora(base, adapters)


def merge_lora(params, config: LoraConfig) -> dict:
    """Base-shaped params with the adapters folded in: W' = W + (alpha / r) A B for each adapted
    kernel W [..., in, out] (A [..., in, r], B [..., r, out]; a leading layer axis broadcasts),
    computed in float32 and cast to W's dtype. Params without adapters come back unchanged."""
    base, adapters = split_lora(params)
    flat_base = _flatten(base)
    flat = _flatten(adapters)
    for key, a in flat.items():
        if not key.endswith("_lora_a"):
            continue
        prefix = key[: -len("_lora_a")]
        if prefix not in flat_base or prefix + "_lora_b" not in flat:
            raise ValueError(f"merge_lora: adapter '{key}' has no matching "
                             f"{'kernel' if prefix not in flat_base else 'kernel_lora_b'}")
        if np.shape(a)[-1] != config.rank:
            raise ValueError(f"merge_lora: adapter '{key}' has rank {np.shape(a)[-1]} but "
                             f"lora_rank={config.rank}")
        w, b = flat_base[prefix], flat[prefix + "_lora_b"]
        delta = jnp.matmul(jnp.asarray(a, jnp.float32), jnp.asarray(b, jnp.float32),
                           precision=jax.lax.Precision.HIGHEST)
        flat_base[prefix] = (jnp.asarray(w, jnp.float32) + config.scale * delta).astype(
            jnp.asarray(w).dtype)
    return _unflatten(flat_base)


def _flatten(tree) -> dict[str, object]:
    from flax import traverse_util

    return traverse_util.flatten_dict(tree, sep="/")


def _unflatten(flat: dict[str, object]) -> dict:
    from flax import traverse_util

    return traverse_util.unflatten_dict(flat, sep="/")


__all__ = ["ADAPTER_SUFFIXES", "TARGETS", "LoraConfig", "apply_lora", "check_lora",
           "combine_lora", "init_lora", "is_adapter", "lora_config_of", "merge_lora",
           "split_lora", "trainable_of"]
