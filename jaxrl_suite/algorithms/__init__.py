"""Training algorithms: the LM trainers (SFT, GRPO and the methods around it, agents, preference,
diffusion, value) and the jitted classic-control ones (PPO, RC-BC, OPPO, IQL, ...).

The public names below load on first use (PEP 562): importing one submodule does not import the
others. A name that several modules define (`make_train`, `train_seeds`), or that is also a
submodule's (`rcbc.evaluate`), is imported from its module.
"""

from jaxrl_suite.core.exports import lazy_exports

_EXPORTS: dict[str, tuple[str, ...]] = {
    "agent": (
        "AgentConfig", "AgentTrainer", "Episode", "EpisodeRunner", "EpisodeSFT", "ParamStore",
        "episode_metrics", "episode_segments", "expert_episodes", "init_episode", "score_episode"
    ),
    "cosmos": ("PlotScorer", "PlotSearchConfig"),
    "diffusion": (
        "DiffusionConfig", "DiffusionScorer", "DiffusionStudy", "estimator_variance",
        "masked_diffusion_objective", "sequence_estimates"
    ),
    "dispatch": ("DISPATCH", "Latency", "async_batch", "async_pipeline", "lm_rows"),
    "dynamic_sampling": (
        "draw_until_full", "dynamic_rollout", "informative_groups", "pool_metrics", "select_groups"
    ),
    "executors": (
        "EXECUTOR_KINDS", "LocalToolExecutor", "RayToolExecutor", "ToolExecutor", "make_executor"
    ),
    "exit": (
        "ExItConfig", "ExItTrainState", "ExItTrainer", "MultiTurnTrainer", "evaluate_iterations"
    ),
    "gencls": (
        "DECODINGS", "DEFINITIONS", "ICL_MODES", "STRATEGIES", "UNCERTAIN", "GenclsMeta",
        "StrategiesConfig", "StrategyConfig", "StrategyTask", "bag_of_words",
        "classification_view", "evaluate_strategy", "label_texts", "needed_lengths", "ppl_scores"
    ),
    "grpo": ("GRPOBatch", "GRPOTrainState", "GRPOTrainer", "UNSET_ANCHOR"),
    "grpo_config": (
        "LR_SCHEDULES", "GRPOConfig", "MemoryConfig", "check_scorer_config", "grpo_optimizer",
        "objective_hparams", "rollout_config"
    ),
    "grpo_ondevice": (
        "GRPOProgram", "PromptTable", "check_on_device", "make_grpo_train", "prompt_table"
    ),
    "kf_grpo": (
        "VIEWS", "KFGRPOConfig", "KFGRPOTrainer", "SelectorConfig", "SelectorTrainer",
        "contrast_view"
    ),
    "iql": (
        "BC", "BCConfig", "IQL", "IQLConfig", "OfflineState", "make_train_bc", "normalize_rewards"
    ),
    "lm_study": (
        "LM", "EvalConfig", "LMStudy", "RunConfig", "TaskConfig", "build_lm", "check_batches",
        "eval_record", "lm_keys"
    ),
    "loop": ("fit", "fit_resumable", "save_or_stop"),
    "offline_data": (
        "DATASETS", "OfflineDataConfig", "PreferenceData", "Transitions", "build_datasets",
        "complete_episode_returns", "dataset_scores", "load_or_build_datasets",
        "pick_expert_and_medium", "preference_data", "train_snapshots", "transitions"
    ),
    "oppo": (
        "OPPO", "OPPOConfig", "OPPOState", "context_diagnostics", "segment_embeddings",
        "zspace_pca"
    ),
    "ppo": (
        "fit_unit", "HPARAMS", "PPO", "PPOConfig", "RunnerState", "SamplerCurriculum", "run_seeds",
        "seed_keys", "sweep"
    ),
    "pref_reward": (
        "PrefIQL", "RewardModel", "RewardModelConfig", "RewardState", "make_train_reward"
    ),
    "preference": (
        "PREFERENCE_LOSSES", "PairLoss", "PreferenceBatch", "PreferenceConfig", "PreferencePair",
        "PreferenceTrainer"
    ),
    "rcbc": (
        "ARCHS", "OfflineTask", "PolicyConfig", "RCBCConfig", "SeqPolicy", "bc_loss", "collect",
        "dataset_tokens", "evaluate_seeds", "fit_seeds", "make_tokens", "popgym_task",
        "tmaze_task", "token_dim"
    ),
    "rest": (
        "DECODERS", "VARIANTS", "RestConfig", "RestSearchConfig", "decoding_comparison",
        "rest_dpo_trainer", "rest_grpo_task"
    ),
    "s3": ("GeneratorConfig", "QuestionPools", "SearchConfig", "SearchReward"),
    "sft": ("VALIDATION_START", "LMTrainer", "SFTConfig", "SFTTrainer"),
    "value": ("ValueBatch", "ValueConfig", "ValueTrainer", "value_mse_loss"),
    "w2s": (
        "BINARY_VIEWS", "LABEL_TEXTS", "SUFFIX", "DataConfig", "LossConfig", "PretrainConfig",
        "Split", "TrainConfig", "W2SData", "accuracy", "classifier_logits", "encode_split",
        "init_params", "label_token_ids", "lm_nll", "make_data", "make_pretrain",
        "one_hot_targets", "parse_pair", "parse_size", "predict_proba", "weak_labels"
    ),
}
__all__, _MODULE_OF, __getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
