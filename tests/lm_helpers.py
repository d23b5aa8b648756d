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


def killed_and_resumed(experiment: str, sets: list, tmp_path, runs, *, killed_at: int):
    """An experiment's smoke run twice: `straight` runs through; `killed` is its copy with each
    of `runs`' checkpoints of steps after `killed_at`, its result.json and the summary removed,
    as a kill after step `killed_at` leaves it, then resumed with --resume. Returns (straight,
    killed) output dirs."""
    import shutil

    from jaxrl_suite.cli import main

    straight, killed = tmp_path / "straight", tmp_path / "killed"
    cmd = ["run", experiment, "--smoke", "--no-progress", *sets]
    assert main([*cmd, "--out", str(straight)]) == 0
    shutil.copytree(straight, killed)
    for run in runs:
        later = [d for d in (killed / "checkpoints" / run).iterdir()
                 if d.name.isdigit() and int(d.name) > killed_at]
        assert later, f"{run} saved no checkpoint after step {killed_at}"
        for d in later:
            shutil.rmtree(d)
        (killed / "runs" / run / "result.json").unlink()
    (killed / "summary.json").unlink()
    assert main([*cmd, "--resume", "--out", str(killed)]) == 0
    return straight, killed


def flat_grpo_keys(config: dict) -> dict:
    """A config's `to_dict` view with its `grpo` section in the flat form runs saved before
    issue 44 hold (`grpo.sampler`, `grpo.slots`, ..., `grpo.logprob_chunk`: the old keys of
    `GRPOConfig.MOVED` in place of the rollout and memory sections)."""
    from jaxrl_suite.algorithms.grpo_config import GRPOConfig

    grpo = dict(config["grpo"])
    sections = {name: grpo.pop(name) for name in ("rollout", "memory")}
    for old, new in GRPOConfig.MOVED.items():
        section, key = new.split(".")
        grpo[old] = sections[section][key]
    return {**config, "grpo": grpo}
