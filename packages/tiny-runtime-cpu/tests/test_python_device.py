"""The PYTHON device on hand-written linear UOp programs (GPU semantics), through the PYTHON renderer's text."""
import numpy as np
import pytest

from tiny_uop.device import Buffer
from tiny_uop.dtype import AddrSpace, dtypes
from tiny_uop.plugins import Device
from tiny_uop.uop import AxisType, KernelInfo, Ops, UOp

from tiny_codegen.renderer.python import PythonRenderer, decode_dtype, encode_dtype, parse
from tiny_runtime_cpu.python import PythonExecError

I = dtypes.int32  # noqa: E741


def c(v, dt=I): return UOp.const(dt, v)
def param(slot, dt, n): return UOp(Ops.PARAM, dt.ptr(n), arg=slot)
def special(name, n): return UOp(Ops.SPECIAL, I, (c(n),), name)


def linearize(*stores: UOp, order: list[UOp] | None = None) -> list[UOp]:
  """Toposort is a valid linear order for straight-line programs; loops pass `order` explicitly."""
  return order if order is not None else list(UOp.sink(*stores, arg=KernelInfo("k")).toposort())


def run(uops, arrays, global_size=(1, 1, 1), local_size=(1, 1, 1), vals=()):
  """Render, parse back, run on PYTHON; returns the buffers' contents as numpy arrays."""
  src = PythonRenderer().render(uops)
  assert parse(src) == uops  # the text is a lossless serialization
  bufs = [Buffer("PYTHON", a.size, dt).copyin(memoryview(np.ascontiguousarray(a))) for a, dt in arrays]
  prg = Device["PYTHON"].get_program("k", src.encode())
  prg(*[b._buf for b in bufs], global_size=global_size, local_size=local_size, vals=vals)
  bits = {1: np.uint8, 2: np.uint16}  # bfloat16 and fp8 (numpy has no such dtype): their raw bits
  return [b.numpy() if b.dtype.fmt else np.frombuffer(bytes(b.as_buffer()), bits[b.dtype.itemsize]) for b in bufs]


def test_dtype_encoding_roundtrip():
  for dt in (dtypes.float32, dtypes.bool, dtypes.int8.vec(4), dtypes.float.ptr(16), dtypes.void, dtypes.bfloat16,
             dtypes.half.ptr(8, AddrSpace.LOCAL), dtypes.float.ptr(1, AddrSpace.REG), dtypes.float.ptr(16).vec(4),
             dtypes.fp8e4m3):
    assert decode_dtype(encode_dtype(dt)) == dt


def test_parse_rejects_garbage():
  with pytest.raises(ValueError, match="not a PYTHON program"): parse("hello")
  with pytest.raises(ValueError, match="line 1 is malformed"): parse("# tiny PYTHON program v1\n0\tNOPE\tvoid\t\t\n")


def test_elementwise_gidx():
  n = 37
  d0, d1, d2 = param(0, dtypes.float32, n), param(1, dtypes.float32, n), param(2, dtypes.float32, n)
  g = special("gidx0", n)
  st = d0.index(g).store(d1.index(g).load() * d2.index(g).load() + 1.5)
  rng = np.random.default_rng(0)
  a, b = rng.random(n, dtype=np.float32), rng.random(n, dtype=np.float32)
  out, _, _ = run(linearize(st), [(np.zeros(n, np.float32), dtypes.float32), (a, dtypes.float32), (b, dtypes.float32)],
                  global_size=(n, 1, 1))
  assert np.array_equal(out, a * b + np.float32(1.5))


def test_2d_grid_and_locals_ids():
  """gidx0 is the fastest dimension; lidx indexes within a workgroup; out[i] = gidx/lidx combined index."""
  gx, gy, lx = 3, 4, 5
  n = gx * gy * lx
  d0 = param(0, I, n)
  g0, g1, l0 = special("gidx0", gx), special("gidx1", gy), special("lidx0", lx)
  idx = (g1 * gx + g0) * lx + l0
  st = d0.index(idx).store(g1 * 100 + g0 * 10 + l0)
  out, = run(linearize(st), [(np.zeros(n, np.int32), I)], global_size=(gx, gy, 1), local_size=(lx, 1, 1))
  want = [y * 100 + x * 10 + lo for y in range(gy) for x in range(gx) for lo in range(lx)]
  assert out.tolist() == want


