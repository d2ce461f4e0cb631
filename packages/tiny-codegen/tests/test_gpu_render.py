"""GPU renderers (PTX, AMDGPU LLVM IR, OpenCL C): golden text for a tiny kernel, shared memory + barriers, vector
loads, and tensor-core (WMMA) rendering on hand-built linear programs, checked by each target's own tools."""
from __future__ import annotations

import re

import pytest
from tiny_uop import KernelInfo, Ops, UOp, dtypes
from tiny_uop.dtype import AddrSpace
from tiny_uop.uop import AxisType

from tiny_codegen.compiler.amdgpu import AMDGPUCompiler, amdgpu_datalayout, find_ld_lld
from tiny_codegen.compiler.opencl import OpenCLCompiler, find_clang
from tiny_codegen.compiler.ptx import PTXCompiler, find_ptxas
from tiny_codegen.lower import lower
from tiny_codegen.renderer.amdgpu import AMDGPURenderer
from tiny_codegen.renderer.opencl import OpenCLRenderer
from tiny_codegen.renderer.ptx import PTXRenderer

needs_ptxas = pytest.mark.skipif(find_ptxas() is None, reason="ptxas not installed (NVIDIA CUDA toolkit)")
needs_clang = pytest.mark.skipif(find_clang() is None, reason="clang not installed (apt-get install clang)")
needs_lld = pytest.mark.skipif(find_ld_lld() is None, reason="ld.lld not installed (apt-get install lld)")


def tiny_kernel() -> UOp:
  c, a = UOp(Ops.PARAM, dtypes.float.ptr(8), arg=0), UOp(Ops.PARAM, dtypes.float.ptr(8), arg=1)
  i = UOp.range(8, 0)
  return c.index(i).store(a.index(i).load() * 2.0).sink(arg=KernelInfo("E_8"))


def render(R: type, ast: UOp, arch: str = "") -> str:
  r = R(arch)
  return r.render(lower(ast, r, optimize=False).uops)


GOLDEN_PTX = """\
.version 7.8
.target sm_90
.address_size 64

.visible .entry E_8(
\t.param .u64 data0,
\t.param .u64 data1
)
{
\t.reg .f32 %f<3>;
\t.reg .b32 %r<2>;
\t.reg .b64 %rd<8>;
\tld.param.u64 %rd0, [data0];
\tcvta.to.global.u64 %rd1, %rd0;
\tmov.s32 %r0, 8;
\tmov.u32 %r1, %ctaid.x;
\tld.param.u64 %rd4, [data1];
\tcvta.to.global.u64 %rd5, %rd4;
\tmov.f32 %f1, 0f40000000;
\tmul.wide.s32 %rd2, %r1, 4;
\tadd.s64 %rd3, %rd1, %rd2;
\tmul.wide.s32 %rd6, %r1, 4;
\tadd.s64 %rd7, %rd5, %rd6;
\tld.global.f32 %f0, [%rd7];
\tmul.rn.f32 %f2, %f0, %f1;
\tst.global.f32 [%rd3], %f2;
\tret;
}
"""

GOLDEN_AMDGPU = """\
target datalayout = "{dl}"
target triple = "amdgcn-amd-amdhsa"

declare i32 @llvm.amdgcn.workgroup.id.x()
define amdgpu_kernel void @E_8(ptr addrspace(1) noalias align 16 %data0, ptr addrspace(1) noalias align 16 %data1) #0 {{
entry:
  %gidx0 = call i32 @llvm.amdgcn.workgroup.id.x()
  %t1 = getelementptr inbounds float, ptr addrspace(1) %data0, i32 %gidx0
  %t2 = getelementptr inbounds float, ptr addrspace(1) %data1, i32 %gidx0
  %t3 = load float, ptr addrspace(1) %t2
  %t4 = fmul float %t3, 0x4000000000000000
  store float %t4, ptr addrspace(1) %t1
  ret void
}}
attributes #0 = {{ "amdgpu-flat-work-group-size"="1,1024" "target-cpu"="gfx1100" }}
!llvm.module.flags = !{{!0}}
!0 = !{{i32 1, !"amdhsa_code_object_version", i32 400}}
"""

GOLDEN_OPENCL = """\
#pragma OPENCL FP_CONTRACT OFF
__kernel void E_8(__global float* restrict data0, __global float* restrict data1) {
  int gidx0 = get_group_id(0); /* 8 */
  float val0 = (*(data1+gidx0));
  *(data0+gidx0) = (val0*2.0f);
}
"""


