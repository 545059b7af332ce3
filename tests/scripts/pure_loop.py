"""A pure-Python loop for interpreters without torch (the Python 3.14 attach test).

``pure_loop.py SECONDS [PATH [STOP]]`` works for SECONDS, or until the file STOP
exists (a test ends it once the doctor is done, however long a busy machine made
that), then prints one JSON line on what a detached doctor must have left behind
(nothing): gpudoctor's import finders still in ``sys.meta_path``, and whether PATH
(the folder the doctor added to ``sys.path`` to load its payload) is still there.
"""

from __future__ import annotations

import os
import sys
import time


def main() -> int:
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 5.0
    stop = sys.argv[3] if len(sys.argv) > 3 else None
    start = time.time()
    n = 0
    ok = True
    while time.time() - start < seconds and not (stop and n % 1000 == 0 and os.path.exists(stop)):
        ok = ok and sum(range(1000)) == 499500
        n += 1
    import json  # an import after the detach must still work

    finders = [f for f in sys.meta_path if type(f).__module__.startswith("gpudoctor")]
    path_left = len(sys.argv) > 2 and sys.argv[2] in sys.path
    print(json.dumps({"done": n, "ok": ok, "finders": len(finders), "path_left": path_left}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
