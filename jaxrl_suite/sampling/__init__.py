"""Generation and search: the `Sampler` protocol and its implementations, and the LM runtime on
the host (`map_batches`, `LMRunner`)."""

from jaxrl_suite.sampling.base import GenerateOutput, Sampler
from jaxrl_suite.sampling.continuous import ContinuousSampler
from jaxrl_suite.sampling.diffusion import DiffusionSampler
from jaxrl_suite.sampling.kv_cache import KVCacheSampler
from jaxrl_suite.sampling.runner import LMRunner, answer_id, map_batches
from jaxrl_suite.sampling.speculative import SpeculativeSampler

__all__ = ["ContinuousSampler", "DiffusionSampler", "GenerateOutput", "KVCacheSampler", "LMRunner",
           "Sampler", "SpeculativeSampler", "answer_id", "map_batches"]
