"""Renderer output: golden text for a tiny kernel in C and LLVM IR, the README example, and source properties."""
from __future__ import annotations

import pathlib
import re
import subprocess
import sys

from tiny_uop import KernelInfo, Ops, UOp, dtypes
from tiny_uop.uop import AxisType

from tiny_codegen.lower import lower
from tiny_codegen.renderer.cstyle import ClangRenderer
from tiny_codegen.renderer.llvmir import LLVMRenderer

README = pathlib.Path(__file__).parents[1] / "README.md"


def tiny_kernel() -> UOp:
  c, a = UOp(Ops.PARAM, dtypes.float.ptr(8), arg=0), UOp(Ops.PARAM, dtypes.float.ptr(8), arg=1)
  i = UOp.range(8, 0)
  return c.index(i).store(a.index(i).load() * 2.0).sink(arg=KernelInfo("E_8"))


def render(R: type, ast: UOp) -> str:
  r = R()
  r.threads = 1
  return r.render(lower(ast, r, optimize=False).uops)


GOLDEN_C = """\
void E_8(float* restrict data0, float* restrict data1, int core_id) {
  for (int Lidx0 = 0; Lidx0 < 8; Lidx0++) {
    float val0 = (*(data1+Lidx0));
    *(data0+Lidx0) = (val0*2.0f);
  }
}
"""

GOLDEN_LLVM = """\
define void @E_8(ptr noalias %data0, ptr noalias %data1, i32 %core_id) #0 {
entry:
  br label %loop0.pre
loop0.pre:
  br label %loop0.head
loop0.head:
  %Lidx0 = phi i32 [ 0, %loop0.pre ], [ %Lidx0.next, %loop0.latch ]
  %Lidx0.cmp = icmp slt i32 %Lidx0, 8
  br i1 %Lidx0.cmp, label %loop0.body, label %loop0.exit
loop0.body:
  %t1 = getelementptr inbounds float, ptr %data0, i32 %Lidx0
  %t2 = getelementptr inbounds float, ptr %data1, i32 %Lidx0
  %t3 = load float, ptr %t2
  %t4 = fmul float %t3, 0x4000000000000000
  store float %t4, ptr %t1
  br label %loop0.latch
loop0.latch:
  %Lidx0.next = add nsw i32 %Lidx0, 1
  br label %loop0.head
loop0.exit:
  ret void
}
attributes #0 = { nounwind "prefer-vector-width"="{bits}" }
"""


def test_golden_c():
  assert render(ClangRenderer, tiny_kernel()) == GOLDEN_C


def test_golden_llvm():
  """(the vector width LLVM's vectorizers are told is the host's: `LLVMRenderer.vector_registers`)"""
  bits = 8 * LLVMRenderer().vector_registers[1]
  assert render(LLVMRenderer, tiny_kernel()) == GOLDEN_LLVM.replace("{bits}", str(bits))


def test_llvm_ir_verifies_and_vectorizes():
  """The optimized IR of a 1024-element kernel uses vector instructions (the host has SIMD)."""
  from tiny_codegen.compiler.llvm import LLVMCompiler
  c, a = UOp(Ops.PARAM, dtypes.float.ptr(1024), arg=0), UOp(Ops.PARAM, dtypes.float.ptr(1024), arg=1)
  i = UOp.range(1024, 0)
  src = render(LLVMRenderer, c.index(i).store(a.index(i).load() * 2.0 + 1.0).sink(arg=KernelInfo("E_1024")))
  opt = LLVMCompiler().optimized_ir(src)
  assert re.search(r"<\d+ x float>", opt), opt


def test_reduce_renders_accumulator():
  c, a = UOp(Ops.PARAM, dtypes.float.ptr(4), arg=0), UOp(Ops.PARAM, dtypes.float.ptr(32), arg=1)
  i, k = UOp.range(4, 0), UOp.range(8, 1, AxisType.REDUCE)
  ast = c.index(i).store(a.index(i * 8 + k).load().reduce(k, arg=Ops.MAX)).sink(arg=KernelInfo("r_4_8"))
  csrc = render(ClangRenderer, ast)
  assert "float acc0[1];" in csrc and "*(acc0+0) = (-__builtin_inff());" in csrc
  assert csrc.index("for (int Lidx0") < csrc.index("for (int Ridx1")
  lsrc = render(LLVMRenderer, ast)
  assert "%acc0 = alloca [1 x float]" in lsrc and "store float 0xFFF0000000000000" in lsrc


def test_gated_load_renders_safely():
  c, a = UOp(Ops.PARAM, dtypes.float.ptr(10), arg=0), UOp(Ops.PARAM, dtypes.float.ptr(8), arg=1)
  i = UOp.range(10, 0)
  ast = c.index(i).store(a.index(i - 1, (i >= 1) & (i < 9)).load()).sink(arg=KernelInfo("E_10"))
  csrc = render(ClangRenderer, ast)
  assert re.search(r"\?\(\*\(data1\+.+?\)\):0\.0f\)", csrc), csrc
  lsrc = render(LLVMRenderer, ast)  # the address is clamped before the load, then the value selected
  assert re.search(r"select i1 %t\d+, i32 %t\d+, i32 0", lsrc), lsrc
  assert re.search(r"select i1 %t\d+, float %t\d+, float zeroinitializer", lsrc), lsrc


