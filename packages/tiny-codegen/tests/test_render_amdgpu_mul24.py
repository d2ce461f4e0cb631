"""The AMDGPU renderer's guard against LLVM 22.1 dropping a 24-bit mask when it fuses a 64-bit multiply-add into
v_mad_u64_u32 (`_AMDGPUEmitter.alu`; tiny-runtime-amd's README, Known issues): which kernels get it in their IR, and
that the ISA LLVM then makes multiplies with the 24-bit pair instead of the unmasked mad. The values themselves are
checked against numpy on the emulators in tiny-runtime-amd's `tests/test_amd_mul24.py`."""
from __future__ import annotations

from typing import Callable

import pytest
from tiny_uop import KernelInfo, Ops, UOp, dtypes
from tiny_uop.dtype import DType

from tiny_codegen.compiler.amdgpu import AMDGPUCompiler
from tiny_codegen.lower import lower
from tiny_codegen.renderer.amdgpu import AMDGPURenderer

M = 0xFFFFFF
GUARD = "@llvm.amdgcn.softwqm"


def _kernel(fn: Callable[[UOp, UOp], UOp], dt: DType) -> UOp:
  c, x, y = (UOp(Ops.PARAM, dt.ptr(64), arg=i) for i in range(3))
  i = UOp.range(64, 0)
  return c.index(i).store(fn(x.index(i).load(), y.index(i).load())).sink(arg=KernelInfo("k"))


def _ir(fn: Callable[[UOp, UOp], UOp], dt: DType, arch: str) -> str:
  r = AMDGPURenderer(arch)
  return r.render(lower(_kernel(fn, dt), r).uops)  # optimized: work-items in lanes, so the ALU ops are VALU


GUARDED = {  # 64-bit multiplies LLVM would make a 24-bit multiply of, with a mask it then drops
  "both_masked_plus_a": lambda a, b: (a & M) * (b & M) + a,
  "masked_times_const_plus_a": lambda a, b: (a & M) * 0x123456 + a,
  "low_bits_mask_plus_a": lambda a, b: (a & 0xFFFF00) * (b & M) + a,
  "xor_of_masked_plus_a": lambda a, b: ((a & M) ^ (b & M)) * (b & M) + a,
}
UNSIGNED_ONLY = {  # a signed `% 2**24` keeps the sign: no 24-bit multiply to guard against (guarded all the same)
  "mod_2_24_plus_a": lambda a, b: (a % (1 << 24)) * (b % (1 << 24)) + a,
}
CASES = [(n, dt) for n in GUARDED for dt in (dtypes.int64, dtypes.uint64)] + [(n, dtypes.uint64) for n in UNSIGNED_ONLY]
UNGUARDED = {  # no 24-bit mask: LLVM's v_mad_u64_u32 is right, and stays
  "full_width": (lambda a, b: a * b + a, dtypes.int64),
  "mask_25_bits": (lambda a, b: (a & 0x1FFFFFF) * (b & 0x1FFFFFF) + a, dtypes.int64),
  "mask_22_bits": (lambda a, b: (a & 0x3FFFFF) * (b & 0x3FFFFF) + a, dtypes.int64),  # Payne-Hanek's limbs
  "mod_2_22": (lambda a, b: (a % (1 << 22)) * (b % (1 << 22)) + a, dtypes.uint64),
  "int32": (lambda a, b: (a & M) * (b & M) + a, dtypes.int32),
}


@pytest.mark.parametrize("arch", ["gfx1100", "gfx942"])
@pytest.mark.parametrize("case,dt", CASES, ids=[f"{n}-{dt.name}" for n, dt in CASES])
def test_masked_64_bit_multiply_add_is_guarded(case: str, dt: DType, arch: str):
  ir = _ir({**GUARDED, **UNSIGNED_ONLY}[case], dt, arch)
  assert f"declare i64 {GUARD}.i64(i64)" in ir
  mul = next(ln.split(" = ")[0].strip() for ln in ir.splitlines() if " = mul i64 " in ln)
  assert f"call i64 {GUARD}.i64(i64 {mul})" in ir  # the product goes through the guard before the add
  asm = AMDGPUCompiler(arch).assembly(ir)
  assert "v_mad_u64_u32" not in asm  # LLVM's unmasked 32x32 multiply-add is gone ...
  assert "v_mul_u32_u24" in asm and "v_mul_hi_u32_u24" in asm  # ... for the 24-bit pair, which masks its sources


@pytest.mark.parametrize("case", sorted(UNGUARDED))
def test_multiply_without_a_24_bit_mask_is_not_guarded(case: str):
  fn, dt = UNGUARDED[case]
  ir = _ir(fn, dt, "gfx1100")
  assert GUARD not in ir
  assert "v_mad_u64_u32" in AMDGPUCompiler("gfx1100").assembly(ir) or dt == dtypes.int32


def test_nvptx_emitter_has_no_amdgpu_guard():
  """The NVPTX emitter builds on the AMDGPU one; the intrinsic is AMDGPU's alone."""
  from tiny_codegen.renderer.nvptx import NVPTXRenderer
  r = NVPTXRenderer("sm_90")
  ir = r.render(lower(_kernel(GUARDED["both_masked_plus_a"], dtypes.int64), r, optimize=False).uops)
  assert "mul i64" in ir and GUARD not in ir
