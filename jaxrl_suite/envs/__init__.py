"""Environments: contextual gymnax wrappers, memory tasks (T-maze, POPGym), offline data; the
verifiable text tasks are `envs.text`.

The public names below load on first use (PEP 562): importing one submodule does not import the
others.
"""

import importlib

_EXPORTS: dict[str, tuple[str, ...]] = {
    "contextual": (
        "CONTEXT_SPACES", "ENV_NAMES", "ContextError", "ContextualEnv", "ContextualState",
        "Sampler", "clip_to_bounds", "context_space", "context_vector", "fixed_sampler",
        "gaussian_sampler", "make_contextual", "params_from_vector", "uniform_sampler",
        "with_context"
    ),
    "d4rl_tfds": (
        "D4RL_REF_SCORES", "STEP_KEYS", "load_tfds_d4rl", "ref_scores",
        "rlds_episode_to_transitions"
    ),
    "offline": (
        "FIELDS", "check_dataset", "check_preferences", "collect", "action_scale_shift", "concat",
        "dataset_actions", "evaluate_policy", "episode_ids", "episode_returns", "gather_segments",
        "make_preferences", "normalized_score", "preference_labels", "sample_segment_pairs",
        "segment_returns", "segment_starts"
    ),
    "popgym": (
        "CountRecall", "DIFFICULTIES", "POPGYM_NAMES", "RepeatPrevious", "StatelessCartPole",
        "make_popgym"
    ),
    "tmaze": ("EnvParams", "TMaze", "tmaze_cue", "tmaze_oracle", "tmaze_params"),
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = sorted(_MODULE_OF)


def __getattr__(name: str):
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
