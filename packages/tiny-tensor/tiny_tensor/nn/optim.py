"""Optimizers: SGD (momentum, nesterov, weight decay), Muon, Adam, AdamW, LAMB, LARS, and OptimizerGroup.

`step()` builds every parameter's update (and the optimizer state's) lazily and realizes them together in one
`Tensor.realize(...)`, so the scheduler fuses each parameter's update chain into a few kernels.

>>> from tiny_tensor import Tensor, nn
>>> w = Tensor([1.0, 2.0], requires_grad=True)
>>> opt = nn.optim.SGD([w], lr=0.1)
>>> with Tensor.train():
...   _ = (w * w).sum().backward(); opt.step()
>>> w.tolist()  # w - 0.1 * 2w  # doctest: +ELLIPSIS
[0.8..., 1.6...]
"""
from __future__ import annotations


import numpy as np

from tiny_uop.dtype import dtypes
from tiny_uop.uop import Ops, UOp

from tiny_tensor import engine
from tiny_tensor.tensor import Tensor

__all__ = ["Optimizer", "OptimizerGroup", "SGD", "Muon", "LARS", "Adam", "AdamW", "LAMB"]


def _dedup(ts: list[Tensor]) -> list[Tensor]:
  return list({id(t): t for t in ts}.values())  # the first of each, in order (a dict keeps insertion order)


def _state(t: Tensor, device: str, fill: float = 0.0) -> Tensor:
  """A realized float32 buffer shaped like `t`, filled with `fill` (copied in: no kernel)."""
  return Tensor(np.full(tuple(int(s) for s in t.shape), fill, dtype=np.float32), device=device, requires_grad=False)


def _to(x: Tensor, device: str | tuple[str, ...]) -> Tensor:
  """x on `device` (optimizer state kept on another device than the parameters, e.g. offloaded to CPU)."""
  if x.device == device or isinstance(x.device, tuple) or isinstance(device, tuple): return x
  return x.contiguous().to(device)


def _parts(u: UOp) -> tuple[UOp, ...]: return u.src if u.op is Ops.MULTI else (u,)  # a sharded tensor: its shards


def _shard_device(u: UOp) -> str:
  """The one device of `u`, a single-device tensor's graph or one shard of a sharded one."""
  if not isinstance(dev := u.device, str): raise ValueError(f"a {u.op} on {dev!r} is not on one device")
  return dev


def _own_buffers(t: Tensor) -> UOp:
  """t's value written into new buffers of its own: one, or one per shard for a sharded tensor (same split)."""
  T = type(t)
  empties = tuple(T.empty(p.shape, dtype=t.dtype, device=_shard_device(p)).uop for p in _parts(t.uop))
  dst = T._new(UOp(Ops.MULTI, t.dtype, empties, t.uop.arg) if t.uop.op is Ops.MULTI else empties[0], False)
  return dst.assign(t.detach()).uop


def _realize_params(ts: list[Tensor]) -> None:
  """Make every parameter a realized buffer so `assign` updates it in place (lazy constants like zeros() aren't)."""
  todo = [t for t in ts if not all(map(engine.is_realized, _parts(t.uop)))]
  # each into a buffer of its own: two parameters built from the same value (every LayerNorm's ones()) are the same
  # interned graph, and `contiguous()` would give them one buffer, which their updates would then share
  for t in todo: t.uop = _own_buffers(t)
  if todo: Tensor.realize(*todo)
  # a parameter is a leaf of autograd: forget the graph it was computed from (its random init), which the tensor
  # keeps (`_origin`) so that gradients can flow through values realized before backward
  for t in ts:
    if getattr(t, "_origin", None) is not None: t._origin = None


