"""Plain-torch definitions of the vision and audio models the ONNX conv tests export.

torchvision is not a dependency: `resnet18` and `mobilenet_v3_small` follow
torchvision's architectures (BasicBlock with a 1x1 downsample; inverted residual
blocks with squeeze-excitation, hardswish and hardsigmoid, torchvision's
block table for the small variant), with random weights. `AudioFrontEnd` is
Whisper's encoder stem: two conv1d (the second stride 2), each followed by GELU.
Batch-norm statistics are randomized so that folding them is actually tested.
"""

from __future__ import annotations

import io

import torch
from torch import nn


def _randomize_bn(model: nn.Module, seed: int) -> nn.Module:
    gen = torch.Generator().manual_seed(seed)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            c = m.num_features
            m.running_mean.copy_(torch.randn(c, generator=gen) * 0.1)
            m.running_var.copy_(torch.rand(c, generator=gen) * 0.5 + 0.75)
            m.weight.data.copy_(torch.rand(c, generator=gen) * 0.5 + 0.75)
            m.bias.data.copy_(torch.randn(c, generator=gen) * 0.1)
    return model.eval()


# ── ResNet-18 ───────────────────────────────────────────────────────────


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, inplanes: int, planes: int, stride: int = 1, downsample: nn.Module | None = None) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class ResNet18(nn.Module):
    def __init__(self, num_classes: int = 1000) -> None:
        super().__init__()
        self.inplanes = 64
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        self.layer1 = self._layer(64, 2)
        self.layer2 = self._layer(128, 2, 2)
        self.layer3 = self._layer(256, 2, 2)
        self.layer4 = self._layer(512, 2, 2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(512, num_classes)

    def _layer(self, planes: int, blocks: int, stride: int = 1) -> nn.Sequential:
        downsample = None
        if stride != 1 or self.inplanes != planes:
            downsample = nn.Sequential(nn.Conv2d(self.inplanes, planes, 1, stride, bias=False), nn.BatchNorm2d(planes))
        layers = [BasicBlock(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes
        layers += [BasicBlock(planes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


# ── MobileNetV3-small ───────────────────────────────────────────────────


def _make_divisible(v: float, divisor: int = 8) -> int:
    new_v = max(divisor, int(v + divisor / 2) // divisor * divisor)
    return new_v + divisor if new_v < 0.9 * v else new_v


class ConvBNAct(nn.Sequential):
    def __init__(self, cin: int, cout: int, k: int, stride: int = 1, groups: int = 1,
                 act: type[nn.Module] | None = nn.Hardswish) -> None:
        layers: list[nn.Module] = [nn.Conv2d(cin, cout, k, stride, (k - 1) // 2, groups=groups, bias=False),
                                   nn.BatchNorm2d(cout, eps=0.001, momentum=0.01)]
        if act is not None:
            layers.append(act())
        super().__init__(*layers)


class SqueezeExcitation(nn.Module):
    def __init__(self, channels: int, squeeze: int) -> None:
        super().__init__()
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc1 = nn.Conv2d(channels, squeeze, 1)
        self.fc2 = nn.Conv2d(squeeze, channels, 1)
        self.relu = nn.ReLU()
        self.hardsigmoid = nn.Hardsigmoid()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = self.hardsigmoid(self.fc2(self.relu(self.fc1(self.avgpool(x)))))
        return scale * x


class InvertedResidual(nn.Module):
    def __init__(self, cin: int, k: int, expanded: int, cout: int, use_se: bool, use_hs: bool, stride: int) -> None:
        super().__init__()
        self.use_res = stride == 1 and cin == cout
        act = nn.Hardswish if use_hs else nn.ReLU
        layers: list[nn.Module] = []
        if expanded != cin:
            layers.append(ConvBNAct(cin, expanded, 1, act=act))
        layers.append(ConvBNAct(expanded, expanded, k, stride, groups=expanded, act=act))
        if use_se:
            layers.append(SqueezeExcitation(expanded, _make_divisible(expanded // 4)))
        layers.append(ConvBNAct(expanded, cout, 1, act=None))
        self.block = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.block(x)
        return y + x if self.use_res else y


#: torchvision's mobilenet_v3_small table: input, kernel, expanded, output, SE, hardswish, stride.
_SMALL = [(16, 3, 16, 16, True, False, 2), (16, 3, 72, 24, False, False, 2), (24, 3, 88, 24, False, False, 1),
          (24, 5, 96, 40, True, True, 2), (40, 5, 240, 40, True, True, 1), (40, 5, 240, 40, True, True, 1),
          (40, 5, 120, 48, True, True, 1), (48, 5, 144, 48, True, True, 1), (48, 5, 288, 96, True, True, 2),
          (96, 5, 576, 96, True, True, 1), (96, 5, 576, 96, True, True, 1)]


class MobileNetV3Small(nn.Module):
    def __init__(self, num_classes: int = 1000) -> None:
        super().__init__()
        layers: list[nn.Module] = [ConvBNAct(3, 16, 3, 2)]
        layers += [InvertedResidual(*row) for row in _SMALL]
        layers.append(ConvBNAct(96, 576, 1))
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Sequential(nn.Linear(576, 1024), nn.Hardswish(), nn.Dropout(0.2),
                                        nn.Linear(1024, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.avgpool(self.features(x)), 1))


# ── a Whisper-like audio front end ─────────────────────────────────────


class AudioFrontEnd(nn.Module):
    """Whisper's encoder stem: conv1d(k=3, pad 1) + GELU, conv1d(k=3, stride 2, pad 1) + GELU."""

    def __init__(self, mels: int = 16, width: int = 32) -> None:
        super().__init__()
        self.conv1 = nn.Conv1d(mels, width, 3, padding=1)
        self.conv2 = nn.Conv1d(width, width, 3, stride=2, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = nn.functional.gelu(self.conv1(x))
        return nn.functional.gelu(self.conv2(x)).permute(0, 2, 1)


def build(name: str, seed: int = 0) -> nn.Module:
    """A model by name ("resnet18", "mobilenet_v3_small", "audio"), random weights from `seed`, in eval mode."""
    torch.manual_seed(seed)
    model = {"resnet18": ResNet18, "mobilenet_v3_small": MobileNetV3Small, "audio": AudioFrontEnd}[name]()
    return _randomize_bn(model, seed)


def export(model: nn.Module, example: torch.Tensor, *, dynamo: bool = False) -> bytes:
    """The ONNX bytes of `model` with a dynamic batch axis named "batch"."""
    buf = io.BytesIO()
    kwargs = {"dynamo": dynamo}
    if dynamo:
        kwargs["dynamic_shapes"] = ({0: torch.export.Dim("batch", max=64)},)
    else:
        kwargs["dynamic_axes"] = {"x": {0: "batch"}, "y": {0: "batch"}}
    with torch.no_grad():
        torch.onnx.export(model, (example,), buf, input_names=["x"], output_names=["y"], opset_version=17, **kwargs)
    return buf.getvalue()
