"""BEAM search against the hand-coded heuristics on the CPU bench kernels, side by side per kernel.

Cases: `a+b` and `a.sum()` on 16M float32 (the sum is the scheduler's two kernels), a 1024^2 float32 matmul and a
3x3 conv (batch 8, 32 -> 64 channels, 32x32). Each case is scheduled through `Tensor`; for every kernel of its
schedule the heuristics' opts and BEAM's choice (`BENCH_BEAM` wide, default 2; `beam_search`, which starts from the
heuristics' opts and keeps them unless it measured something 3% faster; answered from the disk cache after the first
run, `IGNORE_BEAM_CACHE=1` searches again) are compiled and timed on the same buffers, in turns (the least of
`REPS` rounds of each), so both columns see the same load. `heuristic` and `beam` are the summed kernel times of the
case (ms), `search` the search's own time (about 0 when cached). The case's result with `BEAM` set is checked against
numpy. `python bench/bench_beam.py` prints the table; `run()` returns it for bench/run.py.
"""
from __future__ import annotations

import os
import time
from typing import Any, Callable

import numpy as np

os.environ.setdefault("DEV", "CPU")

REPS = 7
BEAM_WIDTH = int(os.environ.get("BENCH_BEAM", "2"))


def _cases() -> dict[str, tuple[Callable[[Any], Any], Callable[[], np.ndarray], float]]:
  """name -> (tiny expression of the inputs, numpy reference, relative tolerance), inputs from `_inputs`."""
  return {
    "a+b 16M float32": (lambda t: t["a"] + t["b"], lambda: _NP["a"] + _NP["b"], 0.0),
    "a.sum() 16M float32": (lambda t: t["a"].sum(), lambda: _NP["a"].astype(np.float64).sum(), 1e-4),
    "matmul 1024^2 float32": (lambda t: t["m"] @ t["n"], lambda: _NP["m"] @ _NP["n"], 1e-4),
    "conv 3x3 8x32x32x32 -> 64": (lambda t: t["x"].conv2d(t["w"], padding=1), _conv_ref, 1e-4),
  }


_NP: dict[str, np.ndarray] = {}


def _inputs() -> None:
  rng = np.random.default_rng(0)
  n = 16 * 1024 * 1024
  _NP.update(a=rng.random(n, dtype=np.float32), b=rng.random(n, dtype=np.float32),
             m=rng.standard_normal((1024, 1024), dtype=np.float32),
             n=rng.standard_normal((1024, 1024), dtype=np.float32),
             x=rng.standard_normal((8, 32, 32, 32), dtype=np.float32),
             w=rng.standard_normal((64, 32, 3, 3), dtype=np.float32))


def _conv_ref() -> np.ndarray:
  x, w = _NP["x"].astype(np.float64), _NP["w"].astype(np.float64)
  xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
  win = np.lib.stride_tricks.sliding_window_view(xp, (3, 3), axis=(2, 3))  # (8, 32, 32, 32, 3, 3)
  return np.einsum("bchwij,ocij->bohw", win, w)


def compare_kernel(ast: Any, renderer: Any, width: int, reps: int = REPS) -> dict[str, Any]:
  """One kernel: the heuristics' and BEAM's opts, each timed (s) in turns on the same buffers, and the search's s."""
  from tiny_codegen import get_program
  from tiny_codegen.opt.search import _Timer, beam_search, heuristic_opts
  heur = heuristic_opts(ast, renderer)
  st = time.perf_counter()
  beam = beam_search(ast, renderer, width, compile=get_program)
  search = time.perf_counter() - st
  timer = _Timer(ast, renderer, get_program)
  th = tb = float("inf")
  for _ in range(reps):
    th = min(th, timer.time(heur))
    if beam != heur: tb = min(tb, timer.time(beam))
  if beam == heur: tb = th  # the same program: one timing (two would differ only by noise)
  return {"heuristic": th, "beam": tb, "search_s": search, "heuristic_opts": heur, "beam_opts": beam}


def run() -> dict[str, dict[str, Any]]:
  """Per case: summed kernel ms with the heuristics' opts and with BEAM's, and the search time."""
  from tiny_tensor import Tensor
  from tiny_uop.helpers import Context
  from tiny_uop.plugins import Device
  _inputs()
  ren = Device["CPU"].renderer
  res: dict[str, dict[str, Any]] = {}
  for case, (expr, ref, rtol) in _cases().items():
    ts = {k: Tensor(v) for k, v in _NP.items() if k in ("a", "b", "m", "n", "x", "w")}
    out = expr(ts)
    kernels = [c.src[0] for c in out.schedule().kernels]
    rows = [compare_kernel(ast, ren, BEAM_WIDTH) for ast in kernels]
    with Context(BEAM=BEAM_WIDTH): got = expr(ts).numpy()  # compiled through the search (its cache, now)
    want = ref()
    if rtol == 0.0: ok = np.array_equal(got, want)
    else: ok = np.allclose(got, want, rtol=rtol, atol=rtol * float(np.abs(want).max()))
    if not ok: raise AssertionError(f"{case}: BEAM={BEAM_WIDTH} result differs from numpy")
    search = sum(r["search_s"] for r in rows)
    res[case] = {"unit": "ms", "better": "lower", "target": f"beam <= heuristic; search {search:.1f} s",
                 "heuristic": sum(r["heuristic"] for r in rows) * 1e3, "beam": sum(r["beam"] for r in rows) * 1e3,
                 "search": f"{search:.1f} s", "kernels": [(r["heuristic_opts"], r["beam_opts"]) for r in rows]}
  return res


if __name__ == "__main__":
  for case, row in run().items():
    print(f"{case:30s} heuristic={row['heuristic']:.3g}ms  beam={row['beam']:.3g}ms  "
          f"beam/heuristic={row['beam'] / row['heuristic']:.2f}  search={row['search']}")
    for h, b in row["kernels"]: print(f"    heuristic {list(h)}\n    beam      {list(b)}")
