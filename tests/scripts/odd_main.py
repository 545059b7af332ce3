"""A pure-Python patient for the attach security tests: stdlib only, any Python 3.

``odd_main.py MODE SECONDS [until-eof]``. MODE:

* ``loop``: works for SECONDS;
* ``shadow``: the same, with ``compile``, ``exec``, ``open``, ``__import__``, ``sys`` and ``os``
  rebound in ``__main__`` (nanoGPT's configurator leaves ``compile = False`` there): an
  injection that looks up a name there breaks;
* ``no-builtins``: ``shadow``, and ``__builtins__`` itself rebound to a dict without them
  (CPython 3.14's own ``sys.remote_exec`` cannot open its script then: gdb's route only);
* ``refuse``: the payload cannot be imported (None in ``sys.modules``): the bootstrap fails;
* ``block``: the main thread sleeps in C for SECONDS, running no bytecode: an injection stays queued.

With ``until-eof`` the work also ends when stdin is closed (the test's ``communicate``): SECONDS is
then a cap, and a doctor slowed by a busy machine still finds the patient alive whatever its pace.

Prints ``ready`` once set up, then one JSON line at the end.
"""

import json as _json
import select as _select
import sys as _sys
import time as _time


def main(mode: str, seconds: float, until_eof: bool) -> int:
    if mode == "refuse":
        _sys.modules["gpudoctor.attach.payload"] = None  # type: ignore[assignment]
    print("ready", flush=True)
    n = 0
    if mode == "block":
        _time.sleep(seconds)
    else:
        start = look = _time.time()
        while _time.time() - start < seconds:
            n += sum(range(100)) == 4950
            # stdin is looked at by the clock, a few times a second: a select() every thousand rounds
            # (about every millisecond) let go of the GIL so briefly and so often that the payload's
            # watchdog, woken from its sleep, waited 1-12 s for it on a quiet machine (CPython's GIL
            # convoy), and the doctor saw its detach unconfirmed.
            if until_eof and _time.time() - look > 0.25:
                look = _time.time()
                if _select.select([_sys.stdin], [], [], 0)[0]:
                    break  # stdin readable: at EOF, the test is done with us
    print(_json.dumps({"done": n}), flush=True)  # no genexpr: it would take __main__'s __builtins__
    return 0


MODE, SECONDS, UNTIL_EOF = _sys.argv[1], float(_sys.argv[2]), _sys.argv[3:] == ["until-eof"]
if MODE in ("shadow", "no-builtins"):  # main() keeps the builtins it was defined with
    compile = False  # noqa: A001
    exec = open = __import__ = None  # noqa: A001
    sys = os = None
if MODE == "no-builtins":
    __builtins__ = {"print": print}
_sys.exit(main(MODE, SECONDS, UNTIL_EOF))
