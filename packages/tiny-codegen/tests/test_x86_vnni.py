"""`tiny_codegen.x86_vnni`: the Q8_0 matvec kernel on `vpdpbusd` against numpy's integer math, the AST it stands in
for (matched exactly), and the gate on the machine model's VNNI flags (a fake machine without them lowers the same
AST as plain int32 math, with the same numbers)."""
from __future__ import annotations

import ctypes
import dataclasses
import platform

import numpy as np
import pytest

from tiny_codegen import cpu_probe, x86_vnni
from tiny_codegen.compiler.llvm import LLVMCompiler
from tiny_codegen.machine import Machine, host_machine

x86_only = pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"), reason="x86-64 machine code")
HOST_FORM = x86_vnni.vnni_form(host_machine().isa) if platform.machine().lower() in ("x86_64", "amd64") else None
needs_vnni = pytest.mark.skipif(HOST_FORM is None, reason="this CPU lists neither AVX512-VNNI (+VL) nor AVX-VNNI")


def _blocks(o: int, nb: int, rng: np.random.Generator) -> np.ndarray:
  """Random Q8_0 blocks (o, nb, 34): a float16 scale, then 32 int8 values over the whole range -128..127."""
  raw = rng.integers(0, 256, (o, nb, 34), dtype=np.uint8)
  raw[:, :, :2] = (rng.random((o, nb, 1)) * 0.1 + 0.01).astype(np.float16).view(np.uint8).reshape(o, nb, 2)
  return np.ascontiguousarray(raw)


def _exact(raw: np.ndarray, xq: np.ndarray, xd: np.ndarray) -> np.ndarray:
  """The matvec in numpy: per block the int64 sum of the int8 products, times both scales, summed in float64."""
  o, nb, _ = raw.shape
  w = raw[:, :, 2:].view(np.int8).astype(np.int64)
  dw = np.ascontiguousarray(raw[:, :, :2]).view(np.float16)[..., 0].astype(np.float64)
  isum = (w * xq.astype(np.int64).reshape(1, nb, 32)).sum(-1)
  return (isum * dw * xd.astype(np.float64).reshape(1, nb)).sum(-1)


def test_vnni_form_from_the_flags(monkeypatch: pytest.MonkeyPatch) -> None:
  assert x86_vnni.vnni_form(frozenset({"avx512_vnni", "avx512vl"}), probe=False) == "avx512_vnni"
  assert x86_vnni.vnni_form(frozenset({"avx512_vnni"}), probe=False) is None  # the 256-bit form needs AVX512VL
  assert x86_vnni.vnni_form(frozenset({"avx_vnni"}), probe=False) == "avx_vnni"
  assert x86_vnni.vnni_form(frozenset({"f16c", "avx512_bf16"}), probe=False) is None
  monkeypatch.setenv("TINY_CPU_PROBE", "0")  # flags alone never count: the probe must have run the instruction
  assert x86_vnni.vnni_form(frozenset({"avx512_vnni", "avx512vl", "avx_vnni"})) is None
  monkeypatch.setattr(cpu_probe, "probe", lambda feature: -4)  # SIGILL in the child (a hypervisor that hides it)
  monkeypatch.delenv("TINY_CPU_PROBE")
  assert x86_vnni.vnni_form(frozenset({"avx512_vnni", "avx512vl", "avx_vnni"})) is None


@pytest.mark.parametrize("form, features", [("avx512_vnni", "+avx512vnni,+avx512vl"), ("avx_vnni", "+avxvnni")])
def test_ir_calls_vpdpbusd(form: str, features: str) -> None:
  src = x86_vnni.q8_0_matvec_ir(8, 3, threads=2, form=form)
  assert src.count("@llvm.x86.avx512.vpdpbusd.256(") == 1 + x86_vnni.ROWS  # the declaration, one call per row
  assert f'"target-features"="{features}"' in src


@pytest.mark.parametrize("kind, o, nb, threads, rows", [("q8_0", 8, 3, 2, 4), ("q8_0", 6, 24, 3, 2),
                                                        ("q8_0", 5, 7, 1, 1), ("q4_k", 12, 3, 1, 4),
                                                        ("q4_k", 6, 2, 3, 2)])
