"""Replay and preflight: diagnose a training config before the GPUs are rented.

``config`` loads and validates the YAML, ``build`` and ``worker`` run exactly what it
describes on the machine at hand (profiled from outside by ``gpudoctor run``), and
``preflight`` predicts the full run on a target GPU from the worker's measurements.
Importing this package is cheap: torch, datasets and transformers load only in
``build``/``worker``.
"""

from __future__ import annotations
