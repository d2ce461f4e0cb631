"""GGUF and safetensors loaders against hostile and changing files (issue #38): `llm.gguf.read_gguf` (the LLM's raw
block reader), `nn.state.gguf_load` and `nn.state.safe_load`. The `gguf` package is the independent writer, reader and
dequantizer; every bad file must be a ValueError naming the field, never wrong data, another exception or a read
outside the file; loaded tensors must not depend on the file afterwards."""
import json
import random
import struct
import subprocess
import sys
import textwrap
import time

import gguf
import numpy as np
import pytest

from tiny_tensor import Tensor
from tiny_tensor.llm import quants
from tiny_tensor.llm.gguf import BLOCK, GGMLType, read_gguf, write_gguf
from tiny_tensor.llm.model import Config, Transformer
from tiny_tensor.nn.state import gguf_load, safe_load, safe_save

LOADERS = {"read_gguf": read_gguf, "gguf_load": gguf_load}


# ***** hand-built GGUF pieces (the format, gguf.md) *****
def _gs(s):
  b = s if isinstance(s, bytes) else s.encode()
  return struct.pack("<Q", len(b)) + b


def _kv(key, vtype, payload): return _gs(key) + struct.pack("<I", vtype) + payload


def _info(name, dims, gtype, offset):
  return _gs(name) + struct.pack(f"<I{len(dims)}QIQ", len(dims), *dims, gtype, offset)


def _gguf(kvs=b"", n_kv=0, infos=b"", n_tensors=0, data=b"", pad_to=32):
  out = b"GGUF" + struct.pack("<IQQ", 3, n_tensors, n_kv) + kvs + infos
  return out + b"\0" * (-len(out) % pad_to) + data


def _gguf_package_file(path, tensors, alignment=None, arch="llama", kv=None):
  """Write with the gguf package: {name: (numpy array, raw ggml type or None)}."""
  w = gguf.GGUFWriter(str(path), arch)
  if alignment is not None: w.add_custom_alignment(alignment)
  for k, v in (kv or {}).items(): w.add_uint32(k, v)
  for name, (arr, qtype) in tensors.items():
    if qtype is None: w.add_tensor(name, arr)
    else: w.add_tensor(name, arr, raw_dtype=gguf.GGMLQuantizationType(int(qtype)))
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()
  return path


# ***** 1. general.alignment *****
@pytest.mark.parametrize("loader", LOADERS)
@pytest.mark.parametrize("vtype,payload,shown", [
  (5, struct.pack("<i", -32), "-32"), (4, struct.pack("<I", 0), "0"), (4, struct.pack("<I", 24), "24"),
  (4, struct.pack("<I", 4), "4"), (6, struct.pack("<f", 32), "32.0"), (8, _gs("32"), "'32'"),
  (7, struct.pack("<?", True), "True")])
def test_alignment_must_be_a_power_of_two_multiple_of_8(loader, vtype, payload, shown):
  # a negative alignment used to round the data section back into the header: tensor bytes were header bytes
  blob = _gguf(_kv("general.alignment", vtype, payload), 1, _info("w", (8,), 0, 0), 1, np.arange(8, dtype=np.float32)
               .tobytes())
  with pytest.raises(ValueError, match=f"general.alignment {shown} must be a positive power of two that is a "
                                       "multiple of 8"):
    LOADERS[loader](blob)


@pytest.mark.parametrize("alignment", [8, 64])
def test_valid_alignments_match_the_gguf_package(tmp_path, alignment):
  w = np.arange(24, dtype=np.float32).reshape(3, 8)
  p = _gguf_package_file(tmp_path / "a.gguf", {"a": (np.ones(3, np.float32), None), "w": (w, None)}, alignment)
  kv, ts = read_gguf(p)
  assert kv["general.alignment"] == alignment
  ref = {t.name: np.asarray(t.data) for t in gguf.GGUFReader(str(p)).tensors}
  np.testing.assert_array_equal(ts["w"].numpy(), ref["w"].reshape(3, 8))
  np.testing.assert_array_equal(gguf_load(p)[1]["w"].numpy(), ref["w"].reshape(3, 8))