def test_ir_prefetches_ahead_when_asked(kind: str, o: int, nb: int, threads: int, rows: int) -> None:
  """With `ahead` > 0 each row's weight bytes are prefetched that far on, every line of a block (Q8_0's 34 bytes: 1
  line asked per block; Q4_K's 144: 3); by default (`ahead` 0, what `tiny_codegen.program` runs: a thread's rows are
  one stream the hardware prefetchers follow, `x86_vnni.ROWS`) none. `rows` rows a K loop: one vpdpbusd call each
  (Q4_K: one vpdpwssd per sub-block, its scale applied in int32)."""
  import re
  ir = x86_vnni.q8_0_matvec_ir if kind == "q8_0" else x86_vnni.q4_k_matvec_ir
  lines = 1 if kind == "q8_0" else 3
  src = ir(o, nb, threads, rows=rows, ahead=4096)
  got = sorted(int(m) for m in re.findall(r"getelementptr i8, ptr %wp0, i64 (\d+)", src))
  assert got == [4096 + 64 * i for i in range(lines)], got
  assert src.count("call void @llvm.prefetch.p0(") == rows * lines
  if kind == "q8_0": assert src.count("@llvm.x86.avx512.vpdpbusd.256(") == 1 + rows
  else: assert src.count("@llvm.x86.avx512.vpdpwssd.256(") == 1 + rows * 8  # a sub-block's scale: one each
  default = ir(o, nb, threads)
  assert "call void @llvm.prefetch.p0(" not in default and "%wp1 " not in default  # one row, no prefetch


@pytest.mark.parametrize("args, msg", [((6, 2, 4), r"O=6 rows must split evenly over threads=4"),
                                       ((0, 2, 1), r"O must be a positive int, got 0"),
                                       ((8, 2, 1.0), r"threads must be a positive int, got 1.0")])
def test_bad_shapes_are_clear_errors(args: tuple, msg: str) -> None:
  with pytest.raises(ValueError, match=msg): x86_vnni.q8_0_matvec_ir(*args)
  with pytest.raises(ValueError, match=r"form 'sse' is not one of"): x86_vnni.q8_0_matvec_ir(8, 2, form="sse")


@x86_only
@needs_vnni
@pytest.mark.parametrize("o, nb, threads, rows", [(8, 1, 1, 1), (12, 5, 2, 1), (6, 24, 3, 2), (256, 64, 2, 1),
                                                 (256, 64, 2, 4)])
def test_kernel_matches_numpy_int_math(o: int, nb: int, threads: int, rows: int) -> None:
  from kernel_runner import load_fn
  rng = np.random.default_rng(o * 100 + nb)
  raw = _blocks(o, nb, rng)
  xq = rng.integers(-128, 128, nb * 32, dtype=np.int8)  # -128 too: the kernel's u8 offset must not overflow
  xd = rng.random(nb).astype(np.float32)
  out = np.full(o, np.nan, np.float32)
  compiler = LLVMCompiler()
  src = x86_vnni.q8_0_matvec_ir(o, nb, threads, name="q8mv", form=HOST_FORM, rows=rows)
  assert "vpdpbusd" in compiler.target_machine.emit_assembly(compiler._optimize(src))
  fn = ctypes.CFUNCTYPE(None, *[ctypes.c_void_p] * 4, ctypes.c_int32)(load_fn("q8mv", compiler.compile(src)))
  for core in range(threads): fn(out.ctypes.data, raw.ctypes.data, xq.ctypes.data, xd.ctypes.data, core)
  exact = _exact(raw, xq, xd)
  # the int32 block sums are exact; the error is float32's: the scales' product, the lanes' FMAs and the final sum
  dw = np.ascontiguousarray(raw[:, :, :2]).view(np.float16)[..., 0].astype(np.float64)
  bound = (nb + 12) * 2.0 ** -23 * (np.abs(dw) * xd.reshape(1, nb) * 127 * 128 * 32).sum(-1)
  assert np.all(np.abs(out - exact) <= bound), float(np.max(np.abs(out - exact) - bound))


