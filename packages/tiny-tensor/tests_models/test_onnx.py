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
