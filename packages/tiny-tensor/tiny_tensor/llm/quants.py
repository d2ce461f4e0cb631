"""GGML block formats decoded with Tensor ops: the raw blocks of a quantized weight stay on the device (a uint8 Tensor
of shape (blocks, bytes per block)) and `dequantize` builds the graph that turns them into floats. Used lazily inside
a matmul, the decoding fuses into the kernel that reads the weight, so a quantized model moves only its quantized
bytes. Bit fields are unpacked with shifts and `where` whose per-position amounts come from the index (`arange`),
never by concatenating pieces: fused into the matvec, a `cat` gates every load of the kernel (see `_halves`).

The layouts are the ones `tiny_tensor.llm.gguf` documents (and checks, in numpy, against the `gguf` package).

The one-token matvecs (`q8_0_matvec`, `q4_k_matvec` over int8 activations, `f32_matvec` for float32 weights) are
graphs whose kernels `tiny_codegen` runs as hand-written LLVM IR where the CPU takes it (`x86_vnni`, `matvec_ir`),
lowered as usual elsewhere.

>>> import numpy as np
>>> from tiny_tensor import Tensor
>>> from tiny_tensor.llm.gguf import GGMLType, quantize
>>> raw = np.frombuffer(quantize(np.arange(32, dtype=np.float32), GGMLType.Q8_0), np.uint8).reshape(1, 34)
>>> [round(v) for v in dequantize(Tensor(raw), GGMLType.Q8_0).tolist()[:4]]
[0, 1, 2, 3]
"""
from __future__ import annotations

import functools
from typing import Any

from tiny_uop.dtype import dtypes
from tiny_uop.uop import sint
from tiny_tensor.llm.gguf import BLOCK, GGMLType
from tiny_tensor.tensor import Tensor

__all__ = ["dequantize", "SUPPORTED", "quantize_q8_act", "q8_0_matvec", "q4_k_matvec", "int8_dot_products",
           "f32_matvec"]


def _cols(raw: Tensor, a: sint, b: sint) -> Tensor:
  """Bytes a..b-1 of every block."""
  return raw.shrink((None, (a, b)))


def _f16(raw: Tensor, a: int) -> Tensor:
  """The little-endian float16 at byte a of every block, as a float32 column (nb, 1)."""
  lo, hi = _cols(raw, a, a + 1).cast(dtypes.uint16), _cols(raw, a + 1, a + 2).cast(dtypes.uint16)
  return (lo | (hi << 8)).bitcast(dtypes.float16).cast(dtypes.float32)


def _u32(raw: Tensor, a: int) -> Tensor:
  """The little-endian uint32 at byte a of every block, as a (nb, 1) uint32 column."""
  parts = [_cols(raw, a + i, a + i + 1).cast(dtypes.uint32) << (8 * i) for i in range(4)]
  return parts[0] | parts[1] | parts[2] | parts[3]


def _halves(qs: Tensor, dim: int) -> Tensor:
  """The low and the high nibbles of the bytes `qs`, along a new axis of size 2 inserted at `dim` (low first).

  A shift by a per-half amount (0 or 4, from the index), not `(qs & 15).cat(qs >> 4)`: fused into a matmul, a
  concatenation makes every load of the kernel a gated one (which half is this element in?), and the matvec over a
  Q4_K weight ran 3x slower than with the shift."""
  shape = [1] * (qs.ndim + 1)
  shape[dim] = 2
  shift = (Tensor.arange(2, device=qs.device) * 4).cast(qs.dtype).reshape(*shape)
  return (qs.unsqueeze(dim) >> shift) & 15


def _nibbles(qs: Tensor) -> Tensor:
  """(nb, 16) bytes -> (nb, 32) values: low nibbles are elements 0..15, high nibbles 16..31."""
  return _halves(qs, 1).reshape(qs.shape[0], 32)


