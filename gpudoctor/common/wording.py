"""Counts in words: ``1 worker``, ``2 workers``, never ``worker(s)``.

Below every layer that writes text for people (rules, reports, renderers, notes), so each says
a count the same way.
"""

from __future__ import annotations


def plural(count: int, word: str, words: str | None = None) -> str:
    """``1 problem``, ``2 problems``; ``words`` for an irregular plural (``process``, ``processes``)."""
    return f"{count} {word if count == 1 else (words or word + 's')}"
