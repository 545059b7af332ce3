"""One module per CLI command, named as the command: ``gpudoctor diff`` is ``commands/diff.py``.

``try`` is a Python keyword, so its module is ``try_.py`` (PEP 8's trailing underscore).
Each exposes ``main(args) -> int``. ``load.py`` is not a command: the report loading that
``report``, ``diff`` and ``check`` share.
"""