def _matvec_ast(o: int, nb: int, scale_first: bool = False) -> object:
  """The kernel AST of `tiny_tensor.llm.quants.q8_0_matvec` (o rows, nb blocks); `scale_first`: the two scales
  multiplied before the products (another graph, which the kernel must not take)."""
  from tiny_tensor import Tensor
  from tiny_tensor.llm.quants import q8_0_matvec
  from tiny_uop import Ops as TOps
  raw, xq, xd = Tensor.empty(o * nb, 34, dtype="uint8"), Tensor.empty(nb * 32, dtype="int8"), Tensor.empty(nb)
  if scale_first:
    w = raw.reshape(o, nb, 34)
    dw = w[:, :, 0:2].contiguous().bitcast("float16").float()  # (o, nb, 1)
    p = (w[:, :, 2:].bitcast("int8").cast("int32") * xq.reshape(1, nb, 32).cast("int32")).float()
    out = (p * (dw * xd.reshape(1, nb, 1))).sum((1, 2)).contiguous()
  else: out = q8_0_matvec(raw.realize(), xq.realize(), xd.realize(), o)
  return [c.src[0] for c in out.schedule().calls if c.src[0].op is TOps.SINK][-1]


@pytest.mark.parametrize("o, nb", [(256, 24), (768, 64), (2048, 24)])
def test_match_is_exact(o: int, nb: int) -> None:
  assert x86_vnni.match_q8_0_matvec(_matvec_ast(o, nb)) == (o, nb)  # type: ignore[arg-type]
  assert x86_vnni.match_q8_0_matvec(_matvec_ast(o, nb, scale_first=True)) is None  # type: ignore[arg-type]


def _renderer_on(isa: frozenset[str]) -> object:
  """An LLVM CPU renderer whose machine model lists exactly the flags `isa` (a fake machine)."""
  from tiny_codegen.renderer.llvmir import LLVMRenderer
  fake: Machine = dataclasses.replace(host_machine(), isa=isa)

  class FakeMachineLLVM(LLVMRenderer):
    @property
    def machine(self) -> Machine: return fake
  return FakeMachineLLVM()


@x86_only
@pytest.mark.parametrize("isa, vnni", [(frozenset({"avx512_vnni", "avx512vl"}), True),
                                       (frozenset({"avx_vnni"}), True), (frozenset({"f16c"}), False)])
def test_program_uses_vnni_only_where_the_machine_has_it(isa: frozenset[str], vnni: bool) -> None:
  from tiny_codegen.program import to_program
  if vnni and x86_vnni.vnni_form(isa) is None: pytest.skip(f"this CPU doesn't run {sorted(isa)}'s vpdpbusd")
  prg = to_program(_matvec_ast(16, 3), _renderer_on(isa))  # type: ignore[arg-type]
  src = prg.src[3].arg
  assert ("@llvm.x86.avx512.vpdpbusd.256(" in src) == vnni


@x86_only
@pytest.mark.parametrize("o, nb, vnni", [(40, 7, False), (44, 7, True)])
def test_tensor_numbers_match_numpy(o: int, nb: int, vnni: bool, monkeypatch: pytest.MonkeyPatch) -> None:
  """`q8_0_matvec` on the CPU: with VNNI (where the host has it) the kernel above, without (the machine's flags
  hidden) the same AST lowered as usual, plain int32 products and float32 sums: the same numbers either way."""
  if vnni and HOST_FORM is None: pytest.skip("this CPU lists neither AVX512-VNNI (+VL) nor AVX-VNNI")
  if not vnni: monkeypatch.setattr(x86_vnni, "vnni_form", lambda isa: None)
  from tiny_tensor import Tensor
  from tiny_tensor.llm.quants import q8_0_matvec
  rng = np.random.default_rng(3)
  raw, xq, xd = _blocks(o, nb, rng), rng.integers(-128, 128, nb * 32, dtype=np.int8), rng.random(nb).astype(np.float32)
  got = q8_0_matvec(Tensor(raw.reshape(o * nb, 34)), Tensor(xq), Tensor(xd), o).numpy()
  exact = _exact(raw, xq, xd)
  np.testing.assert_allclose(got, exact, rtol=1e-5, atol=1e-5 * float(np.abs(exact).max()))


@x86_only
@needs_vnni
@pytest.mark.parametrize("o, ns, threads, rows", [(4, 1, 1, 1), (12, 3, 2, 1), (6, 2, 3, 1), (12, 3, 2, 4),
                                                 (8, 2, 1, 2)])
