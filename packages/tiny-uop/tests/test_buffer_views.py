"""Buffer views on a device whose allocator has no `_offset`: a view is a copy of the viewed bytes (docs/PLUGINS.md)."""
import struct

import pytest
from tiny_uop.device import Allocator, Buffer, BufferSpec, Compiled
from tiny_uop.dtype import dtypes
from tiny_uop.plugins import DevicePlugin, register_device, unregister_device


class BytesAllocator(Allocator[bytearray]):
  """The minimal allocator: bytearrays, no `_offset`, no `_as_buffer`."""
  def __init__(self):
    self.live: list[int] = []
  def _alloc(self, size: int, options: BufferSpec) -> bytearray:
    b = bytearray(size)
    self.live.append(id(b))
    return b
  def _free(self, opaque: bytearray, options: BufferSpec) -> None: self.live.remove(id(opaque))
  def _copyin(self, dest: bytearray, src: memoryview) -> None: dest[:] = src
  def _copyout(self, dest: memoryview, src: bytearray) -> None: dest[:] = src


class NoViewDevice(Compiled):
  def __init__(self, name: str):
    super().__init__(name, BytesAllocator(), [], object)


@pytest.fixture
def dev():
  import sys
  import types
  mod = types.ModuleType("noview_dev_mod")
  mod.NoViewDevice = NoViewDevice  # type: ignore[attr-defined]
  sys.modules["noview_dev_mod"] = mod
  register_device(DevicePlugin("NOVIEWX", "noview_dev_mod:NoViewDevice", default_ok=False))
  yield "NOVIEWX"
  unregister_device("NOVIEWX")
  sys.modules.pop("noview_dev_mod", None)


def test_view_without_offset_is_a_copy_of_the_bytes(dev):
  base = Buffer(dev, 8, dtypes.int32, initial_value=struct.pack("<8i", *range(8)))
  view = base.view(3, dtypes.int32, 8)  # elements 2, 3, 4
  got = view.copyout(memoryview(bytearray(12)))
  assert struct.unpack("<3i", got) == (2, 3, 4)
  assert view._copied_view and view._opaque is not base._opaque


def test_copied_view_writes_stay_in_the_view_and_are_freed(dev):
  from tiny_uop.plugins import Device
  alloc = Device[dev].allocator
  base = Buffer(dev, 4, dtypes.int32, initial_value=struct.pack("<4i", 1, 2, 3, 4))
  view = base.view(2, dtypes.int32, 4).ensure_allocated()
  n = len(alloc.live)
  view.copyin(memoryview(struct.pack("<2i", 7, 8)))
  assert struct.unpack("<4i", base.copyout(memoryview(bytearray(16)))) == (1, 2, 3, 4)
  del view
  assert len(alloc.live) == n - 1, "the view's own memory was not freed"


def test_empty_view(dev):
  base = Buffer(dev, 4, dtypes.int32, initial_value=bytes(16))
  assert base.view(0, dtypes.int32, 16).copyout(memoryview(bytearray(0))).nbytes == 0
