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


# ***** seeded mutation fuzz: every outcome is a clean run or a documented error class, within a time bound *****
ALLOWED = (OnnxError, ValueError, TypeError, NotImplementedError)
CASE_SECONDS = 30


def _fuzz_bases() -> list[onnx.ModelProto]:
  """A few small valid models: elementwise with an initializer, shape arithmetic into Reshape, Gemm + Relu, Loop."""
  a = _model([helper.make_node("Add", ["x", "w"], ["t"]), helper.make_node("Mul", ["t", "x"], ["y"], name="mul")],
             [_vi("x", shape=[2, 3])], [_vi("y")], [numpy_helper.from_array(W, "w")])
  b = _model([helper.make_node("Shape", ["x"], ["s"]), helper.make_node("ReduceProd", ["s"], ["n"], keepdims=1),
              helper.make_node("Reshape", ["x", "n"], ["y"]), helper.make_node("Transpose", ["x"], ["z"], perm=[1, 0])],
             [_vi("x", shape=[2, 3])], [_vi("y"), _vi("z")])
  c = _model([helper.make_node("Gemm", ["x", "w", "bias"], ["g"], transB=1, alpha=0.5),
              helper.make_node("Relu", ["g"], ["y"]), helper.make_node("Softmax", ["g"], ["p"], axis=-1)],
             [_vi("x", shape=[2, 3])], [_vi("y"), _vi("p")],
             [numpy_helper.from_array(W, "w"), numpy_helper.from_array(np.array([1, -1], np.float32), "bias")])
  return [a, b, c, _loop_model(3)]


def _feed(m: onnx.ModelProto) -> dict | None:
  """Inputs for the model's declared graph inputs (small arrays of the declared type), or None when they can't be
  built sensibly (unknown type, huge shape)."""
  inits = {t.name for t in m.graph.initializer}
  feed = {}
  for i in m.graph.input:
    if i.name in inits: continue
    if not i.type.HasField("tensor_type"): return None
    tt = i.type.tensor_type
    try: dt = helper.tensor_dtype_to_np_dtype(tt.elem_type)
    except (KeyError, ValueError, TypeError): return None
    if dt.kind not in "biuf": return None
    shape = [d.dim_value if d.HasField("dim_value") else 2 for d in tt.shape.dim]
    if any(s < 0 for s in shape) or int(np.prod(shape, dtype=np.float64)) > 4096: return None
    feed[i.name] = (np.arange(int(np.prod(shape)), dtype=np.float64) % 5 - 2).reshape(shape).astype(dt)
  return feed


def _mutate_bytes(rng: np.random.Generator, data: bytes) -> bytes:
  b = bytearray(data)
  for _ in range(int(rng.integers(1, 4))):
    pos, kind = int(rng.integers(0, len(b))), int(rng.integers(0, 3))
    if kind == 0: b[pos] ^= 1 << int(rng.integers(0, 8))
    elif kind == 1: b.insert(pos, int(rng.integers(0, 256)))
    elif len(b) > 1: del b[pos]
  return bytes(b)


def _mutate_proto(rng: np.random.Generator, m: onnx.ModelProto) -> onnx.ModelProto:
  m2 = onnx.ModelProto()
  m2.CopyFrom(m)
  g = m2.graph
  node = g.node[int(rng.integers(0, len(g.node)))]
  kind = int(rng.integers(0, 9))
  if kind == 8 and g.initializer:  # a still-valid model with other numbers (extreme ones too), for onnxruntime
    i = int(rng.integers(0, len(g.initializer)))
    arr = numpy_helper.to_array(g.initializer[i])
    vals = rng.choice(np.array([0, 1, -1, 3.5, 1e30, -1e-30, 65504], np.float64), size=arr.shape)
    g.initializer[i].CopyFrom(numpy_helper.from_array(vals.astype(arr.dtype), g.initializer[i].name))
  elif kind == 0:  # an attribute of the wrong type
    name = ["axis", "perm", "alpha", "keepdims", "transB"][int(rng.integers(0, 5))]
    node.attribute.append(helper.make_attribute(name, [[1.5, 2.5], "x", 3.0, [0], 7][int(rng.integers(0, 5))]))
  elif kind == 1 and node.attribute:  # an existing attribute's type field changed, its value left
    node.attribute[0].type = int(rng.integers(0, 15))
  elif kind == 2 and len(node.input):  # an input removed or renamed to something nothing makes
    if rng.integers(0, 2): del node.input[int(rng.integers(0, len(node.input)))]
    else: node.input[0] = "nowhere"
  elif kind == 3:  # a bad op type
    node.op_type = ["", "Nope", "Relu ", "add", "Loop"][int(rng.integers(0, 5))]
  elif kind == 4 and g.initializer:  # initializer dims that don't match its data
    t = g.initializer[int(rng.integers(0, len(g.initializer)))]
    t.dims[:] = [int(v) for v in rng.integers(-2, 5, size=int(rng.integers(0, 3)))]
  elif kind == 5:  # declared input dims/type changed
    tt = g.input[0].type.tensor_type
    if rng.integers(0, 2): tt.elem_type = int(rng.integers(0, 30))
    else: tt.shape.dim[int(rng.integers(0, len(tt.shape.dim)))].dim_value = int(rng.integers(-1, 6))
  elif kind == 6:  # an extra output
    node.output.append(str(rng.integers(0, 3)))
  else:  # a node duplicated at the start (it may read values not yet made)
    g.node.insert(0, node)
  return m2