def _legacy(raw: Tensor, t: GGMLType) -> Tensor:
  """Q4_0, Q4_1, Q5_0, Q5_1: blocks of 32 with one scale (and a min for the _1 types)."""
  has_m, five = t in (GGMLType.Q4_1, GGMLType.Q5_1), t in (GGMLType.Q5_0, GGMLType.Q5_1)
  off = 4 if has_m else 2
  d = _f16(raw, 0)
  q = _nibbles(_cols(raw, off + 4 * five, off + 4 * five + 16)).cast(dtypes.uint32)
  if five:  # bit j of qh is the 5th bit of element j
    bit = Tensor.arange(32, device=raw.device, dtype=dtypes.uint32).reshape(1, 32)
    q = q | (((_u32(raw, off) >> bit) & 1) << 4)
  qf = q.cast(dtypes.float32)
  if has_m: return d * qf + _f16(raw, 2)
  return d * (qf - (16 if five else 8))


def _scale_min_k4(s: Tensor) -> tuple[Tensor, Tensor]:
  """(nb, 12) bytes -> eight 6-bit scales and mins, (nb, 8) each (ggml-quants.c get_scale_min_k4). Scales 0..3 are
  the low 6 bits of bytes 0..3 (mins: 4..7); scales 4..7 take their low 4 bits from bytes 8..11 and their high 2
  from the top of bytes 0..3 (mins: the high nibbles of 8..11, the tops of 4..7). Both halves are computed from the
  same three 4-byte groups and picked per half with `where`, not concatenated: a concatenation gates every load of
  the kernel it fuses into by which half the element is in."""
  nb = s.shape[0]
  s0, s1, s2 = (_cols(s, a, a + 4).reshape(nb, 1, 4) for a in (0, 4, 8))
  first = Tensor.arange(2, device=s.device).reshape(1, 2, 1) == 0   # (1, 2, 1): scales 0..3, else 4..7
  sc = first.where(s0 & 63, (s2 & 15) | ((s0 >> 6) << 4)).reshape(nb, 8)
  mn = first.where(s1 & 63, (s2 >> 4) | ((s1 >> 6) << 4)).reshape(nb, 8)
  return sc.cast(dtypes.float32), mn.cast(dtypes.float32)


def _k4(raw: Tensor, t: GGMLType) -> Tensor:
  """Q4_K and Q5_K: super-blocks of 256 = 8 sub-blocks of 32, each with a 6-bit scale and min."""
  nb = raw.shape[0]
  d, dmin = _f16(raw, 0), _f16(raw, 2)
  sc, mn = _scale_min_k4(_cols(raw, 4, 16))
  qs = _cols(raw, raw.shape[1] - 128, raw.shape[1])
  q = _halves(qs.reshape(nb, 4, 32), 2).reshape(nb, 8, 32)  # chunk c: sub-block 2c low nibbles, 2c+1 high
  if t == GGMLType.Q5_K:
    qh = _cols(raw, 16, 48).reshape(nb, 1, 32)
    bit = Tensor.arange(8, device=raw.device, dtype=dtypes.uint8).reshape(1, 8, 1)
    q = q | (((qh >> bit) & 1) << 4)
  return ((d * sc).reshape(nb, 8, 1) * q.cast(dtypes.float32) - (dmin * mn).reshape(nb, 8, 1)).reshape(nb, 256)


def _q6_k(raw: Tensor) -> Tensor:
  """Q6_K: 256 = 16 sub-blocks of 16 with int8 scales; 4 low bits in ql, 2 high bits in qh."""
  nb = raw.shape[0]
  ql, qh = _cols(raw, 0, 128).reshape(nb, 2, 64), _cols(raw, 128, 192).reshape(nb, 2, 1, 32)
  lo = _halves(ql, 2).reshape(nb, 2, 4, 32)  # quarters: ql[:32]&15, ql[32:]&15, ql[:32]>>4, ql[32:]>>4
  shift = (Tensor.arange(4, device=raw.device) * 2).cast(dtypes.uint8).reshape(1, 1, 4, 1)  # from the index
  hi = (qh >> shift) & 3                                     # (nb, 2, 4, 32)
  q = (lo | (hi << 4)).cast(dtypes.float32) - 32
  sc = _cols(raw, 192, 208).bitcast(dtypes.int8).cast(dtypes.float32).reshape(nb, 2, 4, 2, 1)
  sc = sc.expand(nb, 2, 4, 2, 16).reshape(nb, 2, 4, 32)     # quarter k, element l: scale 2k + l//16
  return (_f16(raw, 208).reshape(nb, 1, 1, 1) * sc * q).reshape(nb, 256)


