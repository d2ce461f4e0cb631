"""The spec verifier: good graphs of each stage pass, bad ones fail with an error naming the node and the rule."""
import pytest

from tiny_uop import AxisType, Context, KernelInfo, Ops, UOp, dtypes
from tiny_uop.dtype import AddrSpace
from tiny_uop.pattern import PatternMatcher, UPat
from tiny_uop.spec import SpecError, kernel_spec, maybe_verify, program_spec, tensor_spec, type_verify, verify

F32 = dtypes.float32


# ***** tensor graph *****
def tensor_graph():
  a = UOp.new_buffer("CPU", 12, F32).reshape((3, 4))
  b = UOp.new_buffer("CPU", 4, F32).reshape((1, 4)).expand((3, 4))
  s = ((a + b) * a.const_like(2.0)).r(Ops.ADD, (1,))
  pad = ((1, 1), (0, 0))
  m = (a.exp2().permute((1, 0)).pad(pad) < 3.0).where(a.const_like(1.0).permute((1, 0)).pad(pad), 0.5)
  n = UOp.variable("n", 1, 4).bind(2)
  return UOp.sink(s.contiguous(), m.cast(dtypes.half), a.copy_to_device("PYTHON"), a.bitcast(dtypes.int32).detach(), n,
                  a.shrink(((0, 2), (1, 3))).flip((True, False)))


def test_tensor_spec_accepts_a_real_graph():
  type_verify(tensor_graph(), tensor_spec)


def test_tensor_spec_rejects_kernel_ops():
  idx = UOp.range(UOp.const(dtypes.index, 4), 0)
  with pytest.raises(SpecError, match=r"tensor_spec: Ops.RANGE is not allowed at this stage \(allowed: .*BUFFER"):
    type_verify(UOp.sink(idx), tensor_spec)


def test_tensor_spec_rejects_mixed_dtypes_and_names_the_node():
  a = UOp.new_buffer("CPU", 4, F32)
  bad = UOp(Ops.ADD, F32, (a, UOp.new_buffer("CPU", 4, dtypes.int32)))
  with pytest.raises(SpecError) as e: type_verify(UOp.sink(bad), tensor_spec)
  msg = str(e.value)
  assert "Ops.ADD dtypes.float32 fails rule _alu_ok" in msg and "sources of dtype [dtypes.int32]" in msg
  assert "= ADD dtypes.float32" in msg  # the pretty-printed node


def test_tensor_spec_rejects_bad_shapes_and_reduce_args():
  a, b = UOp.new_buffer("CPU", 4, F32), UOp.new_buffer("CPU", 6, F32)
  with pytest.raises(SpecError, match="bad shape: .*different shapes"):
    type_verify(UOp(Ops.ADD, F32, (a, b)), tensor_spec)
  with pytest.raises(SpecError, match="REDUCE_AXIS op is Ops.SUB"):
    type_verify(UOp(Ops.REDUCE_AXIS, F32, (a,), (Ops.SUB, (0,))), tensor_spec)
  with pytest.raises(SpecError, match="COPY is COPY"): type_verify(UOp(Ops.COPY, F32, (a, a)), tensor_spec)
  with pytest.raises(SpecError, match="BUFFER is BUFFER"): type_verify(UOp(Ops.BUFFER, F32, (), 4), tensor_spec)


# ***** kernel AST *****
def kernel_ast():
  out = UOp(Ops.PARAM, F32.ptr(12), arg=0)
  inp = UOp(Ops.PARAM, F32.ptr(48), arg=1)
  i = UOp.range(UOp.const(dtypes.index, 12), 0, AxisType.LOOP)
  j = UOp.range(UOp.const(dtypes.index, 4), 1, AxisType.REDUCE)
  val = inp.index(i * 4 + j, (j < 3)).load()
  red = (val * 2.0).reduce(j, arg=Ops.ADD)
  return UOp(Ops.SINK, src=(out.index(i).store(red.maximum(0.0)),), arg=KernelInfo("r_12_4"))


def test_kernel_spec_accepts_an_ast():
  type_verify(kernel_ast(), kernel_spec)
  assert verify(kernel_ast(), kernel_spec) is True


@pytest.mark.parametrize("make,match", [
  (lambda p, i: UOp(Ops.SINK, src=(p.index(i).store(UOp.const(dtypes.int32, 1)),), arg=KernelInfo()),
   "STORE of dtypes.int32 into a pointer to dtypes.float32"),
  (lambda p, i: UOp(Ops.SINK, src=(p.index(i).store(UOp.const(F32, 1.0)),)), "a kernel's SINK carries a KernelInfo"),
  (lambda p, i: UOp(Ops.SINK, src=(p.index(i.cast(F32)).store(UOp.const(F32, 1.0)),), arg=KernelInfo()),
   "INDEX idx is dtypes.float32, not an integer"),
  (lambda p, i: UOp(Ops.SINK, src=(p.index(i).store(UOp(Ops.CONST, F32, arg="1")),), arg=KernelInfo()),
   "float constant holds str '1'"),
  (lambda p, i: UOp(Ops.SINK, src=(p.index(i).store(UOp(Ops.REDUCE, F32, (p.index(i).load(),), Ops.SUB)),),
                    arg=KernelInfo()), "REDUCE arg is Ops.SUB"),
  (lambda p, i: UOp(Ops.SINK, src=(p.index(i).store(UOp.const(dtypes.int32, 3).alu(Ops.EXP2).cast(F32)),),
                    arg=KernelInfo()), "EXP2 needs a float dtype"),
  (lambda p, i: UOp(Ops.SINK, src=(p.index(i).store(p.index(i).load().contiguous()),), arg=KernelInfo()),
   "CONTIGUOUS is not allowed at this stage"),
])
def test_kernel_spec_rejects(make, match):
  p = UOp(Ops.PARAM, F32.ptr(4), arg=0)
  i = UOp.range(UOp.const(dtypes.index, 4), 0)
  with pytest.raises(SpecError, match=match): type_verify(make(p, i), kernel_spec)


