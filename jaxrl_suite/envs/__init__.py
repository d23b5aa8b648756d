"""Environments: contextual gymnax wrappers, memory tasks (T-maze, POPGym), offline data; the
verifiable text tasks are `envs.text`, the vision-language tasks `envs.vision`.

The public names below load on first use (PEP 562): importing one submodule does not import the
others.
"""

from jaxrl_suite.core.exports import lazy_exports

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
__all__, _MODULE_OF, __getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
