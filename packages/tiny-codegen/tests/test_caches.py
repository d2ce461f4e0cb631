"""Caches stay bounded and keys are exact: the schedule cache (entries and total graph size), the kernel-name table
(weak on the kernels), BEAM's disk-cache key (a hash of the whole AST, not of a printout cut in the middle)."""
from __future__ import annotations

import gc

from tiny_uop import KernelInfo, Ops, UOp, dtypes
from tiny_uop.uop import AxisType, structure_key

from tiny_codegen.opt.search import _cache_key
from tiny_codegen.program import _names, kernel_name
from tiny_codegen.renderer.llvmir import LLVMRenderer
from tiny_codegen.schedule import create_schedule
from tiny_codegen.schedule import schedule as sched_mod


def _chain_kernel(n: int, middle: float) -> UOp:
  """A kernel AST whose value is a chain of n adds of 1.0, one of them (in the middle) adding `middle` instead."""
  p0, p1 = UOp(Ops.PARAM, dtypes.float32.ptr(16), arg=0), UOp(Ops.PARAM, dtypes.float32.ptr(16), arg=1)
  r = UOp.range(16, 0, AxisType.LOOP)
  v = p1.index(r).load()
  for i in range(n): v = v + UOp.const(dtypes.float32, middle if i == n // 2 else 1.0)
  return p0.index(r).store(v).sink(arg=KernelInfo("chain"))


def test_beam_key_hashes_the_whole_ast():
  a, b = _chain_kernel(600, 2.0), _chain_kernel(600, 3.0)
  assert repr(a) == repr(b)  # the printout elides the middle: the old key (a hash of it) was the same for both
  ren = LLVMRenderer()
  assert _cache_key(a, ren, 2) != _cache_key(b, ren, 2)
  assert _cache_key(a, ren, 2) == _cache_key(_chain_kernel(600, 2.0), ren, 2)
  assert _cache_key(a, ren, 2) != _cache_key(a, ren, 3)


def test_structure_key_tells_apart_what_equality_of_values_would_not():
  keys = {structure_key(UOp.const(dt, v)) for dt, v in ((dtypes.float32, 0.0), (dtypes.float32, -0.0),
                                                           (dtypes.float64, 0.0), (dtypes.int32, 0))}
  assert len(keys) == 4
  x = UOp.variable("x", 0, 10)
  assert structure_key(x + 1) != structure_key(1 + x) and structure_key(x + 1) == structure_key(x + 1)


def test_schedule_cache_is_bounded_by_entries_and_graph_size(monkeypatch):
  monkeypatch.setattr(sched_mod, "_cache", sched_mod._LRU(4, 10_000))
  b = UOp.new_buffer("CPU", 64, dtypes.float32)
  for i in range(12):  # 12 different structures
    y = b
    for _ in range(i + 1): y = y * 2.0
    create_schedule(UOp.sink(y))
  assert len(sched_mod._cache) == 4
  small = sched_mod._LRU(100, 50)
  monkeypatch.setattr(sched_mod, "_cache", small)
  for i in range(6):
    y = b
    for _ in range(8 * (i + 1)): y = y + 1.0
    create_schedule(UOp.sink(y))
  assert small.size <= 50 and len(small) < 6  # big graphs pushed the older ones out
  # a hit moves an entry to the back: it survives the next insertions
  cache = sched_mod._LRU(2, 1000)
  cache.put("a", 1, 1)
  cache.put("b", 2, 1)
  assert cache.get("a") == 1
  cache.put("c", 3, 1)
  assert cache.get("a") == 1 and cache.get("b") is None


def test_kernel_name_table_forgets_dead_kernels_and_never_reuses_a_name():
  def ast(k: int) -> UOp:
    p0, p1 = UOp(Ops.PARAM, dtypes.float32.ptr(7), arg=0), UOp(Ops.PARAM, dtypes.float32.ptr(7), arg=1)
    r = UOp.range(7, 0, AxisType.LOOP)
    return p0.index(r).store(p1.index(r).load() * float(k + 0.5)).sink(arg=KernelInfo())
  kept = [ast(k) for k in range(3)]
  names = [kernel_name(a) for a in kept]
  # (another test of the same process may hold an E_7 kernel alive: then ours are E_7n1...; the base name is E_7)
  assert len(set(names)) == 3 and all(n.startswith("E_7") for n in names), names
  base = _names["E_7"][0]
  n_before = len(base)
  tmp = [ast(k) for k in range(10, 20)]
  tmp_names = {kernel_name(a) for a in tmp}
  assert len(base) == n_before + 10
  del tmp
  gc.collect()
  assert len(base) == n_before  # the table holds its kernels weakly
  fresh = kernel_name(ast(99))
  assert fresh not in names and fresh not in tmp_names  # the counter moves on: names stay unique


# ***** normalized forms remembered per node by the scheduler (the eager path's cache key) *****
def _random_graphs(seed: int, nbufs: int = 4, nnodes: int = 40) -> list[UOp]:
  """Graph-level values over `nbufs` buffers of shape (4, 4): sums, products, broadcast constants, DETACHes,
  CONTIGUOUS and reduces, each built from earlier ones (so graphs share nodes and buffers)."""
  import random
  rng = random.Random(seed)
  pool = [UOp.new_buffer("CPU", 16, dtypes.float32).reshape((4, 4)) for _ in range(nbufs)]
  for _ in range(nnodes):
    a, b = rng.choice(pool), rng.choice(pool)
    k = rng.randrange(6)
    if k == 0: n = a + b
    elif k == 1: n = a * b
    elif k == 2: n = a + UOp.const(dtypes.float32, float(rng.randrange(3)), "CPU", (4, 4))
    elif k == 3: n = a.detach()
    elif k == 4: n = a.contiguous()
    else: n = a.r(Ops.ADD, (1,)).expand((4, 4))
    pool.append(n)
  return pool[nbufs:]


def test_remembered_normal_forms_give_what_a_full_walk_gives():
  # whatever was normalized before (other roots, other orders), reusing remembered forms gives the same normalized
  # graph, the same input numbering and the same image of every root as walking everything
  import random
  for seed in range(6):
    graphs, rng = _random_graphs(seed, nbufs=4 + 2 * seed, nnodes=20 + 4 * seed), random.Random(100 + seed)
    for _ in range(25):
      for r in rng.sample(graphs, rng.randrange(1, 4)): sched_mod._Normalizer().node(r)  # remembered in its order
      roots = tuple(rng.sample(graphs, rng.randrange(1, 4)))
      fast = sched_mod._Normalizer(reuse=True)
      got = [fast.node(r) for r in roots]
      full = sched_mod._Normalizer(reuse=False)
      want = [full.node(r) for r in roots]
      assert got == want and fast.inputs == full.inputs and fast.var_vals == full.var_vals
      assert all(fast.new[r] is full.new[r] for r in roots)


def test_a_new_op_on_seen_graphs_normalizes_one_node():
  a, b = (UOp.new_buffer("CPU", 16, dtypes.float32).reshape((4, 4)) for _ in range(2))
  x = (a * 2 + b).exp2()
  sched_mod._Normalizer().node(UOp.sink(x))
  norm = sched_mod._Normalizer()
  norm.node(UOp.sink(x + a))  # a is input 0 in x's graph too: x's form is taken, a's placeholder found in it
  full = sched_mod._Normalizer(reuse=False)
  assert norm.node(x + a) is full.node(x + a) and norm.inputs == full.inputs == [a.src[0], b.src[0]]
  walked = [n for n in norm.new if n.op not in (Ops.BUFFER,)]
  assert x in norm.new and (a * 2) not in norm.new and len(walked) <= 4  # SINK, the ADD, x (taken), a's reshape


def test_forms_above_contiguous_or_variables_are_not_remembered():
  a = UOp.new_buffer("CPU", 16, dtypes.float32).reshape((4, 4))
  c = a.contiguous() + 1
  v = UOp.variable("v", 1, 4).bind(2)
  s = a.shrink(((0, v), (0, 4)))
  sched_mod._Normalizer().node(UOp.sink(c, s + 1))
  memo = sched_mod._norm_memo  # the scheduler's memo (keyed weakly by node), not the nodes' `_cache`
  assert c not in memo and a.contiguous() not in memo and (s + 1) not in memo
  assert a in memo  # the reshape of the buffer is


def test_cached_template_finds_the_entry_create_schedule_made():
  a, b = (UOp.new_buffer("CPU", 16, dtypes.float32).reshape((4, 4)) for _ in range(2))
  assert sched_mod.cached_template(((a + 1) * b,)) is None or sched_mod.SCHEDULE_CACHE == 0
  res = create_schedule(UOp.sink((a + 1) * b))
  c, d = (UOp.new_buffer("CPU", 16, dtypes.float32).reshape((4, 4)) for _ in range(2))
  found = sched_mod.cached_template(((c + 1) * d,))
  assert found is not None and found[0] is res.template and found[1] == [c.src[0], d.src[0]]
  assert res.inputs == [a.src[0], b.src[0]]
  assert sched_mod.cached_template(((c + 1) * c,)) is None  # one input in both places: another structure
  assert sched_mod.cached_template(((c + 1) * d,), max_nodes=1) is None  # more new nodes than allowed
  sched_mod.clear_schedule_cache()
  assert sched_mod.cached_template(((c + 1) * d,)) is None


def test_node_memo_is_keyed_by_the_node_itself_and_dies_with_it():
  # issue #39: the normalizer's memos are dicts by id(node) holding a weak reference (a read makes no weak reference
  # and calls no UOp.__eq__). An entry must be found for its node only: never for another node that got the id of a
  # dead one, whose entry's callback has not run yet; a node's death drops its entry
  memo = sched_mod._NodeMemo()
  a = UOp.new_buffer("CPU", 16, dtypes.float32).reshape((4, 4))
  n1 = a + 1
  memo[n1] = "one"
  assert n1 in memo and memo.get(n1) == "one" and len(memo) == 1 and memo.get(a) is None and a not in memo
  dead = memo.data[id(n1)]
  del n1
  assert len(memo) == 0  # the node died: its entry with it
  n2 = a * 2
  memo.data[id(n2)] = dead  # a dead node's entry at a live node's id (as if its callback were still to run)
  assert memo.get(n2) is None and n2 not in memo and memo.pop(n2) is None and len(memo) == 1
  memo[n2] = "two"
  memo._drop_dead(dead[0])  # the dead one's callback, late: the live node's entry stays
  assert memo.get(n2) == "two" and memo.pop(n2) == "two" and n2 not in memo and len(memo) == 0
  memo[n2] = "again"
  memo.clear()
  assert len(memo) == 0 and memo.get(n2) is None
  # the scheduler's memos are such memos, read by the eager hot path
  assert isinstance(sched_mod._norm_memo, sched_mod._NodeMemo) and isinstance(sched_mod._tmpl_memo, sched_mod._NodeMemo)
