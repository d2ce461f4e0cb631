"""`tiny_codegen.x86_bf16`: the `vdpbf16ps` GEMM's IR and machine code on described machines (everywhere: LLVM
compiles AVX512-BF16 for any host), its register block and thread split from the machine model, `program`'s choice
of it (AMX first, then it, only where the probe confirms AVX512-BF16), and, where this CPU runs the instruction, its
numbers against numpy's float64 product of the same bfloat16 values and torch's bfloat16 matmul."""
from __future__ import annotations

import ctypes
import dataclasses

import numpy as np
import pytest

from tiny_codegen import cpu_probe, x86_amx, x86_bf16
from tiny_codegen.compiler.llvm import LLVMCompiler
from tiny_codegen.machine import Machine, host_machine

ZEN4 = dataclasses.replace(Machine.default(cores=2), isa=frozenset({"avx512_bf16", "avx512vl", "avx512_vnni"}))
"""A described Zen 4: 32 zmm, 32 KB L1d, 1 MB L2, AVX512-BF16 listed, no AMX."""


def _bf16_bits(x: np.ndarray) -> np.ndarray:
  """float32 -> the nearest bfloat16's bits (ties to even), as uint16."""
  b = x.astype(np.float32).view(np.uint32).astype(np.uint64)
  return ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype(np.uint16)


