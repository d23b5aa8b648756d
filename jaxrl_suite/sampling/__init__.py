"""Generation and search: the `Sampler` protocol, its implementations and the registry that
chooses the rollout engine (`ENGINES`, `make_engine`), the LM runtime on the host
(`map_batches`, `LMRunner`), and keyframe selection for video (keyframes.py: TAD, `soft_topk`)."""

from jaxrl_suite.sampling.base import GenerateOutput, LearningSampler, Sampler
from jaxrl_suite.sampling.continuous import ContinuousSampler
from jaxrl_suite.sampling.diffusion import DiffusionSampler
from jaxrl_suite.sampling.engines import ENGINES, RolloutConfig, make_engine
from jaxrl_suite.sampling.evaluate import maj_at_k, majority_answer, pass_at_k, ranking_agreement
from jaxrl_suite.sampling.keyframes import (
    KEYFRAME_SELECTORS,
    FrameScorer,
    frame_features,
    frame_saliency,
    inflection_points,
    prioritized_select,
    saliency_mass,
    scorer_features,
    select_keyframes,
    soft_topk,
    tad_select,
    trend_residual,
    variation_scores,
)
from jaxrl_suite.sampling.kv_cache import KVCacheSampler
from jaxrl_suite.sampling.runner import (
    LMRunner,
    answer_id,
    image_prompt,
    map_batches,
    repeat_each,
)
from jaxrl_suite.sampling.speculative import SpeculativeSampler

__all__ = ["ENGINES", "KEYFRAME_SELECTORS", "ContinuousSampler", "DiffusionSampler",
           "FrameScorer", "GenerateOutput", "KVCacheSampler", "LMRunner", "LearningSampler",
           "RolloutConfig", "Sampler", "SpeculativeSampler", "answer_id", "frame_features",
           "frame_saliency", "image_prompt", "inflection_points", "maj_at_k", "majority_answer",
           "make_engine", "map_batches", "pass_at_k", "prioritized_select", "ranking_agreement",
           "repeat_each", "saliency_mass", "scorer_features", "select_keyframes", "soft_topk",
           "tad_select", "trend_residual", "variation_scores"]
