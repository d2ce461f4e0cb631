"""GGUF files for the LLM: a reader that keeps quantized tensors as their raw GGML blocks, a writer, and numpy
codecs (quantize / reference dequantize) of the GGML block formats.

`nn.state.gguf_load` dequantizes everything into float32 on the host; an LLM wants the opposite: the weights stay in
their blocks (a uint8 Tensor per weight) and `tiny_tensor.llm.quants` turns blocks into floats with Tensor ops, in the
kernels that use them.

>>> import io, numpy as np
>>> buf = io.BytesIO()
>>> write_gguf(buf, {"general.architecture": "llama"}, {"w": np.ones((2, 32), np.float32)}, {"w": GGMLType.Q8_0})
>>> kv, ts = read_gguf(buf.getvalue())
>>> kv["general.architecture"], ts["w"].shape, ts["w"].ggml_type.name
('llama', (2, 32), 'Q8_0')

Block layouts (element order within a block, bytes in order; `d`, `dmin` are float16):
- Q8_0 (32 elements, 34 bytes): d, 32 x int8 q; x = d*q.
- Q4_0 (32, 18): d, 16 bytes; element j < 16 is the low nibble of byte j, j >= 16 the high nibble of byte j-16;
  x = d*(q-8).
- Q4_1 (32, 20): d, m, 16 bytes as Q4_0; x = d*q + m.
- Q5_0 (32, 22): d, qh (uint32: bit j is the 5th bit of element j), 16 bytes as Q4_0; x = d*(q-16).
- Q5_1 (32, 24): d, m, qh, 16 bytes; x = d*q + m.
- Q4_K (256, 144): d, dmin, 12 bytes of eight 6-bit (scale, min) pairs, 128 bytes; chunk c (64 elements) takes bytes
  32c..32c+31, low nibbles for sub-block 2c, high nibbles for 2c+1; x = d*scale*q - dmin*min.
- Q5_K (256, 176): d, dmin, 12 scale bytes, qh (32 bytes), 128 bytes as Q4_K; element l of sub-block s adds
  16 * bit s of qh[l].
- Q6_K (256, 210): ql (128), qh (64), 16 int8 scales, d. Half h (128 elements) takes ql[64h..], qh[32h..]; for l < 32
  the four quarters get low/high nibbles of ql[l], ql[l+32] and bit pairs 0-1, 2-3, 4-5, 6-7 of qh[l];
  x = d*scale*(q-32)
  with scale index 8h + l//16 + 2*quarter.
(ggml's ggml-common.h / ggml-quants.c are where these layouts are defined; tests check ours against the `gguf`
package's independent numpy implementation.)
"""
from __future__ import annotations

import enum
import io
import os
import struct
from dataclasses import dataclass
from typing import Any, BinaryIO

import numpy as np

__all__ = ["GGMLType", "GGUFTensor", "read_gguf", "write_gguf", "quantize", "dequantize", "BLOCK"]


class GGMLType(enum.IntEnum):
  """ggml tensor types (the numbers GGUF files store; ggml.h `enum ggml_type`)."""
  F32 = 0
  F16 = 1
  Q4_0 = 2
  Q4_1 = 3
  Q5_0 = 6
  Q5_1 = 7
  Q8_0 = 8
  Q4_K = 12
  Q5_K = 13
  Q6_K = 14
  BF16 = 30


# type -> (elements per block, bytes per block)
BLOCK: dict[GGMLType, tuple[int, int]] = {
  GGMLType.F32: (1, 4), GGMLType.F16: (1, 2), GGMLType.BF16: (1, 2), GGMLType.Q4_0: (32, 18), GGMLType.Q4_1: (32, 20),
  GGMLType.Q5_0: (32, 22), GGMLType.Q5_1: (32, 24), GGMLType.Q8_0: (32, 34), GGMLType.Q4_K: (256, 144),
  GGMLType.Q5_K: (256, 176), GGMLType.Q6_K: (256, 210),
}

