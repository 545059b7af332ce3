"""``gpudoctor attach``: not built yet (see the open issue)."""

from __future__ import annotations

from typing import Any

from gpudoctor.errors import UserError


def main(args: Any) -> int:
    raise UserError("'gpudoctor attach' is not available in this version yet; use 'gpudoctor run -- CMD'")
