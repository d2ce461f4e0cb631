"""torch_load on hostile .pth files (issue #36): truncated archives named as such, storages checked against their
zip members, a memory budget that refuses deflate bombs and huge stride-0 views before allocating, a pickle that
can't size a memo table to gigabytes, and a seeded mutation fuzz over a real torch.save file where every outcome is
a load equal to torch.load(weights_only=True) or a ValueError. torch is the reference writer and reader."""
import argparse
import io
import os
import pickle
import pickletools
import random
import struct
import subprocess
import sys
import textwrap
import time
import tracemalloc
import zipfile
from collections import OrderedDict

import numpy as np
import pytest
import torch

from tiny_tensor.nn.state import torch_load


class _Storage:
  def __init__(self, key, numel, dtype=torch.FloatStorage): self.key, self.numel, self.dtype = key, numel, dtype


class _T:
  """A tensor record as torch writes it: torch._utils._rebuild_tensor_v2(storage, offset, size, stride, ...)."""

  def __init__(self, storage, offset, size, stride): self.args = (storage, offset, size, stride, False, OrderedDict())
  def __reduce__(self): return (torch._utils._rebuild_tensor_v2, self.args)


class _Pickler(pickle.Pickler):
  def persistent_id(self, obj):
    return ("storage", obj.dtype, obj.key, "cpu", obj.numel) if isinstance(obj, _Storage) else None


def _pkl(obj):
  buf = io.BytesIO()
  _Pickler(buf, protocol=2).dump(obj)
  return buf.getvalue()


def _save(tmp_path, sd, name="m.pth"):
  torch.save(sd, tmp_path / name)
  return tmp_path / name


def _flat_torch(obj, pre=""):
  """torch.load's result flattened to {dotted name: numpy array}, the way torch_load names tensors."""
  out, stack = {}, [(obj, pre)]
  while stack:
    x, p = stack.pop()
    if isinstance(x, torch.Tensor): out[p.strip(".")] = x.detach().numpy()
    elif isinstance(x, dict): stack.extend((v, f"{p}{k}.") for k, v in x.items())
    elif isinstance(x, (list, tuple)): stack.extend((v, f"{p}{i}.") for i, v in enumerate(x))
  return out


