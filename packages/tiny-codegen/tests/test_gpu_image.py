"""`IMAGE=1` (Adreno-style images) on OpenCL: kernels read their read-only float32 buffers as `imagef((h, w, 4))`
params (tiny_codegen/lower/image.py). Checked: the image layout, the generated `read_imagef`s (a float4-aligned access
picks a constant channel, the texel's four elements share one read), clang's acceptance, single kernels on PoCL vs
numpy, and a whole small convnet forward -- conv weights and (padded) activations, the linear layer -- compiled on
`NULL:OPENCL` with IMAGE=1 and replayed kernel by kernel on PoCL, equal to numpy."""
from __future__ import annotations

import re

import numpy as np
import pytest
from tiny_uop import Context, KernelInfo, Ops, UOp, dtypes
from tiny_uop.dtype import ImageDType
from tiny_uop.uop import AxisType

from tiny_codegen import get_program
from tiny_codegen.compiler.opencl import OpenCLCompiler, find_clang
from tiny_codegen.lower.image import image_params, image_shape
from tiny_codegen.renderer.opencl import OpenCLRenderer, image_params_of


import gpu_cl_runner as clr
_why = clr.available()  # type: ignore[attr-defined]
needs_pocl = pytest.mark.skipif(_why is not None, reason=_why or "")
rng = np.random.default_rng(3)


def P(slot: int, size: int) -> UOp: return UOp(Ops.PARAM, dtypes.float.ptr(size), arg=slot)


def matmul_ast(M: int, N: int, K: int) -> UOp:
  c, a, b = P(0, M * N), P(1, M * K), P(2, K * N)
  i, j, k = UOp.range(M, 0), UOp.range(N, 1), UOp.range(K, 2, AxisType.REDUCE)
  val = (a.index(i * K + k).load() * b.index(k * N + j).load()).reduce(k, arg=Ops.ADD)
  return c.index(i * N + j).store(val).sink(arg=KernelInfo(f"imm_{M}_{N}_{K}"))


def test_image_shape():
  assert image_shape(4 * 12) == (1, 12, 4)
  assert image_shape(4 * 8192 * 3, 8192) == (3, 8192, 4)
  assert image_shape(4 * 3 * 8191, 8192) == (3, 8191, 4)  # the widest row that divides the texels
  assert image_shape(10) is None and image_shape(0) is None  # not a multiple of 4 floats: stays a buffer
  assert image_shape(4 * 8209 * 8209, 8192) is None  # a prime square: no layout within the limits
  for size in (4, 64, 216, 1728, 4 * 9000):
    h, w, c = image_shape(size, 8192)  # type: ignore[misc]
    assert h * w * c == size and w <= 8192 and h <= 8192


def test_only_read_only_float_buffers_become_images():
  # out = a[i] + b[i]; b is also stored to (in place), c is int32: only a becomes an image
  n = 16
  out, a, b, c = P(0, n), P(1, n), P(2, n), UOp(Ops.PARAM, dtypes.int32.ptr(n), arg=3)
  i = UOp.range(n, 0)
  v = a.index(i).load() + b.index(i).load() + c.index(i).load().cast(dtypes.float)
  ast = UOp.sink(out.index(i).store(v), b.index(i).store(v)).replace(arg=KernelInfo("mixed"))
  got = {u.arg: u.dtype for u in image_params(ast).toposort() if u.op is Ops.PARAM}
  assert isinstance(got[1], ImageDType) and got[1].shape == (1, 4, 4)
  assert not any(isinstance(got[s], ImageDType) for s in (0, 2, 3))


def test_renderer_image_mode_and_arch():
  r = OpenCLRenderer()
  assert not r.images and r.arch == "" and r.extra_matcher is None
  with Context(IMAGE=1): assert r.images and r.arch == "image" and r.extra_matcher is not None
  assert OpenCLRenderer("image").images and OpenCLRenderer("image").arch == "image"


def test_image_kernel_source():
  with Context(NOOPT=0): spec = get_program(matmul_ast(16, 32, 8), OpenCLRenderer("image"))
  assert "read_only image2d_t data1" in spec.src and "read_only image2d_t data2" in spec.src
  assert "__global float* restrict data0" in spec.src  # the output stays a buffer
  assert image_params_of(spec.uops) == {1: (1, 32, 4), 2: (1, 64, 4)}
  # the heuristic upcasts the contiguous axes: every element picks a constant channel (no runtime select), and the
  # texel's elements share one read
  assert "%4" not in spec.src and re.search(r"val\d+\.s3", spec.src)
  reads = re.findall(r"read_imagef\((data\d), smp, (\w+)\)", spec.src)
  assert len(reads) == len(set(reads))
  if find_clang() is not None: OpenCLCompiler().compile(spec.src)


