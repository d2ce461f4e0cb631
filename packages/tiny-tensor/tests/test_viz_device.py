"""VIZ on the session's device (DEV; CPU by default, MOCK+AMD / MOCK+CUDA / MOCK+NV in their nox sessions): kernels,
their source and launches are recorded whatever renders and runs them. The other VIZ tests pin CPU."""
from __future__ import annotations

import numpy as np

from tiny_tensor import Device, Tensor, TinyJit, viz


def test_records_kernels_and_launches_on_the_session_device(tmp_path):
  dev = Device.DEFAULT
  path = str(tmp_path / "t.jsonl")

  @TinyJit
  def f(a: Tensor) -> Tensor: return (a * a + 3).sum(axis=1).realize()
  with viz.record(path):
    outs = [f(Tensor(np.full((4, 9), i, np.float32), device=dev)).numpy() for i in range(4)]
  for i, out in enumerate(outs): np.testing.assert_allclose(out, np.full((4,), 9 * (i * i + 3), np.float32))
  t = viz.load(path)
  assert t.kernels and all(k.info["device"] == Device[dev].renderer.device for k in t.kernels)  # what it targets
  assert all(k.source and k.steps[-1].name == "linearize" for k in t.kernels)
  names = {k.name for k in t.kernels}
  assert {ln.device for ln in t.launches} == {Device.canonicalize(dev)}
  engine = [ln for ln in t.launches if ln.name in names]
  replays = [ln for ln in t.launches if ln.name not in names]
  assert len(engine) >= len(names) and all(ln.name.startswith("graph of ") for ln in replays)
  assert len(t.launches) >= 4  # two calls through the engine, two replays (kernel by kernel or as a device graph)