def test_q4_k_kernel_matches_gguf_dequantize(o: int, ns: int, threads: int, rows: int) -> None:
  """The Q4_K kernel against the `gguf` package's dequantized weight times the int8 activations with one scale per
  super-block (float64): the sub-block scales and mins applied in int32 are exact, so float32 rounding only."""
  import gguf
  from kernel_runner import load_fn
  from tiny_tensor.llm.gguf import GGMLType, quantize
  rng = np.random.default_rng(o + ns)
  raw = np.frombuffer(quantize(rng.standard_normal((o, ns * 256)).astype(np.float32), GGMLType.Q4_K), np.uint8).copy()
  w = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType.Q4_K).reshape(o, ns * 256).astype(np.float64)
  # -127..127: what `quantize_q8_act` makes (vpmaddubsw's int16 pair sums hold 2 * 15 * 128 as well)
  xq, xd = rng.integers(-127, 128, ns * 256, dtype=np.int8), rng.random(ns).astype(np.float32)
  want = w @ (xq.astype(np.float64) * np.repeat(xd.astype(np.float64), 256))
  compiler = LLVMCompiler()
  order = ("xq", "out", "xd", "raw")  # the pointer arguments in the kernel AST's PARAM order, whatever it is
  src = x86_vnni.q4_k_matvec_ir(o, ns, threads, name="q4mv", form=HOST_FORM, order=order, rows=rows, ahead=128 * rows)
  fn = ctypes.CFUNCTYPE(None, *[ctypes.c_void_p] * 4, ctypes.c_int32)(load_fn("q4mv", compiler.compile(src)))
  out = np.full(o, np.nan, np.float32)
  ptrs = {"out": out.ctypes.data, "raw": raw.ctypes.data, "xq": xq.ctypes.data, "xd": xd.ctypes.data}
  for core in range(threads): fn(*[ptrs[a] for a in order], core)
  np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5 * float(np.abs(want).max()))


def test_register_kernel_errors_and_lookup() -> None:
  ast = _matvec_ast(8, 2)
  with pytest.raises(ValueError, match=r"kind 'q5_k' is not one of \('q4_k',\)"):
    x86_vnni.register_kernel(ast, "q5_k", 8, 1, ("out", "raw", "xq", "xd"))  # type: ignore[arg-type]
  with pytest.raises(ValueError, match=r"needs a kernel AST \(SINK\), got Ops.STORE"):
    x86_vnni.register_kernel(ast.src[0], "q4_k", 8, 1, ("out", "raw", "xq", "xd"))  # type: ignore[attr-defined]
  with pytest.raises(ValueError, match=r"order \('out', 'raw', 'xq', 'xq'\) must name out, raw, xq and xd"):
    x86_vnni.q4_k_matvec_ir(4, 1, order=("out", "raw", "xq", "xq"))


@x86_only
@pytest.mark.parametrize("isa, vnni", [(frozenset({"avx_vnni"}), True), (frozenset({"f16c"}), False)])
def test_registered_q4_k_runs_where_the_machine_has_vnni(isa: frozenset[str], vnni: bool) -> None:
  """`tiny_tensor.llm.quants.q4_k_matvec` registers its kernel AST; a VNNI machine's program is the Q4_K kernel."""
  if vnni and x86_vnni.vnni_form(isa) is None: pytest.skip(f"this CPU doesn't run {sorted(isa)}'s vpdpbusd")
  from tiny_tensor import Tensor
  from tiny_tensor.llm.quants import q4_k_matvec
  from tiny_codegen.program import to_program
  from tiny_uop import Ops as TOps
  out = q4_k_matvec(Tensor.empty(8 * 2, 144, dtype="uint8").realize(), Tensor.empty(512, dtype="int8").realize(),
                    Tensor.empty(2).realize(), 8)
  assert out is not None
  ast = [c.src[0] for c in out.schedule().calls if c.src[0].op is TOps.SINK][-1]
  assert x86_vnni.registered_kernel(ast) is not None and x86_vnni.registered_kernel(ast)[:3] == ("q4_k", 8, 2)
  src = to_program(ast, _renderer_on(isa)).src[3].arg  # type: ignore[arg-type]
  assert ("@llvm.x86.avx512.vpdpwssd.256(" in src) == vnni
