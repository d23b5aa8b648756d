"""Generation and search."""

from jaxrl_suite.sampling.generate import GenerateOutput, generate, make_generate

__all__ = ["GenerateOutput", "generate", "make_generate"]