SUPPORTED = (GGMLType.F32, GGMLType.F16, GGMLType.BF16, GGMLType.Q8_0, GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.Q5_0,
             GGMLType.Q5_1, GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K)


def dequantize(raw: Tensor, t: GGMLType | int, shape: Any = None) -> Tensor:
  """float32 values of the GGML blocks in `raw` (uint8, (blocks, bytes per block) or flat), lazily: a graph of
  Tensor ops that fuses into whatever consumes it. `shape` (default: flat) reshapes the result."""
  t = GGMLType(t)
  if t not in SUPPORTED: raise ValueError(f"dequantize: ggml type {t.name} is not supported; supported: "
                                          + ", ".join(x.name for x in SUPPORTED))
  if raw.dtype != dtypes.uint8: raise TypeError(f"dequantize needs the raw bytes as a uint8 Tensor, got {raw.dtype}")
  be, bb = BLOCK[t]
  if raw.ndim != 2 or raw.shape[1] != bb:
    if raw.numel() % bb: raise ValueError(f"{raw.numel()} bytes are not whole {t.name} blocks of {bb} bytes")
    raw = raw.reshape(-1, bb)
  if t == GGMLType.F32: out = _u32(raw.reshape(-1, 4), 0).bitcast(dtypes.float32)
  elif t == GGMLType.F16: out = _f16(raw.reshape(-1, 2), 0)
  elif t == GGMLType.BF16:
    r2 = raw.reshape(-1, 2)
    bits = (_cols(r2, 0, 1).cast(dtypes.uint32) << 16) | (_cols(r2, 1, 2).cast(dtypes.uint32) << 24)
    out = bits.bitcast(dtypes.float32)
  elif t == GGMLType.Q8_0: out = _f16(raw, 0) * _cols(raw, 2, 34).bitcast(dtypes.int8).cast(dtypes.float32)
  elif t in (GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.Q5_0, GGMLType.Q5_1): out = _legacy(raw, t)
  elif t in (GGMLType.Q4_K, GGMLType.Q5_K): out = _k4(raw, t)
  else: out = _q6_k(raw)
  return out.reshape(-1) if shape is None else out.reshape(shape)


def quantize_q8_act(x: Tensor, block: int = 32) -> tuple[Tensor, Tensor]:
  """Activations x (K,) float32 (K a multiple of `block`) -> (int8 values (K,), float32 scales (K/block,)), as
  llama.cpp quantizes what it multiplies with a quantized weight: per block, scale d = max|x| / 127, values
  round(x / d) (0 where d is 0). `block` 32: `quantize_row_q8_0` (for Q8_0 weights); 256: one scale per Q4_K
  super-block, as its Q8_K activations (llama.cpp's rounds with -127 / the signed max, the same values but where the
  max is negative: its -127 here too). Both are realized buffers (`.contiguous()`), so every weight that reads the
  same x shares them."""
  if block not in (32, 256): raise ValueError(f"quantize_q8_act: block {block}; valid: 32 (Q8_0) or 256 (Q8_K)")
  if x.ndim != 1 or x.shape[0] % block:
    raise ValueError(f"quantize_q8_act needs a (K,) vector with K a multiple of {block}, got shape {x.shape}")
  xb = x.float().reshape(-1, block)
  d = (xb.abs().max(-1) / 127).contiguous()  # (K/block,): realized by the reduce's kernel, read by the values' kernel
  dc = d.reshape(-1, 1)
  q = (dc > 0).where(xb / dc, 0).round().clip(-127, 127).cast(dtypes.int8)
  return q.reshape(-1).contiguous(), d