def test_golden_ptx(): assert render(PTXRenderer, tiny_kernel()) == GOLDEN_PTX
def test_golden_amdgpu(): assert render(AMDGPURenderer, tiny_kernel()) == GOLDEN_AMDGPU.format(dl=amdgpu_datalayout())
def test_golden_opencl(): assert render(OpenCLRenderer, tiny_kernel()) == GOLDEN_OPENCL


def test_dims_are_gpu_style():
  r = PTXRenderer()
  low = lower(tiny_kernel(), r, optimize=False)
  assert low.dims.global_size == (8, 1, 1) and [u.arg for u in low.uops if u.op is Ops.SPECIAL] == ["gidx0"]


@pytest.mark.parametrize("arch", ["sm_60", "gfx1100", "foo"])
def test_ptx_bad_arch(arch):
  with pytest.raises(ValueError, match="sm_"): PTXRenderer(arch)


def test_amdgpu_bad_arch():
  with pytest.raises(ValueError, match="gfx"): AMDGPURenderer("sm_90")


def test_tensor_cores_declared_per_arch():
  assert [str(t) for t in PTXRenderer("sm_90").tensor_cores] == ["WMMA_8_16_16_half_float", "WMMA_8_16_16___bf16_float"]
  assert [t.dims for t in PTXRenderer("sm_75").tensor_cores] == [(8, 16, 8)]
  assert PTXRenderer("sm_70").tensor_cores == []
  assert [t.dtype_in for t in AMDGPURenderer("gfx1100").tensor_cores] == [dtypes.float16, dtypes.bfloat16]
  cdna = AMDGPURenderer("gfx90a").tensor_cores  # MFMA 16x16x16, one wave64 per tile
  assert [(t.dtype_in, t.threads, t.elements_per_thread) for t in cdna] == [(dtypes.float16, 64, (4, 4, 4)),
                                                                            (dtypes.bfloat16, 64, (4, 4, 4))]
  assert AMDGPURenderer("gfx1030").tensor_cores == [] and OpenCLRenderer().tensor_cores == []


# ***** hand-built linear programs: shared memory + barrier, vector loads, WMMA *****
def shared_reverse_program(n: int = 16) -> list[UOp]:
  """out[g*n + l] = in[g*n + (n-1-l)] through a __shared__ tile: each work-item stores its element, barrier, loads the
  mirrored one. Launch: groups x n work-items."""
  d0, d1 = UOp(Ops.PARAM, dtypes.float.ptr(4 * n), arg=0), UOp(Ops.PARAM, dtypes.float.ptr(4 * n), arg=1)
  cn = UOp.const(dtypes.int32, n)
  g = UOp(Ops.SPECIAL, dtypes.int32, (UOp.const(dtypes.int32, 4),), "gidx0")
  lid = UOp(Ops.SPECIAL, dtypes.int32, (cn,), "lidx0")
  tmp = UOp(Ops.DEFINE_LOCAL, dtypes.float.ptr(n, AddrSpace.LOCAL), arg=0)
  gbase = g * cn
  gi = gbase + lid
  ld_in = d1.index(gi).load()
  st_tmp = tmp.index(lid).store(ld_in)
  bar = UOp(Ops.BARRIER, dtypes.void, (st_tmp,))
  mirrored = UOp.const(dtypes.int32, n - 1) - lid
  ld_tmp = UOp(Ops.LOAD, dtypes.float, (tmp.index(mirrored), bar))
  st_out = d0.index(gi).store(ld_tmp)
  sink = UOp(Ops.SINK, dtypes.void, (st_out,), KernelInfo("shared_reverse"))
  return list(sink.toposort())


def vector_program() -> list[UOp]:
  """data0[4*g..4*g+3] = 2 * data1[4*g..] with one float4 load and one float4 store."""
  d0, d1 = UOp(Ops.PARAM, dtypes.float.ptr(64), arg=0), UOp(Ops.PARAM, dtypes.float.ptr(64), arg=1)
  g = UOp(Ops.SPECIAL, dtypes.int32, (UOp.const(dtypes.int32, 16),), "gidx0")
  i = g * UOp.const(dtypes.int32, 4)
  v = UOp(Ops.LOAD, dtypes.float.vec(4), (d1.index(i),))
  two = UOp(Ops.VECTORIZE, dtypes.float.vec(4), (UOp.const(dtypes.float, 2.0),) * 4)
  st = UOp(Ops.STORE, dtypes.void, (d0.index(i), v * two))
  return list(UOp(Ops.SINK, dtypes.void, (st,), KernelInfo("vec4")).toposort())


