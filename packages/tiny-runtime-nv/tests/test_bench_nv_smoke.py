"""bench/bench_nv.py runs (small sizes, few reps) on MOCK+CUDA and MOCK+NV: its kernels match numpy (checked inside)
and replays build no graph; no timing is asserted."""
import importlib.util
import pathlib

import pytest

BENCH = pathlib.Path(__file__).resolve().parents[3] / "bench" / "bench_nv.py"


@pytest.mark.skipif(not BENCH.exists(), reason="not run from the repository (bench/ is not installed)")
def test_bench_nv_small(monkeypatch):
  spec = importlib.util.spec_from_file_location("bench_nv", BENCH)
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  for name, v in (("N", 64), ("M", 8), ("REPS", 2), ("CALLS", 5)): monkeypatch.setattr(mod, name, v)
  res = mod.run()
  assert len(res) == 8 and all(isinstance(r["tiny"], float) and r["tiny"] >= 0 for r in res.values())
  assert res["MOCK+CUDA CUDAGraph builds during 25 replays"]["tiny"] == 0.0
  assert res["MOCK+NV HCQ2Graph builds during 25 replays"]["tiny"] == 0.0  # HCQ2 is the default graph
  assert res["MOCK+NV TinyJit replay host cost, 1 kernel"]["tiny first capture"] > 0
