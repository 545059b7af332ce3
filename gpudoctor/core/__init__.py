"""The two contracts, typed once: what the patient writes and what the doctor reports.

``events``: the lines of ``events/<pid>.jsonl`` and ``samples/*.jsonl`` (stdlib only: the hooks
import it inside the patient). ``schema``: ``report.json``, the dict every renderer, tracker and
``check`` reads. ``thresholds``: the share each finding fires at, which the rules and their
``fires_when`` text share. One floor above ``common`` and below everything else, so a type is never
imported from the floor that builds it. This file imports nothing.
"""
