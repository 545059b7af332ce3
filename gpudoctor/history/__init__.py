"""Run history: every report indexed in one SQLite file, so a run can be compared with an earlier one.

:mod:`~gpudoctor.history.entry` takes a report's figures (steps/s, breakdown, waste, top finding) and
where it ran (script, git commit, host, GPU); :mod:`~gpudoctor.history.store` keeps them in a
private database that runs finishing together can share; :mod:`~gpudoctor.history.index` is the
door the commands use after writing a report, which never fails a run; :mod:`~gpudoctor.history.baseline`
holds a run against an earlier one (``gpudoctor check --baseline``). Stdlib only.
"""
