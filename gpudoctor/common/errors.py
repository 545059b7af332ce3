"""User-facing errors: one line that names the problem and the fix."""

from __future__ import annotations


class UserError(Exception):
    """A problem with the user's input or environment.

    The CLI prints ``gpudoctor: <message>`` and exits with ``exit_code``; no
    traceback unless ``--debug``.
    """

    def __init__(self, message: str, exit_code: int = 2) -> None:
        super().__init__(message)
        self.exit_code = exit_code
