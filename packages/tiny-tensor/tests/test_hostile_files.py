"""A hostile-file corpus for nn.state (issue #18): safetensors, GGUF and PyTorch .pth files that are truncated,
oversized, overlapping, of the wrong types, or evil pickles. Every one must end in a ValueError that names the bad
field (never a crash, a read outside the file, another exception type, or a silently wrong tensor), and valid files
must still load exactly. Random byte flips of valid files check the same over inputs nobody wrote by hand.
"""
import io
import json
import os
import pickle
import random
import struct
import subprocess
import sys
import textwrap
import zipfile
from collections import OrderedDict

import numpy as np
import pytest
import torch

from tiny_uop import dtypes
from tiny_tensor import Tensor
from tiny_tensor.nn.state import gguf_load, safe_load, safe_load_metadata, safe_save, torch_load


# ***** safetensors *****
def _st(header, data=b"", raw_len=None):
  hj = header if isinstance(header, bytes) else json.dumps(header).encode()
  return struct.pack("<Q", len(hj) if raw_len is None else raw_len) + hj + data


F32x2 = {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}
SAFE_CORPUS = {
  "empty": (b"", "shorter than the 8-byte header length"),
  "short_len": (b"\x05\x00\x00", "shorter than the 8-byte header length"),
  "len_2**64-1": (_st({}, raw_len=2**64 - 1), "header length 18446744073709551615 is larger"),
  "len_past_end": (_st({"a": F32x2}, b"\0" * 8, raw_len=10**6), "header length 1000000 is larger"),
  "not_json": (_st(b"{nope"), "bad JSON header"),
  "not_utf8": (_st(b'{"\xff": 1}'), "bad JSON header"),
  "deep_json": (_st(b"[" * 100000 + b"]" * 100000), "bad JSON header"),
  "list_header": (_st([1, 2]), "a JSON list, expected an object"),
  "entry_not_object": (_st({"a": 5}), "tensor 'a': entry is a int"),
  "missing_offsets": (_st({"a": {"dtype": "F32", "shape": [2]}}, b"\0" * 8), "entry lacks data_offsets"),
  "unknown_dtype": (_st({"a": {**F32x2, "dtype": "F128"}}, b"\0" * 8), "unsupported dtype 'F128'; valid"),
  "dtype_not_str": (_st({"a": {**F32x2, "dtype": ["F32"]}}, b"\0" * 8), "unsupported dtype"),
  "negative_dim": (_st({"a": {**F32x2, "shape": [-2]}}, b"\0" * 8), "shape \\[-2\\] must be a list of non-negative"),
  "float_dim": (_st({"a": {**F32x2, "shape": [2.0]}}, b"\0" * 8), "must be a list of non-negative ints"),
  "bool_dim": (_st({"a": {**F32x2, "shape": [True, True]}}, b"\0" * 8), "must be a list of non-negative ints"),
  "shape_not_list": (_st({"a": {**F32x2, "shape": "2"}}, b"\0" * 8), "must be a list"),
  "offsets_str": (_st({"a": {**F32x2, "data_offsets": ["0", "8"]}}, b"\0" * 8), "must be \\[start, end\\] ints"),
  "offsets_three": (_st({"a": {**F32x2, "data_offsets": [0, 4, 8]}}, b"\0" * 8), "must be \\[start, end\\] ints"),
  "negative_offset": (_st({"a": {**F32x2, "data_offsets": [-8, 0]}}, b"\0" * 8), "\\[-8, 0\\] are outside the data"),
  "offset_past_end": (_st({"a": {**F32x2, "data_offsets": [8, 16]}}, b"\0" * 8), "\\[8, 16\\] are outside"),
  "end_before_start": (_st({"a": {**F32x2, "data_offsets": [8, 0]}}, b"\0" * 8), "outside the data"),
  "size_mismatch": (_st({"a": {**F32x2, "shape": [3]}}, b"\0" * 8), "spans 8 bytes but shape \\(3,\\) of F32 needs 12"),
  "huge_shape": (_st({"a": {**F32x2, "shape": [2**40, 2**40]}}, b"\0" * 8), "needs"),
  "truncated_data": (_st({"a": F32x2}, b"\0" * 5), "outside the data"),
  "overlap": (_st({"a": F32x2, "b": {**F32x2, "data_offsets": [4, 12]}}, b"\0" * 12),
              "'a' \\[0, 8\\) and 'b' .*overlap"),
  "duplicate_key": (_st(b'{"a": ' + json.dumps(F32x2).encode() + b', "a": ' + json.dumps(F32x2).encode() + b'}',
                        b"\0" * 8), "key 'a' appears twice"),
  "bool_byte_2": (_st({"m": {"dtype": "BOOL", "shape": [3], "data_offsets": [0, 3]}}, b"\x01\x02\x00"),
                  "tensor 'm': BOOL byte 2 is not 0 or 1"),
  # zero elements, but numpy can't index the other dim's bytes: it used to load and fail later in .numpy()
  "zero_dim_huge": (_st({"a": {"dtype": "F32", "shape": [0, 2**62], "data_offsets": [0, 0]}}),
                    "tensor 'a': shape \\(0, 4611686018427387904\\) needs 18446744073709551616 bytes .*limit of "
                    "9223372036854775807"),
  "too_many_dims": (_st({"a": {"dtype": "U8", "shape": [1] * 65, "data_offsets": [0, 1]}}, b"\0"),
                    "tensor 'a': shape has 65 dims; at most 32"),
  "metadata_not_dict": (_st({"__metadata__": [1]}), "__metadata__ must map str to str"),
  "metadata_values": (_st({"__metadata__": {"a": 1}}), "__metadata__ must map str to str"),
}


