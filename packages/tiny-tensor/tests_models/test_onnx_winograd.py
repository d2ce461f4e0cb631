"""The ONNX runner's Winograd convs (issue #39): a resnet-style basic block (3x3 conv, ReLU, 3x3 conv, residual add,
ReLU) against onnxruntime with the rule on (`ONNX_WINO=1`, the default) and off, the jit's kernels per replay in each
case (the weights transformed once at load, not in the replay), and a 3-channel stem conv the rule leaves direct."""
import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from tiny_codegen.machine import machine_of  # noqa: E402
from tiny_tensor import Context, Device  # noqa: E402
from tiny_tensor.nn.onnx import OnnxRunner  # noqa: E402
from tiny_tensor.winograd import winograd_tile  # noqa: E402

rng = np.random.default_rng(39)
C, HW = 16, 19  # an odd map: the last tiles run past its edge


def _block() -> onnx.ModelProto:
  inits = [numpy_helper.from_array((rng.standard_normal(s) * 0.2).astype(np.float32), n)
           for n, s in (("w1", (C, C, 3, 3)), ("b1", (C,)), ("w2", (C, C, 3, 3)), ("b2", (C,)))]
  nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], kernel_shape=[3, 3]),
           helper.make_node("Relu", ["c1"], ["r1"]),
           helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]),
           helper.make_node("Add", ["c2", "x"], ["s"]), helper.make_node("Relu", ["s"], ["y"])]
  g = helper.make_graph(nodes, "block", [helper.make_tensor_value_info("x", TensorProto.FLOAT, (1, C, HW, HW))],
                        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
  return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _kernels(runner: OnnxRunner) -> int: return next(iter(runner.jits.values())).captured.kernel_count


def test_basic_block_matches_onnxruntime_with_and_without_winograd():
  model = _block()
  feed = {"x": rng.standard_normal((1, C, HW, HW)).astype(np.float32)}
  want = ort.InferenceSession(model.SerializeToString()).run(None, feed)[0]
  m = winograd_tile(machine_of(Device["CPU"].renderer), 1, C, C, HW, HW)
  assert m in (2, 4)  # 16 channels, weights of 9 KB: every machine model's multiplies saved win
  kernels = {}
  for wino in (0, 1):
    with Context(ONNX_WINO=wino):
      runner = OnnxRunner(model, device="CPU", jit=True)
      for _ in range(3): np.testing.assert_allclose(runner(feed)["y"].numpy(), want, rtol=1e-4, atol=1e-4)
    kernels[wino] = _kernels(runner)
  # direct: one kernel per conv (their weights' channels-last copies made at load); Winograd: per conv its input
  # transform, product, output transform and the NCHW copy (with the bias, ReLU and residual add fused)
  assert kernels == {0: 2, 1: 8}


def test_three_channel_stem_stays_direct():
  w = numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32), "w")
  g = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])], "stem",
                        [helper.make_tensor_value_info("x", TensorProto.FLOAT, (1, 3, 64, 64))],
                        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w])
  model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
  assert winograd_tile(machine_of(Device["CPU"].renderer), 1, 3, 8, 64, 64) == 0
  feed = {"x": rng.standard_normal((1, 3, 64, 64)).astype(np.float32)}
  runner = OnnxRunner(model, device="CPU", jit=True)
  for _ in range(3):
    np.testing.assert_allclose(runner(feed)["y"].numpy(), ort.InferenceSession(model.SerializeToString()).run(
      None, feed)[0], rtol=1e-4, atol=1e-4)
  assert _kernels(runner) == 1
