"""gpudoctor: where did the GPU-hours go, and what to change.

Kept import-light on purpose: this package is imported inside the patient's
interpreter (via the injected ``sitecustomize``), so nothing here may import
torch, pandas or matplotlib at module load.
"""

from __future__ import annotations

from typing import Any

from gpudoctor._version import __version__

__all__ = ["__version__", "profile", "step", "load", "RunTables", "GpuDoctorCallback", "GpuDoctorLightningCallback"]


def __getattr__(name: str) -> Any:  # PEP 562: lazy public API
    if name in ("profile", "step"):
        from gpudoctor.integrations import loop

        return getattr(loop, name)
    if name in ("load", "RunTables"):  # a run as pandas tables (pandas is imported only when called)
        from gpudoctor import tables

        return getattr(tables, name)
    if name == "GpuDoctorCallback":
        from gpudoctor.integrations.hf import GpuDoctorCallback

        return GpuDoctorCallback
    if name == "GpuDoctorLightningCallback":
        from gpudoctor.integrations.lightning import GpuDoctorLightningCallback

        return GpuDoctorLightningCallback
    raise AttributeError(name)
