"""nn / optim / TinyJit semantics that tinygrad 0.14 defines, checked against torch numbers (issue #35).

Embedding in one kernel, load_state_dict's strictness and shape errors, BatchNorm's num_batches_tracked, fp16
parameters with float32 optimizer state, optimizer state on another device than the parameters, and TinyJit
pruning of the kernels that don't depend on its inputs (their buffers freed).
"""
import gc

import numpy as np
import pytest

from tiny_tensor import GlobalCounters, Tensor, TinyJit, Variable, dtypes, nn
from tiny_tensor.nn.state import get_state_dict, load_state_dict

torch = pytest.importorskip("torch")

RNG = np.random.default_rng(35)


# ***** Embedding *****
def test_embedding_forward_is_one_kernel_and_matches_torch():
  emb = nn.Embedding(11, 5)
  idx = RNG.integers(0, 11, size=(2, 7))
  ti = Tensor(idx.astype(np.int32)).realize()
  emb.weight.realize()
  GlobalCounters.reset()
  out = emb(ti).realize()
  assert GlobalCounters.kernel_count == 1
  ref = torch.nn.functional.embedding(torch.tensor(idx), torch.tensor(emb.weight.numpy()))
  np.testing.assert_array_equal(out.numpy(), ref.numpy())
  with pytest.raises(TypeError, match="integer"): emb(Tensor([1.0]))


# ***** load_state_dict *****
class _Net:
  def __init__(self):
    self.lin = nn.Linear(3, 2)
    self.bn = nn.BatchNorm(2)


def _torch_sd() -> dict:
  m = torch.nn.Module()
  m.lin, m.bn = torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2)
  with torch.no_grad(): m.bn.running_mean.copy_(torch.tensor([0.5, -0.5]))
  m.bn.num_batches_tracked += 7
  return {k: v.detach().numpy().copy() for k, v in m.state_dict().items()}


def test_load_state_dict_takes_a_torch_state_dict_with_num_batches_tracked():
  sd = _torch_sd()
  net = _Net()
  load_state_dict(net, {k: Tensor(v) for k, v in sd.items()})
  ours = get_state_dict(net)
  assert sorted(ours) == sorted(sd)
  for k, v in sd.items(): np.testing.assert_allclose(ours[k].numpy(), v, err_msg=k)
  # torch keeps num_batches_tracked as a long scalar; so do tinygrad and we
  assert str(torch.nn.BatchNorm1d(2).num_batches_tracked.dtype) == "torch.int64"
  assert ours["bn.num_batches_tracked"].dtype == dtypes.int64 and ours["bn.num_batches_tracked"].shape == ()


def test_load_state_dict_scalar_and_one_element_vector_load_into_each_other():
  sd = {k: Tensor(v) for k, v in _torch_sd().items()}
  sd["bn.num_batches_tracked"] = Tensor([7], dtype=dtypes.int64)  # an old checkpoint's (1,) scalar
  net = _Net()
  load_state_dict(net, sd)
  assert net.bn.num_batches_tracked.shape == () and net.bn.num_batches_tracked.item() == 7
  # torch accepts the same checkpoint (it takes a (1,) tensor into a () buffer)
  tm = torch.nn.BatchNorm1d(2)
  tm.load_state_dict({**tm.state_dict(), "num_batches_tracked": torch.tensor([7])})
  assert int(tm.num_batches_tracked) == 7


def test_load_state_dict_errors_have_tinygrads_types():
  sd = {k: Tensor(v) for k, v in _torch_sd().items()}
  net = _Net()
  with pytest.raises(ValueError, match=r"lin.weight.*\(2, 3\).*\(3, 2\)"):
    load_state_dict(net, {**sd, "lin.weight": Tensor.zeros(3, 2)})
  missing = {k: v for k, v in sd.items() if k != "lin.bias"}
  with pytest.raises(KeyError, match="lin.bias"): load_state_dict(net, missing)
  # strict is about the model's tensors (tinygrad's rule): an extra entry, like a torch checkpoint's unused head, is
  # skipped and the rest loads
  extra = {**sd, "head.weight": Tensor.ones(4, 2)}
  load_state_dict(net, extra)
  np.testing.assert_allclose(net.bn.running_mean.numpy(), _torch_sd()["bn.running_mean"])
  assert "head.weight" in extra  # (only consume=True removes what was loaded)
  load_state_dict(net, extra, consume=True)
  assert sorted(extra) == ["head.weight"]
  before = net.lin.bias.numpy().copy()
  load_state_dict(net, missing, strict=False)  # not strict: the missing key is left alone
  np.testing.assert_array_equal(net.lin.bias.numpy(), before)
  np.testing.assert_allclose(net.lin.weight.numpy(), sd["lin.weight"].numpy())