@pytest.mark.parametrize("name", sorted(SAFE_CORPUS))
def test_safetensors_hostile(tmp_path, name):
  blob, msg = SAFE_CORPUS[name]
  p = tmp_path / f"{name}.safetensors"
  p.write_bytes(blob)
  with pytest.raises(ValueError, match=msg): safe_load(p)                       # from the path
  with pytest.raises(ValueError, match=msg): safe_load(Tensor(np.frombuffer(blob, np.uint8).copy()))  # in memory
  if "metadata" in name:
    with pytest.raises(ValueError, match=msg): safe_load_metadata(p)


def test_safetensors_valid_edge_cases(tmp_path):
  # an empty tensor, a scalar, a BOOL tensor and a gap between tensors are all valid
  hdr = {"e": {"dtype": "F32", "shape": [0, 3], "data_offsets": [0, 0]},
         "s": {"dtype": "I16", "shape": [], "data_offsets": [0, 2]},
         "m": {"dtype": "BOOL", "shape": [3], "data_offsets": [2, 5]},
         "f": {"dtype": "F64", "shape": [1], "data_offsets": [8, 16]}, "__metadata__": {"k": "v"}}
  p = tmp_path / "ok.safetensors"
  p.write_bytes(_st(hdr, struct.pack("<h", -7) + b"\x01\x00\x01" + b"\xee" * 3 + struct.pack("<d", 2.5)))
  for sd in (safe_load(p), safe_load(Tensor(np.frombuffer(p.read_bytes(), np.uint8).copy()))):
    assert sd["e"].shape == (0, 3) and sd["s"].item() == -7 and sd["f"].tolist() == [2.5]
    assert sd["m"].dtype == dtypes.bool and sd["m"].tolist() == [True, False, True]
  assert safe_load_metadata(p) == {"k": "v"}


def test_safetensors_zero_element_tensors_numpy_can_hold_load(tmp_path):
  # (0, 2**40) float32 is 0 bytes of data and numpy makes it: valid, the same shape as numpy's
  hdr = {"z": {"dtype": "F32", "shape": [0, 2**40], "data_offsets": [0, 0]},
         "y": {"dtype": "U8", "shape": [2**61, 0, 3], "data_offsets": [0, 0]}}
  p = tmp_path / "z.safetensors"
  p.write_bytes(_st(hdr))
  for sd in (safe_load(p), safe_load(Tensor(np.frombuffer(p.read_bytes(), np.uint8).copy()))):
    assert sd["z"].numpy().shape == np.zeros((0, 2**40), np.float32).shape
    assert sd["y"].numpy().shape == np.zeros((2**61, 0, 3), np.uint8).shape


CRASH_SCRIPT = textwrap.dedent("""
  import sys
  import numpy as np
  from tiny_tensor import Tensor
  from tiny_tensor.nn.state import safe_load, safe_save
  p = sys.argv[1]
  safe_save({"big": Tensor(np.arange(1 << 16, dtype=np.float32))}, p)
  old = safe_load(p)
  safe_save({"small": Tensor([1.0])}, p)    # the same path, much smaller (used to truncate under the mapping)
  got = old["big"].to("CPU").numpy()        # used to be SIGBUS
  assert (got == np.arange(1 << 16, dtype=np.float32)).all()
  assert safe_load(p)["small"].tolist() == [1.0]
  print("OK")
""")