def test_toposorted_programs_are_linear():
  for prg in (shared_reverse_program(), vector_program()):
    assert prg[-1].op is Ops.SINK and all(s in prg[:i] for i, u in enumerate(prg) for s in u.src)


def test_shared_and_barrier_text():
  prg = shared_reverse_program()
  ptx = PTXRenderer().render(prg)
  assert ".shared .align 16 .b8 temp0[64];" in ptx and "bar.sync 0;" in ptx and "%tid.x" in ptx
  assert "st.shared.f32" in ptx and "ld.shared.f32" in ptx
  ir = AMDGPURenderer().render(prg)
  assert "addrspace(3) global [16 x float]" in ir and "call void @llvm.amdgcn.s.barrier()" in ir
  assert "@llvm.amdgcn.workitem.id.x()" in ir
  cl = OpenCLRenderer().render(prg)
  assert "__local float temp0[16];" in cl and "barrier(CLK_LOCAL_MEM_FENCE);" in cl and "get_local_id(0)" in cl


def test_vector_loads_text():
  prg = vector_program()
  ptx = PTXRenderer().render(prg)
  assert "ld.global.v4.f32 {" in ptx and "st.global.v4.f32 [" in ptx
  assert "load <4 x float>, ptr addrspace(1)" in AMDGPURenderer().render(prg)
  cl = OpenCLRenderer().render(prg)
  assert "float4 val0 = (*((__global float4*)" in cl


@needs_ptxas
# CUDA 13 ptxas has no sm_70
@pytest.mark.parametrize("arch", ["sm_75", "sm_80", "sm_86", "sm_89", "sm_90", "sm_100", "sm_120"])
def test_ptxas_accepts_shared_and_vector(arch):
  for prg in (shared_reverse_program(), vector_program()):
    lib = PTXCompiler(arch).compile(PTXRenderer(arch).render(prg))
    assert lib[:4] == b"\x7fELF"


@needs_clang
def test_clang_accepts_shared_and_vector():
  for prg in (shared_reverse_program(), vector_program()):
    OpenCLCompiler().compile(OpenCLRenderer().render(prg))
    assert OpenCLCompiler().build_spir(OpenCLRenderer().render(prg))[:4] == b"BC\xc0\xde"  # LLVM bitcode magic


def test_amdgpu_isa_has_lds_barrier_and_vector_loads():
  comp = AMDGPUCompiler("gfx1100")
  asm = comp.assembly(AMDGPURenderer().render(shared_reverse_program()))
  assert "s_barrier" in asm and "ds_store_b32" in asm and "ds_load_b32" in asm
  assert ".group_segment_fixed_size: 64" in asm  # the 16-float LDS tile, in the kernel metadata
  vasm = comp.assembly(AMDGPURenderer().render(vector_program()))
  assert "_load_b128" in vasm and "global_store_b128" in vasm  # one 16-byte load (scalar: the address is uniform)


# WMMA: one warp/wave-wide matrix multiply-accumulate from registers
def wmma_program(n_a: int, n_b: int, n_c: int, din=dtypes.float16, name="wmma") -> list[UOp]:
  """Each lane loads its A/B fragments (n_a, n_b halves) and C (n_c floats) from global memory, runs one WMMA and
  stores D. Fragment layout is the target's (lane-major here: lane l's fragment is contiguous)."""
  da = UOp(Ops.PARAM, din.ptr(32 * n_a), arg=1)
  db = UOp(Ops.PARAM, din.ptr(32 * n_b), arg=2)
  dc, dd = UOp(Ops.PARAM, dtypes.float.ptr(32 * n_c), arg=3), UOp(Ops.PARAM, dtypes.float.ptr(32 * n_c), arg=0)
  lane = UOp(Ops.SPECIAL, dtypes.int32, (UOp.const(dtypes.int32, 32),), "lidx0")

  def frag(buf: UOp, n: int, dt) -> UOp:
    return UOp(Ops.VECTORIZE, dt.vec(n), tuple(buf.index(lane * UOp.const(dtypes.int32, n) + UOp.const(dtypes.int32, i))
                                              .load() for i in range(n)))
  a, b, c = frag(da, n_a, din), frag(db, n_b, din), frag(dc, n_c, dtypes.float)
  d = UOp(Ops.WMMA, dtypes.float.vec(n_c), (a, b, c), arg=(name, din.name))
  stores = [dd.index(lane * UOp.const(dtypes.int32, n_c) + UOp.const(dtypes.int32, i))
            .store(UOp(Ops.GEP, dtypes.float, (d,), (i,))) for i in range(n_c)]
  return list(UOp(Ops.SINK, dtypes.void, tuple(stores), KernelInfo(name)).toposort())


