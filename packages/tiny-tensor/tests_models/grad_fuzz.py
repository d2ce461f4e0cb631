"""Gradient fuzzer (issue #38): random differentiable programs built once as a description and run in tiny and in
torch; the forward value and every parameter's gradient must agree.

A program is a list of leaves (parameters with requires_grad, constant inputs, integer index tensors; their data is
drawn from a seed) and steps `vN = <expression over earlier names>`. Each step has a tiny expression and a torch
expression, the same but for spelling (`x.max(1)` / `x.amax(1)`, `x.pad(p)` / `F.pad(x, p)`), so a printed program
is runnable tiny code. The loss is sum_k (v_k * R_k).sum() over a few values v_k (R_k fixed random weights), so
gradients are not uniform and values used twice (shared subexpressions) get gradient from both uses.

The generator favours what broke before: one conv weight used in a chain of convs and in a conv_transpose2d, the
same parameter under different views (transposed, reshaped, flipped, sliced), a conv weight reshaped into a matmul,
broadcasting against small parameters, odd sizes (1, 3, 5, 7), non-contiguous views. It draws values with torch as
it goes, so every step fits its inputs' shapes and a step whose value is not finite or grows past 1e3 is drawn
again; a program whose torch gradient is not finite is skipped (counted). Ops that tie (relu, clip, pad, expand)
mark their value: max_pool2d (torch sends a tie's gradient to one element) is not applied to such values.

`shrink` makes a failing program minimal: it keeps one loss term, drops the steps the loss doesn't use, and then
drops each step it can (its users read its first input instead) while the program still fails.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from tiny_tensor import Tensor

SIZES = (1, 3, 5, 7)


def rand(seed: int, shape: tuple[int, ...], scale: float = 1.0) -> np.ndarray:
  """The data of a leaf: standard normal float32 of `shape` from `seed`, times `scale`; for every third seed about a
  third of the entries are exactly 0 (where relu, abs, softplus, ... have their kinks)."""
  rng = np.random.default_rng(seed)
  a = np.asarray(rng.standard_normal(shape) * scale)
  if seed % 3 == 0: a[rng.random(shape) < 0.35] = 0.0
  return a.astype(np.float32)


def randint(seed: int, shape: tuple[int, ...], high: int) -> np.ndarray:
  """The data of an index leaf: ints in [0, high) of `shape` from `seed`."""
  return np.random.default_rng(seed).integers(0, high, shape).astype(np.int32)


@dataclass(frozen=True)
class Leaf:
  """A program input: `kind` "param" (requires_grad), "input" (random data), "index" (int, < `high`), "const" or
  "constparam" (Tensor.full of high/2, the latter with requires_grad: a parameter equal to a constant)."""
  name: str
  kind: str
  shape: tuple[int, ...]
  seed: int
  high: int = 0

  def tiny_src(self) -> str:
    """The tiny line that makes it."""
    if self.kind == "index": return f"{self.name} = Tensor(randint({self.seed}, {self.shape}, {self.high}))"
    if self.kind in ("constparam", "const"):
      rg = ", requires_grad=True" if self.kind == "constparam" else ""
      return f"{self.name} = Tensor.full({self.shape}, {self.high / 2}{rg})"
    rg = ", requires_grad=True" if self.kind == "param" else ""
    return f"{self.name} = Tensor(rand({self.seed}, {self.shape}){rg})"

  def make(self, lib: str) -> Any:
    """The leaf as a tiny Tensor (`lib` "tiny") or a torch tensor."""
    if self.kind == "index":
      a = randint(self.seed, self.shape, self.high)
      return Tensor(a) if lib == "tiny" else torch.tensor(a, dtype=torch.int64)
    if self.kind in ("constparam", "const"):  # a constant (equal to other constants), maybe a parameter
      rg = self.kind == "constparam"
      if lib == "tiny": return Tensor.full(self.shape, self.high / 2, requires_grad=rg)
      return torch.full(self.shape, self.high / 2, requires_grad=rg)
    a = rand(self.seed, self.shape)
    if lib == "tiny": return Tensor(a, requires_grad=self.kind == "param")
    return torch.tensor(a, requires_grad=self.kind == "param")


@dataclass(frozen=True)
class Step:
  """`out = tiny` (in tiny) / `out = torch` (in torch); `{name}` fields of the templates are the names in `args`."""
  out: str
  tiny: str
  torch: str
  args: tuple[str, ...]

  def src(self, lib: str) -> str:
    """The expression in `lib` with the argument names filled in."""
    return (self.tiny if lib == "tiny" else self.torch).format(*self.args)


@dataclass
class Program:
  """Leaves, steps and the names of the values in the loss (weighted by `rand(loss_seed + k, shape)`)."""
  leaves: list[Leaf]
  steps: list[Step]
  outs: list[str]
  loss_seed: int
  note: str = ""

  def source(self) -> str:
    """The program as runnable tiny code."""
    lines = ["from tiny_tensor import Tensor", "from grad_fuzz import rand, randint"]
    lines += [lf.tiny_src() for lf in self.leaves]
    lines += [f"{s.out} = {s.src('tiny')}" for s in self.steps]
    terms = [f"({o} * Tensor(rand({self.loss_seed + k}, {o}.shape))).sum()" for k, o in enumerate(self.outs)]
    lines.append("loss = " + " + ".join(terms))
    grads = ", ".join(f"{lf.name}.grad" for lf in self.leaves if lf.kind in ("param", "constparam"))
    lines.append(f"loss.backward()  # compare loss and {grads} with torch")
    return "\n".join(lines)


_NS_TINY = {"Tensor": Tensor}
_NS_TORCH = {"torch": torch, "F": F}


def run(prog: Program, lib: str) -> tuple[np.ndarray, dict[str, np.ndarray | None], float]:
  """Build and run `prog` in `lib`: (the loss, each parameter's gradient as numpy (None: no gradient), the sum of the
  loss terms' magnitudes: the scale its rounding errors have)."""
  env: dict[str, Any] = {lf.name: lf.make(lib) for lf in prog.leaves}
  ns = _NS_TINY if lib == "tiny" else _NS_TORCH
  for s in prog.steps: env[s.out] = eval(s.src(lib), ns, env)  # noqa: S307 (our own generated expressions)
  params = [lf.name for lf in prog.leaves if lf.kind in ("param", "constparam")]
  T = Tensor if lib == "tiny" else torch.tensor
  terms = [env[o] * T(rand(prog.loss_seed + k, tuple(env[o].shape))) for k, o in enumerate(prog.outs)]
  loss = sum(t.sum() for t in terms)
  if lib == "tiny" or loss.requires_grad: loss.backward()  # (torch: no parameter reaches the loss differentiably)
  if lib == "tiny":
    Tensor.realize(loss, *[env[p].grad for p in params if env[p].grad is not None])  # one schedule for all
    return loss.numpy(), {p: None if env[p].grad is None else env[p].grad.numpy() for p in params}, 0.0
  mag = float(sum(t.detach().abs().sum() for t in terms))
  return loss.detach().numpy(), {p: None if env[p].grad is None else env[p].grad.numpy() for p in params}, mag


def _mismatch(a: np.ndarray | None, b: np.ndarray | None, tol: float, scale: float = 0.0) -> str | None:
  """Why `a` (tiny) isn't `b` (torch) within tol relative to b's magnitude (at least `scale`, and 0.01: a gradient
  that is 0 in exact arithmetic, e.g. of a softmax's shift, is rounding noise of ~1e-7 in both), or None."""
  if b is None: b = None if a is None else np.zeros_like(a)  # torch: unused parameter (tiny may give zeros)
  if a is None: a = np.zeros_like(b)
  if a.shape != b.shape: return f"shape {a.shape} vs torch {b.shape}"
  scale = max(float(np.abs(b).max()) if b.size else 0.0, scale, 0.01)
  bad = ~np.isclose(a, b, rtol=tol, atol=tol * scale)
  if not bad.any(): return None
  i = np.argwhere(bad)[0]
  return f"{bad.sum()} of {b.size} differ, at {tuple(int(v) for v in i)}: {a[tuple(i)]} vs torch {b[tuple(i)]}"


def check(prog: Program, tol: float = 1e-4) -> str | None:
  """None when tiny agrees with torch on `prog`, else what differs (or the exception tiny raised)."""
  ref_loss, ref_grads, mag = run(prog, "torch")
  try: loss, grads, _ = run(prog, "tiny")
  except Exception as e:  # a crash is a finding: reported with the program, not swallowed
    return f"tiny raised {type(e).__name__}: {e}"
  if (m := _mismatch(loss, ref_loss, tol, mag * 1e-2)) is not None: return f"loss: {m}"
  for p, g in ref_grads.items():
    if (m := _mismatch(grads[p], g, tol)) is not None: return f"{p}.grad: {m}"
  return None


def torch_ok(prog: Program) -> bool:
  """Whether torch's loss and gradients are finite and some parameter gets one (else the program tests nothing)."""
  loss, grads, _ = run(prog, "torch")
  return bool(np.isfinite(loss).all()) and any(g is not None for g in grads.values()) and \
    all(g is None or np.isfinite(g).all() for g in grads.values())


# ***** shrinking *****

def _used(prog: Program) -> Program:
  """`prog` without the steps and leaves its loss doesn't read."""
  need = set(prog.outs)
  steps = []
  for s in reversed(prog.steps):
    if s.out in need:
      steps.append(s)
      need.update(s.args)
  return replace(prog, steps=steps[::-1], leaves=[lf for lf in prog.leaves if lf.name in need])


def _drop_step(prog: Program, i: int) -> Program | None:
  """`prog` without step i, its users reading its first argument instead (None if the shapes differ)."""
  s = prog.steps[i]
  if not s.args or s.args[0] not in _shapes(prog) or _shapes(prog)[s.args[0]] != _shapes(prog)[s.out]: return None
  ren = {s.out: s.args[0]}
  steps = [replace(t, args=tuple(ren.get(a, a) for a in t.args)) for t in prog.steps[:i] + prog.steps[i + 1:]]
  return _used(replace(prog, steps=steps, outs=[ren.get(o, o) for o in prog.outs]))


def _shapes(prog: Program) -> dict[str, tuple[int, ...]]:
  """The shape of every value of `prog` (run in torch, without gradients)."""
  env: dict[str, Any] = {lf.name: lf.make("torch").detach() for lf in prog.leaves}
  for s in prog.steps: env[s.out] = eval(s.src("torch"), _NS_TORCH, env)  # noqa: S307
  return {k: tuple(v.shape) for k, v in env.items()}


def shrink(prog: Program, fails: Any = check) -> Program:
  """A smaller program that still fails (`fails(p)` not None): one loss term, then steps dropped one by one."""
  for o in prog.outs:
    cand = _used(replace(prog, outs=[o]))
    if fails(cand) is not None:
      prog = cand
      break
  changed = True
  while changed:
    changed = False
    for i in range(len(prog.steps) - 1, -1, -1):
      if i >= len(prog.steps): continue
      cand = _drop_step(prog, i)
      if cand is not None and cand.steps != prog.steps and fails(cand) is not None:
        prog, changed = cand, True
  return prog


# ***** generation *****

_UNARY: list[tuple[str, str, str, bool]] = [  # name, tiny, torch, ties (the result has exactly equal values)
  ("relu", "{0}.relu()", "{0}.relu()", True), ("sigmoid", "{0}.sigmoid()", "{0}.sigmoid()", False),
  ("tanh", "{0}.tanh()", "{0}.tanh()", False), ("softplus", "{0}.softplus()", "F.softplus({0})", False),
  ("logsigmoid", "{0}.logsigmoid()", "F.logsigmoid({0})", False), ("elu", "{0}.elu()", "F.elu({0})", True),
  ("celu", "{0}.celu(0.5)", "F.celu({0}, 0.5)", False),
  ("gelu", "{0}.gelu()", "F.gelu({0}, approximate='tanh')", False),
  ("gelu_erf", "{0}.gelu('none')", "F.gelu({0})", False), ("silu", "{0}.silu()", "F.silu({0})", False),
  ("mish", "{0}.mish()", "F.mish({0})", False), ("softsign", "{0}.softsign()", "F.softsign({0})", False),
  ("hardswish", "{0}.hardswish()", "F.hardswish({0})", True),
  ("hardsigmoid", "{0}.hardsigmoid()", "F.hardsigmoid({0})", True), ("relu6", "{0}.relu6()", "F.relu6({0})", True),
  ("hardtanh", "{0}.hardtanh()", "F.hardtanh({0})", True),
  ("leaky_relu", "{0}.leaky_relu(0.1)", "F.leaky_relu({0}, 0.1)", False),
  ("selu", "{0}.selu(1.6732632423543772, 1.0507009873554805)", "F.selu({0})", False),
  ("erf", "{0}.erf()", "{0}.erf()", False), ("exp", "({0} * 0.5).exp()", "({0} * 0.5).exp()", False),
  ("log", "({0}.abs() + 1).log()", "({0}.abs() + 1).log()", False),
  ("sqrt", "({0} * {0} + 1).sqrt()", "({0} * {0} + 1).sqrt()", False),
  ("square", "{0}.square()", "{0}.square()", False), ("sin", "{0}.sin()", "{0}.sin()", False),
  ("cos", "{0}.cos()", "{0}.cos()", False),
  ("recip", "({0}.square() + 1).reciprocal()", "({0}.square() + 1).reciprocal()", False),
  ("clamp", "{0}.clamp(-0.5, 0.5)", "{0}.clamp(-0.5, 0.5)", True), ("neg", "-{0}", "-{0}", False),
  ("affine", "{0} * 2.5 + 1", "{0} * 2.5 + 1", False), ("abs", "{0}.abs()", "{0}.abs()", False),
  ("pow", "({0}.abs() + 0.5).pow(1.5)", "({0}.abs() + 0.5).pow(1.5)", False),
  ("contiguous", "{0}.contiguous()", "{0}.contiguous()", False),
]
_BINARY: list[tuple[str, str, str, bool]] = [
  ("add", "{0} + {1}", "{0} + {1}", False), ("sub", "{0} - {1}", "{0} - {1}", False),
  ("mul", "{0} * {1}", "{0} * {1}", False), ("div", "{0} / ({1}.square() + 1)", "{0} / ({1}.square() + 1)", False),
  ("maximum", "{0}.maximum({1})", "torch.maximum({0}, {1})", True),
  ("minimum", "{0}.minimum({1})", "torch.minimum({0}, {1})", True),
  ("where", "({0} > 0).where({0}, {1})", "torch.where({0} > 0, {0}, {1})", True),
]


@dataclass
class _Val:
  name: str
  t: torch.Tensor
  ties: bool
  param: bool = False


@dataclass
class _Gen:
  rng: np.random.Generator
  seed: int
  leaves: list[Leaf] = field(default_factory=list)
  steps: list[Step] = field(default_factory=list)
  vals: list[_Val] = field(default_factory=list)

  def leaf(self, kind: str, shape: tuple[int, ...], high: int = 0) -> _Val:
    prefix = {"param": "p", "constparam": "p", "input": "x", "const": "c", "index": "i"}[kind]
    lf = Leaf(f"{prefix}{len(self.leaves)}", kind, shape, self.seed * 1000 + len(self.leaves), high)
    self.leaves.append(lf)
    ties = kind in ("const", "constparam") or lf.seed % 3 == 0  # (rand's zeros)
    v = _Val(lf.name, lf.make("torch").detach(), ties, kind in ("param", "constparam"))
    if kind != "index": self.vals.append(v)
    return v

  def step(self, tiny: str, tor: str, args: tuple[str, ...], ties: bool) -> _Val | None:
    """Add `v = tiny/tor(args)` if torch's value is finite and moderate; else nothing."""
    env = {v.name: v.t for v in self.vals}
    env.update({lf.name: torch.tensor(randint(lf.seed, lf.shape, lf.high), dtype=torch.int64)
                for lf in self.leaves if lf.kind == "index"})
    t = eval(tor.format(*args), _NS_TORCH, env)  # noqa: S307
    if t.numel() == 0 or not torch.isfinite(t).all() or t.abs().max() > 1e3: return None
    s = Step(f"v{len(self.steps)}", tiny, tor, args)
    self.steps.append(s)
    v = _Val(s.out, t, ties)
    self.vals.append(v)
    return v

  def pick(self, pred: Any = None) -> _Val | None:
    cands = [v for v in self.vals if pred is None or pred(v)]
    if not cands: return None
    # favour recent values (chains) but reuse older ones (shared subexpressions)
    return cands[-1] if self.rng.random() < 0.5 else cands[self.rng.integers(len(cands))]

  def operand(self, shape: tuple[int, ...]) -> _Val:
    """A value broadcastable against `shape`: an existing one, a view of a parameter, or a new parameter."""
    r = self.rng.random()
    if r < 0.35:
      ok = [v for v in self.vals if _broadcasts(tuple(v.t.shape), shape)]
      if ok: return ok[self.rng.integers(len(ok))]
    if r < 0.6:  # an existing parameter under another view
      for v in self.vals:
        if v.param and v.t.numel() == math.prod(shape) and tuple(v.t.shape) != shape and len(shape) >= 1:
          if len(shape) == 2 and tuple(v.t.shape) == shape[::-1]: return self.step("{0}.T", "{0}.T", (v.name,), v.ties)
          return self.step(f"{{0}}.reshape({shape})", f"{{0}}.reshape({shape})", (v.name,), v.ties)
    bshape = tuple(1 if self.rng.random() < 0.4 else s for s in shape)
    if self.rng.random() < 0.3: bshape = bshape[self.rng.integers(len(bshape) + 1):]
    r = self.rng.random()
    if r < 0.15:  # a constant parameter and a constant of the same value
      return self.leaf("constparam" if r < 0.08 else "const", bshape, int(self.rng.integers(-2, 3)))
    return self.leaf("param" if r < 0.8 else "input", bshape)


def _exact(g: _Gen, shape: tuple[int, ...]) -> _Val:
  """An existing parameter of exactly `shape` (reused), or a new one."""
  for v in g.vals:
    if v.param and tuple(v.t.shape) == shape and g.rng.random() < 0.7: return v
  return g.leaf("param", shape)


_Gen.exact = _exact  # type: ignore[attr-defined]


def _broadcasts(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
  """Whether `a` broadcasts to `b` (without changing b)."""
  return len(a) <= len(b) and all(x in (1, y) for x, y in zip(a[::-1], b[::-1]))


def _shape_str(s: tuple[int, ...]) -> str:
  return str(tuple(s))


def _op_unary(g: _Gen) -> None:
  x = g.pick()
  name, tiny, tor, ties = _UNARY[g.rng.integers(len(_UNARY))]
  g.step(tiny, tor, (x.name,), ties or x.ties)


def _op_binary(g: _Gen) -> None:
  x = g.pick()
  b = g.operand(tuple(x.t.shape))
  if b is None: return
  name, tiny, tor, ties = _BINARY[g.rng.integers(len(_BINARY))]
  args = (x.name, b.name) if g.rng.random() < 0.7 or not _broadcasts(tuple(x.t.shape), tuple(b.t.shape)) \
    else (b.name, x.name)
  g.step(tiny, tor, args, ties or x.ties or b.ties)


def _op_reduce(g: _Gen) -> None:
  x = g.pick(lambda v: v.t.ndim >= 1)
  if x is None: return
  ax = int(g.rng.integers(x.t.ndim))
  kd = ", keepdim=True" if g.rng.random() < 0.4 else ""
  n = x.t.shape[ax]
  ops = [("{0}.sum(%d%s)", "{0}.sum(%d%s)"), ("{0}.mean(%d%s)", "{0}.mean(%d%s)"),
         ("{0}.max(%d%s)", "{0}.amax(%d%s)"), ("{0}.logsumexp(%d%s)", "{0}.logsumexp(%d%s)")]
  if n > 1: ops.append(("{0}.var(%d%s)", "{0}.var(%d%s)"))
  tiny, tor = ops[g.rng.integers(len(ops))]
  if g.rng.random() < 0.25:
    tiny, tor = [("{0}.softmax(%d)", "{0}.softmax(%d)"), ("{0}.log_softmax(%d)", "{0}.log_softmax(%d)")][
      g.rng.integers(2)]
    g.step(tiny % ax, tor % ax, (x.name,), x.ties)
    return
  g.step(tiny % (ax, kd), tor % (ax, kd), (x.name,), True)


def _op_movement(g: _Gen) -> None:
  x = g.pick(lambda v: v.t.ndim >= 1)
  if x is None: return
  shp, nd = tuple(x.t.shape), x.t.ndim
  k = g.rng.integers(8)
  if k == 0:  # reshape: flatten, or split / merge dims
    if g.rng.random() < 0.5 or nd == 1: new = (math.prod(shp),) if nd > 1 else (1, shp[0])
    else: new = shp[:-2] + (shp[-2] * shp[-1],)
    g.step(f"{{0}}.reshape({new})", f"{{0}}.reshape({new})", (x.name,), x.ties)
  elif k == 1 and nd >= 2:
    perm = tuple(int(i) for i in g.rng.permutation(nd))
    g.step(f"{{0}}.permute({perm})", f"{{0}}.permute({perm})", (x.name,), x.ties)
  elif k == 2:
    d, n = int(g.rng.integers(nd + 1)), int(SIZES[g.rng.integers(1, len(SIZES))])
    new = shp[:d] + (n,) + shp[d:]
    g.step(f"{{0}}.unsqueeze({d}).expand({new})", f"{{0}}.unsqueeze({d}).expand({new})", (x.name,), True)
  elif k == 3:
    pads = tuple(int(v) for v in g.rng.integers(0, 3, 2 * min(nd, 2)))
    g.step(f"{{0}}.pad({pads})", f"F.pad({{0}}, {pads})", (x.name,), True)
  elif k == 4:  # slicing, with a step sometimes
    sl = []
    for s in shp:
      a = int(g.rng.integers(0, max(1, s // 2) + 1)) if s > 1 else 0
      st = 2 if s - a >= 3 and g.rng.random() < 0.3 else 1
      sl.append(f"{a}::{st}" if st > 1 else f"{a}:")
    idx = ", ".join(sl)
    g.step(f"{{0}}[{idx}]", f"{{0}}[{idx}]", (x.name,), x.ties)
  elif k == 5:
    axes = tuple(sorted({int(v) for v in g.rng.integers(0, nd, 1 + int(g.rng.integers(nd)))}))
    g.step(f"{{0}}.flip({axes})", f"{{0}}.flip({axes})", (x.name,), x.ties)
  elif k == 6 and nd >= 2:
    g.step(f"{{0}}.transpose({nd - 2}, {nd - 1})", f"{{0}}.transpose({nd - 2}, {nd - 1})", (x.name,), x.ties)
  else:  # cat with itself or an operand of the same shape
    d = int(g.rng.integers(nd))
    y = g.operand(shp) if g.rng.random() < 0.5 else x
    if y is None or tuple(y.t.shape) != shp: y = x
    g.step(f"{{0}}.cat({{1}}, dim={d})", f"torch.cat(({{0}}, {{1}}), dim={d})", (x.name, y.name), x.ties or y.ties)


def _op_matmul(g: _Gen) -> None:
  x = g.pick(lambda v: 1 <= v.t.ndim <= 3)
  if x is None: return
  k = x.t.shape[-1]
  # a conv weight reshaped into a matmul weight, the same parameter transposed, or a (k, n) parameter
  for v in g.vals:
    if v.param and v.t.ndim == 4 and v.t.shape[0] == k and g.rng.random() < 0.7:
      w = g.step(f"{{0}}.reshape({k}, -1)", f"{{0}}.reshape({k}, -1)", (v.name,), v.ties)
      break
    if v.param and v.t.ndim == 2 and v.t.shape[0] == k and g.rng.random() < 0.5:
      w = v
      break
    if v.param and v.t.ndim == 2 and v.t.shape[1] == k and g.rng.random() < 0.5:
      w = g.step("{0}.T", "{0}.T", (v.name,), v.ties)
      break
  else: w = g.leaf("param", (k, int(SIZES[g.rng.integers(len(SIZES))])), )
  if w is None: return
  if g.rng.random() < 0.3 and x.t.ndim == 2:
    g.step("Tensor.einsum('ij,jk->ik', {0}, {1})", "torch.einsum('ij,jk->ik', {0}, {1})", (x.name, w.name),
           x.ties or w.ties)
  else: g.step("{0} @ {1}", "{0} @ {1}", (x.name, w.name), x.ties or w.ties)


def _op_einsum(g: _Gen) -> None:
  x = g.pick(lambda v: v.t.ndim == 2)
  if x is None: return
  a, b = x.t.shape
  y = g.operand((a, b)) if g.rng.random() < 0.5 else x
  if y is None or tuple(y.t.shape) != (a, b): y = x
  eq = ["ij,ij->i", "ij,ij->j", "ij,kj->ik", "ij->ji", "ij,ij->"][g.rng.integers(5)]
  args = (x.name,) if eq == "ij->ji" else (x.name, y.name)
  tiny = f"Tensor.einsum('{eq}', {', '.join(f'{{{i}}}' for i in range(len(args)))})"
  g.step(tiny, tiny.replace("Tensor.", "torch."), args, x.ties or y.ties)


def _conv_weight(g: _Gen, co: int, ci: int, k: int) -> _Val:
  """An existing (co, ci, k, k) parameter (one weight in many convs) or a new one."""
  for v in g.vals:
    if v.param and tuple(v.t.shape) == (co, ci, k, k) and g.rng.random() < 0.85: return v
  if g.rng.random() < 0.15: return g.leaf("constparam", (co, ci, k, k), 2)  # all ones: x.conv2d(w).conv2d(w)
  return g.leaf("param", (co, ci, k, k))


def _op_conv(g: _Gen) -> None:
  x = g.pick(lambda v: v.t.ndim == 4 and min(v.t.shape[2:]) >= 2)
  if x is None: return
  n, c, h, w = x.t.shape
  kind = g.rng.integers(5)
  if kind <= 1:  # conv2d: square weights (c, c) so it chains with one weight
    k = int(g.rng.choice([1, 2, 3]))
    s, p, d = int(g.rng.choice([1, 1, 2])), int(g.rng.integers(0, k)), int(g.rng.choice([1, 1, 2]))
    if min(h, w) + 2 * p < d * (k - 1) + 1: return
    co = c if g.rng.random() < 0.8 else int(SIZES[g.rng.integers(1, 3)])
    wt = _conv_weight(g, co, c, k)
    bias = ", {2}" if g.rng.random() < 0.5 else ""
    args = (x.name, wt.name) + ((g.exact((co,)).name,) if bias else ())
    kw = f"stride={s}, padding={p}, dilation={d}"
    # ties: a constant weight, or outputs that read only padding (dilation) are equal
    g.step(f"{{0}}.conv2d({{1}}{bias}, {kw})", f"F.conv2d({{0}}, {{1}}{bias}, {kw})", args, x.ties or wt.ties or p > 0)
  elif kind == 2:  # conv_transpose2d with a (c, c) weight, shared with the conv2ds
    k, s, p = int(g.rng.choice([1, 2, 3])), int(g.rng.choice([1, 2])), 0
    if max(h, w) * s > 16: return
    wt = _conv_weight(g, c, c, k)
    kw = f"stride={s}, padding={p}"
    g.step(f"{{0}}.conv_transpose2d({{1}}, {kw})", f"F.conv_transpose2d({{0}}, {{1}}, {kw})", (x.name, wt.name),
           True)  # (stride > kernel leaves zeros between outputs)
  elif kind == 3:
    k = int(g.rng.choice([2, 3]))
    s, p = int(g.rng.choice([1, 2])), int(g.rng.integers(0, k // 2 + 1))
    if min(h, w) + 2 * p < k: return
    kw = f"stride={s}, padding={p}"
    g.step(f"{{0}}.avg_pool2d({k}, {kw})", f"F.avg_pool2d({{0}}, {k}, {kw})", (x.name,), x.ties)
  elif not x.ties:  # max_pool2d: torch sends a tie's gradient to one element, so only on tie-free values
    k = int(g.rng.choice([2, 3]))
    s, p = int(g.rng.choice([1, 2])), int(g.rng.integers(0, k // 2 + 1))
    if min(h, w) + 2 * p < k: return
    kw = f"stride={s}, padding={p}"
    g.step(f"{{0}}.max_pool2d({k}, {kw})", f"F.max_pool2d({{0}}, {k}, {kw})", (x.name,), False)


def _op_index(g: _Gen) -> None:
  x = g.pick(lambda v: v.t.ndim >= 1)
  if x is None: return
  shp, nd = tuple(x.t.shape), x.t.ndim
  kind = g.rng.integers(3)
  if kind == 0:  # gather along a dim
    d = int(g.rng.integers(nd))
    ishape = tuple(int(SIZES[g.rng.integers(len(SIZES))]) if i == d else s for i, s in enumerate(shp))
    idx = g.leaf("index", ishape, shp[d])
    g.step(f"{{0}}.gather({d}, {{1}})", f"{{0}}.gather({d}, {{1}})", (x.name, idx.name), x.ties)
  elif kind == 1:  # fancy index of the first dim, repeats included
    idx = g.leaf("index", (int(SIZES[g.rng.integers(1, len(SIZES))]),), shp[0])
    g.step("{0}[{1}]", "{0}[{1}]", (x.name, idx.name), x.ties)
  else:  # scatter_reduce("sum") of an operand into x along a dim
    d = int(g.rng.integers(nd))
    src = g.operand(shp)
    if src is None: return
    if tuple(src.t.shape) != shp:
      src = g.step(f"{{0}}.expand({shp})", f"{{0}}.expand({shp})", (src.name,), True)
      if src is None: return
    idx = g.leaf("index", shp, shp[d])
    g.step(f"{{0}}.scatter_reduce({d}, {{1}}, {{2}}, 'sum')", f"{{0}}.scatter_reduce({d}, {{1}}, {{2}}, 'sum')",
           (x.name, idx.name, src.name), True)


_OPS = [(_op_unary, 5), (_op_binary, 4), (_op_reduce, 2), (_op_movement, 4), (_op_matmul, 2), (_op_einsum, 1),
        (_op_conv, 4), (_op_index, 2)]


def generate(seed: int, n_steps: int | None = None) -> Program:
  """The program of `seed` (deterministic): 2-4 leaves, 3-8 steps, 1-3 loss terms."""
  rng = np.random.default_rng(seed)
  g = _Gen(rng, seed)
  if rng.random() < 0.5:  # an image and a square conv weight
    n, c, hw = int(rng.choice([1, 2])), int(rng.choice([1, 3])), int(rng.choice([5, 7]))
    g.leaf("input" if rng.random() < 0.7 else "param", (n, c, hw, hw))
  else:
    nd = int(rng.integers(1, 4))
    g.leaf("param", tuple(int(SIZES[rng.integers(len(SIZES))]) for _ in range(nd)))
  if rng.random() < 0.5: g.leaf("param", tuple(g.vals[0].t.shape[-2:]))
  weights = np.array([w for _, w in _OPS], dtype=np.float64)
  conv_first = g.vals[0].t.ndim == 4
  for _ in range(n_steps if n_steps is not None else int(rng.integers(3, 9))):
    fn = _op_conv if conv_first and rng.random() < 0.4 else _OPS[rng.choice(len(_OPS), p=weights / weights.sum())][0]
    fn(g)
  if not g.steps: g.step("{0}.sigmoid()", "{0}.sigmoid()", (g.vals[0].name,), False)
  outs = [g.steps[-1].out] + [s.out for s in g.steps[:-1] if rng.random() < 0.2][:2]
  return _used(Program(g.leaves, g.steps, outs, seed * 1000 + 500))


def find_failures(seeds: range) -> tuple[list[tuple[int, str, Program]], int]:
  """The failing seeds (seed, why, shrunk program) and how many programs were skipped (torch not finite)."""
  bad, skipped = [], 0
  for seed in seeds:
    prog = generate(seed)
    if not any(lf.kind in ("param", "constparam") for lf in prog.leaves) or not torch_ok(prog):
      skipped += 1
      continue
    if (why := check(prog)) is not None:
      small = shrink(prog)
      bad.append((seed, check(small) or why, small))
  return bad, skipped

