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
import math
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
  (a uint8 numpy array: a view of `read_gguf`'s private copy of the file, never of the file itself)."""
  name: str
  shape: tuple[int, ...]
  ggml_type: GGMLType
  raw: np.ndarray

  @property
  def n_elements(self) -> int: return math.prod(self.shape)

  def blocks(self) -> np.ndarray:
    """The raw bytes as (number of blocks, bytes per block)."""
    return self.raw.reshape(-1, BLOCK[self.ggml_type][1])

  def numpy(self) -> np.ndarray:
    """float32 values in the tensor's shape (dequantized on the host with the numpy reference codec)."""
    return dequantize(self.raw, self.ggml_type, self.n_elements).reshape(self.shape)


# ***** reading *****
_INT_TYPES = (_UINT8, _INT8, _UINT16, _INT16, _UINT32, _INT32, _UINT64, _INT64)
_MAX_DEPTH = 8      # arrays of arrays nest this deep at most (real files use one level)
_MAX_DIMS = 4       # ggml tensors have at most 4 dimensions (GGML_MAX_DIMS in ggml.h)
# the fewest bytes one more item can take: a string (its 8-byte length), an array (4-byte type + 8-byte count), a
# scalar of each type; a kv (key string + 4-byte type + 1-byte value); a tensor info (name + n_dims + type + offset)
_MIN_ITEM = {_STRING: 8, _ARRAY: 12, **{t: struct.calcsize(f) for t, f in _SCALAR_FMT.items()}}
_MIN_KV, _MIN_INFO = 8 + 4 + 1, 8 + 4 + 4 + 8
# model hyperparameters gguf.md stores as unsigned ints: a negative or non-integer one is a malformed file, and no
# model anything could run has one beyond a uint32
_ARCH_COUNTS = ("block_count", "context_length", "embedding_length", "feed_forward_length", "vocab_size",
                "attention.head_count", "attention.head_count_kv", "attention.key_length", "attention.value_length",
                "expert_count", "expert_used_count")


class _Reader:
  """Reads a GGUF header from a byte buffer; every read is bounds-checked against the buffer (a ValueError naming
  what was read, where, and how much was left; never struct.error, never a read past the end)."""

  def __init__(self, data: memoryview): self.data, self.pos = data, 0

  def need(self, n: int, what: str) -> None:
    if n > len(self.data) - self.pos:
      raise ValueError(f"GGUF file truncated: {what} at byte {self.pos} needs {n} bytes, {len(self.data) - self.pos} "
                       f"are left (file size {len(self.data)})")

  def many(self, code: str, n: int, what: str) -> list[Any]:
    """`n` little-endian values of struct type `code` ("Q", "i", ...), in one read."""
    fmt = f"<{n}{code}"
    self.need(struct.calcsize(fmt), what)
    v = struct.unpack_from(fmt, self.data, self.pos)
    self.pos += struct.calcsize(fmt)
    return list(v)

  def unpack(self, fmt: str, what: str) -> Any:
    """One value of struct format `fmt` ("<I", "<Q", ...)."""
    return self.many(fmt[1:], 1, what)[0]

  def count(self, what: str, min_item: int) -> int:
    """A u64 count of items that take at least `min_item` bytes each, refused when the rest of the file can't hold
    them (so a hostile count never makes us loop or allocate for 2**64 items)."""
    at, n = self.pos, self.unpack("<Q", what)
    if n * min_item > len(self.data) - self.pos:
      raise ValueError(f"GGUF {what} {n} at byte {at} is more than the {len(self.data) - self.pos} bytes left in the "
                       f"file can hold (each item takes at least {min_item} bytes)")
    return n

  def string(self, what: str) -> str:
    at, n = self.pos, self.count(f"{what} length", 1)
    raw = bytes(self.data[self.pos:self.pos + n])
    self.pos += n
    try: return raw.decode("utf-8")
    except UnicodeDecodeError as e: raise ValueError(f"GGUF {what} at byte {at} is not valid UTF-8 ({e})") from e

  def array_head(self, key: str) -> list[Any]:
    """[item type, count] of the array that starts here, both checked."""
    itype = self.unpack("<I", f"array item type of {key!r}")
    if itype not in _MIN_ITEM:
      raise ValueError(f"GGUF {key!r}: unknown array item type {itype}; valid: 0-12 (gguf.md GGUF_TYPE_*)")
    return [itype, self.count(f"array length of {key!r}", _MIN_ITEM[itype])]

  def value(self, vtype: int, key: str) -> Any:
    """One metadata value of type `vtype`. Arrays of arrays are read with an explicit stack, at most _MAX_DEPTH deep;
    a numeric array in one unpack."""
    if vtype == _STRING: return self.string(f"value of {key!r}")
    if vtype in _SCALAR_FMT: return self.unpack(_SCALAR_FMT[vtype], f"value of {key!r}")
    if vtype != _ARRAY:
      raise ValueError(f"GGUF {key!r}: unknown metadata value type {vtype}; valid: 0-12 (gguf.md GGUF_TYPE_*)")
    root: list[Any] = []
    stack = [[root, *self.array_head(key)]]      # [list being filled, item type, items still to read]
    while stack:
      top = stack[-1]
      out, itype, left = top
      if left == 0: stack.pop()
      elif itype in _SCALAR_FMT:
        out.extend(self.many(_SCALAR_FMT[itype][1], left, f"array {key!r}"))
        top[2] = 0
      elif itype == _STRING:
        out.append(self.string(f"value of {key!r}"))
        top[2] -= 1
      else:
        if len(stack) >= _MAX_DEPTH:
          raise ValueError(f"GGUF {key!r}: arrays nested deeper than {_MAX_DEPTH}; valid: up to {_MAX_DEPTH} levels")
        inner: list[Any] = []
        out.append(inner)
        top[2] -= 1
        stack.append([inner, *self.array_head(key)])
    return root


def _check_alignment(kv: dict[str, Any], vtypes: dict[str, int]) -> int:
  """general.alignment: gguf.md says a uint32 that is a multiple of 8; llama.cpp and the gguf package need a power of
  two. Both hold for 8, 16, 32, ... A negative or zero one would put the data section inside the header."""
  if "general.alignment" not in kv: return 32
  align, vt = kv["general.alignment"], vtypes["general.alignment"]
  if vt not in _INT_TYPES or align <= 0 or align % 8 or align & (align - 1):
    raise ValueError(f"GGUF general.alignment {align!r} must be a positive power of two that is a multiple of 8 "
                     f"(8, 16, 32, ...; default 32), stored as an integer (gguf.md: uint32; here value type {vt})")
  return align


def _check_arch_counts(kv: dict[str, Any], vtypes: dict[str, int]) -> None:
  """The model hyperparameters gguf.md defines as unsigned counts ({arch}.block_count, ...) must be integers in
  [0, 2**32) (or arrays of them, as per-layer head counts are)."""
  arch = kv.get("general.architecture")
  if not isinstance(arch, str): return
  for name in _ARCH_COUNTS:
    key = f"{arch}.{name}"
    if key not in kv: continue
    v = kv[key]
    vals = v if vtypes[key] == _ARRAY else [v]
    if not all(isinstance(x, int) and not isinstance(x, bool) and 0 <= x < 2**32 for x in vals):
      raise ValueError(f"GGUF {key} = {v!r:.80} (value type {vtypes[key]}): valid is an unsigned integer below 2**32 "
                       f"(or an array of them)")


@dataclass(frozen=True)
class _Info:
  name: str
  dims: tuple[int, ...]   # GGUF order: fastest-varying first
  ggml_type: GGMLType
  offset: int             # bytes from the start of the data section
  nbytes: int


def _tensor_info(r: _Reader, names: set[str]) -> _Info:
  """One tensor info, checked on its own: a new name, at most 4 dims, a known type, rows of whole blocks."""
  name = r.string("tensor name")
  if name in names: raise ValueError(f"GGUF tensor {name!r} appears twice; tensor names must be unique")
  names.add(name)
  ndim = r.unpack("<I", f"dims of {name!r}")
  if ndim > _MAX_DIMS: raise ValueError(f"GGUF tensor {name!r} has {ndim} dims; ggml allows 0-{_MAX_DIMS}")
  dims = tuple(r.many("Q", ndim, f"shape of {name!r}"))
  gtype, offset = r.unpack("<I", f"type of {name!r}"), r.unpack("<Q", f"offset of {name!r}")
  if gtype not in BLOCK:
    raise ValueError(f"GGUF tensor {name!r} has ggml type {gtype}, which is not supported; supported: "
                     + ", ".join(f"{x.name} ({x.value})" for x in BLOCK))
  t = GGMLType(gtype)
  be, bb = BLOCK[t]
  # a zero dim makes the tensor empty, so its byte range can't catch the other dims: ggml holds each dim and their
  # product in an int64 (`ne`), and numpy can't make such an array either
  if 0 in dims and (n := math.prod(d for d in dims if d)) > 2**63 - 1:
    raise ValueError(f"GGUF tensor {name!r} has dims {list(dims)}: its non-zero dims multiply to {n}, over the "
                     f"2**63-1 elements an int64 (ggml's ne) can count")
  # ggml (and gguf.quants) store each row as whole blocks: a row narrower than a block, or not a multiple of it, has
  # no layout (decoding it as if blocks ran across rows gives wrong numbers)
  row = dims[0] if dims else 1
  if row % be:
    raise ValueError(f"GGUF tensor {name!r} of type {t.name} has rows of {row} elements (dims {list(dims)}), not a "
                     f"whole number of {t.name} blocks of {be}; valid: a row width that is a multiple of {be}")
  return _Info(name, dims, t, offset, math.prod(dims) // be * bb)   # Python ints: no overflow


def _parse(data: memoryview) -> tuple[dict[str, Any], list[_Info], int]:
  """(metadata, tensor infos, data section start) of GGUF bytes, everything validated against the buffer's size."""
  if len(data) < 4 or bytes(data[:4]) != b"GGUF":
    raise ValueError(f"not a GGUF file: it starts with {bytes(data[:4])!r}, expected the magic b'GGUF'")
  r = _Reader(data)
  r.pos = 4
  version = r.unpack("<I", "version")
  if version not in (2, 3): raise ValueError(f"GGUF version {version} is not supported; valid: 2, 3")
  n_tensors = r.count("tensor count", _MIN_INFO)
  n_kv = r.count("metadata count", _MIN_KV)
  kv: dict[str, Any] = {}
  vtypes: dict[str, int] = {}
  for _ in range(n_kv):
    k = r.string("metadata key")
    if k in kv: raise ValueError(f"GGUF metadata key {k!r} appears twice; keys must be unique")
    vtypes[k] = r.unpack("<I", f"value type of {k!r}")
    kv[k] = r.value(vtypes[k], k)
  names: set[str] = set()
  infos = [_tensor_info(r, names) for _ in range(n_tensors)]
  align = _check_alignment(kv, vtypes)
  _check_arch_counts(kv, vtypes)
  start = -(-r.pos // align) * align     # the data section starts after the header, never inside it
  data_size = len(data) - start
  spans = []
  for i in infos:
    if i.offset % align:
      raise ValueError(f"GGUF tensor {i.name!r}: offset {i.offset} is not a multiple of the alignment {align}")
    if i.offset + i.nbytes > data_size:
      raise ValueError(f"GGUF tensor {i.name!r}: {i.nbytes} bytes at offset {i.offset} run past the data section of "
                       f"{max(data_size, 0)} bytes ({i.ggml_type.name}, dims {list(i.dims)}; file size {len(data)}): "
                       f"the file is truncated or its header is wrong")
    if i.nbytes: spans.append((i.offset, i.offset + i.nbytes, i.name))
  spans.sort()
  for (s0, e0, k0), (s1, e1, k1) in zip(spans, spans[1:]):
    if s1 < e0: raise ValueError(f"GGUF tensors {k0!r} [{s0}, {e0}) and {k1!r} [{s1}, {e1}) overlap")
  return kv, infos, start


def _read_file(path: str) -> np.ndarray:
  """The whole file as a private uint8 array: read() into anonymous memory (one copy), so nothing loaded depends on
  the file afterwards (a memory map, even MAP_PRIVATE, sees later writes to the file and faults after a truncate)."""
  with open(path, "rb", buffering=0) as f:
    size = os.fstat(f.fileno()).st_size
    buf = np.empty(size, dtype=np.uint8)
    mv, got = buf.data, 0  # (memoryview(buf) too; numpy's stubs declare ndarray a Buffer only for Python >= 3.12)
    while got < size and (n := f.readinto(mv[got:])): got += n
    if got != size or f.read(1):
      raise ValueError(f"{path}: the file changed size while it was read ({size} bytes expected, {got} read)")
  return buf


def read_gguf(src: str | os.PathLike | bytes | bytearray | memoryview) -> tuple[dict[str, Any], dict[str, GGUFTensor]]:
  """(metadata, {name: GGUFTensor}) of a GGUF v2/v3 file or its bytes.

  A path is read into private memory (one copy, no memory map): the tensors never change or fault when the file is
  later rewritten or truncated. The whole header is validated before any tensor is made, and a bad file is a
  ValueError naming the field, its value and what is valid: truncation, counts the file can't hold, unknown value or
  ggml types, nested arrays deeper than 8, duplicate keys or tensor names, general.alignment (a power of two, multiple
  of 8), negative model counts ({arch}.block_count, ...), more than 4 dims, rows that aren't whole blocks, tensor
  byte ranges (aligned, inside the data section, not overlapping; sizes computed without overflow).
  """
  if isinstance(src, (bytes, bytearray, memoryview)): data = np.frombuffer(bytes(src), dtype=np.uint8)
  else: data = _read_file(os.fspath(src))
  kv, infos, start = _parse(data.data)
  tensors = {i.name: GGUFTensor(i.name, tuple(reversed(i.dims)), i.ggml_type,
                                data[start + i.offset:start + i.offset + i.nbytes]) for i in infos}
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
  if not isinstance(alignment, int) or alignment <= 0 or alignment % 8 or alignment & (alignment - 1):
    raise ValueError(f"write_gguf: alignment {alignment!r} must be a positive power of two that is a multiple of 8")
  blobs = []
  for name, arr in tensors.items():
    t = GGMLType(types.get(name, GGMLType.F32))
    row = np.shape(arr)[-1] if np.ndim(arr) else 1
    if row % BLOCK[t][0]:
      raise ValueError(f"write_gguf: tensor {name!r} of shape {np.shape(arr)} has rows of {row} elements, not whole "
                       f"{t.name} blocks of {BLOCK[t][0]}; valid: a last dim that is a multiple of {BLOCK[t][0]}")
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
    q: np.ndarray = np.round(b / np.where(d == 0, 1, d)).clip(-127, 127).astype(np.int8)  # (other dtypes below)
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
