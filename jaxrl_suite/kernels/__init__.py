"""Pallas kernels, each beside a plain `jnp` reference.

The public names below load on first use (PEP 562): importing one submodule does not import the
others.
"""

from jaxrl_suite.core.exports import lazy_exports

_EXPORTS: dict[str, tuple[str, ...]] = {
    "lru_memory": ("DEFAULT_ALPHA", "lru_memory_update", "lru_memory_update_reference"),
}
__all__, _MODULE_OF, __getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