def _bits_to_f64(bits: np.ndarray) -> np.ndarray:
  return (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def _asm(src: str) -> str:
  compiler = LLVMCompiler()
  return compiler.target_machine.emit_assembly(compiler._optimize(src))


def test_ir_and_machine_code_use_vdpbf16ps() -> None:
  """6 x 4 accumulators a k-pair, an odd K's last k alone (zero-extended A), the ragged last strip's masked loads and
  stores; in the machine code, the instruction on A's k-pair broadcast as one 32-bit value, no float32 FMA."""
  src = x86_bf16.avx512_bf16_matmul_ir(13, 100, 33, threads=2, mr=6, nv=4)
  assert src.count("call <16 x float> @llvm.x86.avx512bf16.dpbf16ps.512(") == 2 * (6 * 4 + 1 * 4)  # mk6, mk1
  assert "define internal void @avx512_bf16_matmul.mk1(" in src  # 13 = 2 x 6 + 1 rows
  assert src.count("zext i16") == 6 + 1 and "@llvm.masked.store.v16f32.p0(<16 x float>" in src
  assert "+avx512bf16" in src and "alloca [2176 x i16], align 64" in src  # 17 k-pairs x 64 columns x 2 values
  asm = _asm(src)
  assert "vdpbf16ps" in asm and "vfmadd" not in asm and ("vbroadcastss" in asm or "vpbroadcastd" in asm)
  assert "@llvm.masked.store.v16i16.p0" in x86_bf16.avx512_bf16_matmul_ir(8, 40, 32, out_bf16=True)
  assert "call void @llvm.masked.store" not in x86_bf16.avx512_bf16_matmul_ir(12, 128, 64, mr=6, nv=4)  # N = 2 NR


@pytest.mark.parametrize("args, msg", [((7, 40, 0), r"K must be a positive int, got 0"),
                                       ((7, 40, 8, 1.0), r"threads must be a positive int, got 1.0"),
                                       ((7, 40, 8, 1, "k", False, 4), r"lda=4 is less than K=8"),
                                       ((7, 40, 1 << 15), r"K=32768 is more than 16384")])
def test_bad_shapes_are_clear_errors(args: tuple, msg: str) -> None:
  with pytest.raises(ValueError, match=msg): x86_bf16.avx512_bf16_matmul_ir(*args)


def test_register_block_from_the_machine_model() -> None:
  """The block from the register file, the dot product's chains and the L2: 32 zmm give 6 x 4 (24 accumulators, 4 B
  loads, one spare) or 5 x 5; a K whose 80-column strip passes half the L2 takes 64 columns; a strip share that
  doesn't split evenly over the threads loses to one that does, row blocks likewise; 16 registers give 4 x 3; too
  small an L2 1 column."""
  assert x86_bf16.register_block(ZEN4, 1024) == (5, 5)
  assert x86_bf16.register_block(ZEN4, 4096) == (6, 4)  # 4096 x 80 x 2 bytes > 512 KB
  assert x86_bf16.register_block(ZEN4, 1024, 1024, 2) == (6, 4)  # 16 strips of 64 over 2 threads; 13 of 80 don't
  # a 32-row prefill chunk: 4-row blocks divide it (5-row ones leave a 2-row pass); 1024 rows keep 5 x 5
  assert x86_bf16.register_block(ZEN4, 768, 2048, 1, 32) == (4, 6)
  assert x86_bf16.plan(ZEN4, 32, 768, 768, 1, 8 << 20) == (4, 6)
  assert x86_bf16.register_block(ZEN4, 1024, 1024, 1, 1024) == (5, 5)
  assert x86_bf16.register_block(dataclasses.replace(ZEN4, l2=256 << 10), 4096) == (30, 1)
  assert x86_bf16.register_block(dataclasses.replace(ZEN4, vector_registers=16), 1024) == (4, 3)
  assert x86_bf16.plan(dataclasses.replace(ZEN4, vector_bytes=32), 64, 64, 64, 2, 8 << 20) is None
  assert x86_bf16.plan(dataclasses.replace(ZEN4, vector_registers=8), 64, 64, 64, 2, 8 << 20) is None
  assert x86_bf16.plan(ZEN4, 64, 64, 4096, 2, 2 << 20) == (6, 4)  # its 512 KB strip: a quarter of a 2 MB stack
  assert x86_bf16.plan(ZEN4, 64, 64, 4096, 2, 1 << 20) is None


def test_split_threads_columns_then_rows() -> None:
  assert x86_bf16.split_threads(1024, 1024, 2, 6, 64) == (1, 2)
  assert x86_bf16.split_threads(4096, 64, 2, 6, 64) == (2, 1)  # one strip: the rows split
  assert x86_bf16.split_threads(4096, 64, 16, 6, 64) == (16, 1)
  assert x86_bf16.split_threads(5, 32, 4, 6, 64) == (1, 1)  # one block of each: one thread


def test_usable_needs_the_flag_the_register_file_and_the_probe(monkeypatch: pytest.MonkeyPatch) -> None:
  monkeypatch.setattr(cpu_probe, "probe", lambda feature: 0)  # as if the child ran it
  monkeypatch.setattr(cpu_probe.platform, "machine", lambda: "x86_64")
  monkeypatch.delenv("TINY_CPU_PROBE", raising=False)
  assert x86_bf16.usable(ZEN4)
  assert not x86_bf16.usable(dataclasses.replace(ZEN4, isa=frozenset({"avx512vl"})))  # not listed: no child
  assert not x86_bf16.usable(dataclasses.replace(ZEN4, vector_bytes=32))
  # where AMX tiles run (a Sapphire Rapids), the shapes their kernel doesn't take keep the float32 GEMM
  assert not x86_bf16.usable(dataclasses.replace(ZEN4, isa=ZEN4.isa | {"amx_tile", "amx_bf16"}))
  monkeypatch.setattr(cpu_probe, "probe", lambda feature: -4 if feature == "amx_bf16" else 0)  # listed, SIGILL
  assert x86_bf16.usable(dataclasses.replace(ZEN4, isa=ZEN4.isa | {"amx_tile", "amx_bf16"}))
  monkeypatch.setattr(cpu_probe, "probe", lambda feature: -4)  # the child died of SIGILL
  assert not x86_bf16.usable(ZEN4)
  monkeypatch.setattr(cpu_probe, "probe", lambda feature: 0)
  monkeypatch.setenv("TINY_CPU_PROBE", "0")
  assert not x86_bf16.usable(ZEN4)


def _dot_ast(m: int, k: int, n: int, cast: bool = False) -> object:
  """The kernel AST of the float32 sum `Tensor.dot` builds for bfloat16 A (m, k) @ B (k, n) in one kernel."""
  from tiny_tensor import Tensor
  from tiny_uop import Ops as TOps
  a, b = Tensor.empty(m, k, dtype="bfloat16"), Tensor.empty(k, n, dtype="bfloat16")
  out = (a.reshape(m, 1, k).float() * b.T.reshape(1, n, k).float()).sum(-1)
  out = (out.cast("bfloat16") if cast else out).contiguous()
  return [c.src[0] for c in out.schedule().calls if c.src[0].op is TOps.SINK][-1]


def test_match_any_size() -> None:
  """The tile kernel's recogniser at any size (`any_size`): the shapes its 32 x 32 blocks don't divide."""
  ast = _dot_ast(30, 33, 40, cast=True)
  assert x86_amx.match_matmul_layout(ast) is None  # type: ignore[arg-type]
  assert x86_amx.match_matmul_layout(ast, any_size=True) == (30, 40, 33, True, 33)  # type: ignore[arg-type]


@pytest.mark.parametrize("probe, tiles, want", [(0, False, "dpbf16ps"), (-4, False, None), (0, True, "tdpbf16ps")])
def test_program_chooses_per_machine(monkeypatch: pytest.MonkeyPatch, probe: int, tiles: bool, want: str | None):
  """On a described Zen 4 (AVX512-BF16, no AMX) `program` compiles the `vdpbf16ps` kernel for `dot`'s AST where the
  probe ran it, the float32 lowering where the probe failed (SIGILL), and the AMX tile kernel first where the tiles
  run. Compiled, not run: any x86-64 host's LLVM writes the instructions."""
  from tiny_codegen import program
  from tiny_codegen.renderer.llvmir import LLVMRenderer
  monkeypatch.setattr(LLVMRenderer, "machine", property(lambda self: ZEN4))
  monkeypatch.setattr(cpu_probe, "probe", lambda feature: probe)
  monkeypatch.setattr(cpu_probe.platform, "machine", lambda: "x86_64")
  monkeypatch.setattr(x86_amx, "request_tile_state", lambda: tiles)
  monkeypatch.delenv("TINY_CPU_PROBE", raising=False)
  ren = LLVMRenderer()
  ren.threads = 2  # type: ignore[attr-defined]
  src = program._to_program(_dot_ast(64, 96, 64), ren, ("test", probe, tiles)).src[3].arg
  if want == "tdpbf16ps": assert "tdpbf16ps" in src
  elif want is None: assert "dpbf16ps" not in src
  else: assert "avx512bf16.dpbf16ps" in src and "tdpbf16ps" not in src


def _run(m: int, n: int, k: int, threads: int, out_bf16: bool, mr: int, nv: int, lda: int | None = None):
  from kernel_runner import load_fn
  rng = np.random.default_rng(m * n + k)
  a = _bf16_bits(rng.standard_normal((m, lda or k)))
  b = np.ascontiguousarray(_bf16_bits(rng.standard_normal((k, n))))
  out = np.full((m, n), 0xFFFF, np.uint16) if out_bf16 else np.full((m, n), np.nan, np.float32)
  src = x86_bf16.avx512_bf16_matmul_ir(m, n, k, threads, name="dp_mm", out_bf16=out_bf16, lda=lda, mr=mr, nv=nv)
  fn = ctypes.CFUNCTYPE(None, *[ctypes.c_void_p] * 3, ctypes.c_int32)(load_fn("dp_mm", LLVMCompiler().compile(src)))
  for core in range(threads): fn(out.ctypes.data, a.ctypes.data, b.ctypes.data, core)
  return _bits_to_f64(a[:, :k]), _bits_to_f64(b), (_bits_to_f64(out) if out_bf16 else out.astype(np.float64))


@pytest.mark.parametrize("m, n, k, threads, mr, nv", [(1, 1, 1, 1, 6, 4), (7, 40, 33, 2, 6, 4), (6, 64, 2, 1, 6, 4),
                                                     (13, 100, 17, 3, 5, 5), (64, 128, 96, 2, 6, 4),
                                                     (30, 17, 5, 4, 6, 4), (100, 300, 257, 2, 6, 4),
                                                     (96, 64, 1024, 2, 14, 2), (37, 48, 160, 2, 8, 3)])
def test_matches_numpy_and_torch(m: int, n: int, k: int, threads: int, mr: int, nv: int) -> None:
  """Odd M, N and K (a remainder micro-kernel, masked columns, an odd k alone), more threads than strips, the blocks
  of several register files; float32 out within the float32 sums' bound of float64 numpy (every element written:
  NaN-filled), bfloat16 out within one bfloat16 step of torch's bfloat16 matmul."""
  if not x86_bf16.usable(host_machine()): pytest.skip("this CPU doesn't run vdpbf16ps (the IR tests above ran)")
  fa, fb, out = _run(m, n, k, threads, False, mr, nv)
  bound = k * 2.0 ** -23 * (np.abs(fa) @ np.abs(fb))
  assert np.all(np.abs(out - fa @ fb) <= bound), float(np.nanmax(np.abs(out - fa @ fb) - bound))
  torch = pytest.importorskip("torch")
  fa, fb, out = _run(m, n, k, threads, True, mr, nv)
  want = (torch.from_numpy(fa.astype(np.float32)).bfloat16() @ torch.from_numpy(fb.astype(np.float32)).bfloat16())
  step = 2.0 ** -7 * want.float().abs().numpy()
  assert np.all(np.abs(out - want.float().numpy()) <= step + 1e-30)


def test_strided_a_rows() -> None:
  """`lda` > K: A's rows read `lda` apart (what `dot` hands over for a shrunk A)."""
  if not x86_bf16.usable(host_machine()): pytest.skip("this CPU doesn't run vdpbf16ps (the IR tests above ran)")
  fa, fb, out = _run(20, 48, 31, 2, False, 6, 4, lda=40)
  assert np.all(np.abs(out - fa @ fb) <= 31 * 2.0 ** -23 * (np.abs(fa) @ np.abs(fb)))