def test_signature_vars_then_core_id():
  n, m = UOp.variable("n", 1, 10), UOp.variable("m", 1, 10)
  c = UOp(Ops.PARAM, dtypes.int32.ptr(100), arg=0)
  i = UOp.range(n, 0)
  ast = c.index(i).store(i + m).sink(arg=KernelInfo("E_n"))
  assert "void E_n(int* restrict data0, int m, int n, int core_id)" in render(ClangRenderer, ast)
  assert "define void @E_n(ptr noalias %data0, i32 %var.m, i32 %var.n, i32 %core_id)" in render(LLVMRenderer, ast)


def test_readme_example_runs():
  """The README's example runs as written, with only tiny-uop and tiny-codegen imported."""
  code = re.search(r"```python\n(.*?)```", README.read_text(), re.S)
  assert code is not None
  prog = code.group(1) + ("\nimport sys\n"
                          "assert not [m for m in sys.modules if m.startswith(('tiny_tensor', 'tiny_runtime'))]\n")
  out = subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True, timeout=120)
  assert out.returncode == 0, out.stderr
  assert "void E_16(float* restrict data0, float* restrict data1, float* restrict data2, int core_id)" in out.stdout
  assert "define void @E_16(ptr noalias %data0, ptr noalias %data1, ptr noalias %data2, i32 %core_id)" in out.stdout
  assert re.search(r"E_16 \(1, 1, 1\) \d+ bytes", out.stdout)
  assert ".visible .entry E_16(" in out.stdout and "mul.rn.f32" in out.stdout          # PTX
  assert "define amdgpu_kernel void @E_16(" in out.stdout                            # AMDGPU LLVM IR