# GGUF metadata value types (gguf.md: GGUF_TYPE_*)
_UINT8, _INT8, _UINT16, _INT16, _UINT32, _INT32, _FLOAT32, _BOOL, _STRING, _ARRAY, _UINT64, _INT64, _FLOAT64 = range(13)
_SCALAR_FMT = {_UINT8: "<B", _INT8: "<b", _UINT16: "<H", _INT16: "<h", _UINT32: "<I", _INT32: "<i", _FLOAT32: "<f",
               _BOOL: "<?", _UINT64: "<Q", _INT64: "<q", _FLOAT64: "<d"}
_NP_SCALAR = {_UINT8: np.uint8, _INT8: np.int8, _UINT16: np.uint16, _INT16: np.int16, _UINT32: np.uint32,
              _INT32: np.int32, _FLOAT32: np.float32, _BOOL: np.bool_, _UINT64: np.uint64, _INT64: np.int64,
              _FLOAT64: np.float64}


@dataclass(frozen=True)
class GGUFTensor:
  """One tensor of a GGUF file: its name, shape in numpy order (GGUF stores dims fastest-first), type and raw bytes
  (a uint8 numpy array, memory-mapped when the file was read from a path)."""
  name: str
  shape: tuple[int, ...]
  ggml_type: GGMLType
  raw: np.ndarray

  @property
  def n_elements(self) -> int: return int(np.prod(self.shape, dtype=np.int64)) if self.shape else 1

  def blocks(self) -> np.ndarray:
    """The raw bytes as (number of blocks, bytes per block)."""
    return self.raw.reshape(-1, BLOCK[self.ggml_type][1])

  def numpy(self) -> np.ndarray:
    """float32 values in the tensor's shape (dequantized on the host with the numpy reference codec)."""
    return dequantize(self.raw, self.ggml_type, self.n_elements).reshape(self.shape)


# ***** reading *****
class _Cursor:
  def __init__(self, data: Any, pos: int = 0): self.data, self.pos = data, pos

  def unpack(self, fmt: str) -> Any:
    try: v = struct.unpack_from(fmt, self.data, self.pos)
    except struct.error as e: raise ValueError(f"GGUF: file ends inside its header at byte {self.pos}") from e
    self.pos += struct.calcsize(fmt)
    return v[0]

  def string(self) -> str:
    n = self.unpack("<Q")
    if self.pos + n > len(self.data): raise ValueError(f"GGUF: a string of {n} bytes runs past the end of the file")
    s = bytes(self.data[self.pos:self.pos + n]).decode("utf-8", errors="replace")
    self.pos += n
    return s

  def value(self, vtype: int) -> Any:
    if vtype == _STRING: return self.string()
    if vtype == _ARRAY:
      itype, n = self.unpack("<I"), self.unpack("<Q")
      if itype in _NP_SCALAR:  # numeric arrays (token scores, types) in one read
        dt = np.dtype(_NP_SCALAR[itype]).newbyteorder("<")
        arr = np.frombuffer(self.data, dtype=dt, count=n, offset=self.pos)
        self.pos += n * dt.itemsize
        return arr.tolist()
      return [self.value(itype) for _ in range(n)]
    if vtype not in _SCALAR_FMT: raise ValueError(f"GGUF: unknown metadata value type {vtype} at byte {self.pos}")
    return self.unpack(_SCALAR_FMT[vtype])


