"""Generation and search: the `Sampler` protocol and its implementations."""

from jaxrl_suite.sampling.base import GenerateOutput, LearningSampler, Sampler
from jaxrl_suite.sampling.continuous import ContinuousSampler
from jaxrl_suite.sampling.diffusion import DiffusionSampler
from jaxrl_suite.sampling.kv_cache import KVCacheSampler
from jaxrl_suite.sampling.speculative import SpeculativeSampler

__all__ = ["ContinuousSampler", "DiffusionSampler", "GenerateOutput", "KVCacheSampler",
           "LearningSampler", "Sampler", "SpeculativeSampler"]
