"""Eager OnnxRunner calls that repeat an input signature replay the graph their second call built (OnnxRunner's doc,
"Eager calls"): every call's numbers against numpy/onnxruntime with new data each time, results never overwritten by
later calls, graphs that depend on the inputs' values (a shape fed as data, random operators) built again by every
call, runtime index checks still raised, kernels replayed without scheduling, threads apart."""
import threading

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from tiny_tensor import Context, GlobalCounters, engine
from tiny_tensor.nn.onnx import OnnxError, OnnxRunner

F, I64 = TensorProto.FLOAT, TensorProto.INT64
n = helper.make_node


def _model(nodes, inputs, outputs, inits=(), opset=17):
  g = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
  return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def _mlp(rng):
  """x (3, 8) float, ids (3,) int64 indices into a (10, 8) table: relu(x @ w + b) + table[ids], and its softmax."""
  inits = [numpy_helper.from_array(rng.standard_normal((8, 8)).astype(np.float32), "w"),
           numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "b"),
           numpy_helper.from_array(rng.standard_normal((10, 8)).astype(np.float32), "table")]
  nodes = [n("MatMul", ["x", "w"], ["xw"]), n("Add", ["xw", "b"], ["xb"]), n("Relu", ["xb"], ["h"]),
           n("Gather", ["table", "ids"], ["e"], axis=0, name="embed"), n("Add", ["h", "e"], ["y"]),
           n("Softmax", ["y"], ["p"], axis=-1)]
  ins = [helper.make_tensor_value_info("x", F, [3, 8]), helper.make_tensor_value_info("ids", I64, [3])]
  outs = [helper.make_tensor_value_info("y", F, [3, 8]), helper.make_tensor_value_info("p", F, [3, 8])]
  return _model(nodes, ins, outs, inits)


def _feeds(rng):
  return {"x": rng.standard_normal((3, 8)).astype(np.float32), "ids": rng.integers(-10, 10, 3).astype(np.int64)}


def test_repeated_calls_match_onnxruntime_and_keep_their_results():
  rng = np.random.default_rng(0)
  m = _mlp(rng)
  sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
  r = OnnxRunner(m)
  kept = []
  for _ in range(6):
    feeds = _feeds(rng)
    got = r(feeds)
    want = sess.run(None, feeds)
    kept.append((got, want))
  for got, want in kept:  # every result still holds its own call's numbers after the later calls
    np.testing.assert_allclose(got["y"].numpy(), want[0], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got["p"].numpy(), want[1], rtol=1e-5, atol=1e-6)


def test_replays_run_the_recorded_kernels_without_scheduling(monkeypatch):
  rng = np.random.default_rng(1)
  r = OnnxRunner(_mlp(rng))
  for _ in range(2): r(_feeds(rng))["y"].numpy()
  GlobalCounters.reset()
  r(_feeds(rng))
  kernels = GlobalCounters.kernel_count
  assert kernels >= 1
  import tiny_codegen.schedule as sched
  calls = []
  real = sched.create_schedule
  monkeypatch.setattr(sched, "create_schedule", lambda *a, **k: calls.append(1) or real(*a, **k))
  GlobalCounters.reset()
  feeds = _feeds(rng)
  y = r(feeds)["y"]
  assert GlobalCounters.kernel_count == kernels and not calls
  monkeypatch.undo()
  want = np.maximum(feeds["x"] @ numpy_helper.to_array(r.model.graph.initializer[0]) +
                    numpy_helper.to_array(r.model.graph.initializer[1]), 0)
  want += numpy_helper.to_array(r.model.graph.initializer[2])[feeds["ids"]]
  np.testing.assert_allclose(y.numpy(), want, rtol=1e-5, atol=1e-5)


