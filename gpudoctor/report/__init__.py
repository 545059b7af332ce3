"""The report: built from a recording (``build``), typed (``schema``), checked, loaded, merged and compared.

Nothing here renders: ``gpudoctor.render`` words a report, this package computes it.
"""