def test_safe_save_over_a_mapped_file_is_atomic(tmp_path):
  """safe_save to the same path writes a new file and renames it, and safe_load's tensors never depend on the file
  (test_gguf_loaders covers in-place rewrites): the old tensors keep the old data (a truncate under a map was SIGBUS).
  In a subprocess: a regression must fail, not kill pytest."""
  r = subprocess.run([sys.executable, "-c", CRASH_SCRIPT, str(tmp_path / "m.safetensors")], capture_output=True,
                     text=True, timeout=300)
  assert r.returncode == 0 and r.stdout.strip() == "OK", (r.returncode, r.stderr[-2000:])
  assert sorted(os.listdir(tmp_path)) == ["m.safetensors"]  # no temporary file left behind


def test_safe_save_failure_leaves_the_old_file(tmp_path, monkeypatch):
  p = tmp_path / "m.safetensors"
  safe_save({"a": Tensor([1.0, 2.0])}, p)
  before = p.read_bytes()
  with pytest.raises(ValueError, match="tensor name 5 must be a str"): safe_save({5: Tensor([1.0])}, p)
  def no_space(fd): raise OSError(28, "No space left on device")
  monkeypatch.setattr(os, "fsync", no_space)  # the write fails half way
  with pytest.raises(OSError, match="No space left"): safe_save({"b": Tensor([3.0] * 1000)}, p)
  assert p.read_bytes() == before and sorted(os.listdir(tmp_path)) == ["m.safetensors"]


# ***** GGUF *****
def _gs(s):
  b = s if isinstance(s, bytes) else s.encode()
  return struct.pack("<Q", len(b)) + b


def _gguf(kvs=b"", n_kv=0, infos=b"", n_tensors=0, data=b"", align=32, version=3, head_pad=True):
  out = b"GGUF" + struct.pack("<IQQ", version, n_tensors, n_kv) + kvs + infos
  if head_pad: out += b"\0" * (-len(out) % align)
  return out + data


def _info(name, dims, gtype, offset): return _gs(name) + struct.pack(f"<I{len(dims)}QIQ", len(dims), *dims, gtype,
                                                                      offset)


def _kv(key, vtype, payload): return _gs(key) + struct.pack("<I", vtype) + payload


VALID_GGUF = _gguf(_kv("general.architecture", 8, _gs("llama")) + _kv("n", 4, struct.pack("<I", 7))
                   + _kv("ids", 9, struct.pack("<IQ", 5, 3) + struct.pack("<3i", 1, -2, 3)), 3,
                   _info("a", (3,), 0, 0) + _info("b", (2,), 1, 32), 2,
                   struct.pack("<3f", 1.0, 2.0, 3.0) + b"\0" * 20 + np.array([0.5, -1], np.float16).tobytes())