# ***** 2. sizes that overflow a fixed-width int *****
@pytest.mark.parametrize("loader", LOADERS)
@pytest.mark.parametrize("dims", [(2**32, 2**32), (2**62, 2), (2**64 - 1,), (2**63, 2**63, 4)])
def test_huge_dims_are_refused_not_zero_sized(loader, dims):
  # their element counts wrapped to 0 in an int64 product: zero-byte tensors that loaded "fine"
  blob = _gguf(infos=_info("t", dims, 0, 0), n_tensors=1, data=b"\0" * 64)
  n = 1
  for d in dims: n *= d
  with pytest.raises(ValueError, match=f"'t': {n * 4} bytes at offset 0 run past the data section of 64 bytes"):
    LOADERS[loader](blob)


@pytest.mark.parametrize("loader", LOADERS)
@pytest.mark.parametrize("dims", [(0, 2**64 - 1), (0, 2**32, 2**32)])
def test_empty_tensors_with_huge_dims_are_refused(loader, dims):
  # zero bytes fit any data section: the other dims must still be countable (an int64 in ggml, numpy's limit)
  blob = _gguf(infos=_info("t", dims, 0, 0), n_tensors=1, data=b"\0" * 64)
  with pytest.raises(ValueError, match=r"GGUF tensor 't' has dims .*over the 2\*\*63-1 elements"):
    LOADERS[loader](blob)


# ***** 3. rows of whole blocks, and every decoder against the gguf package *****
def test_rows_narrower_than_a_block_are_refused(tmp_path):
  # the gguf package (like llama.cpp) can't make such a tensor: a row is a whole number of blocks
  with pytest.raises(gguf.quants.QuantError, match="Can't quantize tensor with shape \\(8, 64\\) to Q4_K"):
    gguf.quants.quantize(np.zeros((8, 64), np.float32), gguf.GGMLQuantizationType.Q4_K)
  with pytest.raises(ValueError, match="rows of 64 elements, not whole Q4_K blocks of 256"):
    write_gguf(tmp_path / "w.gguf", {}, {"e": np.zeros((8, 64), np.float32)}, {"e": GGMLType.Q4_K})
  # a file that has one anyway (8 rows of 64 = 2 blocks): it used to load and decode 4 rows as one block
  blob = _gguf(infos=_info("token_embd.weight", (64, 8), int(GGMLType.Q4_K), 0), n_tensors=1, data=b"\1" * 288)
  for load in LOADERS.values():
    with pytest.raises(ValueError, match="'token_embd.weight' of type Q4_K has rows of 64 elements .* not a whole "
                                         "number of Q4_K blocks of 256"):
      load(blob)


# byte offsets of the float16 scales/mins of each block (ggml-common.h): made finite so values compare exactly
F16_FIELDS = {GGMLType.Q8_0: [0], GGMLType.Q4_0: [0], GGMLType.Q4_1: [0, 2], GGMLType.Q5_0: [0],
              GGMLType.Q5_1: [0, 2], GGMLType.Q4_K: [0, 2], GGMLType.Q5_K: [0, 2], GGMLType.Q6_K: [208]}