def test_c_inlines_single_use_values_only_at_full_width():
  """float/int32 values used once are written inline; half and int8 values get a variable (they round/wrap)."""
  c, a = UOp(Ops.PARAM, dtypes.half.ptr(4), arg=0), UOp(Ops.PARAM, dtypes.int8.ptr(4), arg=1)
  i = UOp.range(4, 0)
  x = a.index(i).load()
  ast = c.index(i).store(((x * x) // 3).cast(dtypes.half) * UOp.const(dtypes.half, 0.5)).sink(arg=KernelInfo("E_4"))
  src = render(ClangRenderer, ast)
  assert "signed char alu0 = (val0*val0);" in src and "signed char alu1 = (alu0/((signed char)3));" in src
  half = ClangRenderer().half_type  # __fp16 with clang, _Float16 with gcc
  assert f"{half} cast0 = (({half})(alu1));" in src


def test_c_negative_constants_are_parenthesized():
  c, a = UOp(Ops.PARAM, dtypes.float.ptr(4), arg=0), UOp(Ops.PARAM, dtypes.int32.ptr(4), arg=1)
  i = UOp.range(4, 0)
  x = a.index(i).load()
  ast = c.index(i).store((x * (-3)).cast(dtypes.float) - (-1.5)).sink(arg=KernelInfo("E_4"))
  src = render(ClangRenderer, ast)
  assert "--" not in src and "*(-3)" in src and "-(-1.5f)" in src


def test_c_max_chain_stays_linear():
  """MAX repeats its operands in C (a>b?a:b): they get variables, so a 32-deep chain doesn't blow up."""
  c, a = UOp(Ops.PARAM, dtypes.float.ptr(1), arg=0), UOp(Ops.PARAM, dtypes.float.ptr(32), arg=1)
  x = a.index(UOp.const(dtypes.index, 0)).load()
  for k in range(1, 32): x = x.maximum(a.index(UOp.const(dtypes.index, k)).load() * 2.0)
  src = render(ClangRenderer, c.index(UOp.const(dtypes.index, 0)).store(x).sink(arg=KernelInfo("E_max")))
  assert len(src) < 12000  # ~200 characters per MAX; inlined, it would be 2**31 times more


def test_llvm_contracts_only_reduce_accumulations_into_fma():
  # c[i] = sum_k a[i,k] * b[k] + d[i] * e[i]: the product-sum of the reduce may fuse into FMAs (`contract`), the
  # elementwise d*e + ... after it keeps its two roundings
  ps = [UOp(Ops.PARAM, dtypes.float.ptr(n), arg=i) for i, n in enumerate((4, 32, 8, 4, 4))]
  i, k = UOp.range(4, 0), UOp.range(8, 1, AxisType.REDUCE)
  red = UOp(Ops.REDUCE, dtypes.float, (ps[1].index(i * 8 + k).load() * ps[2].index(k).load(), k), Ops.ADD)
  ast = ps[0].index(i).store(red + ps[3].index(i).load() * ps[4].index(i).load()).sink(arg=KernelInfo("r_4_8"))
  src = render(LLVMRenderer, ast)
  assert re.search(r"= fmul contract float", src) and re.search(r"= fadd contract float %", src)
  assert len(re.findall(r"= fmul float", src)) == 1 and len(re.findall(r"= fadd float", src)) == 1, src


def _bound_after_its_loop() -> tuple[list[UOp], UOp]:
  """A lowered kernel whose loop bound is an expression (n+1), with the bound moved after the RANGE that uses it:
  linear UOps no renderer can spell (a lowering bug would look like this)."""
  n = UOp.variable("n", 1, 8)
  c, a = UOp(Ops.PARAM, dtypes.float.ptr(9), arg=0), UOp(Ops.PARAM, dtypes.float.ptr(9), arg=1)
  i = UOp(Ops.RANGE, dtypes.int32, (n + 1,), arg=(0, AxisType.LOOP))
  ast = c.index(i).store(a.index(i).load() * 2.0).sink(arg=KernelInfo("E_n"))
  r = ClangRenderer()
  r.threads = 1
  uops = lower(ast, r, optimize=False).uops
  rng = next(u for u in uops if u.op is Ops.RANGE)
  bound = rng.src[0]
  assert bound.op is Ops.ADD and uops.index(bound) < uops.index(rng)
  uops = [u for u in uops if u is not bound]
  uops.insert(uops.index(rng) + 1, bound)
  return uops, bound


def test_renderers_refuse_an_operand_with_no_expression():
  # issue #38: the C renderer printed `for (int Ridx1 = 0; Ridx1 < ; ...)` for a loop bound it had no expression for
  # (a missing source read as ""); every renderer raises instead, naming the UOp
  import pytest
  from tiny_codegen.renderer import RenderError
  uops, bound = _bound_after_its_loop()
  for R in (ClangRenderer, LLVMRenderer):
    with pytest.raises(RenderError, match="ADD dtypes.int"):
      R().render(uops)
  with pytest.raises(RenderError, match="source 0 of RANGE"):
    ClangRenderer().render(uops)


def test_c_refuses_a_const_loop_bound_placed_after_its_loop():
  # the shape of the original bug (fixed in linearize, e62abda): a size-1 reduce's bound CONST 1, used only by its
  # RANGE, was placed after the loops; C reads constants by name, so the bound printed as nothing
  import pytest
  from tiny_codegen.renderer import RenderError
  out, inp = UOp(Ops.PARAM, dtypes.int32.ptr(2), arg=0), UOp(Ops.PARAM, dtypes.int32.ptr(2), arg=1)
  r0, r1 = UOp.range(2, 0), UOp.range(1, 1, AxisType.REDUCE)
  ast = out.index(r0).store(inp.index(r0 + r1).load().reduce(r1, arg=Ops.ADD)).sink(arg=KernelInfo("r"))
  r = ClangRenderer()
  r.threads = 1
  uops = lower(ast, r).uops
  assert "Ridx1 < 1;" in r.render(uops)
  rng = next(u for u in uops if u.op is Ops.RANGE and u.arg[0] == 1)
  moved = [u for u in uops if u is not rng.src[0]]
  moved.insert(len(moved) - 1, rng.src[0])  # before the SINK, after every loop
  with pytest.raises(RenderError, match="source 0 of RANGE .* CONST"):
    r.render(moved)


def test_ptx_refuses_an_operand_with_no_register():
  # the PTX renderer read registers with a plain dict: a source rendered after its user was a bare KeyError
  import pytest
  from tiny_codegen.renderer import RenderError
  from tiny_codegen.renderer.ptx import PTXRenderer
  uops, _ = _bound_after_its_loop()
  with pytest.raises(RenderError, match="ADD dtypes.int"):
    PTXRenderer("sm_80").render(uops)


def test_llvm_index_math_is_nsw_only_where_it_cannot_wrap():
  """`nsw` (lets LLVM merge loads at i, i+1, ... of an i32 index) marks exactly the integer ops whose exact result
  over the sources' ranges fits the type: checked against Python's unbounded integers."""
  from tiny_codegen.renderer.llvmir import no_signed_wrap
  i, n = UOp.range(48, 0), UOp.variable("n", 0, 2**31 - 1, dtypes.int32)
  i32 = i.cast(dtypes.int32)
  for u, exact in ((i32 * 16 + 5, [v * 16 + 5 for v in (0, 47)]), (n + 1, [2**31]), (n * 2, [2**32 - 2]),
                   (i32 - n, [0 - (2**31 - 1), 47]), (n - i32, [-47, 2**31 - 1])):
    fits = all(-2**31 <= v <= 2**31 - 1 for v in exact)
    assert no_signed_wrap(u) == fits, (u.render(), exact)
  assert not no_signed_wrap(UOp.const(dtypes.uint32, 3) + UOp.const(dtypes.uint32, 4))  # unsigned: never nsw
  assert not no_signed_wrap(UOp.const(dtypes.float, 3.0) + 1.0)
