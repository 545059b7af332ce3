"""The new lines of a run folder still being written, read a few times a minute by the live view.

The live view runs beside the training for hours: re-reading a recording every second would
cost the patient's machine more as the run grows. A :class:`FileTail` remembers how far it
read and reads only the bytes added since, at most :data:`MAX_READ_BYTES` per call (a burst
is caught up over the next calls); it holds one unfinished line at most, and a line longer
than :data:`~gpudoctor.recording.read.MAX_LINE_BYTES` is skipped, never held. Files are opened
through :func:`~gpudoctor.recording.read.open_recording_file` like every other reader (no
link, no FIFO, no stranger's file). What a tail keeps is up to its caller.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpudoctor.recording.read import MAX_LINE_BYTES, ReadIssues, open_recording_file, parse_lines

MAX_READ_BYTES = 4 * 2**20  # per file and call: a few seconds of the busiest rank's events
MAX_FILES = 512  # events files followed in one folder (ranks x workers); more are left unread


@dataclass
class FileTail:
    """One growing JSON-lines file, read from where the last call stopped."""

    path: Path
    offset: int = 0
    partial: bytes = b""
    skipping: bool = False  # inside a line over the cap: dropped up to its newline
    issues: ReadIssues = field(default_factory=ReadIssues)

    def read(self, max_bytes: int = MAX_READ_BYTES) -> list[Any]:
        """The objects of the whole lines added since the last call (unreadable ones dropped)."""
        fh = open_recording_file(self.path, self.issues)
        if fh is None:
            return []
        with fh:
            size = os.fstat(fh.fileno()).st_size
            if size < self.offset:  # truncated or replaced: start again
                self.offset, self.partial, self.skipping = 0, b"", False
            fh.seek(self.offset)
            data = fh.read(min(max_bytes, size - self.offset))
        self.offset += len(data)
        lines = data.split(b"\n")
        head = self.partial + lines[0]
        self.partial = b""
        whole = [head, *lines[1:-1]] if len(lines) > 1 else []
        if self.skipping and len(lines) > 1:
            whole, self.skipping = whole[1:], False  # the end of the long line
        rest = lines[-1] if len(lines) > 1 else head
        if self.skipping or len(rest) > MAX_LINE_BYTES:
            self.skipping = True
        else:
            self.partial = rest
        objs = parse_lines([line for line in whole if len(line) <= MAX_LINE_BYTES])
        return [o for o in objs if type(o) is dict]


@dataclass
class FolderTail:
    """Every ``events/*.jsonl`` of a run folder and its ``samples/gpu.jsonl``, each a :class:`FileTail`."""

    folder: Path
    events: dict[str, FileTail] = field(default_factory=dict)
    gpu: FileTail | None = None

    def read_events(self) -> dict[str, list[dict[str, Any]]]:
        """New event lines by file name (the writer's pid), files found since the last call included."""
        try:
            names = sorted(n for n in os.listdir(self.folder / "events") if n.endswith(".jsonl"))
        except OSError:
            names = []
        for name in names[:MAX_FILES]:
            self.events.setdefault(name, FileTail(self.folder / "events" / name))
        return {name: tail.read() for name, tail in self.events.items()}

    def read_gpu(self) -> list[dict[str, Any]]:
        """New rows of the GPU sampler."""
        if self.gpu is None:
            self.gpu = FileTail(self.folder / "samples" / "gpu.jsonl")
        return self.gpu.read()
