"""jaxrl_suite: reinforcement learning of language models and classic-control agents in JAX/Flax.

The Python API (`jaxrl_suite.api`, docs/api.md) is exported here lazily, so that
`import jaxrl_suite` stays cheap (JAX loads on first use):

    from jaxrl_suite import GRPO, LM, SFT
"""

__version__ = "0.1.0"

_API = ("GRPO", "LM", "SFT")


def __getattr__(name: str):
    if name in _API:
        from jaxrl_suite import api

        return getattr(api, name)
    raise AttributeError(f"module 'jaxrl_suite' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_API])


__all__ = ["GRPO", "LM", "SFT", "__version__"]