def test_reduce_with_define_reg():
  """out[i] = sum_j x[i, j] with an accumulator register and a RANGE/END loop (the lowering's reduce shape)."""
  rows, cols = 6, 9
  d0, d1 = param(0, dtypes.float32, rows), param(1, dtypes.float32, rows * cols)
  g = special("gidx0", rows)
  acc = UOp(Ops.DEFINE_REG, dtypes.float32.ptr(1, AddrSpace.REG), arg=0)
  init = acc.index(c(0)).store(c(0.0, dtypes.float32))
  r = UOp.range(c(cols), 1, AxisType.REDUCE)
  ld_acc = acc.index(c(0)).load()
  x = d1.index(g * cols + r).load()
  upd = acc.index(c(0)).store(ld_acc + x)
  end = UOp(Ops.END, src=(upd, r))
  res = acc.index(c(0)).load(end)
  st = d0.index(g).store(res)
  order = [d0, d1, c(rows), g, acc, c(0), acc.index(c(0)), c(0.0, dtypes.float32), init, c(cols), r, ld_acc,
           g * cols, g * cols + r, d1.index(g * cols + r), x, ld_acc + x, upd, end, res, d0.index(g), st, UOp.sink(st)]
  a = np.random.default_rng(1).random((rows, cols), dtype=np.float32)
  out, _ = run(order, [(np.zeros(rows, np.float32), dtypes.float32), (a.ravel(), dtypes.float32)],
               global_size=(rows, 1, 1))
  want = np.zeros(rows, np.float32)
  for j in range(cols): want += a[:, j]  # the same order of float32 additions
  assert np.array_equal(out, want)


def test_local_memory_barrier_reduction():
  """A workgroup of 8 threads stages values in local memory, BARRIER, then thread 0 sums them (gated store)."""
  groups, lsz = 3, 8
  d0, d1 = param(0, I, groups), param(1, I, groups * lsz)
  g, lo = special("gidx0", groups), special("lidx0", lsz)
  loc = UOp(Ops.DEFINE_LOCAL, I.ptr(lsz, AddrSpace.LOCAL), arg=0)
  st_loc = loc.index(lo).store(d1.index(g * lsz + lo).load() * 2)
  bar = UOp(Ops.BARRIER, src=(st_loc,))
  total = c(0)
  for k in range(lsz): total = total + loc.index(c(k)).load(bar)
  st = d0.index(g, lo.eq(0)).store(total)   # only lidx0 == 0 stores: a gated store
  uops = linearize(st)
  assert uops.index(bar) < min(uops.index(u) for u in uops if u.op is Ops.LOAD and u.src[0].src[0] is loc)
  a = np.arange(groups * lsz, dtype=np.int32)
  out, _ = run(uops, [(np.full(groups, -1, np.int32), I), (a, I)], global_size=(groups, 1, 1), local_size=(lsz, 1, 1))
  assert out.tolist() == (a.reshape(groups, lsz).sum(1) * 2).tolist()


def test_gated_load_and_if():
  """Padding-style gated load (invalid reads yield 0, even out of bounds) and an IF around a store."""
  n = 10
  d0, d1 = param(0, I, n + 4), param(1, I, n)
  g = special("gidx0", n + 4)
  valid = (g < n + 2) & (g.alu(Ops.CMPLT, 2).logical_not())
  x = d1.index(g - 2, valid).load()     # reads d1[-2] / d1[10], d1[11] would be out of bounds: gated off
  cond = g.alu(Ops.CMPNE, 5)
  if_ = UOp(Ops.IF, src=(cond,))
  st = d0.index(g).store(x + 100)
  endif = UOp(Ops.ENDIF, src=(if_,))
  order = [u for u in linearize(st) if u.op is not Ops.SINK]
  pos = order.index(st)
  pre = order[:pos]
  pre += [u for u in cond.toposort() if u not in pre]
  order = pre + [if_] + order[pos:pos + 1] + [endif, UOp.sink(endif)]
  for i, u in enumerate(order):  # every source before its user, and the IF's condition before it
    assert all(s in order[:i] for s in u.src), u.op
  a = np.arange(1, n + 1, dtype=np.int32)
  out, _ = run(order, [(np.full(n + 4, -1, np.int32), I), (a, I)], global_size=(n + 4, 1, 1))
  want = [100, 100] + [v + 100 for v in a] + [100, 100]
  want[5] = -1  # the IF skipped thread 5
  assert out.tolist() == want


