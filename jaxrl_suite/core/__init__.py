"""The suite's core: strict configs with declared ranges, the guarded train step, the mesh,
checkpoints, metrics, registries, experiments and the Study runner.

The public names below load on first use (PEP 562): importing one submodule does not import the
others.
"""

from jaxrl_suite.core.exports import lazy_exports

_EXPORTS: dict[str, tuple[str, ...]] = {
    "checkpoint": (
        "CheckpointNotFoundError", "Checkpointer", "CorruptCheckpointError", "load_tree",
        "save_tree", "verify_tree"
    ),
    "config": (
        "ConfigError", "Count", "MISSING", "MovedKeyWarning", "NonNegative", "NonNegativeInt",
        "Positive", "Probability", "Range", "Seed", "UnitInterval", "check_divides", "check_fields",
        "config_changes",
        "from_dict", "load_config", "parse_override", "read_yaml", "to_dict"
    ),
    "exports": ("lazy_exports",),
    "experiment": ("EXPERIMENTS", "EvalOptions", "Experiment", "RunOptions", "load_experiments"),
    "metrics": (
        "MetricsLogger", "WANDB_MODES", "WANDB_RUN_FILE", "WandbConfig", "WandbOptions",
        "aggregate_runs", "default_plot_keys", "median_iqr", "plot_curves", "plot_iqr_bands",
        "plot_runs", "pyplot", "read_metrics", "record_figures", "save_figure", "seed_series",
        "to_python", "trailing_mean", "wandb_options", "write_json"
    ),
    "parallel": (
        "MESH_AXES", "MeshConfig", "batch_shards", "data_sharding", "gather_rows", "host_local",
        "init_distributed", "jit_on_mesh", "make_mesh", "mesh_of", "place_seeds", "print0",
        "process_rows", "replicate", "shard_batch"
    ),
    "registry": ("Registry", "UnknownNameError"),
    "rundir": ("earlier_run", "log_resume_changes", "move_aside", "resume_changes"),
    "signals": ("Terminated", "sigterm_received", "stop_on_sigterm"),
    "study": (
        "START_FAILS", "Study", "check_seeds", "check_variants", "compare_seeds", "format_numbers",
        "group_correlations", "open_run_log", "seed_deltas", "seed_stats", "verdict"
    ),
    "train": (
        "NonFiniteError", "ParamState", "TrainAndAgent", "TrainState", "apply_gradients",
        "carry_adam_moments", "init_param_state", "init_train_state", "keep_finite",
        "make_optimizer", "make_train_step", "map_rows", "merge_params", "micro_batch_count",
        "split_params", "split_rows"
    ),
}
__all__, _MODULE_OF, __getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
