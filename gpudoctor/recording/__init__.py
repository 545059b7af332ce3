"""A recorded run: raw samples and in-process events on disk, loadable later.

Folder layout (all appended as they come, so a crash loses at most ~1 s)::

    <run>/meta.json            run metadata (rewritten at start and end)
    <run>/samples/host.jsonl   psutil samples, one JSON object per line
    <run>/samples/gpu.jsonl    NVML samples, one JSON object per line
    <run>/events/<pid>.jsonl   in-process events from each hooked process
    <run>/report.{json,html,md}

See :mod:`gpudoctor.core.events` for the event kinds.
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpudoctor.recording.store import JsonlAppender, Recording, RunFolder, load_recording

__all__ = ["JsonlAppender", "Recording", "RunFolder", "load_recording"]


def __getattr__(name: str) -> Any:  # PEP 562: importing one module here never loads the store (orjson)
    if name in __all__:
        from gpudoctor.recording import store

        return getattr(store, name)
    raise AttributeError(name)