class Optimizer:
  """Base class: `params` with `requires_grad` not False are trained (None becomes True); those with False are
  buffers (e.g. BatchNorm running statistics) that `step` realizes along with the updates.

  `device` is where the optimizer state (learning rate, moments, momentum) lives, the first parameter's by default.
  On another device (e.g. state offloaded to CPU), each gradient is copied to it, the update is computed there and
  copied back to its parameter's device. `fused=True` (tinygrad's FUSE_OPTIM) updates all parameters as one flat
  tensor: one state buffer per kind, and trust ratios over all parameters together. The state is float32 whatever
  the parameters' dtype (fp16 parameters get float32 moments; the update is cast to the parameter's dtype before it is
  subtracted)."""

  def __init__(self, params: list[Tensor], lr: float, device: str | None = None, fused: bool = False):
    if lr < 0: raise ValueError(f"invalid learning rate {lr}: must be >= 0")
    for x in params:
      if x.requires_grad is None: x.requires_grad = True
    self.params: list[Tensor] = _dedup([x for x in params if x.requires_grad])
    if not self.params:
      raise ValueError("the optimizer got no parameter to train (every tensor has requires_grad=False)")
    self.buffers: list[Tensor] = _dedup([x for x in params if not x.requires_grad])
    self.device = device or self.params[0].device
    self.fused = fused
    if fused and any(isinstance(p.device, tuple) for p in self.params):
      raise ValueError("fused=True needs unsharded parameters (it concatenates them into one tensor); got sharded ones")
    if fused and len({p.dtype for p in self.params}) > 1:
      raise ValueError(f"fused=True needs parameters of one dtype, got {sorted({str(p.dtype) for p in self.params})}")
    _realize_params(self.params + self.buffers)
    # the learning rate is a tensor (float32 at least), so changing it (opt.lr.assign(...)) doesn't recompile
    self.lr = Tensor(np.array([lr], dtype=np.float32), device=self.device, requires_grad=False)
    self.initial_lr: float | None = None  # set by the first LR scheduler (torch's param_group["initial_lr"])

  def _new_state(self) -> list[Tensor]:
    """Zeroed float32 optimizer state on `self.device`: one per parameter, or one flat buffer of them all (fused)."""
    if not self.fused: return [_state(p, self.device) for p in self.params]
    total = sum(int(np.prod(tuple(int(s) for s in p.shape))) for p in self.params)
    return [Tensor(np.zeros((total,), dtype=np.float32), device=self.device, requires_grad=False)]

  def zero_grad(self) -> None:
    """Drop every parameter's gradient (`backward` then starts from zero)."""
    for p in self.params: p.grad = None

  def step(self) -> None:
    """One optimization step: update every parameter from its `.grad`, realized together."""
    Tensor.realize(*self.schedule_step())

  def schedule_step(self) -> list[Tensor]:
    """The tensors to realize for one step (assigns to the parameters, the optimizer state and the buffers)."""
    if not Tensor.training:
      raise RuntimeError("the optimizer steps only in training mode: wrap the step in `with Tensor.train():` "
                         "(or set Tensor.training = True)")
    if all(p.grad is None for p in self.params):
      raise RuntimeError("no parameter has a .grad: call loss.backward() before step()")
    if self.fused: return self._fused_step()
    # like torch, a parameter without a gradient (unused in this loss) is left alone, and so is its state
    live = [i for i, p in enumerate(self.params) if p.grad is not None]
    grads = [g for i in live if (g := self.params[i].grad) is not None]  # (all of them: `live` has those with one)
    updates, extra = self._step([self.params[i] for i in live], grads, live)
    for i, up in zip(live, updates): self.params[i].assign(self.params[i].detach() - _to(up, self.params[i].device))
    return extra + self.params + self.buffers

  def _fused_step(self) -> list[Tensor]:
    """fused=True (tinygrad's FUSE_OPTIM): every parameter and gradient flattened into one tensor, one update for it,
    split back. Trust ratios (LARS, LAMB) are then over all parameters together, as in tinygrad."""
    if (no_grad := [i for i, p in enumerate(self.params) if p.grad is None]):
      raise RuntimeError(f"fused=True updates every parameter together, but parameters {no_grad} have no .grad "
                         "(unused in the loss): use fused=False to leave them alone")
    flat_p = Tensor.cat(*[p.detach().flatten() for p in self.params])
    flat_g = Tensor.cat(*[g.contiguous().flatten() for p in self.params if (g := p.grad) is not None])  # (all: above)
    (up,), extra = self._step([flat_p], [flat_g], [0])
    up = _to(up, self.params[0].device)
    pos = 0
    for p in self.params:
      n = int(np.prod(tuple(int(s) for s in p.shape)))
      p.assign(p.detach() - up[pos:pos + n].reshape(p.shape))
      pos += n
    return extra + self.params + self.buffers

  def _step(self, params: list[Tensor], grads: list[Tensor], idx: list[int]) -> tuple[list[Tensor], list[Tensor]]:
    """The updates of `params` (the optimizer's parameters number `idx`) from `grads`, and the state to realize."""
    raise NotImplementedError(f"{type(self).__name__} must implement _step")


