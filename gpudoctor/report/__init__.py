"""The report: built from a recording (``build``), checked, loaded, merged and compared.

Its types are :mod:`gpudoctor.core.schema`, a floor below, so every floor may read a report.

Nothing here renders: ``gpudoctor.render`` words a report, this package computes it.
"""