# bfloat16 fragments move as their raw bits (uint16), as bf16-through-float lowering leaves loads; the WMMA's arg
# names the input type
@pytest.mark.parametrize("arch,din,shape", [("sm_80", dtypes.float16, (8, 4, 4)), ("sm_90", dtypes.uint16, (8, 4, 4)),
                                            ("sm_75", dtypes.float16, (4, 2, 4))])
def test_ptx_wmma_renders_mma_sync(arch, din, shape):
  prg = wmma_program(*shape, din=din, name="wmma_bf16" if din == dtypes.uint16 else "wmma")
  ptx = PTXRenderer(arch).render(prg)
  tin = "bf16" if din == dtypes.uint16 else "f16"
  k = 16 if shape[0] == 8 else 8
  assert f"mma.sync.aligned.m16n8k{k}.row.col.f32.{tin}.{tin}.f32 {{" in ptx
  assert ptx.count("mov.b32 %r") >= shape[0] // 2 + shape[1] // 2  # halves packed in pairs
  if find_ptxas() is not None: assert PTXCompiler(arch).compile(ptx)[:4] == b"\x7fELF"


@pytest.mark.parametrize("din", [dtypes.float16, dtypes.uint16])
def test_amdgpu_wmma_renders_intrinsic(din):
  prg = wmma_program(16, 16, 8, din=din, name="wmma_bf16" if din == dtypes.uint16 else "wmma")
  ir = AMDGPURenderer("gfx1100").render(prg)
  kind = "f16" if din == dtypes.float16 else "bf16"
  assert f"call <8 x float> @llvm.amdgcn.wmma.f32.16x16x16.{kind}(" in ir
  assert f"v_wmma_f32_16x16x16_{kind}" in AMDGPUCompiler("gfx1100").assembly(ir)


def test_wmma_bad_shapes_raise():
  with pytest.raises(ValueError, match="8/4/4"): PTXRenderer("sm_90").render(wmma_program(4, 4, 4))
  with pytest.raises(ValueError, match="16-wide"): AMDGPURenderer("gfx1100").render(wmma_program(8, 4, 4))
  with pytest.raises(NotImplementedError, match="tensor cores"): OpenCLRenderer().render(wmma_program(8, 4, 4))


def test_reduce_loop_and_gates_render():
  # out[i] = sum_j ((j < 3 ? a[i*4 + j] : 0) + 1): a loop, an accumulator and a gated load (the + 1 keeps the loop
  # whole: a sum of gated products alone would have its loop narrowed to j < 3, lower/bounds.py)
  c, a = UOp(Ops.PARAM, dtypes.float.ptr(8), arg=0), UOp(Ops.PARAM, dtypes.float.ptr(32), arg=1)
  i, j = UOp.range(8, 0), UOp.range(4, 1, AxisType.REDUCE)
  term = a.index(i * 4 + j, j < 3).load() + UOp.const(dtypes.float, 1.0)
  ast = c.index(i).store(term.reduce(j, arg=Ops.ADD)).sink(arg=KernelInfo("gated"))
  ptx = render(PTXRenderer, ast)
  assert "bra $L_done" in ptx and "setp.ge.s32" in ptx and ptx.count("@%p") >= 2  # loop exit + predicated load
  ir = render(AMDGPURenderer, ast)
  assert "phi i32" in ir and "alloca [1 x float], align 16, addrspace(5)" in ir and "select i1" in ir
  cl = render(OpenCLRenderer, ast)
  assert "for (int Ridx1 = 0; Ridx1 < 4; Ridx1++)" in cl and "?(*(data1+" in cl



@needs_ptxas
def test_nvptx_llvm_path_shared_and_vector():
  from tiny_codegen.renderer.nvptx import NVPTXRenderer
  r = NVPTXRenderer("sm_90")
  ir = r.render(shared_reverse_program())
  assert "@llvm.nvvm.read.ptx.sreg.tid.x()" in ir and "call void @llvm.nvvm.barrier0()" in ir
  ptx = r.compiler.to_ptx(ir)
  assert ".shared .align 16 .b8" in ptx and "bar.sync" in ptx and "%tid.x" in ptx
  assert r.compiler.compile(ir)[:4] == b"\x7fELF"
  vptx = r.compiler.to_ptx(r.render(vector_program()))
  assert re.search(r"ld\.global(\.nc)?\.v4\.(f32|b32)", vptx) and re.search(r"st\.global\.v4\.(f32|b32)", vptx)
  with pytest.raises(NotImplementedError, match="tensor cores"): r.render(wmma_program(8, 4, 4))


