"""Property tests: random chains of movement ops, elementwise ops and reduces on random shapes, scheduled and run by
the reference kernel evaluator (and, for fewer examples, compiled with LLVM), equal to numpy on the tensor graph."""
from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tiny_uop import Ops, UOp, dtypes
from tiny_uop.helpers import prod

from tiny_codegen.schedule import create_schedule


import test_schedule_ref as ref  # noqa: E402


def _factor(n: int, draw) -> tuple[int, ...]:
  """A random shape with `n` elements (1 to 3 dims, size-1 dims allowed)."""
  dims = []
  while n > 1 and len(dims) < 2:
    divs = [d for d in range(1, n + 1) if n % d == 0]
    d = draw(st.sampled_from(divs))
    dims.append(d)
    n //= d
  dims.append(n)
  if draw(st.booleans()): dims.insert(draw(st.integers(0, len(dims))), 1)
  return tuple(dims)


@st.composite
def movement_chain(draw, x: UOp) -> UOp:
  for _ in range(draw(st.integers(1, 5))):
    s = x.shape
    kind = draw(st.sampled_from(["reshape", "permute", "expand", "pad", "shrink", "flip"]))
    if kind == "reshape": x = x.reshape(_factor(prod(s), draw))
    elif kind == "permute": x = x.permute(tuple(draw(st.permutations(range(len(s))))))
    elif kind == "expand":
      x = x.expand(tuple(draw(st.integers(1, 3)) if d == 1 else d for d in s))
    elif kind == "pad":
      if prod(s) > 60: continue
      x = x.pad(tuple((draw(st.integers(0, 2)), draw(st.integers(0, 2))) for _ in s))
    elif kind == "shrink":
      arg = []
      for d in s:
        b = draw(st.integers(0, d - 1))
        arg.append((b, draw(st.integers(b + 1, d))))
      x = x.shrink(tuple(arg))
    else: x = x.flip(tuple(draw(st.booleans()) for _ in s))
  return x


@st.composite
def program(draw):
  shape = tuple(draw(st.lists(st.integers(1, 4), min_size=1, max_size=3)))
  a = UOp.new_buffer("CPU", prod(shape), dtypes.float32)
  x = draw(movement_chain(a.reshape(shape)))
  x = x.exp2() if draw(st.booleans()) else x * UOp.const(dtypes.float32, 2.0, "CPU", x.shape)
  if draw(st.booleans()): x = x.contiguous()
  if draw(st.booleans()):
    axes = tuple(sorted(draw(st.sets(st.integers(0, len(x.shape) - 1), min_size=1))))
    x = x.r(draw(st.sampled_from([Ops.ADD, Ops.MAX])), axes)
  if draw(st.booleans()): x = draw(movement_chain(x))
  # a second input read with the final shape, so loads of two different index maps meet
  b = UOp.new_buffer("CPU", prod(x.shape), dtypes.float32)
  out = x + b.reshape(x.shape)
  return out, {a: np.random.default_rng(prod(shape)).standard_normal(prod(shape)).astype(np.float32),
               b: np.random.default_rng(7).standard_normal(prod(x.shape)).astype(np.float32)}


@settings(max_examples=150)
@given(program())
def test_random_programs_match_numpy(prog):
  out, ins = prog
  sched = create_schedule(UOp.sink(out))
  env = ref.run_schedule(sched, ins)
  np.testing.assert_allclose(ref.realized_value(sched, env, out), ref.eval_graph(out, ins), rtol=1e-5, atol=1e-5)
  assert sum(c.src[0].op is Ops.SINK for c in sched.calls) <= 3


from tiny_codegen import get_program  # noqa: E402  (this package: always importable)
from tiny_codegen.renderer.llvmir import LLVMRenderer  # noqa: E402


