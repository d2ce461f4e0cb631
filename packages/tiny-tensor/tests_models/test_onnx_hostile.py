"""ONNX models written to attack the runner: external data outside the model's folder, degenerate Range/Loop,
recursive functions, dangling outputs, and a seeded mutation fuzz. References: onnx's own numpy_helper and numpy."""
import os

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from tiny_tensor.nn.onnx import OnnxError, OnnxModelError, OnnxRunner  # noqa: E402

W = np.arange(6, dtype=np.float32).reshape(2, 3) + 0.5


def _ext_model(location: str, offset: int | None = None, length: int | None = None) -> onnx.ModelProto:
  """y = x + w, w an initializer whose data is external at `location`."""
  w = numpy_helper.from_array(W, "w")
  w.ClearField("raw_data")
  w.data_location = TensorProto.EXTERNAL
  for k, v in (("location", location), ("offset", offset), ("length", length)):
    if v is not None: w.external_data.add(key=k, value=str(v))
  g = helper.make_graph([helper.make_node("Add", ["x", "w"], ["y"])], "g",
                        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])], [w])
  return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _x() -> np.ndarray: return np.ones((2, 3), np.float32)


def test_external_data_from_path_reads_model_folder(tmp_path):
  (tmp_path / "w.bin").write_bytes(b"\0" * 8 + W.tobytes())
  onnx.save(_ext_model("w.bin", offset=8, length=W.nbytes), str(tmp_path / "m.onnx"))
  out = OnnxRunner(str(tmp_path / "m.onnx"))({"x": _x()})["y"].numpy()
  np.testing.assert_allclose(out, _x() + W)


def test_external_data_bytes_and_proto_never_read_cwd(tmp_path, monkeypatch):
  (tmp_path / "secret.bin").write_bytes(W.tobytes())
  monkeypatch.chdir(tmp_path)
  m = _ext_model("secret.bin")
  for model in (m, m.SerializeToString()):
    with pytest.raises(ValueError, match=r"'w'.*'secret\.bin'.*base_dir"):
      OnnxRunner(model)
  # an explicit base_dir is the way to allow it
  out = OnnxRunner(m, base_dir=str(tmp_path))({"x": _x()})["y"].numpy()
  np.testing.assert_allclose(out, _x() + W)


@pytest.mark.parametrize("loc", ["../secret.bin", "sub/../../secret.bin", "/etc/passwd", "nope.bin", ""])
def test_external_data_location_outside_folder(tmp_path, loc):
  (tmp_path / "secret.bin").write_bytes(W.tobytes())
  inner = tmp_path / "model"
  (inner / "sub").mkdir(parents=True)
  with pytest.raises(OnnxModelError, match=r"tensor 'w'"):
    OnnxRunner(_ext_model(loc), base_dir=str(inner))


def test_external_data_symlink_escape(tmp_path):
  (tmp_path / "secret.bin").write_bytes(W.tobytes())
  inner = tmp_path / "model"
  inner.mkdir()
  os.symlink(tmp_path / "secret.bin", inner / "link.bin")
  onnx.save(_ext_model("link.bin"), str(inner / "m.onnx"))
  with pytest.raises(ValueError, match=r"'link\.bin'.*not a file inside"):
    OnnxRunner(str(inner / "m.onnx"))


@pytest.mark.parametrize("offset,length", [(-1, None), (0, W.nbytes + 1), (W.nbytes + 4, None), (4, W.nbytes)])
def test_external_data_offset_length_outside_file(tmp_path, offset, length):
  (tmp_path / "w.bin").write_bytes(W.tobytes())
  with pytest.raises(ValueError, match=r"tensor 'w'.*offset"):
    OnnxRunner(_ext_model("w.bin", offset, length), base_dir=str(tmp_path))
