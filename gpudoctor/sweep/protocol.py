"""How a trial is measured (part of its cache key). Stdlib only: the sweep's flags import it,
and ``gpudoctor --help`` stays fast."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class Protocol:
    """How a trial is measured; part of the cache key.

    ``torch_threads`` caps the trial's intra-op threads (``OMP_NUM_THREADS``; None:
    PyTorch's default). On a CPU box the replay's model is a stand-in for GPU work,
    and two spinning OpenMP threads fighting DataLoader workers for two cores made
    steps 5-40x slower and noisy; one thread leaves the cores to the input side,
    as a GPU would.
    """

    warmup_s: float = 2.0
    window_s: float = 2.0
    windows: int = 3
    torch_threads: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def train_s(self) -> float:
        """Training seconds to ask of the worker: warm-up, the windows, a margin for the first batch."""
        return self.warmup_s + self.windows * self.window_s + 1.0
