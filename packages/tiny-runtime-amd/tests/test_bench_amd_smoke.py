"""bench/bench_amd.py runs (small sizes, few reps): its kernels match numpy and replays (through HCQ2) build no
command buffer; no timing is asserted."""
import importlib.util
import pathlib

import pytest

from tiny_codegen.compiler.amdgpu import find_ld_lld

BENCH = pathlib.Path(__file__).resolve().parents[3] / "bench" / "bench_amd.py"


@pytest.mark.skipif(not BENCH.exists(), reason="not run from the repository (bench/ is not installed)")
@pytest.mark.skipif(find_ld_lld() is None, reason="ld.lld not installed: the AMDGPU compiler can't link")
def test_bench_amd_small(monkeypatch):
  spec = importlib.util.spec_from_file_location("bench_amd", BENCH)
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  for name, v in (("N", 64), ("M", 8), ("REPS", 2), ("CALLS", 5), ("BATCHES", 3)): monkeypatch.setattr(mod, name, v)
  res = mod.run()  # run() checks the elementwise and matmul results against numpy itself
  assert len(res) == 4 and all(isinstance(r["tiny"], float) and r["tiny"] >= 0 for r in res.values())
  assert res["MOCK+AMD HCQ2Graph builds during 15 replays"]["tiny"] == 0.0
  host = res["MOCK+AMD TinyJit replay host cost, 1 kernel"]
  assert host["tiny first capture"] > 0 and host["tiny wall"] > 0
  assert host["JIT=2"] > 0 and host["JIT=2 wall"] > 0  # kernel-by-kernel replays, side by side in one run