# ***** BatchNorm num_batches_tracked *****
def test_batchnorm_counts_batches_like_torch():
  x = RNG.standard_normal((4, 3, 2, 2)).astype(np.float32)
  ours, ref = nn.BatchNorm(3), torch.nn.BatchNorm2d(3)
  with Tensor.train():
    for _ in range(3): ours(Tensor(x)).realize()
  for _ in range(3): ref(torch.tensor(x))
  assert ours.num_batches_tracked.item() == int(ref.num_batches_tracked) == 3
  np.testing.assert_allclose(ours.running_mean.numpy(), ref.running_mean.numpy(), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(ours.running_var.numpy(), ref.running_var.numpy(), rtol=1e-5, atol=1e-6)
  ours(Tensor(x)).realize()  # eval mode: no count
  assert ours.num_batches_tracked.item() == 3


# ***** optimizers: fp16 parameters, float32 state *****
W16 = (RNG.standard_normal((4, 3)) * 0.5).astype(np.float16)


def _torch_mixed(kind: str, steps: int, lr: float) -> np.ndarray:
  """A torch reference with fp16 parameters and float32 state: the update is computed in float32 from the fp16
  gradient, cast to fp16 and subtracted from the fp16 parameter (tinygrad's `t - up.cast(t.dtype)`)."""
  w = torch.tensor(W16, requires_grad=True)
  m, v, b = (torch.zeros(W16.shape, dtype=torch.float32) for _ in range(3))
  b1, b2, eps = 0.9, 0.999, 1e-8 if kind == "adam" else 1e-6
  for t in range(1, steps + 1):
    w.grad = None
    (w.float() ** 3).sum().backward()
    g = w.grad.float()
    with torch.no_grad():
      if kind == "sgd":
        b = 0.9 * b + g
        up = lr * b
      else:
        m, v = b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * g * g
        up = (m / (1 - b1 ** t)) / ((v / (1 - b2 ** t)).sqrt() + eps)
        if kind == "lamb":
          r1, r2 = w.float().norm(), up.norm()
          up = up * (r1 / r2 if r1 > 0 and r2 > 0 else 1.0)
        up = lr * up
      w -= up.half()
  return w.detach().numpy()


def _tiny_mixed(make, steps: int, device: str | None = None) -> tuple[np.ndarray, nn.optim.Optimizer]:
  w = Tensor(W16.copy(), requires_grad=True)
  opt = make([w]) if device is None else make([w], device=device)
  with Tensor.train():
    for _ in range(steps):
      opt.zero_grad()
      (w.float() ** 3).sum().backward()
      opt.step()
  assert w.dtype == dtypes.float16
  return w.numpy(), opt


@pytest.mark.parametrize("kind", ["sgd", "adam", "lamb"])
def test_fp16_params_with_fp32_state_match_torch(kind):
  makers = {"sgd": lambda p, **kw: nn.optim.SGD(p, lr=0.01, momentum=0.9, **kw),
            "adam": lambda p, **kw: nn.optim.Adam(p, lr=0.01, **kw),
            "lamb": lambda p, **kw: nn.optim.LAMB(p, lr=0.01, **kw)}
  got, opt = _tiny_mixed(makers[kind], 4)
  state = opt.b if kind == "sgd" else opt.m + opt.v
  assert state and all(s.dtype == dtypes.float32 for s in state)
  np.testing.assert_allclose(got.astype(np.float32), _torch_mixed(kind, 4, 0.01).astype(np.float32), atol=2e-3)


# ***** optimizer state on another device (CPU offload) *****
@pytest.mark.parametrize("kind", ["sgd", "adam", "lamb"])
def test_optimizer_state_on_another_device(kind):
  makers = {"sgd": lambda p, **kw: nn.optim.SGD(p, lr=0.01, momentum=0.9, **kw),
            "adam": lambda p, **kw: nn.optim.Adam(p, lr=0.01, **kw),
            "lamb": lambda p, **kw: nn.optim.LAMB(p, lr=0.01, **kw)}
  got, opt = _tiny_mixed(makers[kind], 3, device="CPU:1")
  state = opt.b if kind == "sgd" else opt.m + opt.v
  assert all(s.device == "CPU:1" for s in state) and opt.lr.device == "CPU:1"
  np.testing.assert_allclose(got.astype(np.float32), _torch_mixed(kind, 3, 0.01).astype(np.float32), atol=2e-3)


# ***** TinyJit: pruning *****
def test_jit_prune_drops_kernels_that_dont_depend_on_inputs():
  w = Tensor(RNG.standard_normal((8,)).astype(np.float32)).realize()
  runs = []

  def f(x: Tensor):
    runs.append(1)
    const = (w.exp() * 2 + 1).contiguous()  # independent of x: computed once
    copy = (w + 0).contiguous()  # an independent copy of a weight
    return (x * const).sum().realize(), copy.realize()

  plain, pruned = TinyJit(f), TinyJit(f, prune=True)
  for _ in range(4):
    x = RNG.standard_normal((8,)).astype(np.float32)
    a, _ = plain(Tensor(x))
    b, cb = pruned(Tensor(x))
    ref = (torch.tensor(x) * (torch.tensor(w.numpy()).exp() * 2 + 1)).sum()
    np.testing.assert_allclose(a.numpy(), ref.numpy(), rtol=1e-5)
    np.testing.assert_allclose(b.numpy(), ref.numpy(), rtol=1e-5)
    np.testing.assert_array_equal(cb.numpy(), w.numpy())
  assert pruned.captured.kernel_count < plain.captured.kernel_count
  assert pruned.captured.kernel_count == 1  # only the kernel that reads x is replayed
  GlobalCounters.reset()
  pruned(Tensor(RNG.standard_normal((8,)).astype(np.float32)))
  assert GlobalCounters.kernel_count == 1


def test_jit_prune_keeps_kernels_that_update_state_in_place():
  counter = Tensor([0.0]).realize()

  def f(x: Tensor) -> Tensor:
    counter.assign(counter + 1).realize()  # independent of x, but changes on every call: never pruned
    return (x + counter).realize()

  j = TinyJit(f, prune=True)
  outs = [j(Tensor([1.0, 2.0])).numpy().copy() for _ in range(4)]
  np.testing.assert_array_equal(np.stack(outs), np.array([[2.0, 3.0], [3.0, 4.0], [4.0, 5.0], [5.0, 6.0]]))
  assert counter.item() == 4.0


def test_jit_prune_keeps_kernels_that_use_a_variable():
  w = Tensor(np.arange(8, dtype=np.float32)).realize()

  @TinyJit(prune=True)
  def f(x: Tensor, n) -> Tensor:
    head = w[:n].sum().realize()  # reads no input buffer, but its size is the bound Variable
    return (x * head).realize()

  for k in (3, 5, 7, 2):
    got = f(Tensor([1.0, 2.0]), Variable("n", 1, 8).bind(k)).numpy()
    np.testing.assert_allclose(got, np.array([1.0, 2.0]) * np.arange(8)[:k].sum())


def test_jit_prune_decorator_form_and_frees_pruned_buffers():
  w = Tensor(RNG.standard_normal((1024,)).astype(np.float32)).realize()

  @TinyJit(prune=True)
  def f(x: Tensor) -> Tensor:
    big = (w * 3).contiguous().realize()  # an intermediate only pruned kernels use ...
    total = big.sum().realize()  # ... and their (kept) output, read by the one replayed kernel
    return (x + total).realize()

  @TinyJit
  def g(x: Tensor) -> Tensor:
    big = (w * 3).contiguous().realize()
    total = big.sum().realize()
    return (x + total).realize()

  x = Tensor([1.0]).realize()
  for _ in range(2): f(x), g(x)
  # the plain jit holds `w` and `big` (4 KiB each); the pruned one only the 4-byte ones
  held = {id(b): b.nbytes for c in g.captured.calls for b in getattr(c, "refs", []) if not isinstance(b, int)}
  held_pruned = {id(b): b.nbytes for c in f.captured.calls for b in getattr(c, "refs", []) if not isinstance(b, int)}
  assert 4096 in held.values() and 4096 not in held_pruned.values()
  ref = 1.0 + (torch.tensor(w.numpy()) * 3).sum()
  for _ in range(2): np.testing.assert_allclose(f(Tensor([1.0])).numpy(), [ref.item()], rtol=1e-5)


def test_jit_prune_frees_intermediates_in_mem_used():
  w = Tensor(np.ones(1 << 14, dtype=np.float32)).realize()

  def body(x: Tensor) -> Tensor:
    big = (w * 3).contiguous().realize()  # 64 KiB, used only by kernels that don't read x
    return (x + big.sum().realize()).realize()

  held = {}
  for prune in (False, True):
    j, x = TinyJit(body, prune=prune), Tensor([1.0]).realize()
    j(x)
    gc.collect()
    before = GlobalCounters.mem_used
    j(x)  # the capture: what the jit keeps allocated for its replays
    gc.collect()
    held[prune] = GlobalCounters.mem_used - before
    np.testing.assert_allclose(j(x).numpy(), [1.0 + 3.0 * (1 << 14)])
  assert held[False] >= 4 << 14 and held[True] < 64


# ***** fused optimizers (tinygrad's FUSE_OPTIM) *****
def _two_params():
  a = (RNG.standard_normal((3, 2)) * 0.5).astype(np.float32)
  b = (RNG.standard_normal((4,)) * 0.5).astype(np.float32)
  return a, b


def _tiny_fused(make, a, b, steps=3):
  ta, tb = Tensor(a.copy(), requires_grad=True), Tensor(b.copy(), requires_grad=True)
  opt = make([ta, tb])
  with Tensor.train():
    for _ in range(steps):
      opt.zero_grad()
      ((ta ** 3).sum() + (tb * tb).sum() * 2).backward()
      opt.step()
  return ta.numpy(), tb.numpy(), opt


def test_fused_adam_and_sgd_match_torch():
  a, b = _two_params()
  for make, tmake in [(lambda p: nn.optim.Adam(p, lr=0.05, fused=True), lambda p: torch.optim.Adam(p, lr=0.05)),
                      (lambda p: nn.optim.SGD(p, lr=0.05, momentum=0.9, fused=True),
                       lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9))]:
    ga, gb, opt = _tiny_fused(make, a, b)
    state = opt.b if hasattr(opt, "b") and opt.b else opt.m
    assert len(state) == 1 and state[0].shape == (10,)  # one flat buffer for both parameters
    qa, qb = torch.tensor(a, requires_grad=True), torch.tensor(b, requires_grad=True)
    topt = tmake([qa, qb])
    for _ in range(3):
      topt.zero_grad()
      ((qa ** 3).sum() + (qb * qb).sum() * 2).backward()
      topt.step()
    np.testing.assert_allclose(ga, qa.detach().numpy(), rtol=1e-5, atol=1e-5)  # steps of lr=0.05: 2e-4 of one
    np.testing.assert_allclose(gb, qb.detach().numpy(), rtol=1e-5, atol=1e-5)