class OptimizerGroup(Optimizer):
  """Several optimizers stepped as one (their updates realize together). `group[i]` is the i-th optimizer."""

  def __init__(self, *optimizers: Optimizer):  # pylint: disable=super-init-not-called
    self.optimizers = optimizers
    self.params = [p for o in optimizers for p in o.params]
    self.buffers = [b for o in optimizers for b in o.buffers]

  def __getitem__(self, i: int) -> Optimizer: return self.optimizers[i]
  def zero_grad(self) -> None:
    for o in self.optimizers: o.zero_grad()
  def schedule_step(self) -> list[Tensor]: return [t for o in self.optimizers for t in o.schedule_step()]


class LARS(Optimizer):
  """Layer-wise adaptive rate scaling: SGD whose per-tensor step is scaled by the trust ratio
  `tcoef * |w| / (|g| + wd * |w|)` (1 where a norm is 0). `tcoef=0` is plain SGD.

  `classic=True` applies the learning rate before the momentum buffer (b = m*b + lr*g), else after (PyTorch's SGD).
  `ns_steps`/`ns_coefficients` orthogonalize the momentum step by Newton-Schulz iterations (Muon); `pre_wd=False`
  moves the weight decay after the momentum, decoupled (w -= lr * wd * w), as Muon does.
  """

  def __init__(self, params: list[Tensor], lr: float = 0.001, momentum: float = 0.9, weight_decay: float = 1e-4,
               ns_steps: int = 0, ns_coefficients: tuple[float, ...] | None = None, nesterov: bool = False,
               classic: bool = True, pre_wd: bool = True, tcoef: float = 0.001, device: str | None = None,
               fused: bool = False):
    if momentum < 0: raise ValueError(f"invalid momentum {momentum}: must be >= 0")
    if weight_decay < 0: raise ValueError(f"invalid weight_decay {weight_decay}: must be >= 0")
    if ns_coefficients is not None and (ns_steps < 1 or len(ns_coefficients) < 1):
      raise ValueError(f"Newton-Schulz needs ns_steps >= 1 and coefficients, got ns_steps={ns_steps}, "
                       f"ns_coefficients={ns_coefficients}")
    super().__init__(params, lr, device, fused)
    self.momentum, self.wd, self.nesterov, self.classic, self.tcoef = momentum, weight_decay, nesterov, classic, tcoef
    self.ns_steps, self.ns_coefficients, self.pre_wd = ns_steps, ns_coefficients, pre_wd
    self.b = self._new_state() if momentum else []

  def _step(self, params: list[Tensor], grads: list[Tensor], idx: list[int]) -> tuple[list[Tensor], list[Tensor]]:
    ret = []
    for i, t, g in zip(idx, params, grads):
      g = _to(g, self.device).cast(dtypes.float32)
      w = _to(t.detach(), self.device).cast(dtypes.float32)
      r: Tensor | float = 1.0
      if self.tcoef != 0:
        r1, r2 = w.square().sum().sqrt(), g.square().sum().sqrt()
        r = (r1 > 0).where((r2 > 0).where(self.tcoef * r1 / (r2 + self.wd * r1), 1.0), 1.0)
      if self.pre_wd and self.wd > 0: g = g + self.wd * w
      if self.classic: g = g * r * self.lr
      if self.momentum:
        self.b[i].assign(self.momentum * self.b[i] + g)  # b starts at 0, so step 1 gives b = g
        g = (g + self.momentum * self.b[i]) if self.nesterov else self.b[i]
      if self.ns_coefficients:  # orthogonalize the step as a (rows, everything else) matrix
        rows = int(g.shape[0]) if g.ndim else 1
        g = g.reshape(rows, -1).newton_schulz(self.ns_steps, self.ns_coefficients).reshape(g.shape)
      if not self.classic: g = g * r * self.lr
      if not self.pre_wd and self.wd > 0: g = g + self.wd * self.lr * w  # decoupled: w -= lr * wd * w
      ret.append(g.cast(t.dtype))
    return ret, self.b


def SGD(params: list[Tensor], lr: float = 0.001, momentum: float = 0.0, weight_decay: float = 0.0,
        nesterov: bool = False, classic: bool = False, device: str | None = None, fused: bool = False) -> LARS:
  """Stochastic gradient descent with optional momentum (PyTorch's rule, dampening 0), nesterov and weight decay.

  >>> from tiny_tensor import Tensor, nn
  >>> opt = nn.optim.SGD([Tensor([1.0], requires_grad=True)], lr=0.1, momentum=0.9)
  """
  return LARS(params, lr, momentum, weight_decay, 0, None, nesterov, classic=classic, pre_wd=True, tcoef=0.0,
              device=device, fused=fused)


