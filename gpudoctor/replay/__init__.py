"""Replay and preflight: diagnose a training config before the GPUs are rented.

The line, stage by stage:

- ``config`` (with ``yamlsrc``, ``schema``, ``checks``): load and validate the YAML
  into one ``ReplayConfig``; every problem is a one-line ``UserError``.
- ``prepare``: what a real project has on disk before training (synthetic data, a
  BPE trained on it, the ``ahead`` stages), cached.
- ``build``, ``data``, ``loop``, ``worker``: the honest training script
  ``python -m gpudoctor.replay.worker CONFIG`` that ``gpudoctor run`` profiles from
  outside; ``measure`` writes what only it can see to ``replay_measure.json``.
- ``gpus``, ``costmodel``, ``fixes``, ``preflight``: ``predict(config, measure)``, the
  whole run on a target GPU before and after the fixes; ``show`` prints it.

Importing this package is cheap: torch, datasets and transformers load only in the
worker's modules.
"""

from __future__ import annotations