def q8_0_matvec(raw: Tensor, xq: Tensor, xd: Tensor, rows: int) -> Tensor:
  """W @ x for a Q8_0 weight W (rows, K) as raw blocks (uint8, rows * K/32 blocks of 34 bytes) and activations
  quantized by `quantize_q8_act`: per block, the exact int32 sum of the int8 products times both scales, summed in
  float32. The kernel this schedules is `tiny_codegen.x86_vnni.q8_0_matvec_ast`'s form: on an LLVM CPU with VNNI it
  runs as `vpdpbusd`, elsewhere as plain int32 math. Returns (rows,) float32, realized apart (`.contiguous()`) so the
  kernel keeps that form."""
  nb = xd.shape[0]
  if raw.dtype != dtypes.uint8 or raw.numel() != rows * nb * 34 or xq.shape != (nb * 32,):
    raise ValueError(f"q8_0_matvec: raw {raw.dtype} {raw.shape}, xq {xq.shape}, xd {xd.shape} are not {rows} rows "
                     f"of {nb} Q8_0 blocks (uint8, {rows * nb * 34} bytes) and int8 ({nb * 32},) activations")
  w = raw.reshape(rows, nb, 34)
  dw = (_cols(w.reshape(-1, 34), 0, 1).cast(dtypes.uint16) | (_cols(w.reshape(-1, 34), 1, 2).cast(dtypes.uint16)
                                                              << 8)).bitcast(dtypes.float16).cast(dtypes.float32)
  wq = w[:, :, 2:34].bitcast(dtypes.int8).cast(dtypes.int32)
  # one REDUCE over (blocks, 32): nested (an int32 sum per block, then the blocks), the scheduler gives the block sums
  # their own kernel where there are fewer than 1024 rows (schedule.REDUCE_SPLIT_OUTPUTS)
  prod = (wq * xq.reshape(1, nb, 32).cast(dtypes.int32)).cast(dtypes.float32)  # exact: |product| <= 127 * 128
  # the weight's scale and the activation's apart: their product, (rows, nb) from two buffers, would be realized
  # on its own for big weights (the scheduler's window rule)
  return (prod * dw.reshape(rows, nb, 1) * xd.reshape(1, nb, 1)).sum((-2, -1)).contiguous()


def int8_dot_products(device: Any) -> bool:
  """Whether `q8_0_matvec` on `device` runs as `vpdpbusd` (`tiny_codegen.x86_vnni`): the CPU device with the LLVM
  renderer on a machine whose model lists AVX512-VNNI (with AVX512VL) or AVX-VNNI. Elsewhere its int32 graph lowers
  as plain math, several times slower than decoding the weight to float32, so callers keep the float path there."""
  if device != "CPU": return False
  from tiny_codegen import x86_vnni
  from tiny_codegen.machine import machine_of
  from tiny_codegen.renderer.llvmir import LLVMRenderer
  from tiny_uop.plugins import Device
  r = Device["CPU"].renderer
  return isinstance(r, LLVMRenderer) and x86_vnni.vnni_form(machine_of(r).isa) is not None


def _q4_k_graph(raw: Tensor, xq: Tensor, xd: Tensor, rows: int) -> Tensor:
  """The Q4_K matvec over int8 activations with one scale per super-block as one float32 reduce: the weight decoded
  as `dequantize` does, times xq * xd."""
  ns = xd.shape[0]
  w = dequantize(raw, GGMLType.Q4_K, (rows, ns * 256))
  xf = (xq.reshape(ns, 256).cast(dtypes.float32) * xd.reshape(ns, 1)).reshape(1, ns * 256)
  return (w * xf).sum(-1).contiguous()


@functools.cache
def _register_q4_k(rows: int, ns: int, device: str) -> bool:
  """Schedule `_q4_k_graph` of this shape over placeholder buffers once and register its kernel AST with
  `tiny_codegen.x86_vnni` (which PARAM is which buffer, from the call's buffers), so the VNNI kernel runs for it.
  False where the scheduler makes more than one kernel of it (then callers keep the float32 path)."""
  from tiny_codegen import x86_vnni
  from tiny_uop.uop import Ops
  ph = {"raw": Tensor.empty(rows * ns, 144, dtype=dtypes.uint8, device=device),
        "xq": Tensor.empty(ns * 256, dtype=dtypes.int8, device=device), "xd": Tensor.empty(ns, device=device)}
  calls = [c for c in _q4_k_graph(ph["raw"], ph["xq"], ph["xd"], rows).schedule().calls if c.src[0].op is Ops.SINK]
  if len(calls) != 1 or len(calls[0].src) != 5: return False
  bufs = {u: name for name, t in ph.items() for u in t.uop.toposort() if u.op is Ops.BUFFER}
  order = tuple(bufs.get(b, "out") for b in calls[0].src[1:])
  if sorted(order) != ["out", "raw", "xd", "xq"]: return False
  x86_vnni.register_kernel(calls[0].src[0], "q4_k", rows, ns, order)
  return True