def test_vectors_and_variables():
  """float4 loads/stores (VECTORIZE, GEP), a DEFINE_VAR bound, CAST and BITCAST."""
  n = 8
  d0, d1, d2 = param(0, dtypes.float32, n * 4), param(1, dtypes.float32, n * 4), param(2, dtypes.uint32, n * 4)
  g = special("gidx0", n)
  v = UOp.variable("scale", 1, 10)
  vec = d1.index(g * 4).load(dtype=dtypes.float32.vec(4))
  lanes = [UOp(Ops.GEP, dtypes.float32, (vec,), (k,)) for k in (3, 2, 1, 0)]
  rev = UOp(Ops.VECTORIZE, dtypes.float32.vec(4), tuple(lanes))
  scaled = rev * UOp(Ops.VECTORIZE, dtypes.float32.vec(4), (v.cast(dtypes.float32),) * 4)
  st = d0.index(g * 4).store(scaled)
  st2 = d2.index(g * 4).store(scaled.bitcast(dtypes.uint32.vec(4)))
  a = np.arange(n * 4, dtype=np.float32) + 0.25
  arrays = [(np.zeros(n * 4, np.float32), dtypes.float32), (a, dtypes.float32),
            (np.zeros(n * 4, np.uint32), dtypes.uint32)]
  out, _, bits = run(linearize(st, st2), arrays, global_size=(n, 1, 1), vals=(3,))
  want = (a.reshape(n, 4)[:, ::-1] * 3).ravel()
  assert np.array_equal(out, want)
  assert np.array_equal(bits, want.view(np.uint32))


