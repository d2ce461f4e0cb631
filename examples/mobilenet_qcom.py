"""A small MobileNet-style network on an Adreno GPU (or its mock), with fp16 math and weights read as textures.

    python examples/mobilenet_qcom.py                 # DEV=MOCK+QCOM unless --device says otherwise
    python examples/mobilenet_qcom.py --device QCOM   # on a phone with /dev/kgsl-3d0

The network is MobileNetV2's shape at a toy size: a strided 3x3 stem, inverted-residual blocks (1x1 expand ->
depthwise 3x3 -> 1x1 project, with a residual when the shape allows), batch norm (inference: running statistics),
ReLU6, global average pooling and a linear classifier. Parameters are stored in float32 and every layer computes in
float16 (the casts fuse into the kernels); with IMAGE=1 each kernel reads its read-only float32 buffers -- the
weights, the stem's input -- through the texture path, as Adreno deployments do. The same network runs on the CPU in
float32 as the reference; the script prints the largest difference (fp16 rounding), the kernel count and how many
kernels read textures, and the time of a jitted forward pass.
"""
from __future__ import annotations

import argparse
import time
from typing import Any

import numpy as np

from tiny_tensor import Tensor, TinyJit, dtypes, engine, nn
from tiny_tensor.nn.state import get_parameters, get_state_dict
from tiny_uop import Context

# (expansion, output channels, stride) per inverted-residual block, MobileNetV2's pattern shrunk
BLOCKS = ((1, 8, 1), (4, 16, 2), (4, 16, 1), (4, 24, 2), (4, 24, 1))


