"""MobileNetV2 (Sandler et al. 2018) in torchvision's layout: `features` (a stem conv, inverted residual blocks of
expand 1x1 -> depthwise 3x3 -> linear 1x1, a last 1x1 conv; each conv followed by BatchNorm and ReLU6 except the
linear ones) and `classifier.1` (dropout, then Linear)."""
from __future__ import annotations

from typing import Any

from tiny_tensor import nn
from tiny_tensor.tensor import Tensor

__all__ = ["MobileNetV2"]


def _make_divisible(v: float, divisor: int = 8) -> int:
  new = max(divisor, int(v + divisor / 2) // divisor * divisor)
  return new + divisor if new < 0.9 * v else new


class ConvBNReLU(list):
  """Conv2d (no bias) + BatchNorm + ReLU6 as a list, so they are named `0` and `1` like torchvision's
  Conv2dNormActivation."""

  def __init__(self, cin: int, cout: int, k: int = 3, stride: int = 1, groups: int = 1):
    super().__init__([nn.Conv2d(cin, cout, k, stride, (k - 1) // 2, groups=groups, bias=False), nn.BatchNorm2d(cout)])

  def __call__(self, x: Tensor) -> Tensor: return x.sequential(list(self)).relu6()


class InvertedResidual:
  """expand (t > 1) -> depthwise 3x3 (stride) -> linear projection; a residual add when shapes match."""

  def __init__(self, cin: int, cout: int, stride: int, t: int):
    hidden = cin * t
    self.use_res = stride == 1 and cin == cout
    conv: list[Any] = [ConvBNReLU(cin, hidden, 1)] if t != 1 else []
    conv += [ConvBNReLU(hidden, hidden, 3, stride, groups=hidden), nn.Conv2d(hidden, cout, 1, bias=False),
             nn.BatchNorm2d(cout)]
    self.conv = conv

  def __call__(self, x: Tensor) -> Tensor:
    y = x.sequential(self.conv)
    return x + y if self.use_res else y


# (expansion t, channels c, repeats n, first stride s) of the paper's Table 2
SETTINGS = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1)]


class MobileNetV2:
  """`MobileNetV2(num_classes=1000, width_mult=1.0, settings=SETTINGS)`."""

  def __init__(self, num_classes: int = 1000, width_mult: float = 1.0, settings: list | None = None,
               last_channel: int = 1280):
    cin = _make_divisible(32 * width_mult)
    self.last_channel = _make_divisible(last_channel * max(1.0, width_mult))
    feats: list[Any] = [ConvBNReLU(3, cin, 3, 2)]
    for t, c, n, s in settings or SETTINGS:
      cout = _make_divisible(c * width_mult)
      for i in range(n):
        feats.append(InvertedResidual(cin, cout, s if i == 0 else 1, t))
        cin = cout
    feats.append(ConvBNReLU(cin, self.last_channel, 1))
    self.features = feats
    # index 0 is dropout (no weights): the state dict's names are torchvision's `classifier.1.weight`, ...
    self.classifier: tuple[None, nn.Linear] = (None, nn.Linear(self.last_channel, num_classes))

  def __call__(self, x: Tensor) -> Tensor:
    x = x.sequential(self.features).mean((2, 3))
    return self.classifier[1](x.dropout(0.2))
