"""Small helpers for the words orchmode shows people and the model."""

from __future__ import annotations

from collections.abc import Sequence


def listed(names: Sequence[str], shown: int = 3) -> str:
    """``a, b, c and 2 more``: a few names, and how many were left out."""
    first = ", ".join(names[:shown])
    return f"{first} and {len(names) - shown} more" if len(names) > shown else first
