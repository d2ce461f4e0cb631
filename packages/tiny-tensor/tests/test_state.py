"""nn.state: state dicts, load_state_dict errors, safetensors roundtrip, torch_load, gguf_load."""
import json
import struct

import numpy as np
import pytest

from tiny_uop import dtypes
from tiny_tensor import Tensor, nn
from tiny_tensor.nn.state import (get_parameters, get_state_dict, gguf_load, load_state_dict, safe_load,
                                  safe_load_metadata, safe_save, torch_load)


class Net:
  def __init__(self):
    self.conv = nn.Conv2d(1, 2, 3)
    self.bn = nn.BatchNorm(2)
    self.layers = [nn.Linear(4, 3), nn.Linear(3, 2, bias=False)]
    self.shared = self.layers[0].weight  # the same tensor under two names


def test_state_dict_names_and_parameters():
  net = Net()
  sd = get_state_dict(net)
  assert sorted(sd) == sorted(["conv.weight", "conv.bias", "bn.weight", "bn.bias", "bn.num_batches_tracked",
                               "bn.running_mean", "bn.running_var", "layers.0.weight", "layers.0.bias",
                               "layers.1.weight", "shared"])
  params = get_parameters(net)
  assert len(params) == len(sd) - 1 and len({id(p) for p in params}) == len(params)


def test_load_state_dict_copies_and_casts():
  net = Net()
  rng = np.random.default_rng(0)
  src = {k: rng.standard_normal(tuple(v.shape)).astype(np.float64) for k, v in get_state_dict(net).items()}
  src["shared"] = src["layers.0.weight"]  # one tensor under two names
  net.layers[0].weight.realize()  # a realized tensor is written in place, a lazy one replaced: test both
  load_state_dict(net, {k: Tensor(v) for k, v in src.items()})
  for k, v in get_state_dict(net).items():
    assert v.dtype == (dtypes.int64 if k.endswith("num_batches_tracked") else dtypes.float32)
    np.testing.assert_allclose(v.numpy(), src[k].astype(v.numpy().dtype), rtol=1e-6)


def test_load_state_dict_errors_name_the_keys():
  net = Net()
  sd = {k: Tensor.zeros(*v.shape) for k, v in get_state_dict(net).items()}
  del sd["conv.bias"]
  sd["extra.weight"] = Tensor.zeros(2)
  with pytest.raises(KeyError, match=r"missing keys .*\['conv.bias'\].*unexpected keys .*\['extra.weight'\]"):
    load_state_dict(net, sd)
  load_state_dict(net, sd, strict=False)  # skips both
  sd["conv.bias"] = Tensor.zeros(5)
  with pytest.raises(ValueError, match=r"conv.bias: model \(2,\), state_dict \(5,\)"):
    load_state_dict(net, sd, strict=False)


def test_safetensors_roundtrip(tmp_path):
  rng = np.random.default_rng(1)
  tensors = {"a": Tensor(rng.standard_normal((3, 4)).astype(np.float32)),
             "b.c": Tensor(rng.integers(-100, 100, (5,)).astype(np.int64)),
             "half": Tensor(rng.standard_normal((2, 2)).astype(np.float16)),
             "u8": Tensor(np.arange(7, dtype=np.uint8)),
             "scalar": Tensor(np.array(3.5, dtype=np.float32))}
  fn = tmp_path / "m.safetensors"
  safe_save(tensors, fn, metadata={"format": "pt"})
  # the file follows the format: u64 header size, JSON, then data
  raw = fn.read_bytes()
  n = struct.unpack("<Q", raw[:8])[0]
  header = json.loads(raw[8:8 + n])
  assert header["a"] == {"dtype": "F32", "shape": [3, 4], "data_offsets": [0, 48]} and (8 + n) % 8 == 0
  assert safe_load_metadata(fn) == {"format": "pt"}
  loaded = safe_load(fn)
  assert sorted(loaded) == sorted(tensors)
  for k, t in tensors.items():
    assert loaded[k].dtype == t.dtype and loaded[k].shape == t.shape
    np.testing.assert_array_equal(loaded[k].to("CPU").numpy(), t.numpy())
  assert loaded["a"].device == "CPU"  # a view of one host copy of the file, not of the file (no DISK mapping)
  np.testing.assert_allclose((loaded["a"].to("CPU") * 2).numpy(), tensors["a"].numpy() * 2)