class ConvBN:
  """conv (any groups) -> batch norm -> ReLU6 (or none), in `dtype`."""

  def __init__(self, cin: int, cout: int, k: int, stride: int = 1, groups: int = 1, act: bool = True):
    self.conv = nn.Conv2d(cin, cout, k, stride=stride, padding=k // 2, groups=groups, bias=False)
    self.bn = nn.BatchNorm(cout)
    self.act = act

  def __call__(self, x: Tensor, dtype: Any) -> Tensor:
    w = self.conv.weight.cast(dtype)
    x = x.conv2d(w, None, self.conv.groups, self.conv.stride, 1, self.conv.padding)
    bn = self.bn
    inv = (bn.running_var + bn.eps).rsqrt()
    x = x.batchnorm(bn.weight.cast(dtype), bn.bias.cast(dtype), bn.running_mean.cast(dtype), inv.cast(dtype))
    return x.relu6() if self.act else x


class InvertedResidual:
  """1x1 expand -> depthwise 3x3 (stride) -> 1x1 project, plus the input when the shapes match."""

  def __init__(self, cin: int, expand: int, cout: int, stride: int):
    hidden = cin * expand
    self.layers = ([ConvBN(cin, hidden, 1)] if expand != 1 else []) + \
      [ConvBN(hidden, hidden, 3, stride, groups=hidden), ConvBN(hidden, cout, 1, act=False)]
    self.residual = stride == 1 and cin == cout

  def __call__(self, x: Tensor, dtype: Any) -> Tensor:
    h = x
    for layer in self.layers: h = layer(h, dtype)
    return x + h if self.residual else h


class MobileNetTiny:
  """Stem conv (stride 2) -> inverted residuals -> 1x1 conv -> global average pool -> linear (`classes` logits)."""

  def __init__(self, classes: int = 10, width: int = 8):
    self.stem = ConvBN(3, width, 3, stride=2)
    self.blocks, cin = [], width
    for t, c, s in BLOCKS:
      self.blocks.append(InvertedResidual(cin, t, c, s))
      cin = c
    self.head = ConvBN(cin, 64, 1)
    self.fc = nn.Linear(64, classes)

  def __call__(self, x: Tensor, dtype: Any = dtypes.float16) -> Tensor:
    h = self.stem(x.cast(dtype), dtype)
    for b in self.blocks: h = b(h, dtype)
    h = self.head(h, dtype).mean(axis=(2, 3))  # global average pooling
    return (h @ self.fc.weight.cast(dtype).T + self.fc.bias.cast(dtype)).cast(dtypes.float32)

  def parameters(self) -> list[Tensor]: return get_parameters(self)


def randomize(model: MobileNetTiny, seed: int) -> None:
  """Batch norm statistics and affine parameters of a trained-looking network (the defaults are the identity)."""
  rng = np.random.default_rng(seed)
  for layer in [model.stem, model.head] + [x for b in model.blocks for x in b.layers]:
    c = layer.bn.running_mean.shape[0]
    layer.bn.running_mean.assign(Tensor(rng.normal(0, 0.1, c).astype(np.float32)))
    layer.bn.running_var.assign(Tensor(rng.uniform(0.5, 1.5, c).astype(np.float32)))
    layer.bn.weight.assign(Tensor(rng.uniform(0.8, 1.2, c).astype(np.float32)))
    layer.bn.bias.assign(Tensor(rng.normal(0, 0.1, c).astype(np.float32)))


def to_device(model: MobileNetTiny, device: str) -> None:
  """Move every parameter and buffer of `model` to `device`."""
  for t in get_state_dict(model).values(): t.replace(t.to(device)).realize()


def run(device: str = "MOCK+QCOM", batch: int = 2, size: int = 32, seed: int = 0, image: int = 1,
        replays: int = 3) -> dict[str, Any]:
  """Build the network, run it on `device` (fp16, IMAGE=`image`, jitted: `replays` calls after the two that capture)
  and on the CPU in float32; return the outputs, the largest difference and kernel statistics."""
  Tensor.manual_seed(seed)
  model = MobileNetTiny()
  randomize(model, seed)
  x = np.random.default_rng(seed + 1).standard_normal((batch, 3, size, size)).astype(np.float32)
  ref = model(Tensor(x), dtypes.float32).numpy()  # the CPU reference, float32 all the way
  to_device(model, device)
  calls: list = []
  with Context(IMAGE=image):
    fwd = TinyJit(lambda t: model(t).realize())
    with engine.capture(calls.append): out = fwd(Tensor(x, device=device)).numpy()
    fwd(Tensor(x, device=device))  # the second call captures; later ones replay one prebuilt command buffer
    st = time.perf_counter()
    for _ in range(replays): outs = fwd(Tensor(x, device=device)).numpy()
    per_call = (time.perf_counter() - st) / max(replays, 1)
  kernels = [c for c in calls if c.kind == "kernel"]
  return {"out": out, "replayed": outs, "ref": ref, "max_abs_diff": float(np.abs(out - ref).max()),
          "scale": float(np.abs(ref).max()), "kernels": len(kernels),
          "texture_kernels": sum("read_image" in c.spec.src for c in kernels), "jit_kernels": fwd.captured.kernel_count,
          "half_kernels": sum("half" in c.spec.src or "_rh(" in c.spec.src for c in kernels),
          "seconds_per_forward": per_call,
          "graphs": [type(c.graph).__name__ for c in fwd.captured.plan if hasattr(c, "graph")]}


def main(argv: list[str] | None = None) -> dict[str, Any]:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--device", default="MOCK+QCOM")
  p.add_argument("--batch", type=int, default=2)
  p.add_argument("--size", type=int, default=32)
  p.add_argument("--image", type=int, default=1, help="IMAGE=1: read-only float32 buffers as textures")
  a = p.parse_args(argv)
  res = run(a.device, a.batch, a.size, image=a.image)
  print(f"{a.device}: logits {res['out'].shape}, max |{a.device} fp16 - CPU fp32| = {res['max_abs_diff']:.4f} "
        f"(outputs up to {res['scale']:.3f}); {res['kernels']} kernels, {res['texture_kernels']} read textures; "
        f"jitted forward {res['seconds_per_forward'] * 1e3:.1f} ms")
  return res


if __name__ == "__main__":
  main()