GGUF_CORPUS = {
  "version_1": (_gguf(version=1), "GGUF version 1 is not supported"),
  "n_tensors_huge": (b"GGUF" + struct.pack("<IQQ", 3, 2**63, 0), "tensor count 9223372036854775808 .* can hold"),
  "n_kv_huge": (b"GGUF" + struct.pack("<IQQ", 3, 0, 2**64 - 1), "metadata count 18446744073709551615"),
  "key_len_huge": (_gguf(_gs("k")[:0] + struct.pack("<Q", 2**62) + b"k", 1), "metadata key length"),
  "key_not_utf8": (_gguf(_kv(b"\xff\xfe", 4, struct.pack("<I", 1)), 1), "metadata key at byte 24 is not valid UTF-8"),
  "value_not_utf8": (_gguf(_kv("k", 8, _gs(b"\xc3")), 1), "value of 'k' at byte .* is not valid UTF-8"),
  "unknown_value_type": (_gguf(_kv("k", 13, b"\0" * 8), 1), "'k': unknown metadata value type 13"),
  "array_len_huge": (_gguf(_kv("k", 9, struct.pack("<IQ", 4, 2**60)), 1), "array length of 'k' 1152921504606846976"),
  "array_bad_item_type": (_gguf(_kv("k", 9, struct.pack("<IQ", 77, 1)), 1), "unknown array item type 77"),
  "nested_arrays": (_gguf(_kv("k", 9, struct.pack("<IQ", 9, 1) * 200), 1), "arrays nested deeper than 8"),
  "duplicate_key": (_gguf(_kv("k", 4, b"\0" * 4) * 2, 2), "metadata key 'k' appears twice"),
  "alignment_0": (_gguf(_kv("general.alignment", 4, struct.pack("<I", 0)), 1), "general.alignment 0 must be a pos"),
  "alignment_3": (_gguf(_kv("general.alignment", 4, struct.pack("<I", 3)), 1, align=3), "alignment 3 must be"),
  "alignment_float": (_gguf(_kv("general.alignment", 6, struct.pack("<f", 32)), 1), "alignment 32.0 must be"),
  "five_dims": (_gguf(infos=_info("t", (1,) * 5, 0, 0), n_tensors=1, data=b"\0" * 4), "'t' has 5 dims; ggml allows"),
  "dims_overflow": (_gguf(infos=_info("t", (2**63, 2**63), 0, 0), n_tensors=1), "run past the data section"),
  "offset_past_end": (_gguf(infos=_info("t", (4,), 0, 64), n_tensors=1, data=b"\0" * 48), "run past the data"),
  "offset_misaligned": (_gguf(infos=_info("t", (1,), 0, 4), n_tensors=1, data=b"\0" * 8), "offset 4 is not a mult"),
  "overlap": (_gguf(infos=_info("a", (16,), 0, 0) + _info("b", (8,), 0, 32), n_tensors=2, data=b"\0" * 64),
              "'a' \\[0, 64\\) and 'b' \\[32, 64\\) overlap"),
  "duplicate_tensor": (_gguf(infos=_info("a", (1,), 0, 0) * 2, n_tensors=2, data=b"\0" * 8), "'a' appears twice"),
  "truncated_data": (VALID_GGUF[:-2], "'b': 4 bytes at offset 32 run past the data section of 34"),
  "not_whole_blocks": (_gguf(infos=_info("q", (16,), 8, 0), n_tensors=1, data=b"\0" * 34),
                       "rows of 16 elements .*not a whole number of Q8_0 blocks of 32"),
}


@pytest.mark.parametrize("dims", [(2**64 - 1, 0), (0, 2**64 - 1), (0, 2**62)])
def test_gguf_zero_element_tensor_with_a_huge_dim(dims):
  # zero bytes of data pass the size checks, but numpy can't make the array: a ValueError naming the tensor (from
  # the parser where the dims overflow ggml's int64 count, else from gguf_load's float32 byte check)
  with pytest.raises(ValueError, match=r"GGUF tensor 't'(: shape \(.*\) needs \d+ bytes .*limit of "
                                       r"9223372036854775807| has dims .* over the 2\*\*63-1 elements)"):
    gguf_load(_gguf(infos=_info("t", dims, 0, 0), n_tensors=1))
  kv, ts = gguf_load(_gguf(infos=_info("t", (2**40, 0), 0, 0), n_tensors=1))  # this one numpy can hold
  assert ts["t"].numpy().shape == np.zeros((0, 2**40), np.float32).shape


@pytest.mark.parametrize("name", sorted(GGUF_CORPUS))
def test_gguf_hostile(name):
  blob, msg = GGUF_CORPUS[name]
  with pytest.raises(ValueError, match=msg): gguf_load(blob)


def test_gguf_every_truncation_is_a_clear_error():
  kv, sd = gguf_load(VALID_GGUF)
  assert kv == {"general.architecture": "llama", "n": 7, "ids": [1, -2, 3]}
  assert sd["a"].tolist() == [1.0, 2.0, 3.0] and sd["b"].tolist() == [0.5, -1.0]
  for n in range(len(VALID_GGUF)):
    with pytest.raises(ValueError, match="truncated|run past|magic|can hold"): gguf_load(VALID_GGUF[:n])


# ***** PyTorch .pth *****
class _Storage:
  def __init__(self, key, numel, dtype=torch.FloatStorage): self.key, self.numel, self.dtype = key, numel, dtype


class _T:
  """A hand-made tensor record: torch's own _rebuild_tensor_v2 with any storage/offset/size/stride."""

  def __init__(self, storage, offset, size, stride): self.args = (storage, offset, size, stride, False, OrderedDict())
  def __reduce__(self): return (torch._utils._rebuild_tensor_v2, self.args)


class _Wrap:
  """An object pickled as a call of `fn(*args)` (an evil global, a tensor subclass, ...)."""

  def __init__(self, fn, *args): self.fn, self.args = fn, args
  def __reduce__(self): return (self.fn, self.args)
  def __call__(self, *args): raise AssertionError("only pickled, never called here")