def Muon(params: list[Tensor], lr: float = 0.001, momentum: float = 0.95, weight_decay: float = 0.1, ns_steps: int = 5,
         ns_coefficients: tuple[float, ...] = (3.4445, -4.775, 2.0315), nesterov: bool = True,
         device: str | None = None, fused: bool = False) -> LARS:
  """Muon (Jordan et al., 2024; Liu et al., arXiv:2502.16982): SGD-momentum (nesterov by default) whose step, seen as a
  (rows, rest) matrix, is orthogonalized by `ns_steps` quintic Newton-Schulz iterations, then decoupled weight decay:
  b = m*b + g;  u = NS(g + m*b);  w -= lr * (u + wd * w).

  >>> from tiny_tensor import Tensor, nn
  >>> opt = nn.optim.Muon([Tensor.ones(4, 4, requires_grad=True)], lr=0.02)
  """
  return LARS(params, lr, momentum, weight_decay, ns_steps, tuple(ns_coefficients), nesterov, classic=False,
              pre_wd=False, tcoef=0.0, device=device, fused=fused)


class LAMB(Optimizer):
  """LAMB: Adam(W)'s update scaled per tensor by the trust ratio |w| / |update| (1 where a norm is 0).

  `adam=True` drops the trust ratio: that is Adam (weight_decay 0) or AdamW (decoupled weight decay).
  """

  def __init__(self, params: list[Tensor], lr: float = 0.001, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-6,
               weight_decay: float = 0.0, adam: bool = False, device: str | None = None, fused: bool = False):
    if weight_decay < 0: raise ValueError(f"invalid weight_decay {weight_decay}: must be >= 0")
    if not (0 <= b1 < 1 and 0 <= b2 < 1): raise ValueError(f"invalid betas ({b1}, {b2}): each must be in [0, 1)")
    super().__init__(params, lr, device, fused)
    self.b1, self.b2, self.eps, self.wd, self.adam = b1, b2, eps, weight_decay, adam
    # b1^t and b2^t, kept as tensors so a jitted step stays correct on every replay
    self.b1_t = Tensor(np.ones((1,), dtype=np.float32), device=self.device, requires_grad=False)
    self.b2_t = Tensor(np.ones((1,), dtype=np.float32), device=self.device, requires_grad=False)
    self.m, self.v = self._new_state(), self._new_state()

  def _step(self, params: list[Tensor], grads: list[Tensor], idx: list[int]) -> tuple[list[Tensor], list[Tensor]]:
    ret = []
    self.b1_t.assign(self.b1_t * self.b1)
    self.b2_t.assign(self.b2_t * self.b2)
    for i, t, g in zip(idx, params, grads):
      g = _to(g, self.device).cast(dtypes.float32)
      w = _to(t.detach(), self.device).cast(dtypes.float32)
      self.m[i].assign(self.b1 * self.m[i] + (1.0 - self.b1) * g)
      self.v[i].assign(self.b2 * self.v[i] + (1.0 - self.b2) * (g * g))
      m_hat = self.m[i] / (1.0 - self.b1_t)
      v_hat = self.v[i] / (1.0 - self.b2_t)
      up = m_hat / (v_hat.sqrt() + self.eps) + self.wd * w
      r: Tensor | float = 1.0
      if not self.adam:
        r1, r2 = w.square().sum().sqrt(), up.square().sum().sqrt()
        r = (r1 > 0).where((r2 > 0).where(r1 / r2, 1.0), 1.0)
      ret.append((self.lr * r * up).cast(t.dtype))
    return ret, [self.b1_t, self.b2_t] + self.m + self.v


def Adam(params: list[Tensor], lr: float = 0.001, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8,
         device: str | None = None, fused: bool = False) -> LAMB:
  """Adam (Kingma & Ba), matching torch.optim.Adam.

  >>> from tiny_tensor import Tensor, nn
  >>> opt = nn.optim.Adam([Tensor([1.0], requires_grad=True)], lr=1e-3)
  """
  return LAMB(params, lr, b1, b2, eps, 0.0, adam=True, device=device, fused=fused)


def AdamW(params: list[Tensor], lr: float = 0.001, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8,
          weight_decay: float = 0.01, device: str | None = None, fused: bool = False) -> LAMB:
  """Adam with decoupled weight decay (Loshchilov & Hutter), matching torch.optim.AdamW."""
  return LAMB(params, lr, b1, b2, eps, weight_decay, adam=True, device=device, fused=fused)


