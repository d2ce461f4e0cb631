"""A matmul's or conv's elementwise epilogue realized with it when its value is broadcast into the next product (#39).

The scheduler realizes a contraction whose value a growing EXPAND reads (the next matmul's operand); its epilogue (a
Gemm's bias, Hardswish, a squeeze-excite's hardsigmoid) used to be fused into the reader's load instead, evaluated
once per broadcast element: mobilenet_v3_small's classifier computed the Hardswish between its two Gemms 1000 times
over its 1024 values, and the second Gemm's body was too big for its dot-product lanes (272 us of the model's 2.3 ms,
one thread, Zen 4). Now the end of the epilogue is realized in the contraction's kernel: the same kernel count, the
reader a plain product; a pool's mean read by the next Gemm likewise. Elementwise rows shorter than a vector
register (the squeeze-excite scales of 14x14 and 7x7 maps) are one vector a row. A depthwise conv whose SiLU two
kernels read (efficientnet_b0's squeeze-excite) computes the SiLU itself, where an exp2 kernel of its own stood.
Values against torch; kernel counts as before the change; the LLVM source of each kernel.
"""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tiny_tensor import Tensor, engine

rng = np.random.default_rng(39)


def _t(a: np.ndarray) -> Tensor:
  """A realized CPU tensor: these checks are of the CPU's schedule and LLVM source."""
  return Tensor(a, device="CPU").realize()


def _arr(*shape: int) -> np.ndarray:
  return (rng.standard_normal(shape) * 0.3).astype(np.float32)


def _kernels(fn, *args: Tensor) -> tuple[np.ndarray, list]:
  """`fn(*args)` realized: its value and the kernel calls it made."""
  calls: list = []
  with engine.capture(calls.append): out = fn(*args).realize().numpy()
  return out, [c for c in calls if c.kind == "kernel"]


def test_classifier_hardswish_in_the_first_gemm():
  # mobilenet_v3_small's head: Gemm 576 -> 1024, Hardswish, Gemm 1024 -> 1000 (nn.Linear's x @ W.T + b)
  x, w1, b1, w2, b2 = _arr(1, 576), _arr(1024, 576), _arr(1024), _arr(1000, 1024), _arr(1000)
  got, ks = _kernels(lambda x, w1, b1, w2, b2: x.linear(w1.T, b1).hardswish().linear(w2.T, b2),
                     *[_t(v) for v in (x, w1, b1, w2, b2)])
  tx = F.hardswish(torch.from_numpy(x) @ torch.from_numpy(w1).T + torch.from_numpy(b1))
  want = (tx @ torch.from_numpy(w2).T + torch.from_numpy(b2)).numpy()
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
  assert len(ks) == 2, [k.spec.name for k in ks]
  first, second = ks[0].spec.src, ks[1].spec.src
  assert ks[0].bufs[0].size == 1024 and ks[1].bufs[0].size == 1000
  # Hardswish's clamps (compares and selects) are in the first Gemm's kernel, once per value; the second one reads a
  # buffer and the bias: nothing to compare
  assert "fcmp" in first and "select" in first, first
  assert "fcmp" not in second and "select" not in second, second


def test_squeeze_excite_gate_in_its_conv():
  # a squeeze-excite block: pool, 1x1 conv + ReLU, 1x1 conv + hardsigmoid, scaling the input (broadcast over H, W):
  # the hardsigmoid is the second 1x1 conv's epilogue, not evaluated per pixel by the scaling kernel
  C, S, H = 96, 24, 14
  x, ws1, bs1, ws2, bs2 = _arr(1, C, H, H), _arr(S, C, 1, 1), _arr(S), _arr(C, S, 1, 1), _arr(C)

  def se(x, ws1, bs1, ws2, bs2, F=None):
    if F is None: return x * x.mean((2, 3), keepdim=True).conv2d(ws1, bs1).relu().conv2d(ws2, bs2).hardsigmoid()
    return x * F.hardsigmoid(F.conv2d(F.relu(F.conv2d(x.mean((2, 3), keepdim=True), ws1, bs1)), ws2, bs2))
  got, ks = _kernels(se, *[_t(v) for v in (x, ws1, bs1, ws2, bs2)])
  want = se(*[torch.from_numpy(v) for v in (x, ws1, bs1, ws2, bs2)], F=F).numpy()
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
  names = [k.spec.name for k in ks]
  assert len(ks) == 6, names  # pool, weight copy, conv + ReLU, weight copy, conv + hardsigmoid, scale (as before)
  scale = ks[-1].spec.src
  assert ks[-1].bufs[0].size == C * H * H and ks[-2].bufs[0].size == C, names
  assert "fcmp" in ks[-2].spec.src and "fcmp" not in scale, scale


def test_epilogue_read_twice_stays_with_its_reader():
  # a matmul's value read by two different epilogues (a ReLU into the next matmul, a plain copy out): no single end
  # to realize, so the product is realized as before and each reader applies its own op; values as torch's
  x, w1, w2 = _arr(4, 64), _arr(64, 32), _arr(32, 48)

  def two(x, w1, w2):
    h = x @ w1
    return (h.relu() @ w2).sum() + (h * 2).sum()
  got, ks = _kernels(two, *[_t(v) for v in (x, w1, w2)])
  th = torch.from_numpy(x) @ torch.from_numpy(w1)
  want = ((th.relu() @ torch.from_numpy(w2)).sum() + (th * 2).sum()).numpy()
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
  assert ks[0].bufs[0].size == 4 * 32, [k.spec.name for k in ks]


