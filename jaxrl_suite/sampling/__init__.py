"""Generation and search: the `Sampler` protocol, its implementations and the registry that
chooses the rollout engine (`ENGINES`, `make_engine`), and the LM runtime on the host
(`map_batches`, `LMRunner`)."""

from jaxrl_suite.sampling.base import GenerateOutput, LearningSampler, Sampler
from jaxrl_suite.sampling.continuous import ContinuousSampler
from jaxrl_suite.sampling.diffusion import DiffusionSampler
from jaxrl_suite.sampling.engines import ENGINES, RolloutConfig, make_engine
from jaxrl_suite.sampling.evaluate import maj_at_k, majority_answer, pass_at_k, ranking_agreement
from jaxrl_suite.sampling.kv_cache import KVCacheSampler
from jaxrl_suite.sampling.runner import (
    LMRunner,
    answer_id,
    image_prompt,
    map_batches,
    repeat_each,
)
from jaxrl_suite.sampling.speculative import SpeculativeSampler

__all__ = ["ENGINES", "ContinuousSampler", "DiffusionSampler", "GenerateOutput", "KVCacheSampler",
           "LMRunner", "LearningSampler", "RolloutConfig", "Sampler", "SpeculativeSampler",
           "answer_id", "image_prompt", "maj_at_k", "majority_answer", "make_engine",
           "map_batches", "pass_at_k", "ranking_agreement", "repeat_each"]
