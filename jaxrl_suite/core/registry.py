"""Name -> factory registries (STYLE habit 7: dicts with a `register` that refuses duplicates)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


class UnknownNameError(LookupError):
    """A name that is not in a registry; the message lists the known names."""


class Registry(Generic[T]):
    """A dict of named entries; registering a name twice is an error.

    Example:
        TASKS: Registry[Callable[..., Task]] = Registry("task")
        TASKS.register("arithmetic", ArithmeticTask)
        task = TASKS.get("arithmetic")(digits=3)
    """

    def __init__(self, kind: str):
        self.kind = kind
        self._entries: dict[str, T] = {}

    def register(self, name: str, entry: T | None = None):
        """Register `entry` under `name`; usable as `register(name, f)` or as `@register(name)`."""
        if entry is None:

            def decorator(e: T) -> T:
                self.register(name, e)
                return e

            return decorator
        if name in self._entries:
            raise ValueError(f"{self.kind} {name!r} is already registered")
        self._entries[name] = entry
        return entry

    def unregister(self, name: str) -> T:
        """Remove and return `name`'s entry (e.g. a test's probe, registered for that test)."""
        if name not in self._entries:
            raise UnknownNameError(f"unknown {self.kind} {name!r}")
        return self._entries.pop(name)

    def get(self, name: str) -> T:
        if name not in self._entries:
            known = ", ".join(sorted(self._entries)) or "(none)"
            raise UnknownNameError(
                f"unknown {self.kind} {name!r}; known: {known}"
            )
        return self._entries[name]

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._entries)


__all__ = ["Registry", "UnknownNameError"]