def _random_rows(t, rows, blocks_per_row, rng):
  """(rows, row bytes) uint8: random blocks (finite random scales), or random finite floats for F32/F16/BF16."""
  be, bb = BLOCK[t]
  if t in (GGMLType.F32, GGMLType.F16, GGMLType.BF16):
    x = rng.standard_normal((rows, blocks_per_row * 32)).astype(np.float32)
    if t == GGMLType.F16: return x.astype(np.float16).view(np.uint8)
    if t == GGMLType.BF16: return (x.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
    return x.view(np.uint8)
  raw = rng.integers(0, 256, size=(rows * blocks_per_row, bb), dtype=np.uint8)
  for off in F16_FIELDS[t]:
    raw[:, off:off + 2] = (rng.standard_normal(len(raw)) * 0.1).astype(np.float16).view(np.uint8).reshape(-1, 2)
  return raw.reshape(rows, -1)


@pytest.mark.parametrize("t", quants.SUPPORTED, ids=lambda t: t.name)
def test_every_type_decodes_like_the_gguf_package_including_embedding_rows(tmp_path, t):
  rng = np.random.default_rng(int(t) + 100)
  rows, bpr = 6, 2
  raw = _random_rows(t, rows, bpr, rng)
  qt = gguf.GGMLQuantizationType(int(t))
  ref = gguf.quants.dequantize(raw, qt).astype(np.float32)                     # (rows, row elements)
  dim = ref.shape[1]
  # one block of small F32 weights besides the embedding: the model refuses a file without the tensors it needs
  block = {f"blk.0.{n}.weight": (rng.standard_normal(shape).astype(np.float32), None) for n, shape in
           [("attn_norm", (dim,)), ("ffn_norm", (dim,)), ("attn_q", (dim, dim)), ("attn_k", (dim, dim)),
            ("attn_v", (dim, dim)), ("attn_output", (dim, dim)), ("ffn_gate", (8, dim)), ("ffn_up", (8, dim)),
            ("ffn_down", (dim, 8))]}
  emb = (raw.view(np.float32 if t == GGMLType.F32 else np.float16), None) if t in (GGMLType.F32, GGMLType.F16) \
    else (raw, t)   # the gguf package writes F32/F16 from their float arrays
  p = _gguf_package_file(tmp_path / "m.gguf", {"token_embd.weight": emb, **block,
                                               "output_norm.weight": (np.ones(dim, np.float32), None)})
  kv, ts = read_gguf(p)
  emb = ts["token_embd.weight"]
  assert emb.shape == (rows, dim) and emb.ggml_type == t
  np.testing.assert_array_equal(emb.numpy(), ref)                                          # numpy codec
  np.testing.assert_array_equal(quants.dequantize(Tensor(np.ascontiguousarray(emb.raw)), t, (rows, dim)).numpy(),
                                ref)                                                       # Tensor ops
  np.testing.assert_array_equal(gguf_load(p)[1]["token_embd.weight"].numpy(), ref)         # nn.state
  # the LLM's token embedding: rows gathered from the raw blocks on the host, decoded on the device
  cfg = Config(arch="llama", dim=dim, n_layers=1, n_heads=1, n_kv_heads=1, hidden_dim=8, vocab_size=rows,
               max_context=8)
  model = Transformer(cfg, ts)
  tokens = [3, 0, 5, 3]
  got = model._embed(model.embed_rows(tokens)).numpy().reshape(len(tokens), dim)
  np.testing.assert_array_equal(got, ref[tokens])


# ***** 4. loaded tensors don't depend on the file *****
CHANGE_SCRIPT = textwrap.dedent("""
  import os, sys
  import numpy as np
  from tiny_tensor import Tensor
  from tiny_tensor.llm.gguf import GGMLType, read_gguf, write_gguf
  from tiny_tensor.nn.state import gguf_load, safe_load, safe_save
  d = sys.argv[1]
  w = np.linspace(-2, 2, 4096, dtype=np.float32).reshape(64, 64)
  write_gguf(d + "/m.gguf", {"general.architecture": "llama"}, {"w": w, "q": w}, {"q": GGMLType.Q8_0})
  safe_save({"w": Tensor(w)}, d + "/m.safetensors")
  kv, ts = read_gguf(d + "/m.gguf")
  _, gl = gguf_load(d + "/m.gguf")
  st = safe_load(d + "/m.safetensors")
  q_before = ts["q"].numpy().copy()
  def check(when):
    assert (ts["w"].numpy() == w).all(), when + ": read_gguf"
    assert (ts["q"].numpy() == q_before).all() and np.abs(q_before - w).max() < 0.02, when + ": read_gguf Q8_0"
    assert (gl["w"].numpy() == w).all(), when + ": gguf_load"
    assert (st["w"].numpy() == w).all() and ((st["w"] * 2).numpy() == w * 2).all(), when + ": safe_load"
  for f in ("m.gguf", "m.safetensors"):   # other bytes, in place (not a new file renamed over it)
    with open(d + "/" + f, "r+b") as fh: fh.write(b"\\xff" * os.path.getsize(d + "/" + f))
  check("overwritten")
  for f in ("m.gguf", "m.safetensors"): os.truncate(d + "/" + f, 0)
  check("truncated")
  print("OK")
""")


def test_loaded_tensors_survive_the_file_changing_and_shrinking(tmp_path):
  """A memory map (even MAP_PRIVATE) sees later writes (NaNs) and SIGBUSes after a truncate; the loaders copy the
  file once into private memory. In a subprocess: a SIGBUS fails this test instead of killing pytest."""
  r = subprocess.run([sys.executable, "-c", CHANGE_SCRIPT, str(tmp_path)], capture_output=True, text=True,
                     timeout=300)
  assert r.returncode == 0 and r.stdout.strip() == "OK", (r.returncode, r.stdout[-500:], r.stderr[-2000:])


# ***** 5. malformed headers, field by field *****
_BC = "llama.block_count"
HEADER_CORPUS = {
  "23_bytes": (b"GGUF" + struct.pack("<IQ", 3, 0) + b"\0" * 7, "truncated: metadata count at byte 16 needs 8 bytes, 7"),
  "not_gguf": (b"GGML" + bytes(40), "not a GGUF file: it starts with b'GGML', expected the magic b'GGUF'"),
  "3_bytes": (b"GGU", "not a GGUF file: it starts with b'GGU'"),
  "block_count_negative": (_gguf(_kv("general.architecture", 8, _gs("llama")) + _kv(_BC, 5, struct.pack("<i", -3)), 2),
                           "llama.block_count = -3 .*valid is an unsigned integer below 2\\*\\*32"),
  "block_count_absurd": (_gguf(_kv("general.architecture", 8, _gs("llama")) + _kv(_BC, 10, struct.pack("<Q", 2**63)),
                               2), "llama.block_count = 9223372036854775808"),
  "block_count_str": (_gguf(_kv("general.architecture", 8, _gs("llama")) + _kv(_BC, 8, _gs("3")), 2),
                      "llama.block_count = '3'"),
  "array_count_max": (_gguf(_kv("k", 9, struct.pack("<IQ", 0, 2**64 - 1)), 1),
                      "array length of 'k' 18446744073709551615 .* more than the 15 bytes left"),
  "string_array_count_max": (_gguf(_kv("k", 9, struct.pack("<IQ", 8, 2**64 - 1)), 1), "array length of 'k'"),
  "nested_too_deep": (_gguf(_kv("k", 9, struct.pack("<IQ", 9, 1) * 9 + struct.pack("<IQ", 4, 0)), 1),
                      "'k': arrays nested deeper than 8"),
  "string_past_end": (_gguf(_kv("k", 8, struct.pack("<Q", 10**9) + b"abc"), 1),
                      "value of 'k' length 1000000000 at byte 37 is more than the 19 bytes left"),
  "key_past_end": (b"GGUF" + struct.pack("<IQQQ", 3, 0, 1, 2**64 - 1) + b"k" * 20, "metadata key length"),
  "unknown_ggml_type": (_gguf(infos=_info("t", (4,), 99, 0), n_tensors=1, data=b"\0" * 32),
                        "'t' has ggml type 99, which is not supported; supported: F32 \\(0\\)"),
  "unknown_value_type": (_gguf(_kv("k", 13, b"\0" * 8), 1), "'k': unknown metadata value type 13; valid: 0-12"),
  "duplicate_tensor": (_gguf(infos=_info("a", (8,), 0, 0) * 2, n_tensors=2, data=b"\0" * 64),
                       "tensor 'a' appears twice"),
  "duplicate_key": (_gguf(_kv("k", 4, b"\0" * 4) * 2, 2), "metadata key 'k' appears twice"),
  "n_tensors_max": (b"GGUF" + struct.pack("<IQQ", 3, 2**64 - 1, 0) + bytes(64), "tensor count 18446744073709551615"),
}


@pytest.mark.parametrize("loader", LOADERS)
@pytest.mark.parametrize("name", sorted(HEADER_CORPUS))
def test_malformed_headers_name_the_field(loader, name):
  blob, msg = HEADER_CORPUS[name]
  with pytest.raises(ValueError, match=msg): LOADERS[loader](blob)


def test_nested_arrays_within_the_limit_load():
  two = struct.pack("<IQ", 9, 2) + struct.pack("<IQ", 4, 2) + struct.pack("<2I", 1, 2) + struct.pack("<IQ", 8, 1) \
    + _gs("x")
  kv, _ = read_gguf(_gguf(_kv("k", 9, two), 1))
  assert kv == {"k": [[1, 2], ["x"]]}


# ***** 5. mutation fuzzing: a clean load or a ValueError, nothing else *****
def _fuzz_gguf():
  """A small valid GGUF (built field by field) and the byte offsets and widths of its integer fields."""
  fields, out = [], bytearray()
  def put(b, width=0):
    if width: fields.append((len(out), width))
    out.extend(b)
  put(b"GGUF"), put(struct.pack("<I", 3), 4), put(struct.pack("<Q", 2), 8), put(struct.pack("<Q", 3), 8)
  for key, vt, payload in (("general.architecture", 8, _gs("llama")), ("llama.block_count", 4, struct.pack("<I", 1)),
                           ("ids", 9, struct.pack("<IQ", 5, 3) + struct.pack("<3i", 1, -2, 3))):
    put(struct.pack("<Q", len(key)), 8), put(key.encode()), put(struct.pack("<I", vt), 4)
    if vt == 9: put(struct.pack("<I", 5), 4), put(struct.pack("<Q", 3), 8), put(payload[12:])
    elif vt == 8: put(payload[:8], 8), put(payload[8:])
    else: put(payload, 4)
  for name, dims, gt, off in (("a", (32,), 8, 0), ("b", (4, 2), 0, 64)):
    put(struct.pack("<Q", len(name)), 8), put(name.encode()), put(struct.pack("<I", len(dims)), 4)
    for d in dims: put(struct.pack("<Q", d), 8)
    put(struct.pack("<I", gt), 4), put(struct.pack("<Q", off), 8)
  put(b"\0" * (-len(out) % 32))
  q8 = np.frombuffer(gguf.quants.quantize(np.linspace(-1, 1, 32, dtype=np.float32), gguf.GGMLQuantizationType.Q8_0),
                     np.uint8)
  put(q8.tobytes() + b"\0" * 30 + np.arange(8, dtype=np.float32).tobytes())
  return bytes(out), fields


BOUNDARY = [0, 1, 2**7, 2**8 - 1, 2**15, 2**16 - 1, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**63 - 1, 2**63, 2**64 - 1]


def _mutations(blob, fields, seed, n):
  """Seeded mutants: byte flips, inserts, deletes, and integer fields set to boundary values."""
  rng = random.Random(seed)
  for _ in range(n):
    b, kind = bytearray(blob), rng.randrange(4)
    if kind == 0:
      for _ in range(rng.randint(1, 4)): b[rng.randrange(len(b))] = rng.randrange(256)
    elif kind == 1:
      at = rng.randrange(len(b) + 1)
      b[at:at] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 9)))
    elif kind == 2:
      at = rng.randrange(len(b))
      del b[at:at + rng.randint(1, 9)]
    else:
      at, width = rng.choice(fields)
      v = rng.choice(BOUNDARY) % (1 << (8 * width))
      b[at:at + width] = v.to_bytes(width, "little")
    yield bytes(b)


