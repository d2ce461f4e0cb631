"""ONNX edge cases that type-checking the operator modules turned up: GatherND with an empty last index dim (each
index row picks a whole slice) against onnxruntime, and clear OnnxErrors for a GatherND index longer than the data's
rank and for a Resize given neither scales nor sizes (onnxruntime refuses both)."""
import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper  # noqa: E402

from tiny_tensor.nn.onnx import OnnxError, OnnxRunner  # noqa: E402


def _model(node, inputs) -> onnx.ModelProto:
  g = helper.make_graph([node], "g", [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
                        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
  return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


X = np.arange(24, dtype=np.float32).reshape(2, 3, 4)


@pytest.mark.parametrize("batch_dims, ishape", [(0, (2, 0)), (0, (3, 2, 0)), (1, (2, 0))])
def test_gathernd_empty_index_rows_pick_whole_slices(batch_dims, ishape):
  m = _model(helper.make_node("GatherND", ["x", "i"], ["y"], batch_dims=batch_dims),
             [("x", TensorProto.FLOAT, X.shape), ("i", TensorProto.INT64, ishape)])
  feed = {"x": X, "i": np.zeros(ishape, np.int64)}
  want = ort.InferenceSession(m.SerializeToString()).run(None, feed)[0]
  got = OnnxRunner(m)(feed)["y"].numpy()
  assert got.shape == want.shape
  np.testing.assert_equal(got, want)


def test_gathernd_index_longer_than_rank_is_a_clear_error():
  m = _model(helper.make_node("GatherND", ["x", "i"], ["y"]),
             [("x", TensorProto.FLOAT, X.shape), ("i", TensorProto.INT64, (1, 4))])
  feed = {"x": X, "i": np.zeros((1, 4), np.int64)}
  with pytest.raises(Exception, match="GatherND"): ort.InferenceSession(m.SerializeToString()).run(None, feed)
  with pytest.raises(OnnxError, match=r"indices' last dim 4 must be at most the data's rank 3 - batch_dims 0"):
    OnnxRunner(m)(feed)


def test_resize_with_neither_scales_nor_sizes_is_a_clear_error():
  m = _model(helper.make_node("Resize", ["x", "", ""], ["y"]), [("x", TensorProto.FLOAT, X.shape)])
  with pytest.raises(Exception, match="(?i)scales|sizes|Resize"):
    ort.InferenceSession(m.SerializeToString()).run(None, {"x": X})
  with pytest.raises(OnnxError, match="Resize needs scales or sizes"): OnnxRunner(m)({"x": X})