def test_fused_lamb_trust_ratio_is_over_all_parameters():
  a, b = _two_params()
  ga, gb, _ = _tiny_fused(lambda p: nn.optim.LAMB(p, lr=0.05, fused=True), a, b)
  # torch reference: LAMB on the concatenation of both parameters (one trust ratio)
  w = torch.tensor(np.concatenate([a.ravel(), b.ravel()]), requires_grad=True)
  m, v = torch.zeros(10), torch.zeros(10)
  for t in range(1, 4):
    w.grad = None
    ((w[:6] ** 3).sum() + (w[6:] * w[6:]).sum() * 2).backward()
    with torch.no_grad():
      g = w.grad
      m, v = 0.9 * m + 0.1 * g, 0.999 * v + 0.001 * g * g
      up = (m / (1 - 0.9 ** t)) / ((v / (1 - 0.999 ** t)).sqrt() + 1e-6)
      w -= 0.05 * (w.norm() / up.norm()) * up
  np.testing.assert_allclose(np.concatenate([ga.ravel(), gb.ravel()]), w.detach().numpy(), rtol=1e-5, atol=1e-6)


def test_fused_errors():
  a = Tensor([1.0, 2.0], requires_grad=True)
  with pytest.raises(ValueError, match="one dtype"):
    nn.optim.Adam([a, Tensor([1.0], dtype=dtypes.float16, requires_grad=True)], fused=True)
  b = Tensor([3.0], requires_grad=True)
  opt = nn.optim.SGD([a, b], fused=True)
  with Tensor.train():
    (a * a).sum().backward()
    with pytest.raises(RuntimeError, match=r"parameters \[1\] have no .grad"): opt.step()


def test_jit_shares_intermediates_whose_lifetimes_dont_overlap():
  n = 1 << 14

  def body(x: Tensor) -> Tensor:
    a = (x * 2).contiguous().realize()  # a, b, c, d: 64 KiB each, each dead once the next is computed
    b = (a + 1).contiguous().realize()
    c = (b * b).contiguous().realize()
    d = (c - 3).contiguous().realize()
    return d.sum().realize()

  j = TinyJit(body)
  base = np.arange(n, dtype=np.float32) / n
  x0, x1 = Tensor(base).realize(), Tensor(base).realize()
  j(x0)
  gc.collect()
  before = GlobalCounters.mem_used
  j(x1)  # the capture: what it keeps allocated for the replays
  gc.collect()
  held = GlobalCounters.mem_used - before
  assert held < 4 * (4 * n)  # fewer than the four intermediates: a and c share one buffer (b and d may too)
  for i in range(3):
    x = base + i
    want = torch.tensor((((x * 2 + 1) ** 2) - 3).astype(np.float64)).sum().item()
    np.testing.assert_allclose(j(Tensor(x)).item(), want, rtol=1e-5)
