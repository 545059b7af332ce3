"""Loaded by every Python process started under ``gpudoctor run``.

``gpudoctor run`` puts this folder first on PYTHONPATH and sets
GPUDOCTOR_RUN_DIR. We install the in-process hooks, then hand over to any
``sitecustomize`` the environment already had, so the user's setup is kept.
"""

import os
import sys


def _gpudoctor_boot() -> None:
    run_dir = os.environ.get("GPUDOCTOR_RUN_DIR")
    if not run_dir or os.environ.get("GPUDOCTOR_HOOKS") == "0":
        return
    pkg_parent = os.environ.get("GPUDOCTOR_PKG_PARENT")
    try:
        import gpudoctor.hooks as hooks
    except ImportError:
        if not pkg_parent:
            raise
        sys.path.append(pkg_parent)  # appended: the user's own packages keep precedence
        import gpudoctor.hooks as hooks
    hooks.install(run_dir)


def _chain_user_sitecustomize() -> None:
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    path = [p for p in sys.path if os.path.abspath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)


try:
    _gpudoctor_boot()
except Exception as exc:  # never stop the patient from starting
    print(f"gpudoctor: in-process hooks not loaded ({exc!r}); host-level figures only", file=sys.stderr)
_chain_user_sitecustomize()
