"""Pallas kernels, each beside a plain `jnp` reference.

The public names below load on first use (PEP 562): importing one submodule does not import the
others.
"""

import importlib

_EXPORTS: dict[str, tuple[str, ...]] = {
    "lru_memory": ("DEFAULT_ALPHA", "lru_memory_update", "lru_memory_update_reference"),
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = sorted(_MODULE_OF)


def __getattr__(name: str):
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
