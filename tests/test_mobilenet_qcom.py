"""examples/mobilenet_qcom.py: a MobileNet-style network (strided and depthwise convolutions, batch norm, ReLU6,
global average pooling, fp16 math, IMAGE=1 textures, TinyJit) on MOCK+QCOM equals the CPU's float32 result within
fp16 tolerance; its replays through HCQ2 (TinyJit's graph on QCOM) equal kernel-by-kernel replays (JIT=2) bit for
bit."""
import importlib.util
import pathlib

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _load(name: str):
  spec = importlib.util.spec_from_file_location(name, ROOT / "examples" / f"{name}.py")
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod


def test_mobilenet_fp16_with_textures_on_mock_qcom_matches_cpu():
  mb = _load("mobilenet_qcom")
  res = mb.run("MOCK+QCOM", batch=2, size=16, image=1, replays=2)
  assert res["out"].shape == (2, 10) and np.isfinite(res["out"]).all()
  # fp16 keeps ~3 decimal digits per op; a dozen layers deep, a few parts in a thousand of the output scale
  np.testing.assert_allclose(res["out"], res["ref"], rtol=2e-2, atol=1e-2 * res["scale"])
  assert res["half_kernels"] > 10  # the layers computed in half (MOCK+QCOM: storage-only half, rounded every op)
  np.testing.assert_array_equal(res["replayed"], res["out"])  # the jitted replays (one graph) give the same logits
  assert res["graphs"] == ["QCOMGraph"]  # TinyJit's graph on QCOM: HCQ2 with QCOM's encoder
  from tiny_uop import Context
  with Context(JIT=2): eager = mb.run("MOCK+QCOM", batch=2, size=16, image=1, replays=2)
  assert eager["graphs"] == []
  np.testing.assert_array_equal(eager["replayed"], res["replayed"])
  assert res["texture_kernels"] > 0 and res["jit_kernels"] > 10
  model = mb.MobileNetTiny()
  assert any(layer.conv.groups > 1 for b in model.blocks for layer in b.layers)  # depthwise convolutions
