"""One module per CLI command, named as the command: ``gpudoctor diff`` is ``commands/diff.py``.

``try`` is a Python keyword, so its module is ``try_.py`` (PEP 8's trailing underscore).
Each command module has ``HELP`` and ``DESCRIPTION`` (its lines in ``--help``),
``add_arguments(parser)`` (its flags) and ``main(args) -> int`` (its work, whose imports stay
inside it so ``gpudoctor --help`` loads none of them); :data:`gpudoctor.cli.COMMANDS` lists them.
Two modules are not commands: ``flags.py``, the value parsers and common options the
commands share, and ``load.py``, the report loading that ``report``, ``diff`` and ``check`` share.
"""
