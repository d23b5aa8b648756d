"""The suite's core: strict configs with declared ranges, the guarded train step, the mesh,
checkpoints, metrics, registries, experiments and the Study runner.

The public names below load on first use (PEP 562): importing one submodule does not import the
others.
"""

import importlib

_EXPORTS: dict[str, tuple[str, ...]] = {
    "checkpoint": (
        "CheckpointNotFoundError", "Checkpointer", "CorruptCheckpointError", "verify_tree"
    ),
    "config": (
        "ConfigError", "Count", "MISSING", "NonNegative", "NonNegativeInt", "Positive",
        "Probability", "Range", "Seed", "UnitInterval", "check_fields", "config_changes",
        "from_dict", "load_config", "parse_override", "read_yaml", "to_dict"
    ),
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
        "Study", "check_seeds", "check_variants", "format_numbers", "open_run_log", "seed_stats"
    ),
    "train": (
        "NonFiniteError", "ParamState", "TrainAndAgent", "TrainState", "apply_gradients",
        "init_param_state", "init_train_state", "keep_finite", "make_optimizer", "make_train_step",
        "map_rows", "merge_params", "split_params", "split_rows"
    ),
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
