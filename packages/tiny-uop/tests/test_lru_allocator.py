"""LRUAllocator (tiny_uop.device): freed blocks come back for the same size and options only, default-options blocks
kept by size alone (issue #39: the eager hot path frees and reuses one per op), and `free_cache` releases them all."""
from tiny_uop.device import BufferSpec, LRUAllocator


class CountingAllocator(LRUAllocator[bytearray]):
  """Blocks are bytearrays; counts what reaches the device."""
  def __init__(self) -> None:
    super().__init__()
    self.made: list[tuple[int, BufferSpec]] = []
    self.freed: list[bytearray] = []

  def _alloc(self, size: int, options: BufferSpec) -> bytearray:
    self.made.append((size, options))
    return bytearray(size)

  def _free(self, opaque: bytearray, options: BufferSpec) -> None: self.freed.append(opaque)


def test_a_freed_block_returns_for_its_size_and_options_only():
  al = CountingAllocator()
  a = al.alloc(64)
  al.free(a, 64)
  assert al.alloc(32) is not a and al.alloc(64, BufferSpec(host=True)) is not a  # another size, other options
  assert al.alloc(64, BufferSpec()) is a  # the default options spelled out are the same as None
  h = al.alloc(64, BufferSpec(host=True))
  al.free(h, 64, BufferSpec(host=True))
  assert al.alloc(64) is not h and al.alloc(64, BufferSpec(host=True)) is h
  assert len(al.made) == 5  # 64, 32, 64 host, 64 host, 64: the two reuses made nothing


def test_blocks_come_back_last_freed_first_and_free_cache_releases_every_kind():
  al = CountingAllocator()
  blocks = [al.alloc(16) for _ in range(3)]
  for b in blocks: al.free(b, 16)
  assert al.alloc(16) is blocks[2] and al.alloc(16) is blocks[1]
  h = al.alloc(16, BufferSpec(host=True))
  al.free(h, 16, BufferSpec(host=True))
  al.free_cache()
  assert sorted(map(id, al.freed)) == sorted(map(id, [blocks[0], h]))
  assert al.alloc(16) is not blocks[0] and al.alloc(16, BufferSpec(host=True)) is not h  # nothing kept


def test_nolru_blocks_go_straight_back_to_the_device():
  al = CountingAllocator()
  n = al.alloc(8, BufferSpec(nolru=True))
  al.free(n, 8, BufferSpec(nolru=True))
  assert al.freed == [n] and al.alloc(8, BufferSpec(nolru=True)) is not n