def test_symbolic_vars_are_kernel_arguments():
  # out[i] = sum_{j < n} a[i*16 + j] with a DEFINE_VAR n: a loop with a register bound and an int kernel argument
  c, a = UOp(Ops.PARAM, dtypes.float.ptr(8), arg=0), UOp(Ops.PARAM, dtypes.float.ptr(128), arg=1)
  n = UOp.variable("n", 1, 16)
  i, j = UOp.range(8, 0), UOp(Ops.RANGE, dtypes.int32, (n,), (1, AxisType.REDUCE))
  ast = c.index(i).store(a.index(i * 16 + j).load().reduce(j, arg=Ops.ADD)).sink(arg=KernelInfo("symbolic"))
  ptx = render(PTXRenderer, ast)
  assert "\t.param .s32 var_n\n)" in ptx and "ld.param.s32" in ptx
  ir = render(AMDGPURenderer, ast)
  assert "ptr addrspace(1) noalias align 16 %data1, i32 %var.n)" in ir and "icmp slt i32 %Ridx1, %var.n" in ir
  assert "__global float* restrict data1, const int n)" in render(OpenCLRenderer, ast)
  if find_ptxas() is not None: assert PTXCompiler().compile(ptx)[:4] == b"\x7fELF"
  assert AMDGPUCompiler().compile(ir)[:4] == b"\x7fELF"


def test_narrowed_reduce_loop_renders_on_gpus():
  # a sum of gated products (a padded conv row): its loop bound becomes an expression of the output index
  # (lower/bounds.py), which every GPU renderer spells and its assembler accepts
  c, a, w = (UOp(Ops.PARAM, dtypes.float.ptr(n), arg=k) for k, n in enumerate((12, 8, 5)))
  y, k = UOp.range(12, 0), UOp.range(5, 1, AxisType.REDUCE)
  valid = (UOp.const(dtypes.index, 1) < (y + k)) & ((y + k) < UOp.const(dtypes.index, 10))
  term = valid.where(a.index(y + k - 2, valid).load(), UOp.const(dtypes.float, 0.0)) * w.index(k).load()
  ast = c.index(y).store(term.reduce(k, arg=Ops.ADD)).sink(arg=KernelInfo("narrowed"))
  cl = render(OpenCLRenderer, ast)
  assert re.search(r"for \(int Ridx1 = 0; Ridx1 < [^0-9]", cl) and "?(*(data1+" not in cl, cl
  ptx = render(PTXRenderer, ast, "sm_90")
  if find_ptxas() is not None: assert PTXCompiler("sm_90").compile(ptx)[:4] == b"\x7fELF"
  ir = render(AMDGPURenderer, ast, "gfx1100")
  if find_ld_lld() is not None: assert AMDGPUCompiler("gfx1100").compile(ir)[:4] == b"\x7fELF"


def half_from_bytes_kernel() -> UOp:
  """out[i] = the half whose two bytes are in[2i], in[2i+1] (as the GGUF F16/K-quant decoders build it): a ushort OR
  ushort << 8, which C's integer promotion makes an int, bitcast to half."""
  out, inp = UOp(Ops.PARAM, dtypes.float.ptr(4), arg=0), UOp(Ops.PARAM, dtypes.uint8.ptr(8), arg=1)
  i = UOp.range(4, 0)
  lo, hi = (inp.index(i * 2 + k).load().cast(dtypes.uint16) for k in (0, 1))
  return out.index(i).store((lo | (hi << 8)).bitcast(dtypes.half).cast(dtypes.float)).sink(arg=KernelInfo("E_4"))


@needs_clang
@pytest.mark.parametrize("storage_only", [False, True])
def test_opencl_half_bitcast_of_a_promoted_expression_compiles(storage_only):
  # `as_ushort(a | b << 8)` of ushorts is as_ushort of an int: "invalid reinterpretation" in every OpenCL compiler
  # (PoCL's CPU device has no cl_khr_fp16: half is storage-only there, converted by _h2f, the path that missed it)
  ren = OpenCLRenderer()
  ren.half_storage_only = storage_only
  src = ren.render(lower(half_from_bytes_kernel(), ren).uops)
  want = r"_h2f\(as_ushort\(\(ushort\)\(" if storage_only else r"as_half\(\(ushort\)\("
  assert re.search(want, src), src
  OpenCLCompiler().compile(src)