def _check_gguf_views(blob, ts):
  """Each raw tensor of a clean load lies inside the file's bytes, has its type's size, and holds those bytes."""
  for t in ts.values():
    base = t.raw.base
    assert isinstance(base, np.ndarray) and base.size == len(blob), t.name
    start = t.raw.__array_interface__["data"][0] - base.__array_interface__["data"][0]
    be, bb = BLOCK[t.ggml_type]
    assert t.raw.size == t.n_elements // be * bb and 0 <= start and start + t.raw.size <= len(blob), t.name
    assert t.raw.tobytes() == blob[start:start + t.raw.size], t.name


def test_mutation_fuzz_gguf(tmp_path):
  blob, fields = _fuzz_gguf()
  kv, ts = read_gguf(blob)   # the seed file is valid, and the gguf package reads it the same
  (tmp_path / "seed.gguf").write_bytes(blob)
  ref = {t.name: np.asarray(t.data) for t in gguf.GGUFReader(str(tmp_path / "seed.gguf")).tensors}
  assert kv["llama.block_count"] == 1 and ts["a"].raw.tobytes() == ref["a"].tobytes()
  np.testing.assert_array_equal(ts["b"].numpy().reshape(-1), ref["b"].reshape(-1))
  outcomes = {"ok": 0, "ValueError": 0}
  for i, m in enumerate(_mutations(blob, fields, 38, 400)):
    t0 = time.perf_counter()
    try:
      got_kv, got = read_gguf(m)
      _check_gguf_views(m, got)
      if i % 4 == 0: [x.numpy() for x in gguf_load(m)[1].values()]
    except ValueError: outcomes["ValueError"] += 1
    else: outcomes["ok"] += 1
    assert time.perf_counter() - t0 < 5, f"mutant {i} took {time.perf_counter() - t0:.1f} s"
  assert outcomes["ok"] > 10 and outcomes["ValueError"] > 100, outcomes