@settings(max_examples=25)
@given(program())
def test_random_programs_compiled(prog):
  import kernel_runner as kr
  out, ins = prog
  sched = create_schedule(UOp.sink(out))
  env = {b: a.copy() for b, a in ins.items()}
  for c in sched.calls:
    ast, bufs = c.src[0], c.src[1:]
    for b in bufs:
      if b not in env: env[b] = np.full(b.arg, 77, np.float32)
    if ast.op is Ops.SINK: kr.run(get_program(ast, LLVMRenderer()), [env[b] for b in bufs])
    elif ast.op is Ops.SLICE: env[bufs[0]] = env[bufs[1]][ast.arg // 4:][:bufs[0].arg]
  np.testing.assert_allclose(ref.realized_value(sched, env, out), ref.eval_graph(out, ins), rtol=1e-5, atol=1e-5)


@st.composite
def dag_program(draw):
  """Several outputs sharing values: reduces broadcast back (softmax-like), values used twice, contiguous cuts."""
  shape = tuple(draw(st.lists(st.integers(1, 4), min_size=2, max_size=3)))
  a = UOp.new_buffer("CPU", prod(shape), dtypes.float32)
  vals = [a.reshape(shape)]
  for _ in range(draw(st.integers(1, 5))):
    x = draw(st.sampled_from(vals))
    kind = draw(st.sampled_from(["reduce_back", "binary", "unary", "contiguous", "permute_flip"]))
    if kind == "reduce_back":
      ax = draw(st.integers(0, len(shape) - 1))
      x = x - x.r(draw(st.sampled_from([Ops.ADD, Ops.MAX])), (ax,)).expand(shape)
    elif kind == "binary": x = x * draw(st.sampled_from(vals)) + x
    elif kind == "unary": x = (x * UOp.const(dtypes.float32, 0.25, "CPU", shape)).exp2()
    elif kind == "contiguous": x = x.contiguous()
    else: x = x.flip(tuple(True for _ in shape)).permute(tuple(range(len(shape)))[::-1]).permute(
      tuple(range(len(shape)))[::-1])
    vals.append(x)
  outs = list(dict.fromkeys(draw(st.lists(st.sampled_from(vals[1:]), min_size=1, max_size=3))))
  if draw(st.booleans()): outs.append(vals[-1].r(Ops.ADD, tuple(range(len(shape)))))
  return outs, {a: np.random.default_rng(prod(shape)).standard_normal(prod(shape)).astype(np.float32)}


@settings(max_examples=100)
@given(dag_program())
def test_random_dags_match_numpy(prog):
  outs, ins = prog
  sched = create_schedule(UOp.sink(*outs))
  env = ref.run_schedule(sched, ins)
  for o in outs:
    np.testing.assert_allclose(ref.realized_value(sched, env, o), ref.eval_graph(o, ins), rtol=1e-4, atol=1e-5)


@st.composite
def assign_program(draw):
  """Assigns into input buffers mixed with reads of old and new values: ordering, in-kernel forwarding, planner.
  No value depends on two versions of a buffer other than the original one (only the original is snapshotted).
  Reading the original value together with assigned ones is allowed: the scheduler snapshots it."""
  shape = tuple(draw(st.lists(st.integers(1, 4), min_size=1, max_size=2)))
  bufs = [UOp.new_buffer("CPU", prod(shape), dtypes.float32) for _ in range(3)]
  cur = [b.reshape(shape) for b in bufs]  # the latest version of each buffer
  vers: dict[UOp, dict[UOp, UOp | None]] = {c: {b: None} for c, b in zip(cur, bufs)}  # buffer -> version read
  outs: list[UOp] = []
  for _ in range(draw(st.integers(1, 5))):
    a, c = draw(st.sampled_from(list(vers))), draw(st.sampled_from(list(vers)))
    if any(b in vers[c] and vers[c][b] is not v and v is not None and vers[c][b] is not None
           for b, v in vers[a].items()): c = a
    x = a * UOp.const(dtypes.float32, 0.5, "CPU", shape) + c
    xv = {b: v for d in (vers[a], vers[c]) for b, v in d.items() if v is not None}
    xv.update({b: None for d in (vers[a], vers[c]) for b, v in d.items() if v is None and b not in xv})
    if draw(st.booleans()): x = x.r(Ops.MAX, (0,)).expand(shape) - x
    if draw(st.booleans()):
      k = draw(st.integers(0, 2))
      cur[k] = cur[k].assign(x)
      # what it read stays a dependency of its readers (they come after it, so after those versions)
      vers[cur[k]] = {**xv, bufs[k]: cur[k]}
      outs.append(cur[k])
    else:
      x = x.contiguous()
      vers[x] = xv  # its own buffer, but ordered after what it read: keep one version per buffer downstream
      outs.append(x)
  rng = np.random.default_rng(prod(shape))
  return outs, {b: rng.standard_normal(prod(shape)).astype(np.float32) for b in bufs}


@settings(max_examples=100)
@given(assign_program())
def test_random_assign_programs_match_numpy(prog):
  outs, ins = prog
  sched = create_schedule(UOp.sink(*outs))
  env = ref.run_schedule(sched, ins)
  def base(o: UOp) -> UOp:
    while o.op is not Ops.BUFFER: o = o.src[0]
    return o
  final = {base(o): o for o in outs if o.op is Ops.ASSIGN}  # the last assign into each buffer: its final value
  for o in outs:
    if o.op is Ops.ASSIGN and final[base(o)] is not o: continue  # overwritten again later: not observable
    np.testing.assert_allclose(ref.realized_value(sched, env, o), ref.eval_graph(o, ins), rtol=1e-5, atol=1e-5)
