"""Analysis: pure functions from a :class:`Recording` to the figures rules need.

``analyze(rec)`` parses the recording once into an :class:`Analysis`; the
report's ``breakdown``, ``shares``, ``padding`` and ``steps`` sections and
every rule read from it.
"""

from __future__ import annotations

from gpudoctor.analysis.model import Analysis, analyze

__all__ = ["Analysis", "analyze"]