# ***** errors that name the real problem *****
def test_truncated_archive_is_named_truncated_not_legacy(tmp_path):
  blob = _save(tmp_path, {"w": torch.arange(64, dtype=torch.float32)}).read_bytes()
  for cut in (len(blob) // 2, len(blob) - 30, 40):
    (tmp_path / "t.pth").write_bytes(blob[:cut])
    with pytest.raises(ValueError, match="truncated or corrupt zip archive") as e: torch_load(tmp_path / "t.pth")
    assert "legacy" not in str(e.value)


def test_legacy_format_is_named_legacy(tmp_path):
  torch.save({"w": torch.zeros(2)}, tmp_path / "old.pth", _use_new_zipfile_serialization=False)
  with pytest.raises(ValueError, match="the pre-1.6 legacy format is not supported"): torch_load(tmp_path / "old.pth")
  (tmp_path / "junk.pth").write_bytes(b"GGUF\x03\x00\x00\x00")
  with pytest.raises(ValueError, match="starts with b'GGUF"): torch_load(tmp_path / "junk.pth")


def test_missing_data_pkl_and_missing_record_name_the_member(tmp_path):
  with zipfile.ZipFile(tmp_path / "nopkl.pth", "w") as zf: zf.writestr("archive/version", b"3\n")
  with pytest.raises(ValueError, match=r"without a data.pkl member .*'archive/version'"):
    torch_load(tmp_path / "nopkl.pth")
  src = _save(tmp_path, {"w": torch.ones(3)})
  with zipfile.ZipFile(src) as zin, zipfile.ZipFile(tmp_path / "norec.pth", "w") as zout:
    for info in zin.infolist():
      if not info.filename.endswith("data/0"): zout.writestr(info, zin.read(info))
  with pytest.raises(ValueError, match=r"storage '0' has no file data/0 .*zip member 'm/data/0' is missing"):
    torch_load(tmp_path / "norec.pth")


def test_storage_record_must_match_its_declared_size(tmp_path):
  # torch writes whole storages: a record longer than numel * itemsize is as corrupt as a shorter one
  with zipfile.ZipFile(tmp_path / "long.pth", "w") as zf:
    zf.writestr("archive/data.pkl", _pkl({"w": _T(_Storage("0", 2), 0, (2,), (1,))}))
    zf.writestr("archive/data/0", np.arange(4, dtype=np.float32).tobytes())
  with pytest.raises(ValueError, match=r"declares 2 .* \(8 bytes\) but data/0 holds 16 bytes"):
    torch_load(tmp_path / "long.pth")


def test_memo_index_cannot_size_a_huge_table(tmp_path):
  # LONG_BINPUT 2**31-1: the C unpickler would grow its memo table to 2**32 slots (32 GB) for 5 bytes of pickle
  with zipfile.ZipFile(tmp_path / "memo.pth", "w") as zf:
    zf.writestr("archive/data.pkl", b"\x80\x02}r\xff\xff\xff\x7f.")
  with pytest.raises(ValueError, match="memo index 2147483647 at byte 3 is past the 3 opcodes"):
    torch_load(tmp_path / "memo.pth")


@pytest.mark.parametrize("bad", [-1, 1.5, "1e9", True])
def test_max_bytes_must_be_a_non_negative_int(tmp_path, bad):
  with pytest.raises(ValueError, match=r"max_bytes=.* must be a non-negative int"):
    torch_load(_save(tmp_path, {"w": torch.ones(2)}), max_bytes=bad)


# ***** the memory budget *****
def test_expanded_view_within_the_budget_loads_like_torch(tmp_path):
  sd = {"e": torch.arange(3, dtype=torch.float32).expand(4, 3), "s": torch.tensor(2.0).expand(5)}
  ours, ref = torch_load(_save(tmp_path, sd)), _flat_torch(torch.load(tmp_path / "m.pth", weights_only=True))
  assert sorted(ours) == sorted(ref)
  for k, v in ref.items(): np.testing.assert_array_equal(ours[k].numpy(), v)


def test_budget_is_explicit_and_named(tmp_path):
  p = _save(tmp_path, {"w": torch.arange(1000, dtype=torch.float32)})
  np.testing.assert_array_equal(torch_load(p, max_bytes=10_000)["w"].numpy(), np.arange(1000, dtype=np.float32))
  with pytest.raises(ValueError, match="over torch_load's memory budget max_bytes=3000"): torch_load(p, max_bytes=3000)


PEAK_SCRIPT = textwrap.dedent("""
  import resource, sys
  from tiny_tensor.nn.state import torch_load
  before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
  try:
    torch_load(sys.argv[1])
    print("LOADED")
  except ValueError as e: print("ValueError:", e)
  print("PEAK_GROWTH_KB", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before)
""")


def _load_in_subprocess(path):
  env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
  r = subprocess.run([sys.executable, "-c", PEAK_SCRIPT, str(path)], capture_output=True, text=True, timeout=120,
                     env=env)
  assert r.returncode == 0, r.stderr[-2000:]
  return r.stdout, int(r.stdout.split("PEAK_GROWTH_KB")[1])


def test_stride0_checkpoint_is_refused_before_it_allocates(tmp_path):
  # 1.5 KB on disk, a 1 GiB tensor once materialised (it used to peak at 3.1 GB)
  p = _save(tmp_path, {"w": torch.zeros(1).expand(2**28)})
  assert p.stat().st_size < 4096
  out, growth_kb = _load_in_subprocess(p)
  assert "ValueError:" in out and "over torch_load's memory budget max_bytes=67108864" in out, out
  assert "size (268435456,), stride (0,)" in out, out
  assert growth_kb < 100 * 1024, growth_kb


def test_deflate_bomb_is_refused_before_it_inflates(tmp_path):
  n = 2**25  # 128 MiB of float32 zeros that deflate to ~130 KB
  p = tmp_path / "bomb.pth"
  with zipfile.ZipFile(p, "w", compression=zipfile.ZIP_DEFLATED) as zf:
    zf.writestr("archive/data.pkl", _pkl({"w": _T(_Storage("0", n), 0, (n,), (1,))}))
    with zf.open("archive/data/0", "w", force_zip64=True) as f:
      for _ in range(n * 4 // (1 << 20)): f.write(bytes(1 << 20))
  assert p.stat().st_size < 1 << 20
  out, growth_kb = _load_in_subprocess(p)
  assert "zip member 'archive/data/0' needs 134217728 bytes, over torch_load's memory budget" in out, out
  assert growth_kb < 100 * 1024, growth_kb


# ***** seeded mutation fuzz over a real torch.save file *****
def _rezip(members, compression=zipfile.ZIP_STORED):
  buf = io.BytesIO()
  with zipfile.ZipFile(buf, "w", compression=compression) as zf:
    for name, data in members: zf.writestr(name, data)
  return buf.getvalue()


def _pickle_edit(pkl, rng):
  """data.pkl with one opcode replaced by another opcode byte, or one of its argument bytes changed."""
  ops = list(pickletools.genops(pkl))
  _, _, pos = ops[rng.randrange(len(ops))]
  b = bytearray(pkl)
  if rng.random() < 0.5: b[pos] = ord(rng.choice(pickletools.opcodes).code)
  elif pos + 1 < len(b): b[pos + 1] = rng.randrange(256)
  return bytes(b)


def _mutate(blob, rng):
  with zipfile.ZipFile(io.BytesIO(blob)) as zf: members = [(i.filename, zf.read(i)) for i in zf.infolist()]
  kind = rng.randrange(9)
  b = bytearray(blob)
  if kind == 0:    # flip bytes
    for _ in range(rng.randint(1, 4)): b[rng.randrange(len(b))] = rng.randrange(256)
  elif kind == 1:  # insert bytes
    i = rng.randrange(len(b))
    b[i:i] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
  elif kind == 2:  # delete a span
    i = rng.randrange(len(b))
    del b[i:i + rng.randint(1, 64)]
  elif kind == 3:  # drop a member
    del members[rng.randrange(len(members))]
    return _rezip(members)
  elif kind == 4:  # truncate or extend a member
    i = rng.randrange(len(members))
    name, data = members[i]
    members[i] = (name, data[:rng.randrange(len(data) + 1)] if rng.random() < 0.5 else data + bytes(rng.randint(1, 9)))
    return _rezip(members)
  elif kind == 5:  # rename or swap members
    i, j = rng.randrange(len(members)), rng.randrange(len(members))
    if rng.random() < 0.5: members[i] = (members[i][0] + "x", members[i][1])
    else: members[i], members[j] = (members[i][0], members[j][1]), (members[j][0], members[i][1])
    return _rezip(members)
  elif kind == 6:  # re-compress (deflate), then flip a byte of the compressed stream
    z = bytearray(_rezip(members, zipfile.ZIP_DEFLATED))
    z[rng.randrange(len(z) // 2)] = rng.randrange(256)
    return bytes(z)
  else:            # pickle opcode edits
    i = next(k for k, (n, _) in enumerate(members) if n.endswith("data.pkl"))
    members[i] = (members[i][0], _pickle_edit(members[i][1], rng))
    return _rezip(members)
  return bytes(b)


def test_mutation_fuzz_pth(tmp_path):
  sd = {"w": torch.arange(6, dtype=torch.float32).reshape(2, 3), "b": torch.tensor([1, -2], dtype=torch.int64),
        "h": torch.tensor([0.5, 1.5, -2.0], dtype=torch.float16), "nested": {"t": torch.arange(4.0).reshape(2, 2).t()}}
  base = _save(tmp_path, sd).read_bytes()
  ref = _flat_torch(torch.load(io.BytesIO(base), weights_only=True))
  ours = torch_load(tmp_path / "m.pth")
  assert sorted(ours) == sorted(ref) and all(np.array_equal(ours[k].numpy(), v) for k, v in ref.items())
  rng = random.Random(36)
  outcomes = {"loaded": 0, "compared": 0, "refused": 0}
  tracemalloc.start()
  try:
    for case in range(300):
      blob = _mutate(base, rng)
      (tmp_path / "f.pth").write_bytes(blob)
      tracemalloc.reset_peak()
      t0 = time.perf_counter()
      try: got = {k: v.numpy() for k, v in torch_load(tmp_path / "f.pth").items()}
      except ValueError: outcomes["refused"] += 1
      else:
        outcomes["loaded"] += 1
        try: theirs = _flat_torch(torch.load(io.BytesIO(blob), weights_only=True))
        except Exception: theirs = None  # torch refusing a file we load is allowed; only a disagreement is a bug
        if theirs is not None:
          outcomes["compared"] += 1
          assert sorted(got) == sorted(theirs), (case, sorted(got), sorted(theirs))
          for k, v in theirs.items():
            assert got[k].dtype == v.dtype and np.array_equal(got[k], v, equal_nan=v.dtype.kind == "f"), (case, k)
      assert time.perf_counter() - t0 < 5, f"case {case} took {time.perf_counter() - t0:.1f}s"
      assert tracemalloc.get_traced_memory()[1] < 100 << 20, (case, tracemalloc.get_traced_memory())
  finally: tracemalloc.stop()
  assert outcomes["refused"] > 50 and outcomes["compared"] > 20, outcomes


def _amplifying_pickle(callee: bytes, items: bytes, reps: int, spread: bool) -> bytes:
  """A pickle that builds one tuple of `items`, then calls `callee` (a GLOBAL) `reps` times, on the tuple (or, with
  `spread`, on its items as the arguments), and keeps every result in a list: each call costs 6 bytes of pickle and
  copies the whole tuple."""
  args = b"h\x02" if spread else b"h\x03"
  return (b"\x80\x02c" + callee + b"q\x01" + b"0"            # GLOBAL fn -> memo 1
          + b"(" + items + b"tq\x02\x85q\x03" + b"0"           # (items...) -> memo 2, ((items...),) -> memo 3
          + b"](" + (b"h\x01" + args + b"R") * reps + b"e.")    # [fn(*args) for each rep]


@pytest.mark.parametrize("callee", [b"__builtin__\nlist\n", b"collections\nOrderedDict\n", b"mymod\nAnything\n"])
def test_pickled_calls_cannot_amplify_memory(tmp_path, callee):
  # < 100 KB of pickle asking for 2000 copies of a 20000-element list / 2000-entry dict / 20000-argument record:
  # hundreds of MB if each copy were free
  if b"Ordered" in callee: items = b"".join(b"M" + struct.pack("<H", i) + b"K\x00\x86" for i in range(2000))
  else: items = b"K\x00" * 20000
  p = tmp_path / "amp.pth"
  with zipfile.ZipFile(p, "w", compression=zipfile.ZIP_DEFLATED) as zf:
    zf.writestr("archive/data.pkl", _amplifying_pickle(callee, items, 2000, spread=b"mymod" in callee))
  assert p.stat().st_size < 100_000
  out, growth_kb = _load_in_subprocess(p)
  assert "over torch_load's memory budget max_bytes=67108864" in out and "a pickled call" in out, out
  assert growth_kb < 100 * 1024, growth_kb


class _Evil:
  def __init__(self, fn, *args): self.fn, self.args = fn, args
  def __reduce__(self): return (self.fn, self.args)


@pytest.mark.parametrize("evil", [_Evil(os.system, "true"), _Evil(eval, "1+1"), _Evil(getattr, 1, "real"),
                                  _Evil(bytes, 10**12), argparse.Namespace(lr=0.1)])
def test_weights_only_refuses_any_other_global_like_torch(tmp_path, evil):
  p = tmp_path / "e.pth"
  torch.save({"w": torch.arange(3.0), "x": evil}, p)
  with pytest.raises(pickle.UnpicklingError): torch.load(p, weights_only=True)  # the reference refuses it too
  with pytest.raises(ValueError, match=r"weights_only=True refuses the global \w+\.\w+; allowed: torch._utils"):
    torch_load(p, weights_only=True)
  np.testing.assert_array_equal(torch_load(p)["w"].numpy(), np.arange(3.0, dtype=np.float32))  # default: recorded
  torch.save({"w": torch.arange(3.0), "o": OrderedDict(a=torch.ones(2))}, p)  # only allowed globals: both load it
  ref = _flat_torch(torch.load(p, weights_only=True))
  ours = torch_load(p, weights_only=True)
  assert sorted(ours) == sorted(ref) and all(np.array_equal(ours[k].numpy(), v) for k, v in ref.items())
