"""``gpudoctor sweep``: measure a grid of settings instead of guessing.

One straight line, a module per stage:

- ``axes``: ``--grid KEY=V1,V2`` -> typed axes, checked like the config file;
- ``plan``: the grid's points (held at one effective batch if asked, the current
  setting appended, worker counts checked against the cores, a shard's slice);
- ``points``: a point -> its trial YAML (validated) and cache key;
- ``trial``: one replay worker process under the in-process hooks, watched by
  :class:`gpudoctor.samplers.tree.TreeSampler` for memory and GPU busy, classified
  (crash, OOM, hang, pruned);
- ``windows``: steady-state figures from the trial's events (read through
  :mod:`gpudoctor.recording.read`), warm-up excluded, and the point's noise;
- ``backend`` / ``ray_backend``: where trials run (this machine, or Ray tasks);
- ``record`` + ``cache``: a point's runs as one cached record;
- ``runner``: cache first, then trials on the backend, again for noisy points;
- ``costs``: $ per million tokens and for the whole run, at the measured speed;
- ``search`` + ``adaptive``: ``--adaptive`` on an Optuna study (coordinate ascent or TPE);
- ``slurm``: ``--emit-slurm``, the sweep as a job array;
- ``results`` + ``summary``: ``sweep.json``, the winner (or a tie), the config change, merging shards;
- ``output`` + ``progress``: the folder's files and the terminal (the pages render in
  :mod:`gpudoctor.render.sweep_page`);
- ``session``: all of it for one command.
"""

from __future__ import annotations

SCHEMA = "gpudoctor.sweep/1"
