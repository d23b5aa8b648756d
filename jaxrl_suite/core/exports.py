"""A package's public names, loaded on first use (PEP 562), so that importing one submodule of
`algorithms` does not import the twenty others: each layer's `__init__.py` lists its names per
submodule and calls `lazy_exports`."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping


def lazy_exports(package: str, exports: Mapping[str, tuple[str, ...]]
                 ) -> tuple[list[str], dict[str, str], Callable, Callable]:
    """(`__all__`, name -> submodule, `__getattr__`, `__dir__`) of `package`, whose public names
    are `exports` {submodule: names}: a name is imported from `package.submodule` when first
    read; an unknown name is an AttributeError."""
    module_of = {name: module for module, names in exports.items() for name in names}

    def __getattr__(name: str):
        module = module_of.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(f"{package}.{module}"), name)

    def __dir__() -> list[str]:
        return sorted({*vars(sys.modules[package]), *module_of})

    return sorted(module_of), module_of, __getattr__, __dir__
