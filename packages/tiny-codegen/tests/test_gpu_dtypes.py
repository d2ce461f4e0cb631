"""Every dtype through every GPU renderer: loads, ALU ops, casts, comparisons, selects, transcendentals and stores,
accepted by the target's assembler (ptxas per sm arch, LLVM's AMDGPU backend + ld.lld, clang's OpenCL front end)."""
from __future__ import annotations

import pytest
from tiny_uop import Context, KernelInfo, Ops, UOp, dtypes
from tiny_uop.dtype import DType
from tiny_uop.uop import AxisType

from tiny_codegen import get_program
from tiny_codegen.compiler.opencl import find_clang
from tiny_codegen.compiler.ptx import find_ptxas
from tiny_codegen.renderer.amdgpu import AMDGPURenderer
from tiny_codegen.renderer.opencl import OpenCLRenderer
from tiny_codegen.renderer.ptx import PTXRenderer

DTYPES = [dtypes.bool, dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.uint16, dtypes.int32, dtypes.uint32,
          dtypes.int64, dtypes.uint64, dtypes.float16, dtypes.bfloat16, dtypes.float32, dtypes.float64]


def dtype_kernel(dt: DType) -> UOp:
  """out0[i] = f(a[i], b[i]) in dt; out1[i] = (float)(...) ; out2[i] = a[i] < b[i]; a reduce over j as well."""
  n, k = 32, 4
  o0, o1, o2 = (UOp(Ops.PARAM, d.ptr(n), arg=s) for s, d in ((0, dt), (1, dtypes.float), (2, dtypes.bool)))
  a, b = UOp(Ops.PARAM, dt.ptr(n * k), arg=3), UOp(Ops.PARAM, dt.ptr(n), arg=4)
  i, j = UOp.range(n, 0), UOp.range(k, 1, AxisType.REDUCE)
  x, y = a.index(i * k + j, j < 3).load(), b.index(i).load()
  if dt == dtypes.bool: v = (x ^ y) | (x & y.logical_not())
  elif dtypes.is_float(dt): v = (x * y + x).maximum(-y) - (x / (y + 1.5)) + (x * 0.5).exp2() + y.sqrt().log2() + x.sin()
  else:
    v = (x * y + x).maximum(y) - (x // (y | 1)) + (x % (y | 1)) + ((x << 1) ^ (y >> 1))
    if not dtypes.is_unsigned(dt): v = v + (-x)
  red = v.reduce(j, arg=Ops.ADD if dt != dtypes.bool else Ops.MAX)
  stores = [o0.index(i).store(red), o1.index(i).store(red.cast(dtypes.float) + y.cast(dtypes.float)),
            o2.index(i).store((x < y).reduce(j, arg=Ops.MAX) if dt != dtypes.bool else red.ne(y))]
  return UOp.sink(*stores).replace(arg=KernelInfo(f"dt_{dt.name.replace(' ', '_')}"))


def _compile(R: type, arch: str, dt: DType, opt: bool) -> object:
  with Context(NOOPT=0 if opt else 1): return get_program(dtype_kernel(dt), R(arch))


@pytest.mark.skipif(find_ptxas() is None, reason="ptxas not installed (NVIDIA CUDA toolkit)")
@pytest.mark.parametrize("arch", ["sm_75", "sm_90"])
@pytest.mark.parametrize("dt", DTYPES, ids=lambda d: d.name)
def test_ptx_dtypes_assemble(dt, arch):
  spec = _compile(PTXRenderer, arch, dt, opt=True)
  assert spec.lib[:4] == b"\x7fELF"  # type: ignore[attr-defined]
  src = spec.src  # type: ignore[attr-defined]
  if dt == dtypes.float16: assert "ld.global.b16" in src and "add.rn.f16" in src
  if dt == dtypes.float32: assert "ex2.approx.f32" in src and "sqrt.rn.f32" in src and "div.rn.f32" in src
  if dt == dtypes.float64: assert "ex2.approx" not in src and "div.rn.f64" in src  # double: polynomial exp2/log2
  if dt == dtypes.int8: assert "ld.global.s8" in src and "st.global.s8" in src and "cvt.s16.s8" in src
  if dt == dtypes.bool: assert "ld.global.u8" in src and "selp.b16" in src


@pytest.mark.parametrize("dt", DTYPES, ids=lambda d: d.name)
def test_amdgpu_dtypes_compile(dt):
  spec = _compile(AMDGPURenderer, "gfx1100", dt, opt=True)
  assert spec.lib[:4] == b"\x7fELF"  # type: ignore[attr-defined]


@pytest.mark.skipif(find_clang() is None, reason="clang not installed (apt-get install clang)")
@pytest.mark.parametrize("dt", DTYPES, ids=lambda d: d.name)
def test_opencl_dtypes_pass_clang(dt):
  src = _compile(OpenCLRenderer, "", dt, opt=True).src  # type: ignore[attr-defined]
  if dt == dtypes.float16: assert src.startswith("#pragma OPENCL FP_CONTRACT OFF\n#pragma OPENCL EXTENSION cl_khr_fp16")
  if dt == dtypes.bool: assert "__global uchar* restrict data0" in src  # no bool in kernel arguments


def test_unoptimized_kernels_compile_too():
  for R, arch in ((PTXRenderer, "sm_90"), (AMDGPURenderer, "gfx1100"), (OpenCLRenderer, "")):
    for dt in (dtypes.float16, dtypes.int8, dtypes.bool):
      assert _compile(R, arch, dt, opt=False).lib  # type: ignore[attr-defined]
