"""A convolutional model's layers, recorded at its first forward and replayed as the warm-compute
stand-in (issue #40: two linear layers of a CNN's weight count ran 0.96 as fast after a build as
back to back where the CNN ran 0.70): what is recorded, what chains, and what a forged record gets."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from gpudoctor.hooks.torch_hooks import model_shape
from gpudoctor.launch import conv_net


def _cnn() -> nn.Module:
    """The proving ground's image classifier, with a batch norm and a grouped, strided convolution."""
    return nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(32, 64, 3, stride=2, padding=1, groups=2), nn.BatchNorm2d(64),
                         nn.ReLU(), nn.AdaptiveAvgPool2d(4), nn.Flatten(), nn.Linear(1024, 10))


class _Block(nn.Module):
    """A ResNet basic block that halves the size: its downsampling convolution reads the block's input."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(16, 32, 3, stride=2, padding=1)
        self.conv2 = nn.Conv2d(32, 32, 3, padding=1)
        self.downsample = nn.Conv2d(16, 32, 1, stride=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.conv2(torch.relu(self.conv1(x))) + self.downsample(x))


def test_a_cnns_layers_are_recorded_in_order_and_replayed_with_its_weights() -> None:
    model = _cnn()
    shape = model_shape(model)
    assert shape is not None
    assert shape["layers"] == [["conv", 3, 32, 3, 3, 1, 1, 1, 1, 1, 1, 1], ["pool", "max", 2, 2, 2, 2, 0, 0],
                               ["conv", 32, 64, 3, 3, 2, 2, 1, 1, 1, 1, 2], ["norm", 64], ["adaptive", 4, 4],
                               ["linear", 1024, 10]]
    params = sum(p.numel() for p in model.parameters())
    net = conv_net.chain({**shape, "input": [8, 3, 64, 64]}, params)
    assert net is not None and (net.convs, net.recorded_convs) == (2, 2) and len(net.layers) == 6
    stand_in, x = conv_net.build(net, torch)
    assert sum(p.numel() for p in stand_in.parameters()) == params  # every weight of the model, no more
    assert stand_in(x).shape == model(x).shape == (8, 10)
    same = model_shape(nn.Sequential(nn.Conv2d(3, 4, 5, padding="same"), nn.Conv2d(4, 4, 3, padding="valid")))
    assert same is not None and [layer[7:9] for layer in same["layers"]] == [[2, 2], [0, 0]]


def test_a_branch_that_does_not_follow_is_left_out_and_counted() -> None:
    stem = nn.Conv2d(3, 16, 3, padding=1)
    model = nn.Sequential(stem, _Block())
    shape = model_shape(model)
    assert shape is not None and [layer[0] for layer in shape["layers"]] == ["conv"] * 4
    net = conv_net.chain({**shape, "input": [2, 3, 32, 32]}, None)
    assert net is not None and (net.convs, net.recorded_convs) == (3, 4)  # the downsampling reads 16 channels
    stand_in, x = conv_net.build(net, torch)
    assert stand_in(x).shape == model(x).shape  # the main path's shapes, as the model's


def test_a_model_without_convolutions_records_no_layers() -> None:
    shape = model_shape(nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2)))
    assert shape is not None and "layers" not in shape


@pytest.mark.parametrize("shape", [
    {"layers": [["conv", 3, 8, 3, 3, 1, 1, 1, 1, 1, 1, 1]], "input": [1 << 10, 3, 4096, 4096]},  # past MAX_ELEMENTS
    {"layers": [["conv", 3, 4096, 3, 3, 1, 1, 1, 1, 1, 1, 1]] + [["conv", 4096, 4096, 3, 3, 1, 1, 1, 1, 1, 1, 1]],
     "input": [1, 3, 8, 8]},  # 151M weights, past twice the 1000 the model said it had
    {"layers": [["linear", 12, 4]], "input": [1, 3, 2, 2]},  # no convolution: nothing a CNN's stand-in adds
    {"layers": [["conv", True, 8, 3, 3, 1, 1, 1, 1, 1, 1, 1], ["conv", 3, 8, -3, 3, 1, 1, 1, 1, 1, 1, 1],
                ["conv", 3, 8, 3, 3, 0, 1, 1, 1, 1, 1, 1], ["conv", "3", 8], "conv", None],
     "input": [1, 3, 8, 8]},  # forged entries: each refused, and then nothing is left
    {"layers": [["conv", 3, 8, 3, 3, 1, 1, 1, 1, 1, 1, 1]] * (conv_net.MAX_LAYERS + 1), "input": [1, 3, 8, 8]},
    {"layers": [["conv", 3, 8, 3, 3, 1, 1, 1, 1, 1, 1, 1]], "input": [1, 3, 8]},
    {"layers": [["conv", 3, 8, 3, 3, 1, 1, 1, 1, 1, 1, 1]], "input": [0, 3, 8, 8]},
    {"layers": "conv", "input": [1, 3, 8, 8]},
])
def test_a_record_the_stand_in_cannot_honestly_or_safely_build_is_refused(shape: dict[str, object]) -> None:
    assert conv_net.chain(shape, 1000) is None


def test_a_layer_that_leaves_no_pixels_is_skipped_not_built() -> None:
    layers = [["conv", 3, 8, 3, 3, 1, 1, 1, 1, 1, 1, 1], ["conv", 8, 8, 9, 9, 1, 1, 0, 0, 1, 1, 1],
              ["pool", "max", 2, 2, 2, 2, 0, 0]]
    net = conv_net.chain({"layers": layers, "input": [1, 3, 4, 4]}, None)
    assert net is not None and [layer[0] for layer in net.layers] == ["conv", "pool"]
    stand_in, x = conv_net.build(net, torch)
    assert stand_in(x).shape == (1, 8, 2, 2)
