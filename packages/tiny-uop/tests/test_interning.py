"""Interning invariants of the lock-free UOp cache: equal nodes are one object (also when built from many threads at
once), dead nodes leave the cache, and a dead entry whose callback has not run yet is replaced, never returned."""
import threading
import uuid

from tiny_uop.dtype import dtypes
from tiny_uop.uop import Ops, UOp, UOpMetaClass, _NodeRef


def _key_of(node: UOp) -> tuple:
  return next(k for k, r in UOpMetaClass.ucache.items() if r() is node)


def test_dead_nodes_leave_the_cache_by_refcount() -> None:
  arg = ("intern", uuid.uuid4().hex)
  n = UOp(Ops.NOOP, dtypes.int32, (UOp.const(dtypes.int32, 3),), arg)
  key = _key_of(n)
  del n  # no gc.collect(): reference counting alone runs the callback
  assert key not in UOpMetaClass.ucache


def test_a_dead_entry_is_replaced_not_returned() -> None:
  arg = ("intern-dead", uuid.uuid4().hex)
  first = UOp(Ops.NOOP, arg=arg)
  key = _key_of(first)
  other = UOp(Ops.NOOP, arg=("intern-other", uuid.uuid4().hex))
  dead = _NodeRef(other)  # no callback: stands for an entry whose node died and whose callback is still pending
  dead.key = key
  del other
  assert dead() is None
  UOpMetaClass.ucache[key] = dead
  del first  # its callback finds the (dead) entry and removes it; put the dead one back for the builder to meet
  UOpMetaClass.ucache[key] = dead
  again = UOp(Ops.NOOP, arg=arg)
  assert again.op is Ops.NOOP and again.arg == arg and UOpMetaClass.ucache[key]() is again
  assert UOp(Ops.NOOP, arg=arg) is again
  del again
  assert key not in UOpMetaClass.ucache


def test_threads_building_the_same_nodes_get_one_object() -> None:
  """Eight threads build, drop and rebuild the same small graphs at once; while a node is alive every thread gets that
  one object (its id is the same in every thread's result at one barrier step)."""
  n_threads, steps = 8, 200
  tag = uuid.uuid4().hex
  barrier = threading.Barrier(n_threads)
  seen: list[list[int]] = [[] for _ in range(steps)]
  keep: list[list[UOp]] = [[] for _ in range(steps)]
  errors: list[BaseException] = []

  def work() -> None:
    try:
      for i in range(steps):
        barrier.wait()
        x = UOp(Ops.NOOP, dtypes.float32, (UOp.const(dtypes.float32, float(i)),), (tag, i % 7))
        y = UOp(Ops.NOOP, dtypes.float32, (x, x), (tag, "y"))
        seen[i].append(id(y))
        keep[i].append(y)
        barrier.wait()
        if i % 2: keep[i].clear()  # half the steps drop their nodes: the next steps rebuild them while others die
    except BaseException as e:  # noqa: BLE001 -- reported below, never swallowed
      errors.append(e)
      barrier.abort()

  threads = [threading.Thread(target=work) for _ in range(n_threads)]
  for t in threads: t.start()
  for t in threads: t.join()
  assert not errors, errors
  for i in range(steps): assert len(set(seen[i])) == 1, (i, seen[i])
  kept = [k[0] for k in keep if k]
  assert len(kept) == steps // 2 and all(k.src[0].src[0].arg == float(i * 2) for i, k in enumerate(kept))


class _EqualsAll:
  def __eq__(self, o: object) -> bool: return True
  def __ne__(self, o: object) -> bool: return False
  __hash__ = object.__hash__


def test_uop_equality_is_identity_and_defers_to_other_types() -> None:
  a, b = UOp.const(dtypes.int32, 1), UOp.const(dtypes.int32, 2)
  assert a == UOp.const(dtypes.int32, 1) and not (a != UOp.const(dtypes.int32, 1))
  assert a != b and not (a == b) and a != UOp.const(dtypes.float32, 1.0)
  assert a != 1 and not (a == 1) and a in (b, a) and a not in (b,)
  assert a == _EqualsAll() and not (a != _EqualsAll())  # NotImplemented for a non-UOp: the other side answers
  assert len({a, b, UOp.const(dtypes.int32, 1)}) == 2