def test_safetensors_bfloat16_and_model_roundtrip(tmp_path):
  net, net2 = Net(), Net()
  safe_save(get_state_dict(net), tmp_path / "net.safetensors")
  load_state_dict(net2, safe_load(tmp_path / "net.safetensors"))
  for (k, a), (_, b) in zip(get_state_dict(net).items(), get_state_dict(net2).items()):
    np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=k)
  x = Tensor([1.0, -2.5, 3.0]).cast(dtypes.bfloat16)
  safe_save({"x": x}, tmp_path / "bf.safetensors")
  y = safe_load(tmp_path / "bf.safetensors")["x"]
  assert y.dtype == dtypes.bfloat16 and y.to("CPU").float().tolist() == [1.0, -2.5, 3.0]


def test_safetensors_bad_file(tmp_path):
  (tmp_path / "bad").write_bytes(struct.pack("<Q", 5) + b"{nope")
  with pytest.raises(ValueError, match="bad JSON header"): safe_load(tmp_path / "bad")


def test_torch_load(tmp_path):
  torch = pytest.importorskip("torch")
  tm = torch.nn.Sequential(torch.nn.Conv2d(1, 2, 3), torch.nn.BatchNorm2d(2), torch.nn.Linear(4, 3))
  sd = tm.state_dict()
  sd["extra.half"] = torch.arange(6, dtype=torch.float16).reshape(2, 3)
  sd["extra.strided"] = torch.arange(12, dtype=torch.float32).reshape(3, 4).t()  # non-contiguous view
  sd["extra.offset"] = torch.arange(10, dtype=torch.int32)[3:7]  # a view at a storage offset
  sd["extra.bf16"] = torch.tensor([1.5, -2.0], dtype=torch.bfloat16)
  torch.save(sd, tmp_path / "m.pth")
  ours = torch_load(tmp_path / "m.pth")
  assert sorted(ours) == sorted(sd)
  for k, v in sd.items():
    ref = v.float().numpy() if v.dtype == torch.bfloat16 else v.numpy()
    got = ours[k].float().numpy() if v.dtype == torch.bfloat16 else ours[k].numpy()
    assert got.shape == ref.shape, k
    np.testing.assert_array_equal(got, ref, err_msg=k)
  assert ours["1.num_batches_tracked"].dtype == dtypes.int64
  (tmp_path / "legacy.pth").write_bytes(b"\x80\x02not a zip")
  with pytest.raises(ValueError, match="not a zip-format"): torch_load(tmp_path / "legacy.pth")


# ***** GGUF: a writer written here (independently of the loader), with numpy quantizers *****
def _gguf_str(s):
  b = s.encode()
  return struct.pack("<Q", len(b)) + b


def _q8_0(x):
  blocks = x.reshape(-1, 32)
  d = (np.abs(blocks).max(axis=1) / 127).astype(np.float16)
  q = np.round(blocks / np.where(d == 0, 1, d.astype(np.float32))[:, None]).astype(np.int8)
  deq = (d.astype(np.float32)[:, None] * q).reshape(-1)
  return b"".join(d[i].tobytes() + q[i].tobytes() for i in range(len(blocks))), deq


def _q4_0(x):
  blocks = x.reshape(-1, 32)
  d = (blocks[np.arange(len(blocks)), np.abs(blocks).argmax(axis=1)] / -8).astype(np.float16)
  inv = np.where(d == 0, 0, 1 / np.where(d == 0, 1, d.astype(np.float32)))
  q = np.clip(np.floor(blocks * inv[:, None] + 8.5), 0, 15).astype(np.uint8)
  packed = q[:, :16] | (q[:, 16:] << 4)  # element j in the low nibble of byte j, element j+16 in the high
  deq = (d.astype(np.float32)[:, None] * (q.astype(np.float32) - 8)).reshape(-1)
  return b"".join(d[i].tobytes() + packed[i].tobytes() for i in range(len(blocks))), deq