def _compare_with_onnxruntime(m: onnx.ModelProto, feed: dict, got: dict) -> bool:
  """A mutant that runs must give onnxruntime's numbers where onnxruntime accepts it too (it is stricter: a mutant
  it refuses may still run here); whether it was compared."""
  import onnxruntime as ort  # a test dependency (noxfile.py TEST_DEPS): missing, the test fails rather than skips
  ort.set_default_logger_severity(3)
  try:
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    want = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feed)))
  except Exception:  # noqa: BLE001 -- onnxruntime refusing a mutant is its verdict, not ours; nothing to compare
    return False
  for k, v in got.items():
    if k in want: np.testing.assert_allclose(v, want[k], rtol=1e-5, atol=1e-5, err_msg=f"output {k!r}")
  return True


def _run_case(model: object) -> str:
  import signal

  def hang(signum, frame): raise TimeoutError(f"case ran past {CASE_SECONDS}s")
  old = signal.signal(signal.SIGALRM, hang)
  signal.alarm(CASE_SECONDS)
  try:
    r = OnnxRunner(model, max_loop_trips=1000)  # a mutated trip count hits the limit in well under CASE_SECONDS
    feed = _feed(r.model)
    if feed is None: return "loaded"
    got = {k: v.numpy() for k, v in r(feed).items() if hasattr(v, "numpy")}
    return "ran, matches onnxruntime" if _compare_with_onnxruntime(r.model, feed, got) else "ran"
  except ALLOWED as e:
    assert str(e), f"{type(e).__name__} without a message"
    return type(e).__name__
  finally:
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


def test_mutation_fuzz():
  rng = np.random.default_rng(1234)
  bases = _fuzz_bases()
  outcomes: dict[str, int] = {}
  for case in range(200):
    base = bases[case % len(bases)]
    model = _mutate_bytes(rng, base.SerializeToString()) if case % 2 else _mutate_proto(rng, base)
    try: res = _run_case(model)
    except Exception as e:
      raise AssertionError(f"fuzz case {case}: {type(e).__name__}: {e}") from e
    outcomes[res] = outcomes.get(res, 0) + 1
  # the fuzz must exercise both sides: some mutants run (checked against onnxruntime), some are refused
  refused = sum(v for k, v in outcomes.items() if not k.startswith(("ran", "loaded")))
  assert outcomes.get("ran, matches onnxruntime", 0) > 0 and refused > 0, outcomes


@pytest.mark.parametrize("dims,et", [([3, 4], TensorProto.FLOAT), ([2, 3], 0)])
def test_initializer_that_does_not_fit_its_dims(dims, et):
  w = numpy_helper.from_array(W, "w")
  w.dims[:] = dims
  w.data_type = et
  # onnx's own reader refuses it too: the reference that the tensor is malformed
  with pytest.raises((ValueError, TypeError)): numpy_helper.to_array(w)
  m = _model([helper.make_node("Add", ["x", "w"], ["y"])], [_vi("x", shape=[2, 3])], [_vi("y")], [w])
  with pytest.raises(OnnxModelError, match=r"tensor 'w' \(dims"): OnnxRunner(m)


def test_corrupt_file_and_bytes(tmp_path):
  junk = b"\x0a\xff\xff\xff\xff\x0f"  # a length-delimited field longer than the data
  with pytest.raises(Exception) as ref: onnx.load_from_string(junk)  # onnx's own parser refuses it too
  assert not isinstance(ref.value, (OnnxError, ValueError))
  (tmp_path / "bad.onnx").write_bytes(junk)
  with pytest.raises(OnnxModelError, match="bad.onnx.*not a valid ONNX model"): OnnxRunner(str(tmp_path / "bad.onnx"))
  with pytest.raises(OnnxModelError, match="bytes given are not a valid ONNX model"): OnnxRunner(junk)
