"""bench/bench_cpu.py runs (on a small size) and its kernels compute the right values; no timing is asserted."""
import importlib.util
import pathlib

import pytest

BENCH = pathlib.Path(__file__).resolve().parents[3] / "bench" / "bench_cpu.py"


@pytest.mark.skipif(not BENCH.exists(), reason="not run from the repository (bench/ is not installed)")
def test_bench_cpu_small(monkeypatch):
  spec = importlib.util.spec_from_file_location("bench_cpu", BENCH)
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  monkeypatch.setattr(mod, "N", 1 << 16)
  monkeypatch.setattr(mod, "REPS", 1)
  monkeypatch.setattr(mod, "settle", lambda: None)  # the pause between libraries' timings (nothing is timed here)
  monkeypatch.setattr(mod, "LOADS", 2)
  monkeypatch.setattr(mod, "launch_overhead_us", lambda fn, n=0: (fn(), 1.0)[1])
  shares = mod.launch_shares
  monkeypatch.setattr(mod, "launch_shares", lambda: shares(n=20, reps=1))  # checks the kernel's result itself
  res = mod.run()  # run() checks a+b and the sum against numpy itself
  launch = "launch of a tiny kernel, 1 vs 2 shares (wall, process CPU)"
  assert set(res) == {"a+b 16M float32", "a.sum() 16M float32", "launch overhead, cached tiny kernel",
                      "load a compiled small kernel", "compile a small kernel (LLVM -O2)", launch}
  assert all(isinstance(res[case]["tiny"], float) for case in res if case != launch)
  assert all(isinstance(res[launch][f"tiny_{k}"], float) for k in ("1share", "2shares", "1share_cpu", "2shares_cpu"))
  assert isinstance(res["a+b 16M float32"]["numpy"], float)