def test_alu_rules():
  x, b = UOp.variable("x", 0, 9), UOp.variable("x", 0, 1).ne(0)
  f = x.cast(F32)
  v2 = UOp(Ops.VECTORIZE, F32.vec(2), (f, f))
  for good in (x < 3, b.where(f, 1.0), x << 2, UOp(Ops.SHL, x.dtype, (x, UOp.const(dtypes.uint32, 1))),
               f.alu(Ops.MULACC, f, f), UOp.const(dtypes.uint64, 1).alu(Ops.THREEFRY, UOp.const(dtypes.uint64, 2)),
               f.bitcast(dtypes.int32), v2, UOp(Ops.GEP, F32, (v2,), (1,))):
    type_verify(good, kernel_spec)
  bad = [(UOp(Ops.WHERE, F32, (x, f, f)), "WHERE condition is dtypes.int32"),
         (UOp(Ops.CMPLT, F32, (f, f)), "CMPLT of dtypes.float32 gives dtypes.bool"),
         (UOp(Ops.SHL, F32, (f, f)), "SHL needs an integer dtype"),
         (UOp(Ops.ADD, F32, (f,)), "ADD takes 2 sources, got 1"),
         (UOp(Ops.BITCAST, dtypes.int16, (f,)), "BITCAST dtypes.float32 \\(4 bytes\\) -> dtypes.int16"),
         (UOp(Ops.GEP, F32, (UOp(Ops.VECTORIZE, F32.vec(2), (f, f)),), (2,)), "GEP lanes \\(2,\\) out of range"),
         (UOp(Ops.VECTORIZE, F32.vec(2), (f, x)), r"VECTORIZE to dtypes.float32.vec\(2\) of sources \[dtypes.int32\]"),
         (UOp(Ops.XOR, F32, (f, f)), "XOR needs int or bool"),
         (UOp(Ops.CONST, dtypes.uint8, arg=300), "constant 300 is out of range of dtypes.uint8"),
         (UOp(Ops.DEFINE_VAR, dtypes.int32, arg=("n", 5, 1)), "min <= max")]
  for node, match in bad:
    with pytest.raises(SpecError, match=match): type_verify(node, kernel_spec)


# ***** linear program *****
def linear_program():
  out = UOp(Ops.PARAM, F32.ptr(16), arg=0)
  inp = UOp(Ops.PARAM, F32.ptr(16), arg=1)
  n = UOp.variable("n", 1, 16)
  g = UOp(Ops.SPECIAL, dtypes.index, (UOp.const(dtypes.index, 4),), "gidx0")
  acc = UOp(Ops.DEFINE_REG, F32.ptr(1, AddrSpace.REG), arg=0)
  r = UOp.range(n, 0, AxisType.REDUCE)
  slot = acc.index(UOp.const(dtypes.index, 0))
  init = slot.store(UOp.const(F32, 0.0))
  ld = inp.index(g * 4 + r, r < 16).load()
  upd = slot.store(slot.load(init, r) + ld)
  end = UOp(Ops.END, src=(upd, r))
  res = slot.load(end)
  cond = g < 2
  iff = UOp(Ops.IF, src=(cond,))
  st = out.index(g).store(res.sqrt(), iff)
  endif = UOp(Ops.ENDIF, src=(iff,))
  sink = UOp(Ops.SINK, src=(st, endif))
  return list(sink.toposort())


def test_program_spec_accepts_a_linear_program():
  type_verify(linear_program(), program_spec)


def test_program_spec_checks_order_and_stage():
  uops = linear_program()
  with pytest.raises(SpecError, match=r"program_spec: uop 0 .* don't come before it"):
    type_verify(uops[::-1], program_spec)
  red = UOp.variable("x", 0, 3).reduce(UOp.range(UOp.const(dtypes.index, 4), 0), arg=Ops.ADD)
  with pytest.raises(SpecError, match="REDUCE is not allowed at this stage"): type_verify(red, program_spec)
  bad_reg = UOp(Ops.DEFINE_REG, F32.ptr(4), arg=0)
  with pytest.raises(SpecError, match="DEFINE_REG is a pointer in AddrSpace.REG"): type_verify([bad_reg], program_spec)
  with pytest.raises(SpecError, match="SPECIAL arg is its name"):
    type_verify(UOp(Ops.SPECIAL, dtypes.index, (UOp.const(dtypes.index, 4),), 0), program_spec)


def test_maybe_verify_only_with_SPEC():
  bad = UOp(Ops.ADD, F32, (UOp.const(F32, 1.0), UOp.const(dtypes.int32, 1)))
  with Context(SPEC=0): maybe_verify(bad, kernel_spec, "after_opt")
  with Context(SPEC=1):
    with pytest.raises(SpecError, match="^after_opt: Ops.ADD"): maybe_verify(bad, kernel_spec, "after_opt")


def test_custom_boolean_spec():
  # any True/False matcher works as a spec; False names the rule
  def no_neg(x): return x.arg >= 0
  spec = PatternMatcher([(UPat(Ops.CONST, name="x"), no_neg), (UPat(Ops.ADD), lambda: True)], name="mine")
  type_verify(UOp.const(dtypes.int32, 1) + 2, spec)
  with pytest.raises(SpecError, match="mine: Ops.CONST dtypes.int32 fails rule no_neg .*the rule returned False"):
    type_verify(UOp.const(dtypes.int32, -1) + 2, spec)
