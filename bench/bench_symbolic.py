"""Speed of the symbolic simplifier on a large index-expression workload, tiny vs tinygrad when installed.

The workload is what the scheduler produces for chains of reshapes: a linear index over SPECIAL/RANGE/Variable
nodes split by a shape with `//` and `%`, re-flattened with the next shape's strides and split again, plus bounds
checks like the masks of padded loads. The same expressions (from one seeded recipe) are built with each library's
UOp API and simplified once from fresh nodes (new variable names per repeat, so no cache helps).

Reported per implementation: expressions per second, rewrites per second (successful rule applications, counted in
a separate untimed pass) and the average node count after simplification (lower is tidier).
`run()` returns {case: {implementation: value, "unit", "better"}} for bench/run.py; `python bench/bench_symbolic.py`
prints a table. tinygrad is measured in-process when importable, else through `TINYGRAD_PYTHON=/path/to/python`
(a separate venv with `pip install tinygrad==0.14.0`), running this file with `--tinygrad`.
"""
from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from typing import Any, Callable

Recipe = tuple  # ("var", name, lo, hi) | ("special", name, n) | ("range", axis, n) | (op, a, b) with int or Recipe


# ***** the workload, as library-independent recipes *****
def _split(idx: Recipe | int, shape: list[int]) -> list[Recipe]:
  """idx split by `shape` (row-major): dim j is (idx // stride_j) % shape_j."""
  out, stride = [], 1
  for s in reversed(shape):
    out.append(("%", ("//", idx, stride) if stride != 1 else idx, s))
    stride *= s
  return out[::-1]


def _flatten(dims: list[Recipe], shape: list[int]) -> Recipe:
  ret: Recipe | None = None
  stride = 1
  for d, s in zip(reversed(dims), reversed(shape)):
    t = d if stride == 1 else ("*", d, stride)
    ret = t if ret is None else ("+", t, ret)
    stride *= s
  assert ret is not None
  return ret


def _factor(n: int, rng: random.Random, parts: int) -> list[int]:
  out = []
  for _ in range(parts - 1):
    divs = [d for d in range(2, n) if n % d == 0]
    if not divs: break
    d = rng.choice(divs)
    out.append(d)
    n //= d
  return out + [n]


def workload(n: int, seed: int = 0) -> list[Recipe]:
  """`n` index expressions (and masks) of reshape chains over GPU-style indices, loop ranges and Variables."""
  rng = random.Random(seed)
  out: list[Recipe] = []
  for _ in range(n):
    local = rng.choice([4, 8, 16, 32, 64])
    glob = rng.choice([2, 4, 8, 16, 32])
    total = local * glob
    idx: Recipe = ("+", ("*", ("special", "gidx0", glob), local), ("special", "lidx0", local))
    kind = rng.random()
    if kind < 0.25:  # a reduce loop inside
      r = rng.choice([3, 4, 8])
      idx, total = ("+", ("*", idx, r), ("range", 0, r)), total * r
    elif kind < 0.4:  # a symbolic batch
      idx = ("+", idx, ("*", ("var", "n", 1, 8), total))
    shape = _factor(total, rng, rng.randint(2, 4))
    dims = _split(idx, shape)
    for _ in range(rng.randint(1, 2)):  # reshape again
      perm = list(range(len(shape)))
      if rng.random() < 0.3: rng.shuffle(perm)
      shape2 = [shape[p] for p in perm]
      flat = _flatten([dims[p] for p in perm], shape2)
      shape = _factor(total, rng, rng.randint(2, 4))
      dims = _split(flat, shape)
    expr = _flatten(dims, shape)
    if rng.random() < 0.3:  # a pad mask on one dim
      j = rng.randrange(len(dims))
      expr = ("&", ("<", dims[j], max(1, shape[j] - 1)), ("<", 0, ("+", dims[j], 1)))
    out.append(expr)
  return out


def build(recipes: list[Recipe], mk: dict[str, Callable], rep: int) -> list[Any]:
  """Each recipe as a UOp of the library `mk` wraps (leaf constructors; operators come from the UOp class).

  Variables and SPECIALs get a per-`rep` name and RANGEs a per-`rep` axis id, so every repeat starts from new nodes.
  """
  memo: dict[Any, Any] = {}

  def go(r: Any) -> Any:
    if isinstance(r, int): return r
    if (hit := memo.get(r)) is not None: return hit
    tag = r[0]
    if tag == "var": ret = mk["var"](f"{r[1]}_{rep}", r[2], r[3])
    elif tag == "special": ret = mk["special"](f"{r[1]}_{rep}", r[2])
    elif tag == "range": ret = mk["range"](r[1] + 100 * (rep + 1), r[2])
    else:
      a, b = go(r[1]), go(r[2])
      if tag == "<": ret = b > a if isinstance(a, int) else a < b
      else:
        if isinstance(a, int): a, b = b, a  # +, *, & commute; // and % always have an expression on the left
        ret = {"+": a.__add__, "*": a.__mul__, "//": a.__floordiv__, "%": a.__mod__, "&": a.__and__}[tag](b)
    memo[r] = ret
    return ret
  return [go(r) for r in recipes]


def _nodes(u: Any) -> int: return len(u.toposort())


