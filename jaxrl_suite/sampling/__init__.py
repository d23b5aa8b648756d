"""Generation and search: the `Sampler` protocol and its implementations."""

from jaxrl_suite.sampling.base import GenerateOutput, Sampler
from jaxrl_suite.sampling.kv_cache import KVCacheSampler

__all__ = ["GenerateOutput", "KVCacheSampler", "Sampler"]
