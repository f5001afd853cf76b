"""Values worked out once from objects that are never changed once made: tool schemas and
system prompts, which every agent of a fan-out sends alike.

Kept by identity, with the object itself, so that its id is not reused while it is kept.
A cache, not a promise: whatever is asked of an object not kept is worked out again.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

__all__ = ["KeptByIdentity"]

T = TypeVar("T")


class KeptByIdentity(Generic[T]):
    """``work(value)`` for each value, worked out once while at most ``size`` are kept."""

    def __init__(self, work: Callable[[object], T], size: int = 256) -> None:
        self._work = work
        self._size = size
        self._kept: dict[int, tuple[object, T]] = {}

    def __call__(self, value: object) -> T:
        kept = self._kept.get(id(value))
        if kept is not None and kept[0] is value:
            return kept[1]
        result = self._work(value)
        if len(self._kept) >= self._size:
            self._kept.clear()
        self._kept[id(value)] = (value, result)
        return result
