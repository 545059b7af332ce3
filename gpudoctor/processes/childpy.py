"""The doctor's own Python children (the replay worker, a sweep's trials, Slurm tasks), started isolated.

``python -m MODULE`` puts the current folder first on ``sys.path``: run as root from a folder
another user owns, a ``gpudoctor/__init__.py`` or ``yaml.py`` planted there would run as root.
Every interpreter the doctor starts for its own code therefore runs with ``-I``: no current
folder or script folder on ``sys.path``, no ``PYTHON*`` variable (``PYTHONPATH`` included), no
user site-packages. This very ``gpudoctor`` package (which ``-I`` alone might not find: a source
checkout reached through ``PYTHONPATH``) is loaded by its absolute path, as the one package it
is; its folder is only appended to ``sys.path`` (for a ``spawn`` child), so nothing beside it
shadows a library. Under ``gpudoctor run``'s machinery (``GPUDOCTOR_RUN_DIR`` set), the hooks
are installed here, as the injected ``sitecustomize`` does for a patient (which ``-I``, ignoring
``PYTHONPATH``, would not load). The patient's own command under ``run`` is the user's and is
never changed.

Every other program the doctor starts for itself (gdb, py-spy, these children) gets
:func:`doctor_env`: PATH is the system folders, never root's own PATH, whose empty or relative
entry means the current folder. gdb runs ``iconv -l`` and a Python's ``platform.platform()``
runs ``uname -p`` by name: through such a PATH, from a folder another user owns, hers would run
as root (issue 34).
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path

from gpudoctor.common.termtext import say

SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
PKG_ROOT = Path(__file__).resolve().parent.parent  # .../gpudoctor
PKG_PARENT = PKG_ROOT.parent

# argv after -c: [PKG_PARENT, MODULE, *args]. No single quote inside, so a shell script can quote it plainly.
BOOT = "; ".join([
    "import importlib.util as u, os, runpy, sys",
    "root, module = sys.argv[1], sys.argv[2]",
    "del sys.argv[1:3]",
    "pkg = os.path.join(root, \"gpudoctor\")",
    "spec = u.spec_from_file_location(\"gpudoctor\", os.path.join(pkg, \"__init__.py\"), "
    "submodule_search_locations=[pkg])",
    "mod = u.module_from_spec(spec)",
    "sys.modules[\"gpudoctor\"] = mod",
    "spec.loader.exec_module(mod)",
    "sys.path.append(root)",
    "from gpudoctor.processes.childpy import boot_hooks",
    "boot_hooks()",
    "runpy.run_module(module, run_name=\"__main__\", alter_sys=True)",
])


def isolated(module: str, *args: str) -> list[str]:
    """The argv of ``python -m MODULE ARGS`` run as the doctor's own, isolated child (see above)."""
    return [sys.executable, "-I", "-c", BOOT, str(PKG_PARENT), module, *args]


def boot_hooks() -> None:
    """In an isolated child under ``run``'s machinery: install the hooks, as ``_inject/sitecustomize`` does."""
    run_dir = os.environ.get("GPUDOCTOR_RUN_DIR")
    if not run_dir or os.environ.get("GPUDOCTOR_HOOKS") == "0":
        return
    try:
        import gpudoctor.hooks as hooks

        hooks.install(run_dir)
    except Exception as exc:  # as sitecustomize: never stop the worker from starting
        say(f"gpudoctor: in-process hooks not loaded ({exc!r}); host-level figures only", file=sys.stderr)


def doctor_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a program the doctor starts for itself: ``base`` (default: the doctor's
    own) with PATH the system folders only, so nothing it runs by name comes from a user's folder."""
    env = dict(os.environ if base is None else base)
    env["PATH"] = SYSTEM_PATH
    return env


def which(program: str) -> str | None:
    """``shutil.which`` over the absolute ``PATH`` entries only: an empty or relative entry (``.``,
    ``bin``) means the current folder, which may be another user's (py-spy and gdb run as root)."""
    entries = [p for p in os.environ.get("PATH", os.defpath).split(os.pathsep) if os.path.isabs(p)]
    return shutil.which(program, path=os.pathsep.join(entries)) if entries else None
