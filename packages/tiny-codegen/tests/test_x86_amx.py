"""`tiny_codegen.x86_amx`: the AMX bfloat16 GEMM kernel against numpy's float64 product of the same bfloat16 values
and torch's bfloat16 matmul, and the gate (`request_tile_state`) that keeps its code from running where the probe
didn't confirm AMX."""
from __future__ import annotations

import ctypes
import platform

import numpy as np
import pytest

from tiny_codegen import cpu_probe, x86_amx
from tiny_codegen.compiler.llvm import LLVMCompiler

x86_only = pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"), reason="x86-64 machine code")


def _bf16_bits(x: np.ndarray) -> np.ndarray:
  """float32 -> the nearest bfloat16's bits (ties to even), as uint16."""
  b = x.astype(np.float32).view(np.uint32).astype(np.uint64)
  return ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype(np.uint16)


def _bits_to_f64(bits: np.ndarray) -> np.ndarray:
  return (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def test_ir_uses_the_tile_instructions() -> None:
  src = x86_amx.amx_bf16_matmul_ir(64, 32, 96, threads=2)
  assert src.count("@llvm.x86.tdpbf16ps.internal(") == 5  # the declaration and the 2 x 2 tile products
  assert src.count("shufflevector <32 x i16>") == 2  # B's pack: each k-pair's two rows interleaved, in the kernel
  assert src.count("call void @llvm.prefetch.p0(") == 32  # the next k step's 32 A rows
  assert "+amx-tile,+amx-bf16" in src and "@llvm.x86.tileloadd64.internal(" in src


@pytest.mark.parametrize("shape, msg", [((48, 32, 32, 1), r"M=48 must be a multiple of 32"),
                                        ((64, 32, 32, 4), r"M=64 must be a multiple of 32 x threads \(128"),
                                        ((32, 16, 32, 1), r"N=16 must be a multiple of 32"),
                                        ((32, 32, 33, 1), r"K=33 must be a multiple of 32"),
                                        ((32, 32, 0, 1), r"K must be a positive int, got 0"),
                                        ((32, 32, 32, 1.0), r"threads must be a positive int, got 1.0"),
                                        ((32, 32, 32768, 1), r"K=32768 is more than 16384"),
                                        ((32, 32, 96, 1, "k", False, 64), r"kb=64; valid: a multiple of 32 that div"),
                                        ((32, 32, 96, 1, "k", False, None, 64), r"lda=64; valid: an int of at least")])
def test_bad_shapes_are_clear_errors(shape: tuple, msg: str) -> None:
  with pytest.raises(ValueError, match=msg): x86_amx.amx_bf16_matmul_ir(*shape)


def test_probe_off_means_no_tiles(monkeypatch: pytest.MonkeyPatch) -> None:
  monkeypatch.setenv("TINY_CPU_PROBE", "0")
  assert x86_amx.request_tile_state() is False
  monkeypatch.setattr(cpu_probe, "executes", lambda feature, flags=None: False)
  monkeypatch.delenv("TINY_CPU_PROBE")
  assert x86_amx.request_tile_state() is False


@x86_only
@pytest.mark.parametrize("m, n, k, threads, cols", [(32, 64, 96, 2, 2), (32, 192, 64, 3, 3), (64, 128, 160, 4, 2),
                                                   (32, 256, 768, 2, 2), (96, 64, 32, 2, 2)])
def test_amx_matmul_split_over_columns_matches_numpy(m: int, n: int, k: int, threads: int, cols: int) -> None:
  """`col_threads`: the column blocks split among threads (a 32-row prefill chunk's one row block gave a second
  thread nothing: issue #39), alone and with row shares (4 threads = 2 x 2), odd counts (3 column shares of 2 blocks);
  every element written once against float64 numpy."""
  if not x86_amx.request_tile_state(): pytest.skip("this CPU (or its hypervisor) doesn't run AMX bfloat16 tiles")
  from kernel_runner import load_fn
  rng = np.random.default_rng(m * n + k)
  a, b = _bf16_bits(rng.standard_normal((m, k))), np.ascontiguousarray(_bf16_bits(rng.standard_normal((k, n))))
  a = np.ascontiguousarray(a)
  out = np.full((m, n), np.nan, np.float32)
  compiler = LLVMCompiler()
  src = x86_amx.amx_bf16_matmul_ir(m, n, k, threads, name="amx_mc", col_threads=cols)
  fn = ctypes.CFUNCTYPE(None, *[ctypes.c_void_p] * 3, ctypes.c_int32)(load_fn("amx_mc", compiler.compile(src)))
  for core in range(threads):
    fn(out.ctypes.data, a.ctypes.data, b.ctypes.data, core)
  fa, fb = _bits_to_f64(a), _bits_to_f64(b)
  exact = fa @ fb
  bound = k * 2.0 ** -23 * (np.abs(fa) @ np.abs(fb))
  assert np.all(np.abs(out - exact) <= bound), float(np.nanmax(np.abs(out - exact) - bound))


@x86_only
@pytest.mark.parametrize("m, n, k, threads, cols", [(32, 64, 96, 1, 1), (32, 192, 64, 3, 3), (64, 128, 160, 4, 2),
                                                   (32, 256, 768, 2, 2)])
def test_amx_matmul_over_packed_b_matches_numpy(m: int, n: int, k: int, threads: int, cols: int) -> None:
  """`b_packed`: B laid out once in the kernel's panels (`pack_b`, done here in numpy) and read in place, no pack
  loop in the kernel; against float64 numpy of the unpacked B."""
  if not x86_amx.request_tile_state(): pytest.skip("this CPU (or its hypervisor) doesn't run AMX bfloat16 tiles")
  from kernel_runner import load_fn
  rng = np.random.default_rng(m * n + k + 1)
  a, b = np.ascontiguousarray(_bf16_bits(rng.standard_normal((m, k)))), _bf16_bits(rng.standard_normal((k, n)))
  shape, to_panels, back = x86_amx.pack_b(k, n)
  panels = np.ascontiguousarray(b.reshape(shape).transpose(to_panels))
  assert np.array_equal(panels.transpose(back).reshape(k, n), b)
  out = np.full((m, n), np.nan, np.float32)
  compiler = LLVMCompiler()
  src = x86_amx.amx_bf16_matmul_ir(m, n, k, threads, name="amx_pb", col_threads=cols, b_packed=True)
  assert "pack.body" not in src and "%pk = alloca" not in src
  fn = ctypes.CFUNCTYPE(None, *[ctypes.c_void_p] * 3, ctypes.c_int32)(load_fn("amx_pb", compiler.compile(src)))
  for core in range(threads): fn(out.ctypes.data, a.ctypes.data, panels.ctypes.data, core)
  fa, fb = _bits_to_f64(a), _bits_to_f64(b)
  bound = k * 2.0 ** -23 * (np.abs(fa) @ np.abs(fb))
  assert np.all(np.abs(out - fa @ fb) <= bound), float(np.nanmax(np.abs(out - fa @ fb) - bound))
  with pytest.raises(ValueError, match=r"a 31x64 B; valid: K even"): x86_amx.pack_b(31, 64)


def test_split_threads_rows_first_then_columns() -> None:
  assert x86_amx.split_threads(1024, 1024, 2) == (2, 1)    # rows split: as before
  assert x86_amx.split_threads(32, 2048, 2) == (2, 2)      # a 32-row chunk: the columns
  assert x86_amx.split_threads(32, 96, 2) == (1, 1)        # 3 column blocks don't split in 2
  assert x86_amx.split_threads(64, 64, 4) == (4, 2)
  assert x86_amx.split_threads(96, 64, 2) == (2, 2)        # 3 row blocks: columns
  assert x86_amx.split_threads(32, 64, 1) == (1, 1)
  with pytest.raises(ValueError, match=r"column blocks must split evenly over col_threads=2"):
    x86_amx.amx_bf16_matmul_ir(32, 96, 32, 2, col_threads=2)
  with pytest.raises(ValueError, match=r"threads=3 must be a multiple of col_threads=2"):
    x86_amx.amx_bf16_matmul_ir(32, 64, 32, 3, col_threads=2)


@x86_only
@pytest.mark.parametrize("m, n, k, threads, kb", [(64, 96, 160, 2, None), (32, 32, 32, 1, None),
                                                 (128, 64, 1056, 2, None), (512, 64, 96, 1, 32),
                                                 (96, 64, 320, 3, 64), (256, 32, 2048, 2, None)])
def test_amx_matmul_matches_numpy_and_torch(m: int, n: int, k: int, threads: int, kb: int | None) -> None:
  """Odd block counts (3 threads, 3 K blocks of 5 steps), 16 row blocks in groups of 8 over 3 K blocks (the C tiles'
  round trips through the stack), K past one L1 block (2048 = two 1024-blocks)."""
  if not x86_amx.request_tile_state(): pytest.skip("this CPU (or its hypervisor) doesn't run AMX bfloat16 tiles")
  from kernel_runner import load_fn
  rng = np.random.default_rng(m + n + k)
  a, b = _bf16_bits(rng.standard_normal((m, k))), _bf16_bits(rng.standard_normal((k, n)))
  a = np.ascontiguousarray(a)
  out = np.full((m, n), np.nan, np.float32)
  compiler = LLVMCompiler()
  src = x86_amx.amx_bf16_matmul_ir(m, n, k, threads, name="amx_mm", kb=kb)
  asm = compiler.target_machine.emit_assembly(compiler._optimize(src))
  assert "tdpbf16ps" in asm and "prefetcht0" in asm
  fn = ctypes.CFUNCTYPE(None, *[ctypes.c_void_p] * 3, ctypes.c_int32)(load_fn("amx_mm", compiler.compile(src)))
  for core in range(threads): fn(out.ctypes.data, a.ctypes.data, np.ascontiguousarray(b).ctypes.data, core)
  fa, fb = _bits_to_f64(a), _bits_to_f64(b)
  exact = fa @ fb  # bfloat16 products are exact in float64; the kernel's only error is its float32 sums
  bound = k * 2.0 ** -23 * (np.abs(fa) @ np.abs(fb))
  assert np.all(np.abs(out - exact) <= bound), float(np.max(np.abs(out - exact) - bound))
  torch = pytest.importorskip("torch")
  want = torch.from_numpy(fa.astype(np.float32)).bfloat16() @ torch.from_numpy(fb.astype(np.float32)).bfloat16()
  got = torch.from_numpy(out).bfloat16().float()  # one rounding to bfloat16, as torch's result
  step = 2.0 ** -7 * want.float().abs()  # a bfloat16 step at the value (the sums may round across one)
  assert bool(((got - want.float()).abs() <= step + 1e-30).all())


def _dot_ast(m: int, k: int, n: int, cast: bool = False, b_t: bool = False) -> object:
  """The kernel AST of the float32 sum `Tensor.dot` builds for bfloat16 A (m, k) @ B (k, n) (the AMX branch's: one
  kernel); `b_t`: B read transposed from an (n, k) buffer (a layout the kernel doesn't read)."""
  from tiny_tensor import Tensor
  from tiny_uop import Ops as TOps
  a = Tensor.empty(m, k, dtype="bfloat16")
  b = Tensor.empty(n, k, dtype="bfloat16").T if b_t else Tensor.empty(k, n, dtype="bfloat16")
  out = (a.reshape(m, 1, k).float() * b.T.reshape(1, n, k).float()).sum(-1)
  out = (out.cast("bfloat16") if cast else out).contiguous()
  calls = [c.src[0] for c in out.schedule().calls if c.src[0].op is TOps.SINK]
  return calls[-1]


def test_match_matmul_is_exact() -> None:
  assert x86_amx.match_matmul(_dot_ast(64, 96, 32)) == (64, 32, 96, False)  # type: ignore[arg-type]
  assert x86_amx.match_matmul(_dot_ast(64, 96, 64, b_t=True)) is None  # B transposed: other strides
  assert x86_amx.match_matmul(_dot_ast(64, 48, 32)) is None  # K=48: the tiles' 32 doesn't divide it
  assert x86_amx.match_matmul(_dot_ast(48, 64, 32)) is None  # M=48
  assert x86_amx.match_matmul(_dot_ast(32, 32768, 32)) is None  # K past MAX_K: the stack's panel


@pytest.mark.parametrize("k, l1d, want", [(1024, 48 << 10, 1024), (4096, 48 << 10, 1024),
                                          (4096, 32 << 10, 1024), (4096, 16 << 10, 512), (96, 48 << 10, 96),
                                          (160, 1 << 10, 32), (3 * 1024, 48 << 10, 1536)])
def test_k_block_from_the_l1d(k: int, l1d: int, want: int) -> None:
  """The largest multiple of 32 dividing K whose packed panel pair (64 bytes a k) takes at most 2 x L1d."""
  assert x86_amx.k_block(k, l1d) == want


def test_k_block_from_the_fake_machines(tmp_path) -> None:
  """`program` derives the K block from the machine model: the fake sysfs trees of test_machine.py (Sapphire Rapids'
  48 KB L1d, Zen 4's 32 KB) give blocks of 1536 and 1024 k for K=3072, 1024 and 1024 for K=4096."""
  from test_machine import TREES, fake_tree  # type: ignore[import-not-found]
  from tiny_codegen.machine import Machine
  got = {}
  for name in ("sapphire_rapids", "znver4"):
    machine = Machine.from_sysfs(fake_tree(str(tmp_path / name), *TREES[name]))
    got[name] = (x86_amx.k_block(3072, machine.l1d), x86_amx.k_block(4096, machine.l1d))
  assert got == {"sapphire_rapids": (1536, 1024), "znver4": (1024, 1024)}
  with pytest.raises(ValueError, match=r"K=48; valid: a positive multiple of 32"): x86_amx.k_block(48, 1 << 15)


def test_fits_leaves_room_on_the_threads_stack(monkeypatch: pytest.MonkeyPatch) -> None:
  """The panel pair lives on the stack: a K whose frame passes a quarter of the threads' stack keeps the float32
  kernel (a 1 MB stack: K=2048's 161 KB frame fits, K=4096's 289 KB doesn't), and so does K past `MAX_K`."""
  assert x86_amx.stack_bytes(2048) == 2048 * 64 + 8 * 4096 + 1024
  monkeypatch.setattr(x86_amx, "thread_stack_limit", lambda: 1 << 20)
  assert x86_amx.fits(64, 64, 2048) and not x86_amx.fits(64, 64, 4096)
  monkeypatch.setattr(x86_amx, "thread_stack_limit", lambda: 1 << 30)
  assert x86_amx.fits(32, 32, x86_amx.MAX_K) and not x86_amx.fits(32, 32, x86_amx.MAX_K + 32)


def test_thread_stack_limit_reads_threading_then_rlimit(monkeypatch: pytest.MonkeyPatch) -> None:
  import resource
  import threading
  monkeypatch.setattr(threading, "stack_size", lambda: 512 << 10)
  assert x86_amx.thread_stack_limit() == 512 << 10
  monkeypatch.setattr(threading, "stack_size", lambda: 0)
  monkeypatch.setattr(resource, "getrlimit", lambda which: (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
  assert x86_amx.thread_stack_limit() == 8 << 20
  monkeypatch.setattr(resource, "getrlimit", lambda which: (2 << 20, resource.RLIM_INFINITY))
  assert x86_amx.thread_stack_limit() == 2 << 20


@x86_only
def test_bf16_out_rounds_as_tiny_casts() -> None:
  """`out_bf16=True`: the float32 kernel's sums rounded to nearest even bfloat16 (numpy here), NaN -> 0x7FC0."""
  if not x86_amx.request_tile_state(): pytest.skip("this CPU (or its hypervisor) doesn't run AMX bfloat16 tiles")
  from kernel_runner import load_fn
  m, n, k = 64, 64, 64
  rng = np.random.default_rng(7)
  af = rng.standard_normal((m, k)) * 1e3
  af[3, 5] = np.nan
  a, b = np.ascontiguousarray(_bf16_bits(af)), _bf16_bits(rng.standard_normal((k, n)))
  outs = {}
  compiler = LLVMCompiler()
  for bf16, dt in ((False, np.float32), (True, np.uint16)):
    out = np.zeros((m, n), dt)
    src = x86_amx.amx_bf16_matmul_ir(m, n, k, 1, name=f"mm{int(bf16)}", out_bf16=bf16)
    lib = compiler.compile(src)
    fn = ctypes.CFUNCTYPE(None, *[ctypes.c_void_p] * 3, ctypes.c_int32)(load_fn(f"mm{int(bf16)}", lib))
    fn(out.ctypes.data, a.ctypes.data, np.ascontiguousarray(b).ctypes.data, 0)
    outs[bf16] = out
  want = np.where(np.isnan(outs[False]), np.uint16(0x7FC0), _bf16_bits(outs[False]))
  assert np.isnan(outs[False][3]).all() and np.array_equal(outs[True], want)
  assert x86_amx.match_matmul(_dot_ast(64, 96, 32, cast=True)) == (64, 32, 96, True)  # type: ignore[arg-type]


@x86_only
def test_padded_a_rows_match_numpy() -> None:
  """A read with its rows `lda` > K elements apart (what `Tensor.dot` pads to, `a_row_pad`): the padding's values
  (NaN bits here) never reach the product, which is numpy's float64 one of the same bfloat16 values to the float32
  sums' bound; 2 threads, 2 K blocks."""
  if not x86_amx.request_tile_state(): pytest.skip("this CPU (or its hypervisor) doesn't run AMX bfloat16 tiles")
  from kernel_runner import load_fn
  m, n, k, lda = 64, 64, 2048, 2048 + 32
  rng = np.random.default_rng(5)
  a = np.full((m, lda), 0x7FC0, np.uint16)  # bfloat16 NaN in the pad
  a[:, :k] = _bf16_bits(rng.standard_normal((m, k)))
  b = _bf16_bits(rng.standard_normal((k, n)))
  out = np.full((m, n), np.nan, np.float32)
  compiler = LLVMCompiler()
  src = x86_amx.amx_bf16_matmul_ir(m, n, k, 2, name="amx_lda", kb=1024, lda=lda)
  assert f"i64 {lda * 2})" in src  # the A tiles' row stride
  fn = ctypes.CFUNCTYPE(None, *[ctypes.c_void_p] * 3, ctypes.c_int32)(load_fn("amx_lda", compiler.compile(src)))
  for core in range(2): fn(out.ctypes.data, a.ctypes.data, np.ascontiguousarray(b).ctypes.data, core)
  fa, fb = _bits_to_f64(a[:, :k]), _bits_to_f64(b)
  bound = k * 2.0 ** -23 * (np.abs(fa) @ np.abs(fb))
  assert np.all(np.abs(out - fa @ fb) <= bound), float(np.max(np.abs(out - fa @ fb) - bound))


def test_match_matmul_reads_padded_rows() -> None:
  """The AST of a product whose A is a view of rows padded apart (`Tensor.dot`'s copy) matches with that stride."""
  from tiny_tensor import Tensor
  from tiny_uop import Ops as TOps
  m, k, n = 64, 96, 32
  a = Tensor.empty(m, k + 32, dtype="bfloat16").shrink(((0, m), (0, k)))
  b = Tensor.empty(k, n, dtype="bfloat16")
  out = (a.reshape(m, 1, k).float() * b.T.reshape(1, n, k).float()).sum(-1).contiguous()
  ast = [c.src[0] for c in out.schedule().calls if c.src[0].op is TOps.SINK][-1]
  assert x86_amx.match_matmul_layout(ast) == (m, n, k, False, k + 32)  # type: ignore[arg-type]
  assert x86_amx.match_matmul(ast) == (m, n, k, False)  # type: ignore[arg-type]


@pytest.mark.parametrize("l1d, ways, n, k, want", [
  (48 << 10, 12, 4096, 4096, 32),  # Sapphire Rapids' 48 KB 12-way L1d, a 4 KB set span: rows of 8 KB, all in 1 set
  (48 << 10, 12, 4096, 1024, 32),  # rows of 2 KB: 2 sets of 12 ways for 32 rows
  (48 << 10, 12, 4096, 4128, 0),   # rows already a cache line off a span multiple: 64 sets
  (48 << 10, 12, 1024, 4096, 0),   # N below A_PAD_MIN_COLUMNS: the copy costs about what it gains
  (48 << 10, 12, 2016, 4096, 0),   # 63 column blocks of 32: 63 passes over A, under the copy's 2 x 32
  (48 << 10, 12, 2048, 4096, 32),  # 64 passes: the copy's 2 passes are 1/32 of them
  (64 << 10, 4, 2016, 4096, 0),    # the same passes on any L1d: a property of the tile loop, not of the cache
  (32 << 10, 8, 4096, 1024, 32),   # Zen 3/4's 32 KB 8-way (4 KB span): 2 sets of 8 ways
  (32 << 10, 8, 4096, 512, 0),     # rows of 1 KB: 4 sets of 8 ways hold the 32 rows
  (64 << 10, 4, 4096, 2048, 32),   # a 64 KB 4-way L1d (Neoverse N1, a 16 KB span): rows of 4 KB in 4 sets of 4
  (64 << 10, 4, 4096, 1024, 0),    # rows of 2 KB: 8 sets of 4 ways
])
def test_a_row_pad_follows_the_l1d_sets(l1d: int, ways: int, n: int, k: int, want: int) -> None:
  """Rows padded by one cache line (32 bfloat16s) exactly when a step's 32 A rows fall into sets with fewer ways than
  rows (the set span of the machine model, `Machine.l1d_set_span`, over gcd(K x 2, span), times the ways) and N is at
  least `A_PAD_MIN_COLUMNS` (N / BLOCK passes of the tile kernel over A against the copy's 2, `A_PAD_COPY_SHARE`)."""
  import dataclasses

  from tiny_codegen.machine import Machine
  m = dataclasses.replace(Machine.default(), l1d=l1d, l1d_ways=ways)
  assert x86_amx.a_row_pad(n, k, m.l1d_set_span, m.l1d_ways) == want, (m.l1d_set_span, n, k)
