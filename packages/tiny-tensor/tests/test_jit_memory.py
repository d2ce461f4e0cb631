"""TinyJit's memory plan (`jit.plan_memory`, issue #39): a replay writes each kernel's output into the storage freed
last (still in cache), across sizes, and never into memory holding a value some later call still reads."""
import numpy as np

from tiny_uop.device import Buffer
from tiny_tensor import Tensor, TinyJit, jit as jitmod, nn


def _planned(monkeypatch) -> list:
  """Record each `plan_memory` call's (calls before, calls after)."""
  seen: list = []
  plain = jitmod.plan_memory

  def spy(calls):
    out = plain(calls)
    seen.append((list(calls), out))
    return out
  monkeypatch.setattr(jitmod, "plan_memory", spy)
  return seen


def _span(r: Buffer) -> tuple[int, int, int]: return id(r.base), r.offset, r.offset + r.nbytes


def _overlap(a: tuple, b: tuple) -> bool: return a[0] == b[0] and a[1] < b[2] and b[1] < a[2]


def _check_no_live_value_overwritten(before: list, after: list) -> int:
  """Every read of an intermediate in `after` finds the storage its value was written to untouched by any other
  value's write since: for each read (call i, argument p) of buffer o in `before`, o's last write before i is at call
  j; no call in (j, i], other than writes of o itself, writes a storage overlapping where o's read is placed in
  `after`. Returns the reads checked."""
  assert len(before) == len(after)
  refs = [list(getattr(c, "refs", [])) for c in before]
  new = [list(getattr(c, "refs", [])) for c in after]
  rws = [getattr(c, "rw", None) for c in before]
  assert all(rw is not None for rw in rws), "the check needs every call's reads and writes"
  checked = 0
  for i, (rs, rw) in enumerate(zip(refs, rws)):
    for p in rw[0]:
      o = rs[p]
      if not isinstance(o, Buffer): continue
      j = max((k for k in range(i) if any(refs[k][q] is o for q in rws[k][1])), default=None)
      if j is None: continue  # written before the capture (a weight)
      where = _span(new[i][p])
      for k in range(j + 1, i + 1):
        for q in rws[k][1]:
          if refs[k][q] is not o and isinstance(new[k][q], Buffer):
            assert not _overlap(_span(new[k][q]), where), f"call {k} overwrites the value call {i} reads (arg {p})"
      checked += 1
  return checked


def _chain(x: Tensor) -> Tensor:
  a = (x * 2).realize()                           # 4096 floats
  b = (a + 1).realize()                           # 4096; a is free after this
  c = (b * 3).realize()                           # 4096: a's storage
  d = c.reshape(2, 2048).sum(0).realize()         # 2048: b's storage, freed last (the old plan: a new buffer)
  return ((d * 2).realize() + 1).realize()        # (the last two: held by the returned graph, not planned)


def test_outputs_go_to_the_storage_freed_last_across_sizes(monkeypatch):
  seen = _planned(monkeypatch)
  f = TinyJit(_chain)
  xs = [np.random.default_rng(i).standard_normal(4096).astype(np.float32) for i in range(4)]
  outs = [f(Tensor(x)).numpy() for x in xs]
  for x, out in zip(xs, outs):  # each replay bit-identical to the unjitted function
    np.testing.assert_array_equal(out, _chain(Tensor(x)).numpy())
  (before, after), = seen
  ks = [c for c in after if isinstance(c, jitmod._KernelCall)]
  assert len(ks) == 6 and f.captured.kernel_count == 6
  out_of = [c.refs[c.rw[1][0]] for c in ks]  # each kernel's output as placed
  a, b, c, d = out_of[:4]
  assert c.base is a.base and d.base is b.base  # reused; d as a view of 4096-float storage
  assert d.base is not d and d.size == 2048 and d.offset == 0
  assert len({id(o.base) for o in out_of[:4]}) == 2
  assert _check_no_live_value_overwritten(before, after) >= 4


def test_convnet_plan_keeps_every_live_value_and_results(monkeypatch):
  seen = _planned(monkeypatch)

  class Net:
    def __init__(self):
      self.c1, self.c2, self.c3 = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(8, 8, 3, padding=1), nn.Conv2d(8, 16, 1)
      self.l = nn.Linear(16, 5)

    def __call__(self, x: Tensor) -> Tensor:
      h = self.c1(x).relu().contiguous()
      r = (self.c2(h).relu() + h).contiguous()        # a residual: h lives across c2
      s = r.mean((2, 3), keepdim=True).sigmoid()      # squeeze-excite: r lives across the reduce
      y = self.c3(r * s).relu().max_pool2d(2).contiguous()
      return self.l(y.mean((2, 3)))

  net = Net()
  f = TinyJit(lambda x: net(x).realize())
  xs = [np.random.default_rng(i).standard_normal((1, 3, 12, 12)).astype(np.float32) for i in range(4)]
  outs = [f(Tensor(x)).numpy() for x in xs]
  for x, out in zip(xs, outs): np.testing.assert_array_equal(out, net(Tensor(x)).realize().numpy())
  (before, after), = seen
  assert _check_no_live_value_overwritten(before, after) > 0
  assert sum(isinstance(c, jitmod._KernelCall) for c in after) == f.captured.kernel_count


def test_a_later_write_never_splits_a_buffer_in_two():
  # a kernel writing a buffer without reading it may write part of it (an assign to a slice): the rest still holds
  # the earlier write's values, so the buffer keeps one storage from its first write to its last use
  from tiny_uop.dtype import dtypes
  y, w, o = (Buffer("CPU", 4, dtypes.float32).allocate() for _ in range(3))

  def k(name, refs, reads, writes):
    c = jitmod._KernelCall(None, name, "CPU", refs, (1, 1, 1), None, [], {}, 0, 0)
    c.rw = (reads, writes)
    return c
  before = [k("y", [y, 0], (1,), (0,)), k("w", [w, y], (1,), (0,)), k("w_part", [w, 0], (1,), (0,)),
            k("o", [o, w], (1,), (0,))]
  after = jitmod.plan_memory(before)
  assert after[1].refs[0] is after[2].refs[0] is after[3].refs[1]
  assert after[3].refs[0].base is y  # o: y's storage, free since call 1
  assert _check_no_live_value_overwritten(before, after) == 2


def test_of_two_free_storages_the_one_freed_last_is_taken():
  from tiny_uop.dtype import dtypes
  p, q, s = (Buffer("CPU", 4, dtypes.float32).allocate() for _ in range(3))
  r = Buffer("CPU", 8, dtypes.float32).allocate()  # too big for p's or q's storage

  def k(name, refs):
    c = jitmod._KernelCall(None, name, "CPU", refs, (1, 1, 1), None, [], {}, 0, 0)
    c.rw = ((1,), (0,))
    return c
  before = [k("p", [p, 0]), k("q", [q, p]), k("r", [r, q]), k("s", [s, r])]
  after = jitmod.plan_memory(before)
  assert after[2].refs[0] is r and after[3].refs[0] is q  # p (free since call 1) and q (since call 2): q, hotter
  assert _check_no_live_value_overwritten(before, after) == 3