class _Pickler(pickle.Pickler):
  def persistent_id(self, obj):
    return ("storage", obj.dtype, obj.key, "cpu", obj.numel) if isinstance(obj, _Storage) else None


def _pth(path, obj, storages, pkl=None):
  buf = io.BytesIO()
  _Pickler(buf, protocol=2).dump(obj)
  with zipfile.ZipFile(path, "w") as zf:
    zf.writestr("archive/data.pkl", buf.getvalue() if pkl is None else pkl)
    for key, data in storages.items(): zf.writestr(f"archive/data/{key}", data)
  return path


F4 = np.arange(4, dtype=np.float32).tobytes()
S0 = _Storage("0", 4)


def _marker(tmp_path): return str(tmp_path / "pwned")


PTH_CORPUS = {
  # size/stride/offset that read past the storage (used to read process memory, or segfault)
  "size_past_storage": (lambda t: {"w": _T(S0, 0, (5,), (1,))}, {"0": F4},
                        "reads element 4 of storage '0', which holds 4"),
  "stride_past_storage": (lambda t: {"w": _T(S0, 0, (2, 2), (2**40, 1))}, {"0": F4}, "reads element 1099511627777"),
  "offset_past_storage": (lambda t: {"w": _T(S0, 4, (1,), (1,))}, {"0": F4}, "at offset 4 reads element 4"),
  "negative_stride": (lambda t: {"w": _T(S0, 3, (4,), (-1,))}, {"0": F4}, "stride \\(-1,\\) must be a tuple of no"),
  "negative_offset": (lambda t: {"w": _T(S0, -1, (1,), (1,))}, {"0": F4}, "storage offset -1 must be"),
  "rank_mismatch": (lambda t: {"w": _T(S0, 0, (2, 2), (1,))}, {"0": F4}, "size \\(2, 2\\) and stride \\(1,\\) differ"),
  "size_not_ints": (lambda t: {"w": _T(S0, 0, ("4",), (1,))}, {"0": F4}, "size \\('4',\\) must be a tuple"),
  "storage_not_storage": (lambda t: {"w": _Wrap(torch._utils._rebuild_tensor_v2, 5, 0, (1,), (1,), False, {})}, {},
                          "storage is a int, not a storage record"),
  "missing_storage_file": (lambda t: {"w": _T(_Storage("9", 4), 0, (4,), (1,))}, {"0": F4}, "no file data/9"),
  "storage_shorter_than_numel": (lambda t: {"w": _T(_Storage("0", 100), 0, (4,), (1,))}, {"0": F4},
                                 "declares 100 .* holds 16 bytes"),
  "storage_two_dtypes": (lambda t: {"w": _T(S0, 0, (4,), (1,)), "v": _T(_Storage("0", 4, torch.IntStorage), 0, (4,),
                                                                        (1,))}, {"0": F4}, "used as both"),
  # a tensor inside a class we don't load must not silently vanish
  "tensor_subclass": (lambda t: {"ok": _T(S0, 0, (4,), (1,)),
                                 "sub": _Wrap(torch._tensor._rebuild_from_type_v2, torch._utils._rebuild_tensor_v2,
                                              torch.nn.Buffer, (S0, 0, (4,), (1,), False, OrderedDict()), {})},
                      {"0": F4}, "sub \\(torch._tensor._rebuild_from_type_v2\\)"),
  "tensor_in_custom_class": (lambda t: {"w": _Wrap(OrderedDict.__class__, "X", (), {"t": _T(S0, 0, (4,), (1,))})},
                             {"0": F4}, "w \\(__builtin__.type\\)"),
}


@pytest.mark.parametrize("name", sorted(PTH_CORPUS))
def test_torch_load_hostile(tmp_path, name):
  build, storages, msg = PTH_CORPUS[name]
  p = _pth(tmp_path / f"{name}.pth", build(tmp_path), storages)
  with pytest.raises(ValueError, match=msg): torch_load(p)


def test_torch_load_evil_pickles_run_nothing(tmp_path):
  marker = _marker(tmp_path)
  evil = {"w": _T(S0, 0, (4,), (1,)), "x": _Wrap(os.system, f"touch {marker}"),
          "y": _Wrap(eval, f"open({marker!r}, 'w')"), "z": _Wrap(bytes, 10**12),
          "g": _Wrap(_Wrap(getattr, _Wrap(__import__, "os"), "system"), f"touch {marker}")}
  sd = torch_load(_pth(tmp_path / "evil.pth", evil, {"0": F4}))
  assert not os.path.exists(marker)
  assert list(sd) == ["w"] and sd["w"].tolist() == [0.0, 1.0, 2.0, 3.0]


