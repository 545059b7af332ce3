"""``gpudoctor sweep``: measure a grid of settings instead of guessing.

One straight line, a module per stage:

- ``axes``: ``--grid KEY=V1,V2`` -> typed axes, checked like the config file;
- ``plan``: the grid's points (held at one effective batch if asked, the current
  setting appended, worker counts checked against the cores, a shard's slice);
- ``points``: a point -> its trial YAML (validated) and cache key;
- ``trial`` + ``monitor``: one replay worker process under the in-process hooks,
  watched for memory, GPU busy, crashes and hangs;
- ``windows``: steady-state figures from the trial's events, warm-up excluded;
- ``record`` + ``cache``: a point's runs as one cached record;
- ``runner``: cache first, then trials, again for noisy points;
- ``costs``: $ per million tokens and for the whole run (preflight on a target);
- ``adaptive``: coordinate ascent instead of the whole grid;
- ``results`` + ``summary``: ``sweep.json``, the winner, the config change, merging shards;
- ``render`` / ``heatmap`` / ``format`` / ``progress``: pages and terminal;
- ``session``: all of it for one command.
"""

from __future__ import annotations

SCHEMA = "gpudoctor.sweep/1"