@pytest.mark.parametrize("width", [64, 32])
def test_short_rows_are_one_vector_each(vector_registers, width: int):
  # the squeeze-excite scale of a 14x14 map (and 7x7): rows shorter than a vector register (AVX-512: 16 floats,
  # AVX2: 8), which LLVM's loop vectorizer left scalar, are upcast whole: one 14-lane (7-lane) vector multiply a row;
  # a row of a register or more is left to the loop vectorizer; values as numpy's
  vector_registers(32 if width == 64 else 16, width)
  for c, h in ((240, 14), (576, 7)):
    c += width == 32  # another shape per register file: the compiled kernels are cached by their AST
    x, g = _arr(1, c, h, h), _arr(1, c, 1, 1)
    got, ks = _kernels(lambda x, g: x * g, _t(x), _t(g))
    np.testing.assert_array_equal(got, x * g)
    assert len(ks) == 1 and (f"fmul <{h} x float>" in ks[0].spec.src) == (h < width // 4), ks[0].spec.src


def test_pooled_mean_divided_once_before_the_gemm():
  # mobilenet_v3_small's head: global average pool of 576x7x7, then Gemm 576 -> 1024: the mean's `/ 49` was evaluated
  # in the Gemm's loads, an fdiv per weight (1024 times over the 576 sums); now the pool's kernel stores the mean. Not
  # a norm's mean (read by a subtraction: its statistics merge into one kernel, see test_schedule_tensor's layernorm)
  f, w, b = _arr(1, 576, 7, 7), _arr(1024, 576), _arr(1024)
  got, ks = _kernels(lambda f, w, b: f.mean((2, 3)).linear(w.T, b), *[_t(v) for v in (f, w, b)])
  want = (torch.from_numpy(f).mean((2, 3)) @ torch.from_numpy(w).T + torch.from_numpy(b)).numpy()
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
  assert len(ks) == 2 and ks[0].bufs[0].size == 576, [k.spec.name for k in ks]
  assert "fdiv" in ks[0].spec.src or "fmul" in ks[0].spec.src, ks[0].spec.src
  assert "fdiv" not in ks[1].spec.src, ks[1].spec.src


@pytest.mark.parametrize("stride, H", [(1, 28), (2, 56)])
def test_depthwise_silu_read_twice_is_the_convs_epilogue(stride: int, H: int):
  # efficientnet_b0's MBConv middle: depthwise conv + SiLU, read by the squeeze-excite's mean and by its scaling
  # (whose product the 1x1 project conv reads). The SiLU (an exp2) is realized in the depthwise conv's kernel, once
  # per value: before, the conv was stored, a kernel of its own stored exp2 of it and both readers read the two
  C, S, P = 48, 6, 16
  x, wd, w1, w2, wp = _arr(1, C, H, H), _arr(C, 1, 3, 3), _arr(S, C, 1, 1), _arr(C, S, 1, 1), _arr(P, C, 1, 1)

  def block(x, wd, w1, w2, wp):
    y = x.conv2d(wd, groups=C, stride=stride, padding=1).silu()
    return (y * y.mean((2, 3), keepdim=True).conv2d(w1).silu().conv2d(w2).sigmoid()).conv2d(wp)
  got, ks = _kernels(block, *[_t(v) for v in (x, wd, w1, w2, wp)])
  tx, twd, tw1, tw2, twp = (torch.from_numpy(v).double() for v in (x, wd, w1, w2, wp))
  ty = F.silu(F.conv2d(tx, twd, groups=C, stride=stride, padding=1))
  want = F.conv2d(ty * torch.sigmoid(F.conv2d(F.silu(F.conv2d(ty.mean((2, 3), keepdim=True), tw1)), tw2)), twp)
  np.testing.assert_allclose(got, want.numpy(), rtol=1e-4, atol=1e-4)
  out = (H - 1) // stride + 1
  maps = [k for k in ks if k.bufs[0].size == C * out * out]
  # the conv with its SiLU (the sigmoid's division in it), then the scaling, an elementwise kernel: no kernel that
  # stores an exp2 for the two readers
  assert [k.spec.name[0] for k in maps] == ["r", "E"], [k.spec.name for k in ks]
  assert "fdiv" in maps[0].spec.src and "fdiv" not in maps[1].spec.src


def test_depthwise_batchnorm_silu_read_twice_is_one_kernel():
  # the same with an unfolded batch norm between the conv and its SiLU (four more buffers): the whole epilogue stays
  # in the conv's kernel, none of its inner values (the normalized map, read through the SiLU by both kernels) stored
  # apart by the rule for values of many buffers that several kernels read
  C, H = 48, 28
  x, wd, m, v, g, b = _arr(1, C, H, H), _arr(C, 1, 3, 3), _arr(1, C, 1, 1), _arr(1, C, 1, 1), _arr(1, C, 1, 1), \
    _arr(1, C, 1, 1)

  def block(x, wd, m, v, g, b, F=None):
    conv = x.conv2d(wd, groups=C, padding=1) if F is None else F.conv2d(x, wd, groups=C, padding=1)
    y = (conv - m) * (v.abs() + 1e-5).rsqrt() * g + b
    y = y * y.sigmoid()
    return y * y.mean((2, 3), keepdim=True).sigmoid()
  got, ks = _kernels(block, *[_t(a) for a in (x, wd, m, v, g, b)])
  want = block(*[torch.from_numpy(a).double() for a in (x, wd, m, v, g, b)], F=F)
  np.testing.assert_allclose(got, want.numpy(), rtol=1e-4, atol=1e-5)
  maps = [k.spec.name for k in ks if k.bufs[0].size == C * H * H]
  assert len(maps) == 2 and maps[0].startswith("r_"), [k.spec.name for k in ks]