def test_bad_runtime_index_raises_in_a_replay_and_the_runner_goes_on():
  rng = np.random.default_rng(2)
  m = _mlp(rng)
  sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
  r = OnnxRunner(m)
  for _ in range(3): r(_feeds(rng))
  bad = _feeds(rng)
  bad["ids"][1] = 10
  with pytest.raises(OnnxError, match=r"'embed'.*10.*\[-10, 9\]"): r(bad)
  bad["ids"][1] = -11
  with pytest.raises(OnnxError, match=r"'embed'.*-11"): r(bad)
  feeds = _feeds(rng)
  np.testing.assert_allclose(r(feeds)["y"].numpy(), sess.run(None, feeds)[0], rtol=1e-5, atol=1e-5)


def test_a_shape_fed_as_data_is_read_by_every_call():
  # the same input signature (a (2,) int64 shape), other values: the graph differs from call to call
  m = _model([n("Reshape", ["x", "s"], ["r"]), n("Mul", ["r", "r"], ["y"])],
             [helper.make_tensor_value_info("x", F, [12]), helper.make_tensor_value_info("s", I64, [2])],
             [helper.make_tensor_value_info("y", F, None)])
  r = OnnxRunner(m)
  x = np.arange(12, dtype=np.float32)
  for shape in ([3, 4], [4, 3], [2, 6], [6, 2], [12, 1]):
    y = r({"x": x, "s": np.array(shape, np.int64)})["y"]
    assert y.shape == tuple(shape)
    np.testing.assert_array_equal(y.numpy(), (x * x).reshape(shape))


def test_random_operators_draw_new_numbers_every_call():
  m = _model([n("Bernoulli", ["x"], ["y"])],
             [helper.make_tensor_value_info("x", F, [64])], [helper.make_tensor_value_info("y", F, [64])])
  r = OnnxRunner(m)
  x = np.full(64, 0.5, np.float32)
  draws = [r({"x": x})["y"].numpy() for _ in range(5)]
  assert all(set(np.unique(d)) <= {0.0, 1.0} for d in draws)
  assert len({d.tobytes() for d in draws}) == 5  # 2**-64 odds of two equal draws


def test_an_output_that_is_an_input_is_not_overwritten():
  m = _model([n("Identity", ["x"], ["y"]), n("Neg", ["x"], ["z"])],
             [helper.make_tensor_value_info("x", F, [4])],
             [helper.make_tensor_value_info("y", F, [4]), helper.make_tensor_value_info("z", F, [4])])
  r = OnnxRunner(m)
  outs = [(v, r({"x": np.full(4, v, np.float32)})) for v in range(5)]
  for v, o in outs:
    np.testing.assert_array_equal(o["y"].numpy(), np.full(4, v, np.float32))
    np.testing.assert_array_equal(o["z"].numpy(), np.full(4, -v, np.float32))


def test_threads_replay_their_own_inputs():
  rng = np.random.default_rng(3)
  m = _mlp(rng)
  sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
  r = OnnxRunner(m)
  errors: list[str] = []

  def work(seed: int) -> None:
    g = np.random.default_rng(seed)
    for _ in range(8):
      feeds = _feeds(g)
      got, want = r(feeds)["y"].numpy(), sess.run(None, feeds)[0]
      if not np.allclose(got, want, rtol=1e-5, atol=1e-5): errors.append(f"thread {seed}: {got} != {want}")

  ts = [threading.Thread(target=work, args=(s,)) for s in (10, 11, 12)]
  for t in ts: t.start()
  for t in ts: t.join()
  assert not errors, errors[0]


def test_codegen_flags_and_reuse_off_give_the_same_numbers():
  rng = np.random.default_rng(4)
  m = _mlp(rng)
  sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
  r, plain = OnnxRunner(m), OnnxRunner(m, reuse_graphs=False)
  for _ in range(3): r(_feeds(rng))
  feeds = _feeds(rng)
  with Context(NOOPT=1): y = r(feeds)["y"].numpy()  # the recording's programs were compiled optimized
  np.testing.assert_allclose(y, sess.run(None, feeds)[0], rtol=1e-5, atol=1e-5)
  for _ in range(3):
    feeds = _feeds(rng)
    got = plain(feeds)["y"]
    assert not engine.is_realized(got.uop)  # built in the call, lazy, as tinygrad's
    np.testing.assert_allclose(got.numpy(), sess.run(None, feeds)[0], rtol=1e-5, atol=1e-5)