def q4_k_matvec(raw: Tensor, xq: Tensor, xd: Tensor, rows: int) -> Tensor | None:
  """W @ x for a Q4_K weight W (rows, K) as raw blocks (uint8, rows * K/256 super-blocks of 144 bytes) and
  activations quantized by `quantize_q8_act(x, 256)` (one scale per super-block, llama.cpp's Q8_K), as one float32
  reduce of the decoded weight times xq * xd; on an LLVM CPU with VNNI its kernel runs as
  `tiny_codegen.x86_vnni.q4_k_matvec_ir` (nibbles times int8 and the 6-bit sub-block scales and mins applied in
  int32, two float32 FMAs a super-block). None where that kernel can't be registered for this shape (then use the
  float32 path)."""
  ns = xd.shape[0]
  if raw.dtype != dtypes.uint8 or raw.numel() != rows * ns * 144 or xq.shape != (ns * 256,):
    raise ValueError(f"q4_k_matvec: raw {raw.dtype} {raw.shape}, xq {xq.shape}, xd {xd.shape} are not {rows} rows "
                     f"of {ns} Q4_K super-blocks (uint8, 144 bytes each) and int8 ({ns * 256},) activations")
  if not _register_q4_k(rows, ns, str(raw.device)): return None
  return _q4_k_graph(raw.reshape(-1, 144), xq, xd, rows)


def _f32_graph(w: Tensor, x: Tensor) -> Tensor:
  """W @ x for a float32 W (O, K) and x (K,): one reduce over K, its result a buffer of its own."""
  return (w * x.reshape(1, x.shape[0])).sum(-1).contiguous()


@functools.cache
def _register_f32(rows: int, k: int, device: str) -> bool:
  """Schedule `_f32_graph` of this shape over placeholder buffers once and register its kernel AST with
  `tiny_codegen.matvec_ir`, so its prefetching kernel runs for it on the LLVM CPU renderer: True when registered.
  False off the LLVM CPU, for a K its vectors don't divide, or where the scheduler makes more than one kernel of it
  (then callers keep `x @ W.T`)."""
  if device != "CPU": return False
  from tiny_codegen import matvec_ir
  from tiny_codegen.renderer.llvmir import LLVMRenderer
  from tiny_uop.plugins import Device
  from tiny_uop.uop import Ops
  r = Device["CPU"].renderer
  if not isinstance(r, LLVMRenderer) or not matvec_ir.fits(rows, k, r.vector_registers[1] // 4): return False
  ph = {"w": Tensor.empty(rows, k, device=device), "x": Tensor.empty(k, device=device)}
  calls = [c for c in _f32_graph(ph["w"], ph["x"]).schedule().calls if c.src[0].op is Ops.SINK]
  if len(calls) != 1 or len(calls[0].src) != 4: return False
  bufs = {u: name for name, t in ph.items() for u in t.uop.toposort() if u.op is Ops.BUFFER}
  order = tuple(bufs.get(b, "out") for b in calls[0].src[1:])
  if sorted(order) != ["out", "w", "x"]: return False
  matvec_ir.register_kernel(calls[0].src[0], rows, k, order)
  return True


def f32_matvec(w: Tensor, x: Tensor) -> Tensor | None:
  """W @ x for a float32 weight W (O, K) and one token's activations x (K,) (a lazy graph is fine: it is written to a
  buffer first), as a kernel of its own that `tiny_codegen.matvec_ir` runs on the LLVM CPU (its weight rows
  prefetched: a decode step streams every weight from L3 or memory); None where that kernel isn't registered for this
  shape and device (then use `x @ W.T`).

  >>> w, x = Tensor([[1.0, 2.0], [3.0, 4.0]]), Tensor([1.0, 1.0])
  >>> y = f32_matvec(w, x)
  >>> y is None or y.tolist() == [3.0, 7.0]
  True
  """
  if w.ndim != 2 or x.shape != (w.shape[1],) or w.dtype != dtypes.float32 or x.dtype != dtypes.float32:
    raise ValueError(f"f32_matvec: w {w.dtype} {w.shape} and x {x.dtype} {x.shape} are not a float32 (O, K) weight "
                     "and its (K,) activations")
  o, k = (int(d) for d in w.shape)
  if not isinstance(w.device, str) or not _register_f32(o, k, w.device): return None
  return _f32_graph(w, x.contiguous())