@pytest.mark.parametrize("pkl,msg", [
  (b"\x80\x02}q\x00.", None),                                        # an empty dict: valid, no tensors
  (b"\x80\x02", "corrupt PyTorch checkpoint \\(archive/data.pkl: .*before seeing STOP"),  # truncated
  (b"\x80\x02cfoo\nbar\nq\x00)\x81q\x01h\x05.", "corrupt"),             # a memo index that isn't there
  (b"\x80\x02X\x03\x00\x00\x00abcQ.", "corrupt"),                     # a persistent id that is a str
  (b"\x80\x02(X\x07\x00\x00\x00storageq\x00tQ.", "corrupt.*unknown persistent id"),
  (b"\x80\x02" + b"]q\x00(" * 50000 + b"e" * 50000 + b".", None),     # deep nesting: iterative, no RecursionError
])
def test_torch_load_bad_pickles(tmp_path, pkl, msg):
  p = _pth(tmp_path / "m.pth", None, {}, pkl=pkl)
  if msg is None: assert torch_load(p) == {}
  else:
    with pytest.raises(ValueError, match=msg): torch_load(p)


class SubTensor(torch.Tensor):
  """A tensor subclass, as torch.save writes it (torch._tensor._rebuild_from_type_v2 naming this class)."""


def test_torch_load_refuses_a_real_tensor_subclass(tmp_path):
  torch.save({"w": torch.zeros(2), "s": torch.ones(3).as_subclass(SubTensor)}, tmp_path / "sub.pth")
  with pytest.raises(ValueError, match="classes torch_load doesn't load: s \\(torch._tensor._rebuild_from_type_v2"):
    torch_load(tmp_path / "sub.pth")


def test_torch_load_real_checkpoint_still_loads(tmp_path):
  sd = {"w": torch.arange(12, dtype=torch.float32).reshape(3, 4).t(), "p": torch.nn.Parameter(torch.ones(2)),
        "nested": {"list": [torch.tensor([1, 2], dtype=torch.int64)]}, "meta": {"epoch": 3, "name": "x"}}
  torch.save(sd, tmp_path / "m.pth")
  ours = torch_load(tmp_path / "m.pth")
  assert sorted(ours) == ["nested.list.0", "p", "w"]
  np.testing.assert_array_equal(ours["w"].numpy(), sd["w"].numpy())
  assert ours["p"].tolist() == [1.0, 1.0] and ours["nested.list.0"].tolist() == [1, 2]


# ***** random byte flips: only ValueError, never a crash or another exception *****
def _flips(blob, seed, n):
  rng = random.Random(seed)
  for _ in range(n):
    b = bytearray(blob)
    for _ in range(rng.randint(1, 4)): b[rng.randrange(len(b))] = rng.randrange(256)
    yield bytes(b)


def test_byte_flips_never_crash(tmp_path):
  safe_save({"a": Tensor([1.0, 2.0]), "m": Tensor([True, False]), "i": Tensor([[1, 2], [3, 4]])}, tmp_path / "v.st",
            metadata={"k": "v"})
  st = (tmp_path / "v.st").read_bytes()
  sd = {"w": torch.arange(6, dtype=torch.float32).reshape(2, 3), "b": torch.tensor([1, 2], dtype=torch.int64)}
  torch.save(sd, tmp_path / "v.pth")
  pth = (tmp_path / "v.pth").read_bytes()
  ok = bad = 0
  for blob in _flips(st, 1, 80):
    (tmp_path / "f.st").write_bytes(blob)
    for src in (tmp_path / "f.st", Tensor(np.frombuffer(blob, np.uint8).copy())):
      try: [t.to("CPU").numpy() for t in safe_load(src).values()]
      except ValueError: bad += 1
      else: ok += 1
  for blob in _flips(VALID_GGUF, 2, 300):
    try: gguf_load(blob)
    except ValueError: bad += 1
    else: ok += 1
  for blob in _flips(pth, 3, 60):
    (tmp_path / "f.pth").write_bytes(blob)
    try: torch_load(tmp_path / "f.pth")
    except ValueError: bad += 1
    else: ok += 1
  assert ok > 0 and bad > 0, (ok, bad)  # both outcomes happen: the flips hit headers and data
