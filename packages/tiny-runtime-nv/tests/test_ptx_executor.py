"""The PTX executor on hand-written PTX: divergence and reconvergence, barriers with shared memory, atomics with
repeated addresses, vector loads/stores, conversions, exact fma rounding, faults, and errors by name. Every kernel
here is also assembled by NVIDIA's ptxas (the nvidia-cuda-nvcc wheel, a test dependency), so the PTX is valid."""
from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from tiny_codegen.compiler.ptx import PTXCompiler, find_ptxas
from tiny_runtime_nv.ptx import GPUFault, Memory, load_kernel, run

HEAD = ".version 7.8\n.target sm_90\n.address_size 64\n"


def kernel(body: str, params: str = ".param .u64 data0", regs: str = "") -> str:
  decl = regs or (".reg .pred %p<4>; .reg .b16 %rs<8>; .reg .b32 %r<16>; .reg .f32 %f<8>; .reg .b64 %rd<16>; "
                  ".reg .f64 %fd<4>;")
  return HEAD + f".visible .entry k({params})\n{{\n{decl}\n{body}\nret;\n}}\n"


def assembled(ptx: str) -> str:
  """`ptx`, after checking that NVIDIA's ptxas accepts it."""
  assert find_ptxas() is not None, "ptxas comes from the nvidia-cuda-nvcc test dependency"
  assert PTXCompiler("sm_90").compile(ptx)[:4] == b"\x7fELF"
  return ptx


OUT_ADDR = """ld.param.u64 %rd0, [data0]; cvta.to.global.u64 %rd1, %rd0; mov.u32 %r0, %tid.x; mov.u32 %r1, %ctaid.x;
mov.u32 %r2, %ntid.x; mad.lo.s32 %r3, %r1, %r2, %r0; mul.wide.s32 %rd2, %r3, 4; add.s64 %rd3, %rd1, %rd2;"""


def test_divergent_loop_reconverges():
  # each thread loops tid times adding 3, then all threads (reconverged) add 100
  ptx = assembled(kernel(OUT_ADDR + """
mov.u32 %r4, 0; mov.u32 %r5, 0;
$L_top: setp.ge.s32 %p0, %r5, %r0; @%p0 bra $L_done;
add.s32 %r4, %r4, 3; add.s32 %r5, %r5, 1; bra $L_top;
$L_done: add.s32 %r4, %r4, 100; st.global.u32 [%rd3], %r4;"""))
  out = np.zeros(96, np.int32)
  run(ptx, "k", [out], (3, 1, 1), (32, 1, 1))
  np.testing.assert_array_equal(out, np.tile(np.arange(32) * 3 + 100, 3))


def test_if_else_and_predicated_ret():
  ptx = assembled(kernel(OUT_ADDR + """
and.b32 %r4, %r0, 1; setp.eq.s32 %p0, %r4, 0; @%p0 bra $L_even;
mov.u32 %r5, 7; bra $L_end;
$L_even: mov.u32 %r5, 8;
$L_end: setp.gt.u32 %p1, %r0, 5; @%p1 ret; st.global.u32 [%rd3], %r5;"""))
  out = np.full(16, -1, np.int32)
  run(ptx, "k", [out], (1, 1, 1), (16, 1, 1))
  want = np.where(np.arange(16) % 2 == 0, 8, 7)
  want[6:] = -1
  np.testing.assert_array_equal(out, want)


def test_shared_memory_tree_reduction_with_barriers():
  body = OUT_ADDR + """
mov.u32 %r6, sbuf; shl.b32 %r7, %r0, 2; add.s32 %r8, %r6, %r7; st.shared.u32 [%r8], %r3; bar.sync 0;
mov.u32 %r9, 32;
$L_top: shr.u32 %r9, %r9, 1; setp.eq.s32 %p0, %r9, 0; @%p0 bra $L_done;
setp.lt.u32 %p1, %r0, %r9; @!%p1 bra $L_skip;
shl.b32 %r10, %r9, 2; add.s32 %r11, %r8, %r10; ld.shared.u32 %r12, [%r11]; ld.shared.u32 %r13, [%r8];
add.s32 %r13, %r13, %r12; st.shared.u32 [%r8], %r13;
$L_skip: bar.sync 0; bra $L_top;
$L_done: ld.shared.u32 %r14, [%r6]; st.global.u32 [%rd3], %r14;"""
  ptx = assembled(kernel(".shared .align 4 .b8 sbuf[128];\n" + body))
  out = np.zeros(64, np.int32)
  run(ptx, "k", [out], (2, 1, 1), (32, 1, 1))
  np.testing.assert_array_equal(out, np.repeat([np.arange(32).sum(), np.arange(32, 64).sum()], 32))


