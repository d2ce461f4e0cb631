"""Host, NULL and DISK memory through `tiny_uop.device.Buffer`: roundtrips, views, LRU reuse, bounds, zero-copy."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tiny_uop.device import Buffer, BufferSpec
from tiny_uop.dtype import dtypes
from tiny_uop.plugins import Device

from tiny_runtime_cpu.memory import ALIGN, MMAP_THRESHOLD, HostMem


DTYPES = [(dtypes.float32, np.float32), (dtypes.int8, np.int8), (dtypes.uint64, np.uint64),
          (dtypes.float16, np.float16), (dtypes.bool, np.bool_)]


@pytest.mark.parametrize("dev", ["CPU", "PYTHON"])
@pytest.mark.parametrize("dtype,npdt", DTYPES)
def test_roundtrip(dev, dtype, npdt):
  rng = np.random.default_rng(0)
  a = (rng.random(1000) * 100).astype(npdt)
  b = Buffer(dev, 1000, dtype).copyin(memoryview(a))
  assert np.array_equal(b.numpy(), a)
  out = np.empty_like(a)
  b.copyout(memoryview(out))
  assert np.array_equal(out, a)


@pytest.mark.parametrize("nbytes", [0, 1, 100, 4096, MMAP_THRESHOLD, MMAP_THRESHOLD + 3])
def test_alignment_and_zeroed(nbytes):
  Device["CPU"].allocator.free_cache()  # a fresh block, not one the LRU cache kept (those hold old data)
  b = Buffer("CPU", nbytes, dtypes.uint8).allocate()
  mem = b._buf
  assert isinstance(mem, HostMem) and mem.addr % ALIGN == 0 and mem.nbytes == nbytes
  assert bytes(b.as_buffer()) == bytes(nbytes)


def test_as_buffer_is_zero_copy():
  b = Buffer("CPU", 16, dtypes.int32).copyin(memoryview(np.arange(16, dtype=np.int32)))
  mv = b.as_buffer(allow_zero_copy=True)
  mv.cast("i")[3] = -7
  assert b.numpy()[3] == -7


def test_views_share_memory():
  base = Buffer("CPU", 64, dtypes.float32).copyin(memoryview(np.arange(64, dtype=np.float32)))
  v = base.view(8, dtypes.float32, offset=16 * 4)
  assert np.array_equal(v.numpy(), np.arange(16, 24, dtype=np.float32))
  v.copyin(memoryview(np.full(8, -1, dtype=np.float32)))
  want = np.arange(64, dtype=np.float32)
  want[16:24] = -1
  assert np.array_equal(base.numpy(), want)
  # a view of a view, reinterpreting the bytes
  vv = v.view(4, dtypes.int32, offset=8)
  assert vv.numpy().tolist() == [np.float32(-1).view(np.int32)] * 4
  assert vv._buf.addr == base._buf.addr + 16 * 4 + 8


def test_views_out_of_bounds_raise():
  base = Buffer("CPU", 10, dtypes.float32)
  with pytest.raises(ValueError, match="outside"): base.view(4, dtypes.float32, offset=28)
  with pytest.raises(ValueError, match="outside"): base.view(1, dtypes.float32, offset=-4)
  base.allocate()
  alloc = Device["CPU"].allocator
  with pytest.raises(ValueError, match="outside"): alloc._offset(base._buf, 8, 36)
  with pytest.raises(ValueError, match="outside"): alloc._offset(base._buf, 4, -1)


def test_copies_out_of_bounds_raise():
  b = Buffer("CPU", 10, dtypes.float32)
  with pytest.raises(ValueError, match="sizes must match"): b.copyin(memoryview(np.zeros(11, np.float32)))
  with pytest.raises(ValueError, match="sizes must match"): b.copyin(memoryview(np.zeros(9, np.float32)))
  with pytest.raises(ValueError, match="sizes must match"): b.copyout(memoryview(np.zeros(20, np.float32)))
  v = b.view(2, dtypes.float32, offset=32)
  with pytest.raises(ValueError, match="sizes must match"): v.copyin(memoryview(np.zeros(3, np.float32)))


def test_lru_reuse():
  alloc = Device["CPU"].allocator
  alloc.free_cache()
  m1 = alloc.alloc(1234)
  alloc.free(m1, 1234)
  assert alloc.alloc(1234) is m1           # same size: reused
  m2 = alloc.alloc(1234)
  assert m2 is not m1                      # cache empty again: a new block
  alloc.free(m2, 1234, BufferSpec(nolru=True))
  assert alloc.alloc(1234) is not m2       # nolru blocks are not kept
  b = Buffer("CPU", 77, dtypes.uint8).allocate()
  mem = b._buf
  del b
  assert alloc.alloc(77) is mem            # Buffer.__del__ returns it to the cache


def test_external_ptr():
  host = Buffer("CPU", 8, dtypes.float32).copyin(memoryview(np.arange(8, dtype=np.float32)))
  ext = Buffer("CPU", 4, dtypes.float32, options=BufferSpec(external_ptr=host._buf.addr + 16)).allocate()
  assert np.array_equal(ext.numpy(), [4, 5, 6, 7])


# ***** NULL *****
def test_null_buffers_hold_nothing():
  b = Buffer("NULL", 1 << 40, dtypes.float32).allocate()  # 4 TiB: free
  small = Buffer("NULL", 4, dtypes.float32).copyin(memoryview(np.zeros(4, np.float32)))
  with pytest.raises(RuntimeError, match="NULL device buffers hold no data"): small.numpy()
  with pytest.raises(ValueError, match="sizes must match"): small.copyin(memoryview(np.zeros(5, np.float32)))
  assert b.view(4, dtypes.float32, 16).allocate()._buf.nbytes == 16
  prg = Device["NULL"].get_program("k", b"whatever")
  assert prg(b._buf, global_size=(4, 1, 1), wait=True) == 0.0


# ***** DISK *****
def test_disk_roundtrip_and_slices(tmp_path):
  path = tmp_path / "x.bin"
  a = np.arange(256, dtype=np.float32)
  path.write_bytes(a.tobytes())
  b = Buffer(f"DISK:{path}", 256, dtypes.float32)
  assert np.array_equal(b.numpy(), a)
  v = b.view(16, dtypes.float32, offset=64 * 4)
  mv = v.as_buffer(allow_zero_copy=True)
  assert np.array_equal(np.frombuffer(mv, np.float32), a[64:80])
  v.copyin(memoryview(np.full(16, 9, np.float32)))   # writes go to the file
  assert np.frombuffer(mv, np.float32)[0] == 9        # the zero-copy view sees it: same memory
  del mv
  Device[f"DISK:{path}"].allocator  # still open
  want = a.copy()
  want[64:80] = 9
  assert np.array_equal(np.fromfile(path, np.float32), want)
  with pytest.raises(ValueError, match="outside"): b.view(2, dtypes.float32, offset=255 * 4)


def test_disk_creates_and_grows(tmp_path):
  path = tmp_path / "new.bin"
  b = Buffer(f"DISK:{path}", 10, dtypes.int16).copyin(memoryview(np.arange(10, dtype=np.int16)))
  assert os.path.getsize(path) == 20
  big = Buffer(f"DISK:{path}", 100, dtypes.int16)
  assert np.array_equal(big.numpy()[:10], np.arange(10)) and not big.numpy()[10:].any()
  assert np.array_equal(b.numpy(), np.arange(10))  # the older mapping still works


def test_disk_runs_no_kernels(tmp_path):
  dev = Device[f"DISK:{tmp_path / 'k.bin'}"]
  with pytest.raises(RuntimeError, match="runs no kernels"): dev.renderer  # noqa: B018
  with pytest.raises(RuntimeError, match="runs no kernels"): dev.get_program("k", b"")


def test_disk_needs_a_path():
  from tiny_runtime_cpu.disk import DiskDevice
  with pytest.raises(ValueError, match="needs a file path"): DiskDevice("DISK").allocator.alloc(4)
  with pytest.raises(ValueError, match="DISK:/path"): DiskDevice("DISKX:/a")


def test_plugins_listing():
  out = subprocess.run([sys.executable, "-m", "tiny_uop.plugins", "--json"], capture_output=True, text=True, check=True,
                       env={**os.environ, "DEV": "", "TINY_PLUGINS": ""}).stdout
  rows = {r["name"]: r for r in json.loads(out) if r["kind"] == "device"}
  for name in ("CPU", "PYTHON", "NULL", "DISK"):
    assert rows[name]["status"] == "ok", rows[name]
    assert rows[name]["package"] == "tiny-runtime-cpu"


def test_disk_sees_a_rewritten_file(tmp_path):
  """Rewriting the file (smaller, or replaced by another file) between loads never reads a stale/too-long mapping."""
  path = tmp_path / "w.bin"
  path.write_bytes(np.arange(100, dtype=np.int32).tobytes())
  assert Buffer(f"DISK:{path}", 100, dtypes.int32).numpy()[-1] == 99
  path.write_bytes(np.arange(10, 20, dtype=np.int32).tobytes())          # truncated in place, then written
  assert Buffer(f"DISK:{path}", 10, dtypes.int32).numpy().tolist() == list(range(10, 20))
  other = tmp_path / "other.bin"
  other.write_bytes(np.full(10, 7, dtype=np.int32).tobytes())
  os.replace(other, path)                                                 # a new inode at the same path
  assert Buffer(f"DISK:{path}", 10, dtypes.int32).numpy().tolist() == [7] * 10
