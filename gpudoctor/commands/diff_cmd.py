"""``gpudoctor diff BEFORE AFTER [-o OUT]``: before/after for a pull request."""

from __future__ import annotations

from typing import Any

from gpudoctor.commands.load import load_report
from gpudoctor.errors import UserError


def main(args: Any) -> int:
    from gpudoctor.diff import diff_reports, render_diff_html, render_diff_markdown

    d = diff_reports(load_report(args.before), load_report(args.after))
    out = args.output
    if out is None or out.suffix.lower() == ".md":
        text = render_diff_markdown(d)
    elif out.suffix.lower() in (".html", ".htm"):
        text = render_diff_html(d)
    elif out.suffix.lower() == ".json":
        import json

        text = json.dumps(d, indent=2)
    else:
        raise UserError(f"cannot write a diff to {out}: use an output ending in .md, .html or .json")
    if out is None:
        print(text)
    else:
        try:
            out.write_text(text, encoding="utf-8")
        except OSError as exc:
            raise UserError(f"cannot write {out}: {exc.strerror}; choose a writable path") from None
    return 0
