"""Recorded graphs (`engine.realize_recorded` / `replay_recorded`, docs/PIPELINE.md §6): fixed graphs over input
buffers the caller refills, replayed without scheduling; every replay's numbers against numpy, fresh outputs each
time, and the cases that must schedule (DEBUG, a capture, a changed codegen flag) or can't be recorded."""
import numpy as np
import pytest

import tiny_codegen.schedule as sched_mod
from tiny_tensor import Context, Device, GlobalCounters, Tensor, engine


@pytest.fixture
def count_schedules(monkeypatch):
  real, calls = sched_mod.create_schedule, []
  monkeypatch.setattr(sched_mod, "create_schedule", lambda *a, **k: calls.append(1) or real(*a, **k))
  return calls


def _graph():
  """Two roots over input buffer x (8, 16) and a constant weight: an inner contiguous (its own kernel, whose buffer
  the schedule gives to an inner node), a matmul, a reduce; the input Tensor and the numpy reference."""
  rng = np.random.default_rng(0)
  w = rng.standard_normal((16, 4)).astype(np.float32)
  x = Tensor(rng.standard_normal((8, 16)).astype(np.float32)).realize()
  h = (x.exp() * 0.5).contiguous()
  y = (h @ Tensor(w)).relu()
  s = (h.sum(axis=1) - x.max(axis=1))

  def ref(xv):
    hv = np.exp(xv) * 0.5
    return np.maximum(hv @ w, 0), hv.sum(axis=1) - xv.max(axis=1)

  return x, (y.uop, s.uop), ref


def _refill(x, seed):
  xv = np.random.default_rng(seed).standard_normal((8, 16)).astype(np.float32)
  engine.copy_into(x.uop, xv)
  return xv


@pytest.mark.parametrize("jit", [1, 2])
def test_replays_read_the_refilled_inputs_into_fresh_outputs(count_schedules, jit):
  x, roots, ref = _graph()
  with Context(JIT=jit): becomes, rec = engine.realize_recorded(list(roots))
  assert rec is not None and len(becomes) > len(roots)  # the inner contiguous got a buffer too
  # one device graph of every kernel where the device has a graph class; JIT=2: kernel by kernel
  assert (rec.graph is not None) == (jit == 1 and Device[x.device].graph is not None)
  first = [Tensor(becomes[r]) for r in roots]
  xv0 = x.numpy()
  GlobalCounters.reset()
  count_schedules.clear()
  kept = []
  for seed in range(1, 4):
    xv = _refill(x, seed)
    GlobalCounters.reset()
    outs = [Tensor(u) for u in engine.replay_recorded(rec)]
    assert GlobalCounters.kernel_count == len(rec.replay.kernels) >= 3
    kept.append((xv, outs))
  assert not count_schedules
  for xv, outs in [(xv0, first), *kept]:  # every result keeps its own call's numbers
    for got, want in zip(outs, ref(xv)): np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-5)
  bufs = {engine.buffer_view(t.uop)[0] for _, outs in kept for t in outs}
  assert len(bufs) == 2 * len(kept)  # fresh output buffers per replay


@pytest.mark.parametrize("how", ["debug", "capture", "noopt"])
def test_replays_that_must_schedule_give_the_same_numbers(count_schedules, how, capsys):
  x, roots, ref = _graph()
  _, rec = engine.realize_recorded(list(roots))
  xv = _refill(x, 7)
  count_schedules.clear()
  seen = []
  if how == "debug":
    with Context(DEBUG=1): views = engine.replay_recorded(rec)
    assert "realize:" in capsys.readouterr().out
  elif how == "capture":
    with engine.capture(seen.append): views = engine.replay_recorded(rec)
    assert len(seen) == len(rec.replay.kernels)
  else:
    with Context(NOOPT=1): views = engine.replay_recorded(rec)
  assert count_schedules
  for got, want in zip([Tensor(u) for u in views], ref(xv)):
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-5)
  count_schedules.clear()
  xv = _refill(x, 8)
  views = engine.replay_recorded(rec)  # the recording holds again
  assert not count_schedules
  for got, want in zip([Tensor(u) for u in views], ref(xv)):
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-5)


def test_what_cant_be_recorded_says_so():
  xv = np.arange(6, dtype=np.float32)
  x = Tensor(xv).realize()
  with pytest.raises(ValueError, match="not realized"): engine.realize_recorded([x.uop])
  # no kernel (a root that is a view of the input, a slice of it) or a copy between devices: realized, not recorded
  for make, want in ((lambda: x.reshape(2, 3).contiguous(), xv.reshape(2, 3)), (lambda: x[1:3], xv[1:3]),
                     (lambda: x.to("CPU:1"), xv)):
    u = make().uop
    becomes, rec = engine.realize_recorded([u])
    assert rec is None
    np.testing.assert_array_equal(Tensor(becomes[u]).numpy(), want)
  u = x.flip(0).uop  # a kernel: recorded, its root a fresh buffer
  becomes, rec = engine.realize_recorded([u])
  assert rec is not None and all(i >= len(rec.inputs) for i, _ in rec.replay.outs)
  np.testing.assert_array_equal(Tensor(engine.replay_recorded(rec)[0]).numpy(), xv[::-1])
