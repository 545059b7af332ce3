"""Importing this module registers every built-in rule."""

from gpudoctor.rules import batches, data, evaluation, gpu, ranks, saving, startup  # noqa: F401