@needs_pocl
@pytest.mark.parametrize("M,N,K,opt", [(16, 32, 8, True), (4, 8, 64, True), (5, 7, 12, False)])
def test_image_matmul_on_pocl(M, N, K, opt):
  with Context(NOOPT=0 if opt else 1): spec = get_program(matmul_ast(M, N, K), OpenCLRenderer("image"))
  assert set(image_params_of(spec.uops)) == {1, 2}
  A, B = rng.standard_normal((M, K)).astype(np.float32), rng.standard_normal((K, N)).astype(np.float32)
  C = np.zeros(M * N, np.float32)
  clr.run(spec, [C, A.reshape(-1), B.reshape(-1)])  # type: ignore[attr-defined]
  np.testing.assert_allclose(C.reshape(M, N), A.astype(np.float64) @ B, rtol=1e-5, atol=1e-5)


@needs_pocl
def test_image_elementwise_uses_whole_texels():
  # out[i, j] = a[i, j] * b[j] + 1: the heuristic upcasts j by 4 on an image renderer, so channels are constants
  n, m = 6, 32
  out, a, b = P(0, n * m), P(1, n * m), P(2, m)
  i, j = UOp.range(n, 0), UOp.range(m, 1)
  ast = out.index(i * m + j).store(a.index(i * m + j).load() * b.index(j).load() + 1.0).sink(arg=KernelInfo("iew"))
  with Context(NOOPT=0): spec = get_program(ast, OpenCLRenderer("image"))
  assert image_params_of(spec.uops) == {1: (1, 48, 4), 2: (1, 8, 4)}
  assert "%4" not in spec.src and spec.src.count("read_imagef") == 2  # one texel of each image per thread
  A, B = rng.standard_normal((n, m)).astype(np.float32), rng.standard_normal(m).astype(np.float32)
  C = np.zeros(n * m, np.float32)
  clr.run(spec, [C, A.reshape(-1), B])  # type: ignore[attr-defined]
  np.testing.assert_array_equal(C.reshape(n, m), A * B + np.float32(1))


# ***** a whole convnet forward: compiled on NULL:OPENCL with IMAGE=1, replayed on PoCL *****
def _np_conv(x: np.ndarray, w: np.ndarray, b: np.ndarray, pad: int = 0) -> np.ndarray:
  x = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
  win = np.lib.stride_tricks.sliding_window_view(x, w.shape[2:], axis=(2, 3))  # (N, C, H', W', kh, kw)
  return np.einsum("nchwij,ocij->nohw", win, w) + b[None, :, None, None]


def _np_pool(x: np.ndarray) -> np.ndarray:
  n, c, h, w = x.shape
  return x[:, :, :h // 2 * 2, :w // 2 * 2].reshape(n, c, h // 2, 2, w // 2, 2).max((3, 5))


def _np_forward(x, w1, b1, w2, b2, wl, bl):
  h = _np_pool(np.maximum(_np_conv(x, w1, b1, pad=1), 0))
  h = _np_pool(np.maximum(_np_conv(h, w2, b2), 0))
  return h.reshape(h.shape[0], -1) @ wl.T + bl


@needs_pocl
def test_convnet_forward_with_images_on_pocl():
  tt = pytest.importorskip("tiny_tensor")
  from tiny_tensor import engine
  shapes = {"x": (2, 3, 10, 10), "w1": (8, 3, 3, 3), "b1": (8,), "w2": (16, 8, 3, 3), "b2": (16,), "wl": (10, 16),
            "bl": (10,)}
  data = {k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()}
  calls: list = []
  with Context(DEV="NULL:OPENCL", IMAGE=1), engine.capture(calls.append):
    t = {k: tt.Tensor(v, device="CPU").to("NULL") for k, v in data.items()}  # captured host->NULL copies
    h = t["x"].conv2d(t["w1"], t["b1"], padding=1).relu().max_pool2d()  # gated image reads
    h = h.conv2d(t["w2"], t["b2"]).relu().max_pool2d()
    out = h.flatten(1).linear(t["wl"].T, t["bl"]).realize()
  kernels = [c for c in calls if c.kind == "kernel"]
  assert len(kernels) >= 3 and all(c.spec.device in ("CL", "NULL") or c.spec.src for c in kernels)
  imaged = [c for c in kernels if image_params_of(c.spec.uops)]
  # every kernel that reads a float buffer of a multiple of 4 floats reads it as an image: the conv weights (216 and
  # 1152 floats), the activations, the linear weight
  assert len(imaged) == len(kernels), [c.spec.name for c in kernels if c not in imaged]
  image_sizes = {int(np.prod(s)) for c in kernels for s in image_params_of(c.spec.uops).values()}
  assert {8 * 3 * 3 * 3, 16 * 8 * 3 * 3, 2 * 3 * 10 * 10, 10 * 16} <= image_sizes, sorted(image_sizes)
  arrs = clr.replay(calls)  # type: ignore[attr-defined]
  last = kernels[-1]  # the linear layer writes the realized output
  got = arrs[last.bufs[list(last.spec.globals).index(last.spec.outs[0])]]
  assert got.size == out.numel()
  ref = _np_forward(*(data[k].astype(np.float64) for k in shapes))
  np.testing.assert_allclose(got.reshape(ref.shape), ref, rtol=1e-4, atol=1e-4)
