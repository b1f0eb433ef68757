"""Counted nouns as every view writes them: ``1 rank``, ``2 ranks``."""

from __future__ import annotations


def plural(count: int, noun: str, nouns: str | None = None) -> str:
    """``count`` and ``noun``, in the plural (``nouns``, default ``noun + "s"``)
    unless ``count`` is 1."""
    return f"{count} {noun if count == 1 else (nouns or noun + 's')}"
