"""ResNet (He et al. 2015) in torchvision's layout: `conv1`, `bn1`, `layer1..4` of BasicBlock/Bottleneck blocks
(stride on the 3x3 conv, "v1.5"), `fc`."""
from __future__ import annotations

from typing import Callable

from tiny_tensor import nn
from tiny_tensor.tensor import Tensor

__all__ = ["ResNet", "resnet18", "resnet34", "resnet50"]


class BasicBlock:
  """Two 3x3 convolutions and a shortcut (a 1x1 conv + BN when the shape changes)."""
  expansion = 1

  def __init__(self, cin: int, planes: int, stride: int = 1):
    self.conv1 = nn.Conv2d(cin, planes, 3, stride, 1, bias=False)
    self.bn1 = nn.BatchNorm2d(planes)
    self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
    self.bn2 = nn.BatchNorm2d(planes)
    self.downsample: list[Callable[[Tensor], Tensor]] = \
      [nn.Conv2d(cin, planes, 1, stride, bias=False), nn.BatchNorm2d(planes)] if stride != 1 or cin != planes else []

  def __call__(self, x: Tensor) -> Tensor:
    out = self.bn2(self.conv2(self.bn1(self.conv1(x)).relu()))
    return (out + x.sequential(self.downsample)).relu()


class Bottleneck:
  """1x1 reduce, 3x3 (strided), 1x1 expand by 4, and a shortcut."""
  expansion = 4

  def __init__(self, cin: int, planes: int, stride: int = 1):
    self.conv1 = nn.Conv2d(cin, planes, 1, bias=False)
    self.bn1 = nn.BatchNorm2d(planes)
    self.conv2 = nn.Conv2d(planes, planes, 3, stride, 1, bias=False)
    self.bn2 = nn.BatchNorm2d(planes)
    self.conv3 = nn.Conv2d(planes, planes * 4, 1, bias=False)
    self.bn3 = nn.BatchNorm2d(planes * 4)
    self.downsample: list[Callable[[Tensor], Tensor]] = \
      [nn.Conv2d(cin, planes * 4, 1, stride, bias=False), nn.BatchNorm2d(planes * 4)] \
      if stride != 1 or cin != planes * 4 else []

  def __call__(self, x: Tensor) -> Tensor:
    out = self.bn1(self.conv1(x)).relu()
    out = self.bn2(self.conv2(out)).relu()
    out = self.bn3(self.conv3(out))
    return (out + x.sequential(self.downsample)).relu()


class ResNet:
  """`ResNet(block, layers, num_classes=1000, width=64)`: a 7x7/2 stem, max pool, four stages, global average pool."""

  def __init__(self, block: type[BasicBlock] | type[Bottleneck], layers: list[int], num_classes: int = 1000,
               width: int = 64):
    self.conv1 = nn.Conv2d(3, width, 7, 2, 3, bias=False)
    self.bn1 = nn.BatchNorm2d(width)
    cin = width
    for i, n in enumerate(layers):
      planes = width * 2 ** i
      blocks: list[BasicBlock | Bottleneck] = []
      for j in range(n):
        blocks.append(block(cin, planes, 2 if j == 0 and i > 0 else 1))
        cin = planes * block.expansion
      setattr(self, f"layer{i + 1}", blocks)
    self.fc = nn.Linear(cin, num_classes)

  def features(self, x: Tensor) -> Tensor:
    """(N, C) pooled features before `fc`."""
    x = self.bn1(self.conv1(x)).relu().max_pool2d(3, 2, padding=1)
    for i in range(4): x = x.sequential(getattr(self, f"layer{i + 1}"))
    return x.mean((2, 3))

  def __call__(self, x: Tensor) -> Tensor: return self.fc(self.features(x))


def resnet18(num_classes: int = 1000, width: int = 64) -> ResNet:
  """ResNet-18 (BasicBlock x [2, 2, 2, 2]); `width` scales every stage's channels (64 is the standard network)."""
  return ResNet(BasicBlock, [2, 2, 2, 2], num_classes, width)
def resnet34(num_classes: int = 1000, width: int = 64) -> ResNet:
  """ResNet-34 (BasicBlock x [3, 4, 6, 3]); `width` scales every stage's channels (64 is the standard network)."""
  return ResNet(BasicBlock, [3, 4, 6, 3], num_classes, width)
def resnet50(num_classes: int = 1000, width: int = 64) -> ResNet:
  """ResNet-50 (Bottleneck x [3, 4, 6, 3]); `width` scales every stage's channels (64 is the standard network)."""
  return ResNet(Bottleneck, [3, 4, 6, 3], num_classes, width)
