"""RDNA3 emulator on real code objects: half, bfloat16, int16/int8 and float kernels compiled by our AMDGPU backend
(gfx1100, so LLVM picks true16 VOP3, VOP3P packed math, d16 loads/stores, VOPD...) run on MOCK+AMD against numpy."""
from __future__ import annotations

import numpy as np
import pytest
from tiny_codegen import get_program
from tiny_codegen.compiler.amdgpu import find_ld_lld
from tiny_codegen.renderer.amdgpu import AMDGPURenderer
from tiny_uop import KernelInfo, Ops, UOp, dtypes
from tiny_uop.device import Buffer
from tiny_uop.plugins import Device

pytestmark = pytest.mark.skipif(find_ld_lld() is None, reason="ld.lld not installed: the AMDGPU compiler can't link")
N = 96
NP = {dtypes.float16: np.float16, dtypes.float: np.float32, dtypes.double: np.float64, dtypes.int16: np.int16,
      dtypes.int8: np.int8, dtypes.int: np.int32, dtypes.uint16: np.uint16}


def run(fn, din, dout, a: np.ndarray, b: np.ndarray) -> np.ndarray:
  c, x, y = UOp(Ops.PARAM, dout.ptr(N), arg=0), UOp(Ops.PARAM, din.ptr(N), arg=1), UOp(Ops.PARAM, din.ptr(N), arg=2)
  i = UOp.range(N, 0)
  ast = c.index(i).store(fn(x.index(i).load(), y.index(i).load())).sink(arg=KernelInfo("k"))
  spec = get_program(ast, AMDGPURenderer("gfx1100"))
  dev = Device["MOCK+AMD"]
  bufs = [Buffer("MOCK+AMD", N, dout), Buffer("MOCK+AMD", N, din), Buffer("MOCK+AMD", N, din)]
  for buf, arr in zip(bufs[1:], (a, b)): buf.copyin(memoryview(np.ascontiguousarray(arr)))
  prg = dev.get_program(spec.name, spec.lib)
  prg(*[buf._buf for buf in bufs], global_size=spec.global_size, local_size=spec.local_size, vals=(), wait=True)
  return np.frombuffer(bufs[0].as_buffer(), dtype=NP[dout]).copy()


rng = np.random.default_rng(6)
HA, HB = rng.standard_normal(N).astype(np.float16), rng.standard_normal(N).astype(np.float16)


@pytest.mark.parametrize("name, fn, ref", [
  ("add", lambda x, y: x + y, lambda a, b: a + b),
  ("mul", lambda x, y: x * y, lambda a, b: a * b),
  ("max", lambda x, y: x.maximum(y), np.maximum),
  ("where", lambda x, y: (x < y).where(x, y * 2), lambda a, b: np.where(a < b, a, b * np.float16(2))),
  ("div", lambda x, y: x / (y * y + 1), lambda a, b: a / (b * b + np.float16(1))),
  ("sqrt", lambda x, y: (x * x).sqrt(), lambda a, b: np.sqrt(a * a)),
  ("exp2", lambda x, y: x.exp2(), lambda a, b: np.exp2(a.astype(np.float32)).astype(np.float16)),
])
def test_half_kernels(name, fn, ref):
  got = run(fn, dtypes.float16, dtypes.float16, HA, HB)
  want = ref(HA, HB).astype(np.float16)
  np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=2e-3, atol=2e-3)


def test_half_to_float_and_back():
  got = run(lambda x, y: x.cast(dtypes.float) * y.cast(dtypes.float), dtypes.float16, dtypes.float, HA, HB)
  np.testing.assert_array_equal(got, HA.astype(np.float32) * HB.astype(np.float32))
  a32, b32 = HA.astype(np.float32) * 1000, HB.astype(np.float32)
  got = run(lambda x, y: (x + y).cast(dtypes.float16), dtypes.float, dtypes.float16, a32, b32)
  np.testing.assert_array_equal(got, (a32 + b32).astype(np.float16))


def test_bfloat16_products_in_float():
  # bfloat16 buffers travel as their 16-bit patterns; the backend computes in float32
  a, b = (rng.standard_normal(N).astype(np.float32).view(np.uint32) >> 16 for _ in range(2))
  af, bf = ((v.astype(np.uint32) << 16).view(np.float32) for v in (a, b))
  got = run(lambda x, y: x.cast(dtypes.float) * y.cast(dtypes.float), dtypes.bfloat16, dtypes.float,
            a.astype(np.uint16), b.astype(np.uint16))
  np.testing.assert_array_equal(got, af * bf)


@pytest.mark.parametrize("dt", [dtypes.int16, dtypes.int8])
def test_small_int_kernels_wrap(dt):
  info = np.iinfo(NP[dt])
  a = rng.integers(info.min, info.max, N).astype(NP[dt])
  b = rng.integers(info.min, info.max, N).astype(NP[dt])
  got = run(lambda x, y: x * y + x.maximum(y), dt, dt, a, b)
  with np.errstate(over="ignore"): want = (a * b + np.maximum(a, b)).astype(NP[dt])
  np.testing.assert_array_equal(got, want)


def test_bench_module_measures_kernels_and_instructions():
  from tiny_runtime_amd.emu.bench import bench, elementwise
  kps, ips = bench(elementwise(256), 256, reps=1)
  assert kps > 0 and ips > 8 * kps  # every wave runs more than a handful of instructions


def test_float64_division_kernel():
  # v_div_scale_f64 (VOP3 0x2FD, whose low 7 bits look like a VOPC class_f16) must not be taken for a 16-bit op
  a, b = rng.standard_normal(N), rng.standard_normal(N) + 3
  got = run(lambda x, y: x / y, dtypes.double, dtypes.double, a, b)
  np.testing.assert_array_equal(got, a / b)


DECODE_CASES = [(lambda x, y: x / (y * y + 1), dtypes.float16, dtypes.float16),
                (lambda x, y: (x < y).where(x, y * 2).maximum(x), dtypes.float16, dtypes.float16),
                (lambda x, y: x * y + x.maximum(y), dtypes.int8, dtypes.int8),
                (lambda x, y: x / y, dtypes.double, dtypes.double),
                (lambda x, y: (x.cast(dtypes.float) * y.cast(dtypes.float)).sqrt(), dtypes.float16, dtypes.float)]


@pytest.mark.parametrize("fn, din, dout", DECODE_CASES, ids=["half_div", "half_where", "int8", "double_div", "h2f"])
def test_decode_matches_llvm_assembly(fn, din, dout):
  """Every instruction of the code object decodes to the mnemonic (and size) LLVM's own assembly listing has."""
  from amd_listing import check_decode_matches_assembly
  c, x, y = UOp(Ops.PARAM, dout.ptr(N), arg=0), UOp(Ops.PARAM, din.ptr(N), arg=1), UOp(Ops.PARAM, din.ptr(N), arg=2)
  i = UOp.range(N, 0)
  check_decode_matches_assembly(get_program(c.index(i).store(fn(x.index(i).load(), y.index(i).load()))
                                            .sink(arg=KernelInfo("k")), AMDGPURenderer("gfx1100")))
