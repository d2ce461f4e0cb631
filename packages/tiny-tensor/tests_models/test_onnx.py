"""tiny_tensor.nn.onnx: the runner's API and errors, opset-dependent operator semantics, and the onnx package's node
conformance cases (pass rate >= 85%, run in two processes to fit the CI budget)."""
import collections
import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnx_conformance
from tiny_tensor import Tensor
from tiny_tensor.nn.onnx import OnnxError, OnnxRunner


def _model(nodes, inputs, outputs, inits=(), opset=17):
  g = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
  return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def _vi(name, shape, t=TensorProto.FLOAT): return helper.make_tensor_value_info(name, t, shape)


def test_small_convnet_from_file_against_numpy(tmp_path):
  rng = np.random.default_rng(0)
  w, b = rng.standard_normal((4, 3, 3, 3)).astype(np.float32), rng.standard_normal(4).astype(np.float32)
  fc = rng.standard_normal((4, 5)).astype(np.float32)
  m = _model([helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
              helper.make_node("Relu", ["c"], ["r"]),
              helper.make_node("GlobalAveragePool", ["r"], ["p"]),
              helper.make_node("Flatten", ["p"], ["f"]),
              helper.make_node("Gemm", ["f", "fc"], ["y"], alpha=0.5)],
             [_vi("x", [2, 3, 8, 8])], [_vi("y", [2, 5])],
             [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b"), numpy_helper.from_array(fc, "fc")])
  onnx.save(m, tmp_path / "m.onnx")
  x = rng.standard_normal((2, 3, 8, 8)).astype(np.float32)
  out = OnnxRunner(tmp_path / "m.onnx")({"x": Tensor(x)})
  xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
  conv = np.zeros((2, 4, 8, 8), np.float32)
  for i in range(3):
    for j in range(3): conv += np.einsum("nchw,oc->nohw", xp[:, :, i:i + 8, j:j + 8], w[:, :, i, j])
  want = 0.5 * np.maximum(conv + b[None, :, None, None], 0).mean((2, 3)) @ fc
  assert list(out) == ["y"]
  np.testing.assert_allclose(out["y"].numpy(), want, rtol=1e-4, atol=1e-4)
  out2 = OnnxRunner(m.SerializeToString())({"x": x})  # bytes and numpy inputs work too
  np.testing.assert_allclose(out2["y"].numpy(), want, rtol=1e-4, atol=1e-4)


def test_errors_name_what_is_wrong():
  m = _model([helper.make_node("FancyOp", ["x"], ["y"]), helper.make_node("OtherOp", ["y"], ["z"])],
             [_vi("x", [2])], [_vi("z", [2])])
  with pytest.raises(OnnxError, match=r"unsupported ONNX operators: \['FancyOp', 'OtherOp'\]"): OnnxRunner(m)
  r = OnnxRunner(_model([helper.make_node("Relu", ["x"], ["y"])], [_vi("x", [2])], [_vi("y", [2])]))
  with pytest.raises(KeyError, match="missing"): r({})
  with pytest.raises(KeyError, match="unknown ONNX input"): r({"x": np.zeros(2, np.float32), "q": 1})
  bad = _model([helper.make_node("Reshape", ["x", "s"], ["y"])], [_vi("x", [6]), _vi("s", [2], TensorProto.INT64)],
               [_vi("y", None)])
  with pytest.raises(OnnxError, match=r"Reshape.*shape mismatch"):
    OnnxRunner(bad)({"x": np.zeros(6, np.float32), "s": np.array([4, 4], np.int64)})
  with pytest.raises(TypeError, match="path, bytes or onnx.ModelProto"): OnnxRunner(3)


@pytest.mark.parametrize("opset", [11, 13])
def test_softmax_follows_the_opset(opset):
  # opset < 13 flattens the input to 2-D at `axis`; 13+ normalizes along `axis` alone
  x = np.random.default_rng(1).standard_normal((2, 3, 4)).astype(np.float32)
  m = _model([helper.make_node("Softmax", ["x"], ["y"], axis=1)], [_vi("x", [2, 3, 4])], [_vi("y", [2, 3, 4])],
             opset=opset)
  got = OnnxRunner(m)({"x": x})["y"].numpy()
  if opset < 13:
    f = x.reshape(2, 12)
    want = (np.exp(f - f.max(1, keepdims=True)) / np.exp(f - f.max(1, keepdims=True)).sum(1, keepdims=True))
    want = want.reshape(x.shape)
  else: want = np.exp(x) / np.exp(x).sum(1, keepdims=True)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_attribute_turned_input_and_negative_axes():
  x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
  old = _model([helper.make_node("ReduceSum", ["x"], ["y"], axes=[-1], keepdims=0)], [_vi("x", [2, 3, 4])],
               [_vi("y", [2, 3])], opset=11)
  new = _model([helper.make_node("ReduceSum", ["x", "a"], ["y"], keepdims=0)], [_vi("x", [2, 3, 4])],
               [_vi("y", [2, 3])], [numpy_helper.from_array(np.array([-1], np.int64), "a")], opset=13)
  for m in (old, new): np.testing.assert_array_equal(OnnxRunner(m)({"x": x})["y"].numpy(), x.sum(-1))
  sp = _model([helper.make_node("Split", ["x"], ["a", "b"], axis=-1, split=[1, 3])], [_vi("x", [2, 3, 4])],
              [_vi("a", None), _vi("b", None)], opset=11)
  out = OnnxRunner(sp)({"x": x})
  np.testing.assert_array_equal(out["a"].numpy(), x[..., :1])
  np.testing.assert_array_equal(out["b"].numpy(), x[..., 1:])
  # broadcasting in a binary op and an omitted optional input (Clip without min)
  cm = _model([helper.make_node("Add", ["x", "c"], ["s"]), helper.make_node("Clip", ["s", "", "m"], ["y"])],
              [_vi("x", [2, 3, 4])], [_vi("y", [2, 3, 4])],
              [numpy_helper.from_array(np.array([100, 0, -100, 5], np.float32), "c"),
               numpy_helper.from_array(np.array(20, np.float32), "m")])
  np.testing.assert_array_equal(OnnxRunner(cm)({"x": x})["y"].numpy(), np.minimum(x + [100, 0, -100, 5], 20))


def test_control_flow_if_and_loop():
  then = helper.make_graph([helper.make_node("Constant", [], ["o"], value=numpy_helper.from_array(
    np.array([1.0], np.float32)))], "t", [], [_vi("o", [1])])
  els = helper.make_graph([helper.make_node("Neg", ["x"], ["o"])], "e", [], [_vi("o", [1])])
  m = _model([helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=els)],
             [_vi("c", [], TensorProto.BOOL), _vi("x", [1])], [_vi("y", [1])])
  r = OnnxRunner(m)
  assert r({"c": np.array(True), "x": np.array([3.0], np.float32)})["y"].tolist() == [1.0]
  assert r({"c": np.array(False), "x": np.array([3.0], np.float32)})["y"].tolist() == [-3.0]
  body = helper.make_graph([helper.make_node("Identity", ["cond"], ["cond_out"]),
                            helper.make_node("Cast", ["i"], ["i_f"], to=TensorProto.FLOAT),
                            helper.make_node("Add", ["acc", "i_f"], ["acc_out"])], "body",
                           [_vi("i", [], TensorProto.INT64), _vi("cond", [], TensorProto.BOOL), _vi("acc", [])],
                           [_vi("cond_out", [], TensorProto.BOOL), _vi("acc_out", [])])
  lm = _model([helper.make_node("Loop", ["n", "", "a0"], ["a"], body=body)],
              [_vi("n", [], TensorProto.INT64), _vi("a0", [])], [_vi("a", [])])
  assert OnnxRunner(lm)({"n": np.array(5, np.int64), "a0": np.array(0.5, np.float32)})["a"].item() == 10.5


# ***** what onnxruntime refuses must fail here too (checked against onnxruntime 1.32 when written) *****
def _one(op, inputs, feed, inits=(), **attrs):
  """A one-node model `op(inputs) -> y`; `inputs`: value infos of the graph inputs (initializers go in `inits`)."""
  names = [i.name for i in inputs] + [t.name for t in inits]
  return OnnxRunner(_model([helper.make_node(op, names, ["y"], **attrs)], inputs, [_vi("y", None)], inits))(feed)


X3 = np.array([10.0, 20.0, 30.0], np.float32)
I64 = TensorProto.INT64


@pytest.mark.parametrize("how", ["numpy", "tensor", "initializer"])
@pytest.mark.parametrize("bad", [10, -10, 3, -4])
def test_gather_index_out_of_range_is_an_error(how, bad):
  idx = np.array([0, bad], np.int64)
  if how == "initializer":
    args = ([_vi("x", [3])], {"x": X3}, [numpy_helper.from_array(idx, "i")])
  else: args = ([_vi("x", [3]), _vi("i", [2], I64)], {"x": X3, "i": idx if how == "numpy" else Tensor(idx)}, [])
  with pytest.raises(OnnxError, match=rf"Gather.*{bad}.*\[-3, 2\]"): _one("Gather", args[0], args[1], args[2])
  # in range, negative indices count from the end, as numpy's take
  ok = {**args[1], "i": np.array([0, -3, 2], np.int64)} if how != "initializer" else args[1]
  if how != "initializer":
    got = _one("Gather", [_vi("x", [3]), _vi("i", [3], I64)], ok)["y"].numpy()
    np.testing.assert_equal(got, np.take(X3, [0, -3, 2]))


def test_gather_of_computed_indices_is_checked_after_the_graph_runs():
  nodes = [helper.make_node("Add", ["i", "i"], ["j"]), helper.make_node("Gather", ["x", "j"], ["y"], name="g")]
  r = OnnxRunner(_model(nodes, [_vi("x", [3]), _vi("i", [2], I64)], [_vi("y", None)]))
  with pytest.raises(OnnxError, match=r"'g' \(Gather\): 1 axis-0 index value\(s\) out of range, e.g. -6"):
    r({"x": X3, "i": np.array([1, -3], np.int64)})
  np.testing.assert_equal(r({"x": X3, "i": np.array([1, -1], np.int64)})["y"].numpy(), np.take(X3, [2, -2]))
  scalar = OnnxRunner(_model([helper.make_node("Gather", ["x", "i"], ["y"])], [_vi("x", [3]), _vi("i", [], I64)],
                             [_vi("y", None)]))
  with pytest.raises(OnnxError, match=r"index -4 is out of range \[-3, 2\]"): scalar({"x": X3, "i": np.array(-4)})


def test_eager_index_checks_run_with_the_outputs_in_one_schedule(monkeypatch):
  # the deferred checks read the graph's own computed indices: realized together with the outputs, in one realize
  # that exposes nothing (realized alone first, they shared nodes with the lazy outputs: expose + substitute)
  from tiny_tensor import engine
  exposed: list[int] = []
  real = engine.realize
  def counting(uops, expose=(), replay=True):
    exposed.append(len(expose))
    return real(uops, expose, replay)
  monkeypatch.setattr(engine, "realize", counting)
  x = np.arange(12, dtype=np.float32).reshape(3, 4) - 5
  nodes = [helper.make_node("Add", ["i", "i"], ["j"]), helper.make_node("Gather", ["x", "j"], ["g"], name="g"),
           helper.make_node("Relu", ["g"], ["y"])]
  r = OnnxRunner(_model(nodes, [_vi("x", [3, 4]), _vi("i", [2], I64)], [_vi("y", None)]))
  for _ in range(2):
    exposed.clear()
    out = r({"x": x, "i": Tensor(np.array([1, -1], np.int64))})["y"]
    assert engine.is_realized(out.uop) and exposed and not any(exposed)
    np.testing.assert_equal(out.numpy(), np.maximum(np.take(x, [2, -2], axis=0), 0))
  with pytest.raises(OnnxError, match=r"'g' \(Gather\): 1 axis-0 index value\(s\) out of range, e.g. 4"):
    r({"x": x, "i": Tensor(np.array([0, 2], np.int64))})


def test_other_index_taking_operators_refuse_out_of_range_indices():
  x = np.arange(12, dtype=np.float32).reshape(3, 4)
  xi = [_vi("x", [3, 4])]
  cases = [
    ("GatherElements", [_vi("i", [1, 2], I64)], {"i": np.array([[0, 3]])}, {"axis": 0}, r"3 .*\[-3, 2\]"),
    ("GatherND", [_vi("i", [1, 2], I64)], {"i": np.array([[2, -5]])}, {}, r"-5 .*\[-4, 3\]"),
    ("ScatterElements", [_vi("i", [1, 1], I64), _vi("u", [1, 1])], {"i": np.array([[4]]), "u": np.ones((1, 1),
                                                                                                        np.float32)},
     {"axis": 1}, r"4 .*\[-4, 3\]"),
    ("ScatterND", [_vi("i", [1, 1], I64), _vi("u", [1, 4])], {"i": np.array([[-4]]), "u": np.ones((1, 4), np.float32)},
     {}, r"-4 .*\[-3, 2\]"),
  ]
  for op, ins, feed, attrs, msg in cases:
    with pytest.raises(OnnxError, match=rf"\({op}\).*{msg}"): _one(op, xi + ins, {"x": x, **feed}, **attrs)
    feed_t = {k: Tensor(v) if k == "i" else v for k, v in feed.items()}  # runtime indices: the deferred check
    with pytest.raises(OnnxError, match=rf"\({op}\).*out of range"): _one(op, xi + ins, {"x": x, **feed_t}, **attrs)
  # in range (negative ones count from the end), against numpy
  got = _one("GatherND", xi + [_vi("i", [2, 2], I64)], {"x": x, "i": np.array([[2, -1], [-3, 0]])})["y"].numpy()
  np.testing.assert_equal(got, x[[2, -3], [-1, 0]])
  want = x.copy()
  want[-1] = 7.0
  got = _one("ScatterND", xi + [_vi("i", [1, 1], I64), _vi("u", [1, 4])],
             {"x": x, "i": np.array([[-1]]), "u": np.full((1, 4), 7.0, np.float32)})["y"].numpy()
  np.testing.assert_equal(got, want)


def test_maxunpool_and_tensorscatter_refuse_positions_outside_their_output():
  ins = [_vi("x", [1, 1, 1, 1]), _vi("i", [1, 1, 1, 1], I64)]
  x = np.full((1, 1, 1, 1), 5.0, np.float32)
  for bad, how in ((4, "numpy"), (-1, "numpy"), (7, "tensor")):
    i = np.array(bad, np.int64).reshape(1, 1, 1, 1)
    with pytest.raises(OnnxError, match=r"MaxUnpool.*out of range.*\[0, 3\]"):
      _one("MaxUnpool", ins, {"x": x, "i": i if how == "numpy" else Tensor(i)}, kernel_shape=[2, 2], strides=[2, 2])
  got = _one("MaxUnpool", ins, {"x": x, "i": np.array(3, np.int64).reshape(1, 1, 1, 1)}, kernel_shape=[2, 2],
             strides=[2, 2])["y"].numpy()
  np.testing.assert_equal(got, np.array([[[[0, 0], [0, 5]]]], np.float32))  # flat position 3 of the 2x2 output
  ts = OnnxRunner(_model([helper.make_node("TensorScatter", ["c", "u", "w"], ["y"])],
                         [_vi("c", [1, 4, 1]), _vi("u", [1, 2, 1]), _vi("w", [1], I64)], [_vi("y", None)], opset=24))
  c, u = np.zeros((1, 4, 1), np.float32), np.ones((1, 2, 1), np.float32)
  for w in (3, -1):
    with pytest.raises(OnnxError, match=rf"write_indices\[0\] = {w}: valid are 0 .. 2"): ts({"c": c, "u": u, "w": [w]})
  want = c.copy()
  want[0, 2:] = 1.0
  np.testing.assert_equal(ts({"c": c, "u": u, "w": np.array([2])})["y"].numpy(), want)


def test_onehot_depth_must_be_positive_and_out_of_range_indices_are_all_off():
  ins = [_vi("i", [3], I64), _vi("d", [], I64), _vi("v", [2])]
  feed = {"i": np.array([1, 5, -7]), "v": np.array([0.0, 1.0], np.float32)}
  with pytest.raises(OnnxError, match="OneHot depth is 0"): _one("OneHot", ins, {**feed, "d": np.array(0)})
  got = _one("OneHot", ins, {**feed, "d": np.array(3)})["y"].numpy()
  np.testing.assert_equal(got, np.eye(3, dtype=np.float32)[[1]].tolist() + [[0.0] * 3] * 2)  # the spec: all off


def test_expand_refuses_shapes_that_dont_broadcast():
  with pytest.raises(OnnxError, match=r"Expand: input shape \[3\] doesn't broadcast to shape \[4\]"):
    _one("Expand", [_vi("x", [3]), _vi("s", [1], I64)], {"x": X3, "s": np.array([4])})
  got = _one("Expand", [_vi("x", [3, 1]), _vi("s", [3], I64)], {"x": X3.reshape(3, 1), "s": np.array([2, 1, 4])})
  np.testing.assert_equal(got["y"].numpy(), np.broadcast_to(X3.reshape(3, 1), (2, 3, 4)))


def test_conv_kernel_shape_attribute_must_match_the_weight():
  w = numpy_helper.from_array(np.ones((2, 1, 3, 3), np.float32), "w")
  x = np.ones((1, 1, 5, 5), np.float32)
  for op in ("Conv", "ConvTranspose"):
    with pytest.raises(OnnxError, match=rf"{op}: attribute kernel_shape=\[2, 2\] contradicts the weight"):
      _one(op, [_vi("x", [1, 1, 5, 5])], {"x": x}, [w], kernel_shape=[2, 2])
  got = _one("Conv", [_vi("x", [1, 1, 5, 5])], {"x": x}, [w], kernel_shape=[3, 3])["y"].numpy()
  np.testing.assert_equal(got, np.full((1, 2, 3, 3), 9.0, np.float32))  # a 3x3 window of ones


def test_inputs_are_checked_against_the_declared_type_and_shape():
  ident = OnnxRunner(_model([helper.make_node("Identity", ["x"], ["y"])], [_vi("x", [2], I64)], [_vi("y", None)]))
  with pytest.raises(TypeError, match=r"'x' is declared tensor\(int64\), but an array of float64"):
    ident({"x": np.array([1e20, 1.0])})
  with pytest.raises(TypeError, match="an array of int32"): ident({"x": np.array([1, 2], np.int32)})
  with pytest.raises(TypeError, match="a Tensor of dtypes.float"): ident({"x": Tensor([1.0, 2.0])})
  with pytest.raises(TypeError, match="isn't exactly representable"): ident({"x": [1.5, 2.0]})
  assert ident({"x": [7, -3]})["y"].numpy().tolist() == [7, -3]  # Python ints convert exactly
  with pytest.raises(ValueError, match=r"'x' is declared with shape \[2\] \(rank 1\), but one of shape \[2, 1\]"):
    ident({"x": np.zeros((2, 1), np.int64)})
  with pytest.raises(ValueError, match=r"'x' is declared with shape \[2\], but one of shape \[3\].*dim 0: 3 != 2"):
    ident({"x": np.zeros(3, np.int64)})
  add = OnnxRunner(_model([helper.make_node("Add", ["a", "b"], ["y"])], [_vi("a", ["n", 2]), _vi("b", ["n", "m"])],
                          [_vi("y", None)]))
  with pytest.raises(ValueError, match=r"'b' has size 1 in dim 0, declared 'n', but input 'a' gave 'n' size 3"):
    add({"a": np.zeros((3, 2), np.float32), "b": np.zeros((1, 2), np.float32)})
  a, b = np.ones((3, 2), np.float32), np.full((3, 2), 2.0, np.float32)
  np.testing.assert_equal(add({"a": a, "b": b})["y"].numpy(), a + b)  # any size for 'n', the same in both


def test_runtime_index_checks_and_tinyjit():
  from tiny_tensor import TinyJit
  m = _model([helper.make_node("Gather", ["w", "i"], ["y"])], [_vi("i", [2], I64)], [_vi("y", None)],
             [numpy_helper.from_array(X3, "w")])
  checked = OnnxRunner(m)
  jit = TinyJit(lambda i: checked({"i": i})["y"].realize())
  jit(Tensor(np.array([0, 1], np.int64)))  # eager: checked
  with pytest.raises(OnnxError, match="runtime_index_checks=False"): jit(Tensor(np.array([0, 1], np.int64)))
  unchecked = OnnxRunner(m, runtime_index_checks=False)
  jit = TinyJit(lambda i: unchecked({"i": i})["y"].realize())
  for k in range(4):
    idx = np.array([k % 3, -1 - k % 3], np.int64)
    np.testing.assert_equal(jit(Tensor(idx)).numpy(), np.take(X3, idx))


def _run_share(i: int, k: int) -> dict:
  """Worker: collect the cases and run every k-th from the i-th; {name: (operator, None | why it failed)}."""
  every = onnx_conformance.collect()
  by_name = {c.name: c for c in every}
  cases = every[i::k]
  res = onnx_conformance.run_all(cases)
  return {c.name: (onnx_conformance.op_of(c, by_name), res[c.name]) for c in cases}


def _run_cases_in(procs: int) -> dict:
  """All node cases, shared among `procs` worker processes (each collects them itself: the collection, ~30 s, runs
  in parallel too). A worker that crashes fails the test, naming it."""
  res: dict = {}
  ctx = multiprocessing.get_context("spawn")
  with ProcessPoolExecutor(procs, mp_context=ctx) as ex:
    for fut in [ex.submit(_run_share, i, procs) for i in range(procs)]: res.update(fut.result())
  return res


def test_node_conformance_pass_rate():
  res = _run_cases_in(int(os.environ.get("ONNX_CONFORMANCE_PROCS", "2")))
  assert len(res) > 1500, f"only {len(res)} node cases collected from onnx {onnx.__version__}"
  passed = sum(msg is None for _, msg in res.values())
  rate = passed / len(res)
  by_op: dict[str, list[str]] = collections.defaultdict(list)
  for name, (op, msg) in res.items():
    if msg is not None: by_op[op].append(name)
  print(f"\nONNX node conformance (onnx {onnx.__version__}): {passed}/{len(res)} = {100 * rate:.1f}% pass")
  print("failing operators (failed cases): " + ", ".join(f"{op} ({len(v)})" for op, v in
                                                        sorted(by_op.items(), key=lambda kv: -len(kv[1]))))
  # the operators every model uses must pass all their cases
  core = ["Conv", "MatMul", "Gemm", "Relu", "Add", "Mul", "Reshape", "Transpose", "Concat", "Softmax", "MaxPool",
          "AveragePool", "BatchNormalization", "LayerNormalization", "Gather", "Slice", "ReduceMean", "Where", "LSTM"]
  broken = {op: by_op[op] for op in core if op in by_op}
  assert not broken, f"core operators fail: {broken}"
  assert rate >= 0.85, f"pass rate {100 * rate:.1f}% < 85%; failing: {dict(by_op)}"
