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


def _model(nodes, inputs, outputs, inits=(), functions=(), opset=17) -> onnx.ModelProto:
  g = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
  ops = [helper.make_opsetid("", opset)] + ([helper.make_opsetid("local", 1)] if functions else [])
  return helper.make_model(g, opset_imports=ops, functions=list(functions))


def _vi(name, et=TensorProto.FLOAT, shape=None): return helper.make_tensor_value_info(name, et, shape)


@pytest.mark.parametrize("s,l,d", [(0, 5, 0), (0, np.inf, 1), (0, np.nan, 1), (np.inf, 5, 1), (0, 5, np.nan)])
@pytest.mark.parametrize("on_host", [True, False])
def test_range_degenerate(s, l, d, on_host):
  vals = [np.array(v, np.float32) for v in (s, l, d)]
  # numpy refuses the same range, the reference that it has no finite length
  with pytest.raises((ZeroDivisionError, ValueError, OverflowError)): np.arange(*[float(v) for v in vals])
  node = helper.make_node("Range", ["s", "l", "d"], ["y"], name="rng")
  if on_host:  # constant inputs: evaluated on the host (host.py)
    m = _model([node], [], [_vi("y")], [numpy_helper.from_array(v, n) for v, n in zip(vals, "sld")])
    with pytest.raises(OnnxModelError, match="'rng'.*Range"): OnnxRunner(m)({})
  else:  # graph inputs: the device operator
    m = _model([node], [_vi(n, shape=[]) for n in "sld"], [_vi("y")])
    with pytest.raises(ValueError, match="'rng'.*Range"): OnnxRunner(m)(dict(zip("sld", vals)))


def test_range_valid_matches_numpy():
  m = _model([helper.make_node("Range", ["s", "l", "d"], ["y"])], [_vi(n, shape=[]) for n in "sld"], [_vi("y")])
  out = OnnxRunner(m)({"s": np.float32(1), "l": np.float32(-4), "d": np.float32(-1.5)})["y"].numpy()
  np.testing.assert_allclose(out, np.arange(1, -4, -1.5, dtype=np.float32))


def test_output_nothing_makes():
  m = _model([helper.make_node("Relu", ["x"], ["y"])], [_vi("x", shape=[2])], [_vi("y"), _vi("ghost")])
  with pytest.raises(ValueError, match="'ghost'"): OnnxRunner(m)


def test_output_in_subgraph_nothing_makes():
  then = helper.make_graph([], "then", [], [_vi("nowhere")])
  other = helper.make_graph([helper.make_node("Identity", ["x"], ["e"])], "else", [], [_vi("e")])
  node = helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)
  m = _model([node], [_vi("c", TensorProto.BOOL, []), _vi("x", shape=[2])], [_vi("y")])
  with pytest.raises(ValueError, match="'nowhere'"): OnnxRunner(m)


@pytest.mark.parametrize("mutual", [False, True])
def test_recursive_function(mutual):
  def fn(name, callee):
    return helper.make_function("local", name, ["a"], ["b"], [helper.make_node(callee, ["a"], ["b"], domain="local")],
                                [helper.make_opsetid("", 17), helper.make_opsetid("local", 1)])
  fns = [fn("F", "G"), fn("G", "F")] if mutual else [fn("F", "F")]
  m = _model([helper.make_node("F", ["x"], ["y"], domain="local")], [_vi("x", shape=[2])], [_vi("y")], functions=fns)
  with pytest.raises(ValueError, match=r"local function 'F'.*F"): OnnxRunner(m)


def test_nonrecursive_functions_still_run():
  f = helper.make_function("local", "F", ["a"], ["b"], [helper.make_node("G", ["a"], ["b"], domain="local")],
                           [helper.make_opsetid("", 17), helper.make_opsetid("local", 1)])
  g = helper.make_function("local", "G", ["a"], ["b"], [helper.make_node("Neg", ["a"], ["b"])],
                           [helper.make_opsetid("", 17)])
  m = _model([helper.make_node("F", ["x"], ["y"], domain="local")], [_vi("x", shape=[2])], [_vi("y")], functions=[f, g])
  x = np.array([1.5, -2], np.float32)
  np.testing.assert_allclose(OnnxRunner(m)({"x": x})["y"].numpy(), -x)


def _loop_model(trips: int) -> onnx.ModelProto:
  """Loop(M=trips, cond=true) adding 1 to a carried value: the condition never goes false."""
  body = helper.make_graph(
    [helper.make_node("Identity", ["cin"], ["cout"]), helper.make_node("Add", ["v", "one"], ["vout"])], "body",
    [_vi("i", TensorProto.INT64, []), _vi("cin", TensorProto.BOOL, []), _vi("v", shape=[])],
    [_vi("cout", TensorProto.BOOL, []), _vi("vout", shape=[])],
    [numpy_helper.from_array(np.array(1, np.float32), "one")])
  inits = [numpy_helper.from_array(np.array(trips, np.int64), "M"), numpy_helper.from_array(np.array(True), "c"),
           numpy_helper.from_array(np.array(0, np.float32), "v0")]
  return _model([helper.make_node("Loop", ["M", "c", "v0"], ["y"], name="forever", body=body)], [], [_vi("y")], inits)


def test_loop_trip_limit():
  with pytest.raises(ValueError, match=r"'forever'.*more than 5 iterations.*1000000000000.*max_loop_trips"):
    OnnxRunner(_loop_model(10**12), max_loop_trips=5)({})
  # within the limit it runs: 7 trips add 1 seven times
  assert OnnxRunner(_loop_model(7), max_loop_trips=7)({})["y"].numpy() == np.float32(7)
  with pytest.raises(ValueError, match="max_loop_trips"): OnnxRunner(_loop_model(1), max_loop_trips=-1)
