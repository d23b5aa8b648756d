"""jaxrl_suite: reinforcement learning of language models and classic-control agents in JAX/Flax."""

__version__ = "0.1.0"
