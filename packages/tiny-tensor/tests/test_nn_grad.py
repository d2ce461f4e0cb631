"""Every nn layer against its torch.nn counterpart with copied weights: the forward value, the input's gradient and
every weight's gradient for a random upstream gradient (tinygrad 0.14's layer list: `test_layer_list_is_tinygrads`)."""
import numpy as np
import pytest

from tiny_tensor import Tensor, nn

torch = pytest.importorskip("torch")


def _x(*shape, seed=0):
  return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _copy_all(ours, theirs, names, seed=100):
  """Give both layers the same weights: torch's (random, or `seed`-random where torch starts at ones/zeros)."""
  for k, n in enumerate(names):
    src = getattr(theirs, n)
    val = src.detach().numpy().copy()
    if np.all(val == val.flat[0]): val = _x(*val.shape, seed=seed + k)  # ones/zeros: make the gradients telling
    with torch.no_grad(): src.copy_(torch.tensor(val))
    assert tuple(getattr(ours, n).shape) == val.shape, (n, getattr(ours, n).shape, val.shape)
    setattr(ours, n, Tensor(val.copy(), requires_grad=True))


def _check(ours, theirs, names, *inputs, rtol=1e-4, atol=1e-5, int_input=False):
  _copy_all(ours, theirs, names)
  ts = [Tensor(a, requires_grad=not int_input) for a in inputs]
  qs = [torch.tensor(a, requires_grad=not int_input) if not int_input else torch.tensor(a, dtype=torch.long)
        for a in inputs]
  out, want = ours(*ts), theirs(*qs)
  outs, wants = (out, want) if isinstance(out, tuple) else ((out,), (want,))
  ups = [_x(*w.shape, seed=50 + i) for i, w in enumerate(wants)]
  for o, w in zip(outs, wants):
    assert tuple(o.shape) == tuple(w.shape)
    np.testing.assert_allclose(o.numpy(), w.detach().numpy(), rtol=rtol, atol=atol)
  sum((o * Tensor(u)).sum() for o, u in zip(outs, ups)).backward()
  sum((w * torch.tensor(u)).sum() for w, u in zip(wants, ups)).backward()
  for n in names:
    np.testing.assert_allclose(getattr(ours, n).grad.numpy(), getattr(theirs, n).grad.numpy(), rtol=rtol * 10,
                               atol=atol * 10, err_msg=f"grad of {n}")
  if not int_input:
    for t, q in zip(ts, qs):
      np.testing.assert_allclose(t.grad.numpy(), q.grad.numpy(), rtol=rtol * 10, atol=atol * 10, err_msg="input grad")


def test_linear():
  _check(nn.Linear(5, 3), torch.nn.Linear(5, 3), ["weight", "bias"], _x(4, 5))


@pytest.mark.parametrize("kw", [{"stride": 2, "padding": 1}, {"dilation": 2, "groups": 2, "padding": "same"}])
def test_conv1d(kw):
  _check(nn.Conv1d(4, 6, 3, **kw), torch.nn.Conv1d(4, 6, 3, **kw), ["weight", "bias"], _x(2, 4, 11))


@pytest.mark.parametrize("kw", [{"stride": 2, "padding": 1}, {"groups": 2, "dilation": 2, "bias": False}])
def test_conv2d(kw):
  names = ["weight", "bias"] if kw.get("bias", True) else ["weight"]
  _check(nn.Conv2d(4, 6, 3, **kw), torch.nn.Conv2d(4, 6, 3, **kw), names, _x(2, 4, 9, 8))


@pytest.mark.parametrize("kw", [{"stride": 2, "padding": 1, "output_padding": 1}, {"groups": 2, "dilation": 2}])
def test_conv_transpose1d(kw):
  _check(nn.ConvTranspose1d(4, 6, 3, **kw), torch.nn.ConvTranspose1d(4, 6, 3, **kw), ["weight", "bias"], _x(2, 4, 7))


