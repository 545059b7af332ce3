"""A stand-in for a convolutional model's compute: its recorded layers replayed at its batch's shape.

The warm-compute timing (:mod:`gpudoctor.launch.warm_compute`) times a stand-in step right after a
build and back to back. Two linear layers of a CNN's weight count ran after a build 0.96 as fast as
back to back where the CNN itself ran 0.70 (proving loops 11 and 12: images decoded and augmented on
the training process, a prediction 20% short): a convolution's working set (the image batch, its
unfolded patches, each layer's activations) is what a build pushes out of the caches, and a
matmul on a few weights holds none of it. The hooks record a model's convolutions, pools, batch
norms and linear layers in module order and the first forward's image batch shape (shapes only,
:func:`gpudoctor.hooks.torch_hooks.model_shape`); :func:`chain` keeps the layers that follow one
another at those shapes (a branch that does not, a ResNet's downsampling, is left out and said by
the count), bounded in weights and in activation size, and :func:`build` makes them a model, with a
ReLU after each convolution. Nothing of the user's code runs: the layers are torch's own.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeGuard

MAX_LAYERS = 256
MAX_ELEMENTS = 1 << 26  # one activation at most (256 MiB of float32): a recorded shape past it is not timed
MAX_PARAMS = 1 << 27  # and at most twice the training's own weight count


@dataclass(frozen=True)
class Chain:
    """The layers that chain, the input they take, and how many convolutions of the model they hold."""

    layers: list[list[Any]]
    input: list[int]  # N, C, H, W
    convs: int
    recorded_convs: int


def chain(shape: Mapping[str, Any], params: int | None) -> Chain | None:
    """The recorded layers that follow one another from the recorded input, or None where none of
    its convolutions does, the record is malformed, or the stand-in would outgrow the bounds."""
    layers, size = shape.get("layers"), shape.get("input")
    if not isinstance(layers, list) or not _ints(size, 4) or len(layers) > MAX_LAYERS:
        return None
    n, c, h, w = size
    if min(n, c, h, w) < 1 or n * c * h * w > MAX_ELEMENTS:
        return None
    kept: list[list[Any]] = []
    state: tuple[int, ...] = (c, h, w)
    weights, convs, recorded = 0, 0, 0
    for layer in layers:
        recorded += isinstance(layer, list) and bool(layer) and layer[0] == "conv"
        step = _next(layer, state)
        if step is None:
            continue
        state, added = step
        if n * math.prod(state) > MAX_ELEMENTS:
            return None
        weights += added
        convs += layer[0] == "conv"
        kept.append(list(layer))
    limit = min(MAX_PARAMS, 2 * params) if params else MAX_PARAMS
    if not convs or weights > limit:
        return None
    return Chain(kept, [n, c, h, w], convs, recorded)


def _next(layer: object, state: tuple[int, ...]) -> tuple[tuple[int, ...], int] | None:
    """The activation's shape (C, H, W, or the flat width) after ``layer`` and its weight count;
    None where the layer is malformed or does not take this shape."""
    if not isinstance(layer, list) or not layer or not isinstance(layer[0], str):
        return None
    kind, nums = layer[0], layer[1:]
    if kind == "conv" and _ints(nums, 11) and len(state) == 3:
        cin, cout, kh, kw, sh, sw, ph, pw, dh, dw, groups = nums
        if (cin != state[0] or min(cout, kh, kw, sh, sw, dh, dw, groups) < 1 or cin % groups or cout % groups
                or min(ph, pw) < 0):
            return None
        h = (state[1] + 2 * ph - dh * (kh - 1) - 1) // sh + 1
        w = (state[2] + 2 * pw - dw * (kw - 1) - 1) // sw + 1
        return ((cout, h, w), cout * cin // groups * kh * kw + cout) if min(h, w) >= 1 else None
    if kind == "pool" and len(nums) == 7 and nums[0] in ("max", "avg") and _ints(nums[1:], 6) and len(state) == 3:
        kh, kw, sh, sw, ph, pw = nums[1:]
        if min(kh, kw, sh, sw) < 1 or not (0 <= ph <= kh // 2 and 0 <= pw <= kw // 2):
            return None
        h, w = (state[1] + 2 * ph - kh) // sh + 1, (state[2] + 2 * pw - kw) // sw + 1
        return ((state[0], h, w), 0) if min(h, w) >= 1 else None
    if kind == "adaptive" and _ints(nums, 2) and len(state) == 3 and min(nums) >= 1:
        return (state[0], *nums), 0
    if kind == "norm" and _ints(nums, 1) and len(state) == 3 and nums[0] == state[0]:
        return state, 2 * nums[0]
    if kind == "linear" and _ints(nums, 2) and min(nums) >= 1 and nums[0] == math.prod(state):
        return (nums[1],), nums[0] * nums[1] + nums[1]
    return None


def build(c: Chain, torch: Any) -> tuple[Any, Any]:
    """The chain as a ``torch.nn.Sequential`` and a random input batch of the recorded shape."""
    nn = torch.nn
    mods: list[Any] = []
    flat = False
    for layer in c.layers:
        kind, nums = layer[0], layer[1:]
        if kind == "conv":
            cin, cout, kh, kw, sh, sw, ph, pw, dh, dw, groups = nums
            mods += [nn.Conv2d(cin, cout, (kh, kw), (sh, sw), (ph, pw), (dh, dw), groups), nn.ReLU()]
        elif kind == "pool":
            pool = nn.MaxPool2d if nums[0] == "max" else nn.AvgPool2d
            mods.append(pool((nums[1], nums[2]), (nums[3], nums[4]), (nums[5], nums[6])))
        elif kind == "adaptive":
            mods.append(nn.AdaptiveAvgPool2d((nums[0], nums[1])))
        elif kind == "norm":
            mods.append(nn.BatchNorm2d(nums[0]))
        else:
            if not flat:
                mods.append(nn.Flatten())
                flat = True
            mods.append(nn.Linear(nums[0], nums[1]))
    return nn.Sequential(*mods), torch.rand(*c.input)


def _ints(value: object, n: int) -> TypeGuard[Sequence[int]]:
    return (isinstance(value, Sequence) and not isinstance(value, str) and len(value) == n
            and all(isinstance(v, int) and not isinstance(v, bool) for v in value))