def test_barrier_in_divergent_code_is_an_error():
  ptx = assembled(kernel(OUT_ADDR + "setp.lt.u32 %p0, %r0, 4; @!%p0 bra $L_end; bar.sync 0; $L_end: "
                                    "st.global.u32 [%rd3], %r0;"))
  with pytest.raises(RuntimeError, match="divergent"): run(ptx, "k", [np.zeros(32, np.int32)], (1, 1, 1), (32, 1, 1))


def test_atomics_with_repeated_addresses_return_old_values_in_order():
  ptx = assembled(kernel("""ld.param.u64 %rd0, [data0]; cvta.to.global.u64 %rd1, %rd0; mov.u32 %r0, %tid.x;
and.b32 %r1, %r0, 3; mul.wide.u32 %rd2, %r1, 4; add.s64 %rd3, %rd1, %rd2; atom.global.add.u32 %r2, [%rd3], 1;
mul.wide.u32 %rd4, %r0, 4; add.s64 %rd5, %rd1, %rd4; add.s64 %rd6, %rd5, 16; st.global.u32 [%rd6], %r2;"""))
  out = np.zeros(4 + 16, np.uint32)
  run(ptx, "k", [out], (1, 1, 1), (16, 1, 1))
  np.testing.assert_array_equal(out[:4], [4, 4, 4, 4])
  np.testing.assert_array_equal(out[4:], np.arange(16) // 4)  # lane order: the i-th lane at an address sees i


def test_vector_load_store_and_alignment_fault():
  ptx = assembled(kernel("""ld.param.u64 %rd0, [data0]; cvta.to.global.u64 %rd1, %rd0; mov.u32 %r0, %tid.x;
mul.wide.u32 %rd2, %r0, 16; add.s64 %rd3, %rd1, %rd2; ld.global.v4.f32 {%f0, %f1, %f2, %f3}, [%rd3];
st.global.v4.f32 [%rd3], {%f3, %f2, %f1, %f0};"""))
  x = np.arange(32, dtype=np.float32)
  run(ptx, "k", [x], (1, 1, 1), (8, 1, 1))
  np.testing.assert_array_equal(x, np.arange(32, dtype=np.float32).reshape(8, 4)[:, ::-1].ravel())
  k, mem = load_kernel(ptx, "k"), Memory()
  buf = np.zeros(64, np.uint8)
  mem.add(buf.ctypes.data, buf.nbytes, buf)
  with pytest.raises(GPUFault, match="misaligned"):
    k.launch(mem, k.pack_params([buf.ctypes.data + 4]), (1, 1, 1), (1, 1, 1))
  with pytest.raises(GPUFault, match="page fault"):
    k.launch(mem, k.pack_params([buf.ctypes.data + 64]), (1, 1, 1), (1, 1, 1))


def test_conversions_saturate_and_round():
  ptx = assembled(kernel("""ld.param.u64 %rd0, [data0]; cvta.to.global.u64 %rd1, %rd0; mov.u32 %r0, %tid.x;
mul.wide.u32 %rd2, %r0, 4; add.s64 %rd3, %rd1, %rd2; ld.global.f32 %f0, [%rd3];
cvt.rzi.s32.f32 %r1, %f0; cvt.rni.s32.f32 %r2, %f0; cvt.rn.f16.f32 %rs0, %f0; cvt.f32.f16 %f1, %rs0;
cvt.rn.bf16.f32 %rs1, %f0; cvt.f32.bf16 %f2, %rs1;
add.s64 %rd4, %rd3, 32; st.global.u32 [%rd4], %r1; add.s64 %rd5, %rd3, 64; st.global.u32 [%rd5], %r2;
add.s64 %rd6, %rd3, 96; st.global.f32 [%rd6], %f1; add.s64 %rd7, %rd3, 128; st.global.f32 [%rd7], %f2;"""))
  vals = np.array([2.5, -2.5, 1e10, -1e10, np.nan, 65520.0, 1.00390625, -0.0], np.float32)
  buf = np.zeros(8 * 5, np.float32)
  buf[:8] = vals
  run(ptx, "k", [buf], (1, 1, 1), (8, 1, 1))
  ints = buf.view(np.int32)
  np.testing.assert_array_equal(ints[8:16], [2, -2, 2**31 - 1, -2**31, 0, 65520, 1, 0])   # trunc, saturating
  np.testing.assert_array_equal(ints[16:24], [2, -2, 2**31 - 1, -2**31, 0, 65520, 1, 0])  # to nearest even
  with np.errstate(over="ignore"): np.testing.assert_array_equal(buf[24:32], vals.astype(np.float16).astype(np.float32))
  bf = buf[32:40]
  assert bf[0] == 2.5 and np.isnan(bf[4]) and bf[6] == 1.0  # 1 + 2**-8 ties to even in bf16's 8-bit mantissa


def test_fma_rounds_once():
  ptx = assembled(kernel("""ld.param.u64 %rd0, [data0]; cvta.to.global.u64 %rd1, %rd0; mov.u32 %r0, %tid.x;
mul.wide.u32 %rd2, %r0, 16; add.s64 %rd3, %rd1, %rd2; ld.global.v4.f32 {%f0, %f1, %f2, %f3}, [%rd3];
fma.rn.f32 %f3, %f0, %f1, %f2; st.global.f32 [%rd3+12], %f3;"""))
  rng = np.random.default_rng(0)
  n = 256
  abc = rng.standard_normal((n, 4)).astype(np.float32)
  abc[:, 2] = -(abc[:, 0].astype(np.float64) * abc[:, 1]).astype(np.float32)  # cancellation: the product's tail
  run(ptx, "k", [abc.reshape(-1)], (1, 1, 1), (n, 1, 1))
  for a, b, c, d in abc[:64]:
    exact = Fraction(float(a)) * Fraction(float(b)) + Fraction(float(c))
    assert d == np.float32(float(exact)), (a, b, c, d)


def test_unknown_instruction_raises_by_name():
  ptx = kernel("ld.param.u64 %rd0, [data0]; vote.sync.all.pred %p0, %p1, 0xffffffff;")
  with pytest.raises(NotImplementedError, match="vote.sync.all.pred"): load_kernel(ptx, "k")


def test_launch_limits_are_checked():
  ptx = kernel("ld.param.u64 %rd0, [data0];")
  k = load_kernel(ptx, "k")
  with pytest.raises(ValueError, match="threads per block"):
    k.launch(Memory(), k.pack_params([0]), (1, 1, 1), (1024, 2, 1))
  with pytest.raises(ValueError, match="grid dim y"):
    k.launch(Memory(), k.pack_params([0]), (1, 70000, 1), (1, 1, 1))


def test_mov_of_array_element_address():
  # `mov.u32 %r, A[i]` is the address of A's element i (PTX ISA, mov: "move address of A[5] into ptr"); tinygrad's
  # PTXRenderer writes `mov.u64 %local_u64_0, local0[0];`. Each thread stores tid*10 at sarr[tid], then every thread
  # reads sarr[2] and pad8[3] through addresses taken that way.
  body = OUT_ADDR + """
mov.u32 %r5, sarr; shl.b32 %r7, %r0, 2; add.s32 %r8, %r5, %r7; mul.lo.s32 %r9, %r0, 10; st.shared.u32 [%r8], %r9;
mov.u32 %r10, pad8; add.s32 %r10, %r10, %r0; cvt.u16.u32 %rs0, %r0; st.shared.u8 [%r10], %rs0; bar.sync 0;
mov.u32 %r6, sarr[2]; ld.shared.u32 %r11, [%r6];
mov.u64 %rd4, pad8[3]; cvt.u32.u64 %r12, %rd4; ld.shared.u8 %rs1, [%r12]; cvt.u32.u16 %r13, %rs1;
mad.lo.s32 %r14, %r13, 1000, %r11; st.global.u32 [%rd3], %r14;"""
  ptx = assembled(kernel(".shared .align 4 .b8 pad8[16];\n.shared .align 4 .u32 sarr[8];\n" + body))
  out = np.zeros(8, np.int32)
  run(ptx, "k", [out], (1, 1, 1), (8, 1, 1))
  np.testing.assert_array_equal(out, np.full(8, 3 * 1000 + 2 * 10))


def test_fma64_is_exact_for_operands_past_2_to_995():
  """The executor's `fma.rn.f64` splits each operand (Veltkamp) to keep the product exact: a split of |x| > 2**995
  overflowed (inf - inf: NaN), which made float64 fmod NaN for quotients past ~2**995 under MOCK+NV."""
  from fractions import Fraction
  import numpy as np
  from tiny_runtime_nv.ptx.values import fma64
  a = np.array([1.5 * 2.0 ** 1000, -(2.0 ** 1023) * 1.75, 3.0, 2.0 ** 996])
  b = np.array([1 + 2.0 ** -52, 1 - 2.0 ** -53, 1 / 3, -(1 + 2.0 ** -50)])
  c = -a
  got = fma64(a, b, c)
  want = [float(Fraction(x) * Fraction(y) + Fraction(z)) for x, y, z in zip(a, b, c)]
  assert got.tolist() == want and np.isfinite(got).all()