def test_loop_with_divergent_bounds():
  """Each thread loops gidx0 times: out[g] = sum(range(g)) — loops whose bounds differ between threads."""
  n = 7
  d0 = param(0, I, n)
  g = special("gidx0", n)
  acc = UOp(Ops.DEFINE_REG, I.ptr(1, AddrSpace.REG), arg=0)
  init = acc.index(c(0)).store(c(0))
  r = UOp.range(g, 1, AxisType.REDUCE)
  ld = acc.index(c(0)).load()
  upd = acc.index(c(0)).store(ld + r)
  end = UOp(Ops.END, src=(upd, r))
  res = acc.index(c(0)).load(end)
  st = d0.index(g).store(res)
  order = [d0, c(n), g, acc, c(0), acc.index(c(0)), init, r, ld, ld + r, upd, end, res, d0.index(g), st, UOp.sink(st)]
  out, = run(order, [(np.zeros(n, np.int32), I)], global_size=(n, 1, 1), local_size=(1, 1, 1))
  assert out.tolist() == [k * (k - 1) // 2 for k in range(n)]


def test_int_semantics_match_exec_alu():
  """Wrapping int8 arithmetic, C division and shifts come out exactly as tiny_uop.alu defines them."""
  from tiny_uop.alu import exec_alu
  n = 16
  d0, d1 = param(0, dtypes.int8, n), param(1, dtypes.int8, n)
  g = special("gidx0", n)
  x = d1.index(g).load()
  y = (x * x + 100) // (x - 3) ^ (x << 3)
  st = d0.index(g).store(y)
  a = np.array([-128, -100, -7, -3, -1, 0, 1, 2, 3, 4, 7, 50, 100, 126, 127, 5], dtype=np.int8)
  out, _ = run(linearize(st), [(np.zeros(n, np.int8), dtypes.int8), (a, dtypes.int8)], global_size=(n, 1, 1))
  i8 = dtypes.int8

  def ref(v):
    sq = exec_alu(Ops.ADD, i8, (exec_alu(Ops.MUL, i8, (v, v)), 100))
    q = exec_alu(Ops.CDIV, i8, (sq, exec_alu(Ops.SUB, i8, (v, 3))))
    return exec_alu(Ops.XOR, i8, (q, exec_alu(Ops.SHL, i8, (v, 3))))
  assert out.tolist() == [ref(int(v)) for v in a]


def test_out_of_bounds_raises():
  n = 4
  d0 = param(0, I, n)
  g = special("gidx0", n + 1)
  st = d0.index(g).store(g)
  with pytest.raises(PythonExecError, match="out-of-bounds access: element 4 of buffer data0"):
    run(linearize(st), [(np.zeros(n, np.int32), I)], global_size=(n + 1, 1, 1))
  st = d0.index(g - 1).store(g)
  with pytest.raises(PythonExecError, match="element -1"):
    run(linearize(st), [(np.zeros(n, np.int32), I)], global_size=(n, 1, 1))


def test_wrong_arguments_raise():
  d0 = param(0, I, 4)
  st = d0.index(special("gidx0", 4)).store(UOp.variable("v", 0, 9))
  with pytest.raises(PythonExecError, match="1 variables"): run(linearize(st), [(np.zeros(4, np.int32), I)])
  prg = Device["PYTHON"].get_program("k2", PythonRenderer().render(linearize(st)).encode())
  with pytest.raises(PythonExecError, match="1 buffers"): prg(vals=(1,))


def test_many_workgroups_batched():
  """More threads than one interpreter batch: every workgroup still runs exactly once."""
  from tiny_runtime_cpu import python as pydev
  n, lsz = 300, 4
  d0 = param(0, I, n * lsz)
  g, lo = special("gidx0", n), special("lidx0", lsz)
  st = d0.index(g * lsz + lo).store(d0.index(g * lsz + lo).load() + g * lsz + lo + 1)
  old = pydev.MAX_BATCH_THREADS
  pydev.MAX_BATCH_THREADS = 64
  try: out, = run(linearize(st), [(np.zeros(n * lsz, np.int32), I)], global_size=(n, 1, 1), local_size=(lsz, 1, 1))
  finally: pydev.MAX_BATCH_THREADS = old
  assert out.tolist() == list(range(1, n * lsz + 1))


def test_value_after_divergent_loop_is_each_threads_last():
  """A value computed in a loop whose trip count differs per thread keeps, per thread, its last iteration's value."""
  n = 6
  d0 = param(0, I, n)
  g = special("gidx0", n)
  r = UOp.range(g + 1, 1, AxisType.LOOP)
  x = r * 10
  end = UOp(Ops.END, src=(x, r))
  st = d0.index(g).store(x)
  order = [d0, c(n), g, c(1), g + 1, r, c(10), x, end, d0.index(g), st, UOp.sink(st)]
  out, = run(order, [(np.zeros(n, np.int32), I)], global_size=(n, 1, 1))
  assert out.tolist() == [k * 10 for k in range(n)]


def test_vector_access_through_cast_and_ptrcat():
  """A pointer CAST to a vector pointer loads 4 consecutive elements; PTRCAT gathers lanes from separate pointers."""
  n = 4
  d0, d1 = param(0, dtypes.float32, n * 4), param(1, dtypes.float32, n * 4)
  g = special("gidx0", n)
  vptr = d1.index(g * 4).cast(dtypes.float32.vec(4).ptr(n * 4))
  vec = vptr.load(dtype=dtypes.float32.vec(4))
  gather = UOp(Ops.PTRCAT, dtypes.float32.ptr(n * 4).vec(4), tuple(d1.index(g + k * 4) for k in range(4)))
  cols = gather.load(dtype=dtypes.float32.vec(4))
  st = d0.index(g * 4).cast(dtypes.float32.vec(4).ptr(n * 4)).store(vec + cols)
  a = np.arange(n * 4, dtype=np.float32)
  out, _ = run(linearize(st), [(np.zeros(n * 4, np.float32), dtypes.float32), (a, dtypes.float32)],
               global_size=(n, 1, 1))
  m = a.reshape(n, 4)
  assert np.array_equal(out.reshape(n, 4), m + m.T)


@pytest.mark.parametrize("dt", [dtypes.bfloat16, dtypes.fp8e4m3, dtypes.fp8e5m2, dtypes.float16])
def test_narrow_float_memory(dt):
  """Stores of bfloat16/fp8/float16 write the dtype's bits (dtype.float_to_bits); loads read them back."""
  from tiny_uop.dtype import bits_to_float, float_to_bits
  n = 8
  src, narrow, back = param(0, dtypes.float32, n), param(1, dt, n), param(2, dtypes.float32, n)
  g = special("gidx0", n)
  st1 = narrow.index(g).store(src.index(g).load().cast(dt))
  st2 = back.index(g).store(narrow.index(g).load(st1).cast(dtypes.float32))
  a = np.array([0.0, 1.0, -2.5, 3.14159, 100.3, -0.001, 7.75, 1e-3], dtype=np.float32)
  bits = np.uint16 if dt.itemsize == 2 else np.uint8
  arrays = [(a, dtypes.float32), (np.zeros(n, bits), dt), (np.zeros(n, np.float32), dtypes.float32)]
  _, raw, out = run(linearize(st2), arrays, global_size=(n, 1, 1))
  raw = raw.view(bits)
  assert raw.tolist() == [float_to_bits(float(x), dt) for x in a]
  assert out.tolist() == [np.float32(bits_to_float(float_to_bits(float(x), dt), dt)) for x in a]