def _q4_1(x):
  blocks = x.reshape(-1, 32)
  lo, hi = blocks.min(axis=1), blocks.max(axis=1)
  d, m = ((hi - lo) / 15).astype(np.float16), lo.astype(np.float16)
  df = d.astype(np.float32)
  scaled = (blocks - m.astype(np.float32)[:, None]) / np.where(df == 0, 1, df)[:, None]
  q = np.clip(np.round(scaled), 0, 15).astype(np.uint8)
  packed = q[:, :16] | (q[:, 16:] << 4)
  deq = (df[:, None] * q + m.astype(np.float32)[:, None]).reshape(-1)
  return b"".join(d[i].tobytes() + m[i].tobytes() + packed[i].tobytes() for i in range(len(blocks))), deq


def _write_gguf(path, kvs, tensors, align=32):
  out = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kvs))
  for k, (vtype, v) in kvs.items():
    out += _gguf_str(k) + struct.pack("<I", vtype)
    if vtype == 8: out += _gguf_str(v)
    elif vtype == 9: out += struct.pack("<IQ", 5, len(v)) + b"".join(struct.pack("<i", x) for x in v)
    else: out += struct.pack({4: "<I", 6: "<f", 10: "<Q", 7: "<?"}[vtype], v)
  data, infos = b"", b""
  for name, (gtype, shape, blob) in tensors.items():
    data += b"\0" * (-len(data) % align)
    infos += _gguf_str(name) + struct.pack("<I", len(shape)) + b"".join(struct.pack("<Q", d) for d in reversed(shape))
    infos += struct.pack("<IQ", gtype, len(data))
    data += blob
  out += infos
  out += b"\0" * (-len(out) % align)
  path.write_bytes(out + data)


def test_gguf_load(tmp_path):
  rng = np.random.default_rng(5)
  f32 = rng.standard_normal((3, 5)).astype(np.float32)
  f16 = rng.standard_normal((4, 8)).astype(np.float16)
  q8_blob, q8 = _q8_0(rng.standard_normal(64).astype(np.float32))
  q40_blob, q40 = _q4_0(rng.standard_normal(96).astype(np.float32))
  q41_blob, q41 = _q4_1(rng.standard_normal(64).astype(np.float32))
  kvs = {"general.architecture": (8, "llama"), "llama.block_count": (4, 2), "llama.rope.freq_base": (6, 10000.0),
         "tokenizer.ids": (9, [1, -2, 3]), "general.flag": (7, True)}
  _write_gguf(tmp_path / "m.gguf", kvs, {
    "f32": (0, (3, 5), f32.tobytes()), "f16": (1, (4, 8), f16.tobytes()), "q8": (8, (2, 32), q8_blob),
    "q40": (2, (3, 32), q40_blob), "q41": (3, (64,), q41_blob)})
  kv, sd = gguf_load(tmp_path / "m.gguf")
  assert kv == {"general.architecture": "llama", "llama.block_count": 2, "llama.rope.freq_base": 10000.0,
                "tokenizer.ids": [1, -2, 3], "general.flag": True}
  np.testing.assert_array_equal(sd["f32"].numpy(), f32)
  np.testing.assert_array_equal(sd["f16"].numpy(), f16.astype(np.float32))
  np.testing.assert_array_equal(sd["q8"].numpy(), q8.reshape(2, 32))
  np.testing.assert_array_equal(sd["q40"].numpy(), q40.reshape(3, 32))
  np.testing.assert_allclose(sd["q41"].numpy(), q41, rtol=1e-6, atol=1e-6)
  # quantization error stays within half a step of each block
  assert np.abs(sd["q40"].numpy().reshape(-1)).max() > 0
  with pytest.raises(ValueError, match="magic"): gguf_load(b"GGML" + b"\0" * 20)
  _write_gguf(tmp_path / "bad.gguf", {}, {"k": (10, (256,), b"\0" * 84)})  # Q2_K: not decoded here
  with pytest.raises(ValueError, match="ggml type 10, which is not supported; supported: F32"):
    gguf_load(tmp_path / "bad.gguf")
