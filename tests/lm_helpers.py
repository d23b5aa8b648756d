"""Helpers that test modules import by name (`from lm_helpers import ...`). They live here, not
in conftest.py: tests/rewards has a conftest.py of its own, and `from conftest import` would
import whichever conftest module pytest loaded last."""


def load_hf_parity():
    """benchmarks/hf_parity.py as a module: the tiny transformers model / tokenizer builders
    and the torch / our forwards that the HF tests share."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "hf_parity.py"
    spec = importlib.util.spec_from_file_location("hf_parity", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def peaked_params(model, rng):
    """Random params of a causal / diffusion LM perturbed by 0.1 N(0, 1) and with the embeddings
    scaled 5x, so that the logits are far from uniform and move with the input (the default
    init's barely do). Jit it with the model closed over."""
    import jax
    import jax.numpy as jnp
    from jax.flatten_util import ravel_pytree

    flat, unravel = ravel_pytree(model.init(rng, jnp.zeros((1, 4), jnp.int32)))
    params = unravel(flat + 0.1 * jax.random.normal(jax.random.fold_in(rng, 1), flat.shape))
    params["params"]["embed"]["embedding"] *= 5.0
    return params