def measure(recipes: list[Recipe], mk: dict[str, Callable], simplify: Callable[[Any], Any],
            count_rewrites: Callable[[Callable], int], repeats: int = 3) -> dict[str, float]:
  """Best-of-`repeats` seconds to simplify every expression (fresh nodes each time), and quality/rewrite counts."""
  best = float("inf")
  outs: list[Any] = []
  for rep in range(repeats):
    exprs = build(recipes, mk, rep)
    t0 = time.perf_counter()
    outs = [simplify(e) for e in exprs]
    best = min(best, time.perf_counter() - t0)
  exprs = build(recipes, mk, repeats)
  rewrites = count_rewrites(lambda: [simplify(e) for e in exprs])
  return {"seconds": best, "exprs_per_s": len(recipes) / best, "rewrites": rewrites, "rewrites_per_s": rewrites / best,
          "nodes_after": sum(_nodes(o) for o in outs) / len(outs)}


# ***** tiny *****
def measure_tiny(recipes: list[Recipe]) -> dict[str, float]:
  from tiny_uop import Ops, UOp, dtypes
  from tiny_uop.pattern import PatternMatcher
  from tiny_uop.symbolic import simplify
  mk = {"var": lambda name, lo, hi: UOp.variable(name, lo, hi),
        "special": lambda name, n: UOp(Ops.SPECIAL, dtypes.index, (UOp.const(dtypes.index, n),), name),
        "range": lambda axis, n: UOp.range(n, axis)}

  def count(fn: Callable) -> int:
    calls = [0]
    orig = PatternMatcher.rewrite

    def counting(self: Any, uop: Any, ctx: Any = None) -> Any:
      ret = orig(self, uop, ctx)
      if ret is not None: calls[0] += 1
      return ret
    PatternMatcher.rewrite = counting  # type: ignore[method-assign]
    try: fn()
    finally: PatternMatcher.rewrite = orig  # type: ignore[method-assign]
    return calls[0]
  return measure(recipes, mk, simplify, count)


# ***** tinygrad (0.14 API) *****
def measure_tinygrad(recipes: list[Recipe]) -> dict[str, float]:
  from tinygrad.uop.ops import PatternMatcher as TPM, UOp as TUOp  # type: ignore[import-not-found]
  mk = {"var": lambda name, lo, hi: TUOp.variable(name, lo, hi),
        "special": lambda name, n: TUOp.special(n, name),
        "range": lambda axis, n: TUOp.range(n, axis)}

  def count(fn: Callable) -> int:
    calls = [0]
    orig = TPM.rewrite

    def counting(self: Any, uop: Any, ctx: Any = None) -> Any:
      ret = orig(self, uop, ctx)
      if ret is not None: calls[0] += 1
      return ret
    TPM.rewrite = counting
    try: fn()
    finally: TPM.rewrite = orig
    return calls[0]
  return measure(recipes, mk, lambda u: u.simplify(), count)


def _tinygrad_result(recipes_n: int, seed: int) -> dict[str, float] | None:
  try:
    import tinygrad  # type: ignore[import-not-found]  # noqa: F401
    return measure_tinygrad(workload(recipes_n, seed))
  except ImportError:
    pass
  py = os.environ.get("TINYGRAD_PYTHON")
  if not py: return None
  out = subprocess.run([py, __file__, "--tinygrad", str(recipes_n), str(seed)], capture_output=True, text=True,
                       timeout=1800)
  if out.returncode != 0:
    print(f"tinygrad run failed:\n{out.stderr[-2000:]}", file=sys.stderr)
    return None
  return json.loads(out.stdout.strip().splitlines()[-1])


def run(n: int = 2000, seed: int = 0) -> dict[str, dict[str, Any]]:
  """Simplifier speed on `n` reshape-chain index expressions: tiny vs tinygrad (when available)."""
  recipes = workload(n, seed)
  tiny = measure_tiny(recipes)
  tg = _tinygrad_result(n, seed)
  rows: dict[str, dict[str, Any]] = {
    f"simplify {n} index exprs: exprs/s": {"tiny": tiny["exprs_per_s"], "unit": "/s", "better": "higher"},
    "symbolic rewrites/s": {"tiny": tiny["rewrites_per_s"], "unit": "/s", "better": "higher",
                            "target": ">= tinygrad"},
    "nodes per simplified expr": {"tiny": tiny["nodes_after"], "unit": "", "better": "lower"},
  }
  if tg is not None:
    rows[f"simplify {n} index exprs: exprs/s"]["tinygrad"] = tg["exprs_per_s"]
    rows["symbolic rewrites/s"]["tinygrad"] = tg["rewrites_per_s"]
    rows["nodes per simplified expr"]["tinygrad"] = tg["nodes_after"]
  return rows


def main(argv: list[str]) -> None:
  if argv[:1] == ["--tinygrad"]:  # the subprocess mode: print tinygrad's numbers as one JSON line
    n, seed = int(argv[1]), int(argv[2])
    print(json.dumps(measure_tinygrad(workload(n, seed))))
    return
  n = int(argv[0]) if argv else 2000
  rows = run(n)
  print(f"{'case':40s} {'tiny':>14s} {'tinygrad':>14s} {'tiny/tinygrad':>14s}")
  for case, row in rows.items():
    t, g = row["tiny"], row.get("tinygrad")
    ratio = "" if g is None else f"{(t / g if row['better'] == 'higher' else g / t):.2f}x"
    print(f"{case:40s} {t:14,.1f} {'' if g is None else f'{g:14,.1f}':>14s} {ratio:>14s}")


if __name__ == "__main__":
  main(sys.argv[1:])