def read_gguf(src: str | os.PathLike | bytes | bytearray | memoryview) -> tuple[dict[str, Any], dict[str, GGUFTensor]]:
  """(metadata, {name: GGUFTensor}) of a GGUF v2/v3 file or its bytes. A path is memory-mapped: tensors are views of
  the file, nothing is copied until used."""
  if isinstance(src, (bytes, bytearray, memoryview)): data: Any = np.frombuffer(bytes(src), dtype=np.uint8)
  else: data = np.memmap(os.fspath(src), dtype=np.uint8, mode="r")
  if len(data) < 24 or bytes(data[:4]) != b"GGUF":
    raise ValueError(f"not a GGUF file: it starts with {bytes(data[:4])!r}, expected b'GGUF'")
  c = _Cursor(memoryview(data), 4)
  version = c.unpack("<I")
  if version not in (2, 3): raise ValueError(f"GGUF version {version} is not supported (2 and 3 are)")
  n_tensors, n_kv = c.unpack("<Q"), c.unpack("<Q")
  kv: dict[str, Any] = {}
  for _ in range(n_kv):
    key = c.string()
    kv[key] = c.value(c.unpack("<I"))
  infos = []
  for _ in range(n_tensors):
    name = c.string()
    dims = [c.unpack("<Q") for _ in range(c.unpack("<I"))]
    gtype, offset = c.unpack("<I"), c.unpack("<Q")
    infos.append((name, dims, gtype, offset))
  align = int(kv.get("general.alignment", 32))
  start = -(-c.pos // align) * align
  tensors: dict[str, GGUFTensor] = {}
  for name, dims, gtype, offset in infos:
    try: t = GGMLType(gtype)
    except ValueError:
      raise ValueError(f"GGUF tensor {name!r} has ggml type {gtype}, which is not supported; supported: "
                       + ", ".join(f"{x.name} ({x.value})" for x in BLOCK)) from None
    n = int(np.prod(dims, dtype=np.int64)) if dims else 1
    be, bb = BLOCK[t]
    if n % be: raise ValueError(f"GGUF tensor {name!r}: {n} elements are not whole {t.name} blocks of {be}")
    nbytes = n // be * bb
    if start + offset + nbytes > len(data):
      raise ValueError(f"GGUF tensor {name!r} ({nbytes} bytes at {start + offset}) runs past the end of the file "
                       f"({len(data)} bytes): the file is truncated")
    shape = tuple(int(d) for d in reversed(dims))
    tensors[name] = GGUFTensor(name, shape, t, data[start + offset:start + offset + nbytes])
  return kv, tensors


# ***** writing *****
def _value_type(v: Any) -> int:
  if isinstance(v, bool): return _BOOL
  if isinstance(v, int): return _INT32 if -2**31 <= v < 2**31 else _INT64
  if isinstance(v, float): return _FLOAT32
  if isinstance(v, str): return _STRING
  if isinstance(v, (list, tuple)): return _ARRAY
  raise TypeError(f"GGUF metadata value {v!r} of type {type(v).__name__}: valid are bool, int, float, str, list")


def _write_value(f: BinaryIO, v: Any, vtype: int) -> None:
  if vtype == _STRING:
    b = v.encode("utf-8")
    f.write(struct.pack("<Q", len(b)) + b)
  elif vtype == _ARRAY:
    itype = _value_type(v[0]) if len(v) else _INT32
    if itype == _INT32 and any(not -2**31 <= x < 2**31 for x in v): itype = _INT64
    f.write(struct.pack("<IQ", itype, len(v)))
    if itype in _NP_SCALAR: f.write(np.asarray(v, dtype=np.dtype(_NP_SCALAR[itype]).newbyteorder("<")).tobytes())
    else:
      for x in v: _write_value(f, x, itype)
  else: f.write(struct.pack(_SCALAR_FMT[vtype], v))


def write_gguf(dst: str | os.PathLike | BinaryIO, kv: dict[str, Any], tensors: dict[str, np.ndarray],
               types: dict[str, GGMLType] | None = None, alignment: int = 32) -> None:
  """Write a GGUF v3 file: metadata `kv` (bool/int/float/str/lists of them; ints are INT32 unless they need INT64,
  floats FLOAT32) and float `tensors` in numpy shape order, each stored as `types[name]` (default F32), quantized
  with `quantize`."""
  types = types or {}
  blobs = []
  for name, arr in tensors.items():
    t = GGMLType(types.get(name, GGMLType.F32))
    blobs.append((name, np.asarray(arr).shape, t, quantize(np.asarray(arr, dtype=np.float32), t)))
  f: Any = open(dst, "wb") if isinstance(dst, (str, os.PathLike)) else dst
  try:
    f.write(b"GGUF" + struct.pack("<IQQ", 3, len(blobs), len(kv) + (alignment != 32)))
    items = dict(kv)
    if alignment != 32: items["general.alignment"] = alignment
    for k, v in items.items():
      kb = k.encode("utf-8")
      vt = _UINT32 if k == "general.alignment" else _value_type(v)
      f.write(struct.pack("<Q", len(kb)) + kb + struct.pack("<I", vt))
      _write_value(f, v, vt)
    offset = 0
    for name, shape, t, raw in blobs:
      nb = name.encode("utf-8")
      f.write(struct.pack("<Q", len(nb)) + nb + struct.pack("<I", len(shape)))
      for d in reversed(shape): f.write(struct.pack("<Q", d))
      f.write(struct.pack("<IQ", int(t), offset))
      offset += -(-len(raw) // alignment) * alignment
    pos = f.tell() if not isinstance(f, io.BytesIO) else f.getbuffer().nbytes
    f.write(b"\0" * (-pos % alignment))
    for _, _, _, raw in blobs: f.write(raw + b"\0" * (-len(raw) % alignment))
  finally:
    if isinstance(dst, (str, os.PathLike)): f.close()


# ***** numpy codecs *****
def _f16(a: np.ndarray) -> np.ndarray:
  """float16 bytes of a float array, as (n, 2) uint8."""
  return np.ascontiguousarray(a.astype(np.float16)).view(np.uint8).reshape(-1, 2)


def _nibbles_to_bytes(q: np.ndarray) -> np.ndarray:
  """(nb, 32) values 0..15 -> (nb, 16) bytes: element j in the low nibble of byte j, j+16 in its high nibble."""
  return (q[:, :16] | (q[:, 16:] << 4)).astype(np.uint8)


def _pack_scale_min_k4(sc: np.ndarray, mn: np.ndarray) -> np.ndarray:
  """(nb, 8) 6-bit scales and mins -> (nb, 12) bytes in ggml's get_scale_min_k4 layout."""
  out = np.zeros((sc.shape[0], 12), np.uint8)
  out[:, 0:4] = (sc[:, 0:4] & 63) | ((sc[:, 4:8] >> 4) << 6)
  out[:, 4:8] = (mn[:, 0:4] & 63) | ((mn[:, 4:8] >> 4) << 6)
  out[:, 8:12] = (sc[:, 4:8] & 15) | ((mn[:, 4:8] & 15) << 4)
  return out


def _unpack_scale_min_k4(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """(nb, 12) bytes -> (nb, 8) scales, (nb, 8) mins (ggml-quants.c get_scale_min_k4)."""
  s = s.astype(np.uint32)
  sc = np.concatenate([s[:, 0:4] & 63, (s[:, 8:12] & 15) | ((s[:, 0:4] >> 6) << 4)], axis=1)
  mn = np.concatenate([s[:, 4:8] & 63, (s[:, 8:12] >> 4) | ((s[:, 4:8] >> 6) << 4)], axis=1)
  return sc.astype(np.float32), mn.astype(np.float32)


def quantize(x: np.ndarray, t: GGMLType) -> bytes:
  """The bytes of float array `x` (flattened) stored as ggml type `t`: round-to-nearest block quantization (simple,
  not llama.cpp's error-minimizing search; good for writing test models)."""
  t = GGMLType(t)
  flat = np.ascontiguousarray(x, dtype=np.float32).reshape(-1)
  if t == GGMLType.F32: return flat.tobytes()
  if t == GGMLType.F16: return flat.astype(np.float16).tobytes()
  if t == GGMLType.BF16: return ((flat.view(np.uint32) + 0x7FFF + ((flat.view(np.uint32) >> 16) & 1)) >> 16) \
    .astype(np.uint16).tobytes()
  be, _ = BLOCK[t]
  if flat.size % be: raise ValueError(f"{t.name} needs a multiple of {be} elements, got {flat.size}")
  b = flat.reshape(-1, be)
  if t == GGMLType.Q8_0:
    d = np.abs(b).max(1, keepdims=True) / 127
    q = np.round(b / np.where(d == 0, 1, d)).clip(-127, 127).astype(np.int8)
    return np.concatenate([_f16(d), q.view(np.uint8)], axis=1).tobytes()
  if t in (GGMLType.Q4_0, GGMLType.Q5_0):
    bits = 4 if t == GGMLType.Q4_0 else 5
    amax_i = np.abs(b).argmax(1)
    mx = b[np.arange(len(b)), amax_i][:, None]
    d = mx / -(1 << (bits - 1))
    q = np.round(b / np.where(d == 0, 1, d) + (1 << (bits - 1))).clip(0, (1 << bits) - 1).astype(np.uint32)
    lo = _nibbles_to_bytes(q & 15)
    if t == GGMLType.Q4_0: return np.concatenate([_f16(d), lo], axis=1).tobytes()
    qh = ((q >> 4) << np.arange(32, dtype=np.uint32)).sum(1, dtype=np.uint32)[:, None]
    return np.concatenate([_f16(d), qh.view(np.uint8).reshape(-1, 4), lo], axis=1).tobytes()
  if t in (GGMLType.Q4_1, GGMLType.Q5_1):
    bits = 4 if t == GGMLType.Q4_1 else 5
    mn, mx = b.min(1, keepdims=True), b.max(1, keepdims=True)
    d = (mx - mn) / ((1 << bits) - 1)
    q = np.round((b - mn) / np.where(d == 0, 1, d)).clip(0, (1 << bits) - 1).astype(np.uint32)
    lo = _nibbles_to_bytes(q & 15)
    if t == GGMLType.Q4_1: return np.concatenate([_f16(d), _f16(mn), lo], axis=1).tobytes()
    qh = ((q >> 4) << np.arange(32, dtype=np.uint32)).sum(1, dtype=np.uint32)[:, None]
    return np.concatenate([_f16(d), _f16(mn), qh.view(np.uint8).reshape(-1, 4), lo], axis=1).tobytes()
  if t in (GGMLType.Q4_K, GGMLType.Q5_K):
    bits = 4 if t == GGMLType.Q4_K else 5
    sub = b.reshape(-1, 8, 32)
    mn = np.minimum(sub.min(2), 0)                          # x = scale*q - min, min >= 0
    scale = (sub.max(2) - mn) / ((1 << bits) - 1)
    d = scale.max(1, keepdims=True) / 63
    dmin = -mn.min(1, keepdims=True) / 63
    sc = np.round(scale / np.where(d == 0, 1, d)).clip(0, 63).astype(np.uint32)
    m6 = np.round(-mn / np.where(dmin == 0, 1, dmin)).clip(0, 63).astype(np.uint32)
    d16, dmin16 = d.astype(np.float16).astype(np.float32), dmin.astype(np.float16).astype(np.float32)
    eff_s, eff_m = d16 * sc, dmin16 * m6                    # (nb, 8)
    q = np.round((sub + eff_m[:, :, None]) / np.where(eff_s == 0, 1, eff_s)[:, :, None])
    q = q.clip(0, (1 << bits) - 1).astype(np.uint32)        # (nb, 8, 32)
    lo = q & 15
    qs = (lo[:, 0::2] | (lo[:, 1::2] << 4)).reshape(-1, 128).astype(np.uint8)  # chunk c: sub 2c low, 2c+1 high
    head = [_f16(d), _f16(dmin), _pack_scale_min_k4(sc, m6)]
    if t == GGMLType.Q4_K: return np.concatenate(head + [qs], axis=1).tobytes()
    qh = ((q >> 4) << np.arange(8, dtype=np.uint32)[None, :, None]).sum(1).astype(np.uint8)  # (nb, 32): bit s
    return np.concatenate(head + [qh, qs], axis=1).tobytes()
  if t == GGMLType.Q6_K:
    sub = b.reshape(-1, 16, 16)
    amax_i = np.abs(sub).argmax(2)
    mx = np.take_along_axis(sub, amax_i[:, :, None], 2)[:, :, 0]
    scale = mx / -32
    d = np.abs(scale).max(1, keepdims=True) / 127
    sc = np.round(scale / np.where(d == 0, 1, d)).clip(-128, 127).astype(np.int8)
    eff = d.astype(np.float16).astype(np.float32) * sc
    q = np.round(sub / np.where(eff == 0, 1, eff)[:, :, None] + 32).clip(0, 63).astype(np.uint8).reshape(-1, 2, 4, 32)
    ql = np.concatenate([q[:, :, 0] & 15 | (q[:, :, 2] & 15) << 4, q[:, :, 1] & 15 | (q[:, :, 3] & 15) << 4], axis=2)
    qh = (q[:, :, 0] >> 4) | (q[:, :, 1] >> 4) << 2 | (q[:, :, 2] >> 4) << 4 | (q[:, :, 3] >> 4) << 6
    return np.concatenate([ql.reshape(-1, 128), qh.reshape(-1, 64), sc.view(np.uint8), _f16(d)], axis=1).tobytes()
  raise ValueError(f"quantize: ggml type {t.name} is not supported; supported: {', '.join(x.name for x in BLOCK)}")


def dequantize(raw: np.ndarray | bytes, t: GGMLType, n: int | None = None) -> np.ndarray:
  """Reference (numpy) float32 values of `n` elements stored as ggml type `t` in `raw`."""
  t = GGMLType(t)
  be, bb = BLOCK[t]
  raw = np.frombuffer(raw, np.uint8) if isinstance(raw, (bytes, bytearray)) else np.asarray(raw, np.uint8)
  n = raw.size // bb * be if n is None else n
  raw = np.ascontiguousarray(raw[:n // be * bb])
  if t == GGMLType.F32: return raw.view(np.float32).copy()
  if t == GGMLType.F16: return raw.view(np.float16).astype(np.float32)
  if t == GGMLType.BF16: return (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
  blk = raw.reshape(-1, bb)
  def f16(a: np.ndarray) -> np.ndarray: return np.ascontiguousarray(a).view(np.float16).astype(np.float32)
  if t == GGMLType.Q8_0: return (f16(blk[:, :2]) * blk[:, 2:].view(np.int8)).reshape(-1)
  if t in (GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.Q5_0, GGMLType.Q5_1):
    has_m = t in (GGMLType.Q4_1, GGMLType.Q5_1)
    off = 4 if has_m else 2
    qh = None
    if t in (GGMLType.Q5_0, GGMLType.Q5_1):
      qh = np.ascontiguousarray(blk[:, off:off + 4]).view(np.uint32)
      off += 4
    qs = blk[:, off:off + 16]
    q = np.concatenate([qs & 15, qs >> 4], axis=1).astype(np.uint32)
    if qh is not None: q |= ((qh >> np.arange(32, dtype=np.uint32)) & 1) << 4
    d = f16(blk[:, :2])
    if has_m: return (d * q + f16(blk[:, 2:4])).reshape(-1)
    return (d * (q.astype(np.float32) - (8 if qh is None else 16))).reshape(-1)
  if t in (GGMLType.Q4_K, GGMLType.Q5_K):
    d, dmin = f16(blk[:, 0:2]), f16(blk[:, 2:4])
    sc, mn = _unpack_scale_min_k4(blk[:, 4:16])
    qs = blk[:, -128:].reshape(-1, 4, 32)
    q = np.stack([qs & 15, qs >> 4], axis=2).reshape(-1, 8, 32).astype(np.uint32)  # sub-block 2c low, 2c+1 high
    if t == GGMLType.Q5_K:
      qh = blk[:, 16:48].astype(np.uint32)                                           # (nb, 32)
      q |= ((qh[:, None, :] >> np.arange(8, dtype=np.uint32)[None, :, None]) & 1) << 4
    return ((d * sc)[:, :, None] * q.astype(np.float32) - (dmin * mn)[:, :, None]).reshape(-1)
  if t == GGMLType.Q6_K:
    ql, qh = blk[:, :128].reshape(-1, 2, 64), blk[:, 128:192].reshape(-1, 2, 32)
    sc = blk[:, 192:208].view(np.int8).astype(np.float32).reshape(-1, 2, 8)
    d = f16(blk[:, 208:210]).reshape(-1, 1, 1)
    lo = np.stack([ql[:, :, :32] & 15, ql[:, :, 32:] & 15, ql[:, :, :32] >> 4, ql[:, :, 32:] >> 4], axis=2)
    hi = np.stack([(qh >> s) & 3 for s in (0, 2, 4, 6)], axis=2)
    q = (lo | (hi << 4)).astype(np.float32) - 32                                     # (nb, 2, 4, 32)
    scale = sc.reshape(-1, 2, 4, 2).repeat(16, axis=3)                               # quarter k uses sc[2k + l//16]
    return (d[..., None] * scale * q).reshape(-1)
  raise ValueError(f"dequantize: ggml type {t.name} is not supported")