def test_mutation_fuzz_safetensors(tmp_path):
  p = tmp_path / "v.safetensors"
  safe_save({"a": Tensor([1.0, 2.0, 3.0]), "m": Tensor([True, False]), "i": Tensor([[1, 2], [3, 4]])}, p,
            metadata={"k": "v"})
  blob = p.read_bytes()
  n = struct.unpack("<Q", blob[:8])[0]
  header = json.loads(blob[8:8 + n])
  rng = random.Random(5)
  mutants = list(_mutations(blob, [(0, 8)], 6, 150))
  for _ in range(100):   # JSON integers (dims, offsets) set to boundary values, negatives and floats
    h = json.loads(json.dumps(header))
    entry = h[rng.choice(["a", "m", "i"])]
    field = rng.choice(["shape", "data_offsets"])
    entry[field][rng.randrange(len(entry[field]))] = rng.choice(BOUNDARY + [-1, -2**63, 2**64, 1.5, len(blob)])
    hj = json.dumps(h).encode()
    mutants.append(struct.pack("<Q", len(hj)) + hj + blob[8 + n:])
  outcomes = {"ok": 0, "ValueError": 0}
  for i, m in enumerate(mutants):
    (tmp_path / "f.safetensors").write_bytes(m)
    for src in (tmp_path / "f.safetensors", Tensor(np.frombuffer(m, np.uint8).copy())):
      try: loaded = {k: v.numpy() for k, v in safe_load(src).items()}
      except ValueError: outcomes["ValueError"] += 1
      else:
        outcomes["ok"] += 1
        assert sum(v.nbytes for v in loaded.values()) <= len(m), i
  assert outcomes["ok"] > 10 and outcomes["ValueError"] > 100, outcomes