@pytest.mark.parametrize("kw", [{"stride": 2, "padding": 1, "output_padding": 1}, {"groups": 2, "dilation": (2, 1)}])
def test_conv_transpose2d(kw):
  _check(nn.ConvTranspose2d(4, 2, (3, 2), **kw), torch.nn.ConvTranspose2d(4, 2, (3, 2), **kw), ["weight", "bias"],
         _x(2, 4, 5, 4))


def test_batchnorm_training_gradients():
  t = torch.nn.BatchNorm2d(3)
  with Tensor.train():
    _check(nn.BatchNorm2d(3), t, ["weight", "bias"], _x(4, 3, 3, 3) * 2 + 1, atol=1e-4)


def test_groupnorm():
  _check(nn.GroupNorm(2, 6), torch.nn.GroupNorm(2, 6), ["weight", "bias"], _x(2, 6, 5) * 3 - 1)


def test_instancenorm():
  _check(nn.InstanceNorm(3), torch.nn.InstanceNorm2d(3, affine=True), ["weight", "bias"], _x(2, 3, 4, 4) + 2)


def test_layernorm():
  _check(nn.LayerNorm((3, 4)), torch.nn.LayerNorm((3, 4)), ["weight", "bias"], _x(2, 3, 4) * 2)


class _TorchLayerNorm2d(torch.nn.LayerNorm):
  def forward(self, x): return super().forward(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


def test_layernorm2d():
  _check(nn.LayerNorm2d(4), _TorchLayerNorm2d(4), ["weight", "bias"], _x(2, 4, 3, 3) - 1)


def test_rmsnorm():
  _check(nn.RMSNorm(6), torch.nn.RMSNorm(6, eps=1e-6), ["weight"], _x(3, 2, 6))


def test_embedding():
  idx = np.array([[0, 3, 6, 3], [2, 2, 1, 6]], dtype=np.int32)  # repeats: their gradients add up
  _check(nn.Embedding(7, 4), torch.nn.Embedding(7, 4), ["weight"], idx, int_input=True)


def test_lstmcell():
  names = ["weight_ih", "weight_hh", "bias_ih", "bias_hh"]
  o, t = nn.LSTMCell(3, 5), torch.nn.LSTMCell(3, 5)
  _copy_all(o, t, names)
  x, h, c = _x(2, 3), _x(2, 5, seed=1), _x(2, 5, seed=2)
  ts = [Tensor(a, requires_grad=True) for a in (x, h, c)]
  qs = [torch.tensor(a, requires_grad=True) for a in (x, h, c)]
  (oh, oc), (th, tc) = o(ts[0], (ts[1], ts[2])), t(qs[0], (qs[1], qs[2]))
  u1, u2 = _x(2, 5, seed=3), _x(2, 5, seed=4)
  (oh * Tensor(u1) + oc * Tensor(u2)).sum().backward()
  (th * torch.tensor(u1) + tc * torch.tensor(u2)).sum().backward()
  np.testing.assert_allclose(oh.numpy(), th.detach().numpy(), rtol=1e-4, atol=1e-5)
  for n in names: np.testing.assert_allclose(getattr(o, n).grad.numpy(), getattr(t, n).grad.numpy(), atol=1e-4)
  for a, b in zip(ts, qs): np.testing.assert_allclose(a.grad.numpy(), b.grad.numpy(), atol=1e-4)


def test_layer_list_is_tinygrads():
  tinygrad_nn = pytest.importorskip("tinygrad.nn")
  import inspect
  theirs = {n for n, v in vars(tinygrad_nn).items() if not n.startswith("_") and (inspect.isclass(v) or
            inspect.isfunction(v)) and getattr(v, "__module__", "") == "tinygrad.nn"}
  ours = {n for n in nn.__all__ if n not in ("optim", "state", "lr_scheduler")}
  assert theirs <= ours, f"tinygrad.nn layers missing here: {sorted(theirs - ours)}"
  topt = pytest.importorskip("tinygrad.nn.optim")
  theirs_opt = {n for n, v in vars(topt).items() if (inspect.isclass(v) or inspect.isfunction(v))
                and getattr(v, "__module__", "") == "tinygrad.nn.optim"}
  missing = theirs_opt - set(nn.optim.__all__)
  assert not missing, f"tinygrad.nn.optim missing here: {sorted(missing)}"


@pytest.mark.parametrize("k, pad", [(5, 0), (3, 1), (5, 2)])
def test_conv2d_input_gradient_skips_padding_by_loop_bounds(k, pad):
  # the input gradient is a conv of the padded output gradient: only its last dim's padding is stored, the rows of
  # padding are a gated view whose filter loop the codegen narrows (a RANGE bound that isn't a constant, no gated
  # load left in that kernel); gradients vs torch
  from tiny_uop import AxisType, Ops
  from tiny_tensor import Device, engine
  x, w = _x(2, 3, 12, 10), _x(4, 3, k, k, seed=1)
  tx, tw = Tensor(x, requires_grad=True), Tensor(w, requires_grad=True)
  up = _x(2, 4, 12 + 2 * pad - k + 1, 10 + 2 * pad - k + 1, seed=2)
  (tx.conv2d(tw, padding=pad) * Tensor(up)).sum().backward()
  calls: list = []
  with engine.capture(calls.append): tx.grad.realize()
  uops = [c.spec.uops for c in calls if c.kind == "kernel"]
  narrowed = [u for u in uops if any(x.op is Ops.RANGE and x.arg[1] is AxisType.REDUCE and x.src[0].op is not Ops.CONST
                                     for x in u)]
  if Device.DEFAULT == "CPU":  # (GPU heuristics may unroll the filter rows or make the output rows lanes instead)
    assert len(narrowed) == 1 and not any(x.op is Ops.INDEX and len(x.src) > 2 for x in narrowed[0])
  px, pw = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
  (torch.nn.functional.conv2d(px, pw, padding=pad) * torch.tensor(up)).sum().backward()
  np.testing.assert_allclose(tx.grad.numpy(), px.grad.numpy(), rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(tw.grad.numpy(), pw.grad.numpy(), rtol=1e-4, atol=1e-4)


def _channel_lanes() -> int:
  """The lanes of a conv's channel vector on the CPU's LLVM renderer: 16, or one register's worth where registers are
  narrower (AVX2: 8 floats)."""
  from tiny_tensor import Device
  _, width = getattr(Device[Device.DEFAULT].renderer, "vector_registers", (0, 0))
  return width // 4 if 0 < width < 64 else 16


def test_conv2d_forward_vectors_output_channels():
  # the forward reads its weight copied output-channels-last: on the LLVM CPU renderer the conv's vector axis is 16
  # output channels (8 with AVX2's registers; a 20-wide row would fill 10 of 16 lanes); values and gradients vs torch
  from tiny_tensor import Device, engine
  x, w = _x(2, 32, 24, 24), _x(32, 32, 5, 5, seed=1)
  tx, tw = Tensor(x, requires_grad=True), Tensor(w, requires_grad=True)
  calls: list = []
  with engine.capture(calls.append): out = tx.conv2d(tw).realize()
  convs = [c for c in calls if c.kind == "kernel" and c.spec.name.startswith("r_")]
  assert len(convs) == 1 and len([c for c in calls if c.kind == "kernel"]) == 2  # the conv and the weight copy
  if Device.DEFAULT == "CPU" and "define void" in convs[0].spec.src:  # LLVM IR
    assert f"load <{_channel_lanes()} x float>" in convs[0].spec.src
  px, pw = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
  po = torch.nn.functional.conv2d(px, pw)
  np.testing.assert_allclose(out.numpy(), po.detach().numpy(), rtol=1e-4, atol=1e-3)
  up = _x(*po.shape, seed=3)
  (out * Tensor(up)).sum().backward()
  (po * torch.tensor(up)).sum().backward()
  np.testing.assert_allclose(tw.grad.numpy(), pw.grad.numpy(), rtol=1e-4, atol=1e-2)
  np.testing.assert_allclose(tx.grad.numpy(), px.grad.numpy(), rtol=1e-4, atol=1e-3)


def test_conv2d_input_gradient_vectors_input_channels():
  # the input gradient (a conv of the padded output gradient with the flipped weight) reads that weight copied
  # channels-last too: on the LLVM CPU renderer its vector axis is 16 of the forward's input channels, not the
  # 10-wide rows of the gradient map; its kernels: the padded gradient, the forward's weight copy (not realized yet
  # here), the flipped weight's copy from it, the conv; values vs torch
  from tiny_tensor import Device, engine
  x, w = _x(2, 16, 10, 10), _x(32, 16, 3, 3, seed=1)
  tx, tw = Tensor(x, requires_grad=True), Tensor(w, requires_grad=True)
  up = _x(2, 32, 8, 8, seed=2)
  (tx.conv2d(tw) * Tensor(up)).sum().backward()
  calls: list = []
  with engine.capture(calls.append): tx.grad.realize()
  kernels = [c for c in calls if c.kind == "kernel"]
  convs = [c for c in kernels if c.spec.name.startswith("r_")]
  assert len(convs) == 1 and len(kernels) == 4, [c.spec.name for c in kernels]
  if Device.DEFAULT == "CPU" and "define void" in convs[0].spec.src:  # LLVM IR
    assert f"load <{_channel_lanes()} x float>" in convs[0].spec.src
  px, pw = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
  (torch.nn.functional.conv2d(px, pw) * torch.tensor(up)).sum().backward()
  np.testing.assert_allclose(tx.grad.numpy(), px.grad.numpy(), rtol=1e-4, atol=1e-3)


def test_batchnorm_training_gradients_of_a_big_batch():
  # 200 x 11 x 13 = 28600 elements per channel and 1200 (image, channel) pairs: the statistics and the gradients'
  # channel sums are split into per-image partials (`_split_channel_reduce`); odd pixel counts (143 per image)
  t = torch.nn.BatchNorm2d(6)
  ours = nn.BatchNorm2d(6)
  with Tensor.train():
    _check(ours, t, ["weight", "bias"], _x(200, 6, 11, 13) * 2 + 1, atol=1e-4)
  np.testing.assert_allclose(ours.running_mean.numpy(), t.running_mean.numpy(), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(ours.running_var.numpy(), t.running_var.numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kw", [{}, {"stride": 2, "padding": 2}, {"groups": 2, "padding": 1, "dilation": 2}])
def test_conv2d_wide_channels_odd_maps(kw):
  # 48 output channels (3 vectors of 16, the weight gradient's widened block) on odd 13x11 maps, 5x5 taps
  _check(nn.Conv2d(32, 48, 5, **kw), torch.nn.Conv2d(32, 48, 5, **kw), ["weight", "bias"], _x(3, 32, 13, 11),
         rtol=1e-4, atol=1e-4)


def test_conv_bias_gradient_sums_the_channels_last_copy():
  # conv -> bias -> ReLU -> conv, as in a training step: the first conv's bias gradient is the sum of the channels-last
  # gradient copy its weight gradient reads (one map-sized buffer), not a second pass over the ReLU's mask and the
  # input gradient; that input gradient (the second conv's transposed conv) then has one reader left and is stored
  # channels-last with the ReLU's backward fused: 9 kernels for both gradients before, 7 now; values vs torch
  from tiny_tensor import Device, engine
  x, w1, b1, w2 = _x(2, 4, 9, 9), _x(8, 4, 3, 3, seed=1), _x(8, seed=2), _x(6, 8, 3, 3, seed=3)
  up = _x(2, 6, 5, 5, seed=4)
  tw1, tb1, tw2 = (Tensor(a, requires_grad=True) for a in (w1, b1, w2))
  (Tensor(x).conv2d(tw1, tb1).relu().conv2d(tw2) * Tensor(up)).sum().backward()
  calls: list = []
  with engine.capture(calls.append): Tensor.realize(tw1.grad, tb1.grad)
  kernels = [c for c in calls if c.kind == "kernel"]
  if Device.DEFAULT == "CPU":
    assert len(kernels) == 7, [c.spec.name for c in kernels]
    map_bytes = 2 * 8 * 7 * 7 * 4
    bias_kernel = [c for c in kernels if c.bufs[0].nbytes == 8 * 4]  # (its output: 8 floats)
    assert bias_kernel and all(sum(b.nbytes == map_bytes for b in c.bufs[1:]) == 1 for c in bias_kernel), \
      [(c.spec.name, [b.nbytes for b in c.bufs]) for c in bias_kernel]
  pw1, pb1, pw2 = (torch.tensor(a, requires_grad=True) for a in (w1, b1, w2))
  F = torch.nn.functional
  (F.conv2d(F.conv2d(torch.tensor(x), pw1, pb1).relu(), pw2) * torch.tensor(up)).sum().backward()
  np.testing.assert_allclose(tw1.grad.numpy(), pw1.grad.numpy(), rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(tb1.grad.numpy(), pb1.grad.numpy(), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("shape, kw", [((5, 3), {}), ((3, 4, 5, 6), {"affine": False}),
                                       ((2, 3, 4, 3, 5), {}), ((4, 3, 7, 5), {"track_running_stats": False})])
def test_batchnorm_batch_statistics_gradients(shape, kw):
  # the closed-form backward of batch-statistics BatchNorm (1-d, 3-d, no affine, no running statistics: batch
  # statistics in eval too) vs torch's
  kind = {2: torch.nn.BatchNorm1d, 4: torch.nn.BatchNorm2d, 5: torch.nn.BatchNorm3d}[len(shape)]
  names = ["weight", "bias"] if kw.get("affine", True) else []
  with Tensor.train():
    _check(nn.BatchNorm(shape[1], **kw), kind(shape[1], **kw).train(), names, _x(*shape) * 2 + 1, atol=1e-4)
  if not kw.get("track_running_stats", True):  # batch statistics outside training too
    _check(nn.BatchNorm(shape[1], **kw), kind(shape[1], **kw).eval(), names, _x(*shape, seed=9) - 1, atol=1e-4)


def test_batchnorm_backward_kernels():
  # BatchNorm's backward in closed form: two channel sums of the incoming gradient (plain and times xhat) and one
  # elementwise pass for the input's gradient; autograd through the mean and the variance took 8 kernels here (a
  # ReLU after the norm, whose backward each pass recomputes), 15 on the MNIST step's 128x32x20x20 map (now 10);
  # values vs torch
  from tiny_tensor import Device, engine
  x, up = _x(8, 4, 6, 6) * 2 + 1, _x(8, 4, 6, 6, seed=3)
  bn, t = nn.BatchNorm(4), torch.nn.BatchNorm2d(4)
  tx = Tensor(x, requires_grad=True)
  with Tensor.train(): out = bn(tx).relu()
  (out * Tensor(up)).sum().backward()
  calls: list = []
  with engine.capture(calls.append): Tensor.realize(tx.grad, bn.weight.grad, bn.bias.grad)
  if Device.DEFAULT == "CPU":
    assert len([c for c in calls if c.kind == "kernel"]) <= 5, [c.spec.name for c in calls if c.kind == "kernel"]
  px = torch.tensor(x, requires_grad=True)
  (t(px).relu() * torch.tensor(up)).sum().backward()
  np.testing.assert_allclose(tx.grad.numpy(), px.grad.numpy(), rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(bn.weight.grad.numpy(), t.weight.grad.numpy(), rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(bn.bias.grad.numpy(), t.bias.grad.numpy(), rtol=1e-4, atol=1e-4)


def test_batchnorm_gradient_keeps_no_lazy_tensor_alive():
  # the closed-form gradient lives as long as the output's node; it must hold nodes, not Tensors: a lazy Tensor it
  # held (the reshaped mean and inverse deviation) stayed registered, walked by every later realize and seen sharing
  # constants with unrelated graphs (an ONNX test's realize then exposed a node, after the convnet tests)
  import gc
  from tiny_tensor.live import _lazy_tensors, _live
  bn = nn.BatchNorm(3, track_running_stats=False)
  x = Tensor(_x(4, 3, 5, 5), requires_grad=True)
  gc.collect()
  before = len(list(_live(_lazy_tensors)))
  with Tensor.train(): out = bn(x)
  gc.collect()
  assert len(list(_live(_lazy_tensors))) == before + 1  # `out` alone
  out.sum().backward()
  np.testing.assert_allclose(x.grad.numpy(), np.zeros(x.shape), atol=1e-5)  # a normalized map's sum: constant


def test_batchnorm_second_order_gradients():
  # the closed-form backward is itself a graph of x (its mean and inverse deviation not detached), so a gradient of
  # the gradient (create_graph in torch) goes through the batch statistics too: vs torch's, wrt input and weight
  x, up, v = _x(4, 3, 5, 5), _x(4, 3, 5, 5, seed=3), _x(4, 3, 5, 5, seed=5)
  bn, t = nn.BatchNorm(3), torch.nn.BatchNorm2d(3)
  bn.weight.assign(Tensor(_x(3, seed=7) + 1)).realize()
  with torch.no_grad(): t.weight.copy_(torch.tensor(bn.weight.numpy()))
  tx = Tensor(x, requires_grad=True)
  with Tensor.train():
    gx, = ((bn(tx) ** 3) * Tensor(up)).sum().gradient(tx)
    hx, hw = (gx * Tensor(v)).sum().gradient(tx, bn.weight)
  px = torch.tensor(x, requires_grad=True)
  pg, = torch.autograd.grad(((t(px) ** 3) * torch.tensor(up)).sum(), px, create_graph=True)
  ph, pw = torch.autograd.grad((pg * torch.tensor(v)).sum(), (px, t.weight))
  np.testing.assert_allclose(gx.numpy(), pg.detach().numpy(), rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(hx.numpy(), ph.numpy(), rtol=1e-4, atol=1e-3)
  np.testing.assert_allclose(hw.numpy(), pw.numpy(), rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("xdt, bdt", [("float16", "float32"), ("float32", "float16")])
def test_conv_bias_of_another_dtype_gradients(xdt, bdt):
  # a bias wider than the conv promotes the sum (its gradient then autograd's), a narrower one is cast into it (its
  # gradient from the conv's channels-last copy, cast back): each gradient in its tensor's dtype, values vs torch's
  # float32
  x, w, b, up = _x(2, 3, 7, 6), _x(4, 3, 3, 3, seed=1), _x(4, seed=2), _x(2, 4, 5, 4, seed=3)
  tx, tw = Tensor(x.astype(xdt), requires_grad=True), Tensor(w.astype(xdt), requires_grad=True)
  tb = Tensor(b.astype(bdt), requires_grad=True)
  (tx.conv2d(tw, tb) * Tensor(up)).sum().backward()
  px, pw, pb = (torch.tensor(a.astype(dt).astype(np.float32), requires_grad=True) for a, dt in ((x, xdt), (w, xdt),
                                                                                               (b, bdt)))
  (torch.nn.functional.conv2d(px, pw, pb) * torch.tensor(up)).sum().backward()
  for t, p in ((tx, px), (tw, pw), (tb, pb)):
    assert t.grad.numpy().dtype == t.numpy().dtype
    np.testing.assert_allclose(t.grad.numpy().astype(np.float32), p.grad.numpy(), rtol=2e-2, atol=2e-2)
