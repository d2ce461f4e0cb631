"""resize_ and out= tensors of the wrong shape on `tiny`, against the same calls on torch's CPU tensors."""
import warnings

import pytest
import torch

import tiny_torch  # noqa: F401  (registers the device)


def _both(data: list) -> tuple[torch.Tensor, torch.Tensor]:
  c = torch.tensor(data, dtype=torch.float32)
  return c, c.clone().to("tiny")


def _same_meta(t: torch.Tensor, c: torch.Tensor) -> None:
  assert (tuple(t.shape), t.stride(), t.storage_offset()) == (tuple(c.shape), c.stride(), c.storage_offset())


def test_resize_shrink_and_regrow_keeps_storage() -> None:
  c, t = _both([float(i) for i in range(12)])
  for size in ((3, 4), (2, 3), (12,), (2, 2, 3)):
    assert c.resize_(size) is c and t.resize_(size) is t
    _same_meta(t, c)
    torch.testing.assert_close(t.cpu(), c)


def test_resize_of_a_view_keeps_offset_and_grows_the_shared_storage() -> None:
  c, t = _both([float(i) for i in range(6)])
  cv, tv = c[2:], t[2:]
  cv.resize_(2, 2)
  tv.resize_(2, 2)
  _same_meta(tv, cv)
  torch.testing.assert_close(tv.cpu(), cv)
  cv.resize_(3, 3)  # needs 2 + 9 elements: the storage grows; the first 6 stay
  tv.resize_(3, 3)
  _same_meta(tv, cv)
  torch.testing.assert_close(tv.cpu().reshape(-1)[:4], cv.reshape(-1)[:4])
  tv.fill_(7.0)  # writes through the grown storage to the base
  cv.fill_(7.0)
  torch.testing.assert_close(t.cpu(), c)


def test_resize_channels_last_and_errors() -> None:
  c, t = _both([1.0] * 24)
  c.resize_((1, 2, 3, 4), memory_format=torch.channels_last)
  t.resize_((1, 2, 3, 4), memory_format=torch.channels_last)
  _same_meta(t, c)
  with pytest.raises(RuntimeError) as want:
    torch.zeros(2).resize_(-1)
  with pytest.raises(RuntimeError) as got:
    t.resize_(-1)
  assert str(got.value) == str(want.value)  # torch's own error (from the meta run)


def test_resize_as_and_zero() -> None:
  c, t = _both([1.0, 2.0, 3.0])
  c.resize_as_(torch.empty(3, 2))
  t.resize_as_(torch.empty(3, 2, device="tiny"))
  _same_meta(t, c)
  t.resize_(0)
  assert t.shape == (0,) and t.cpu().numel() == 0


def test_out_of_wrong_shape_is_resized_with_torchs_warning() -> None:
  a = torch.randn(3, 4)
  ta = a.to("tiny")
  # an empty out= tensor: resized silently (torch warns only when it had elements)
  out_c, out_t = torch.empty(0), torch.empty(0, device="tiny")
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    torch.exp(a, out=out_c)
    r = torch.exp(ta, out=out_t)
  assert r is out_t
  _same_meta(out_t, out_c)
  torch.testing.assert_close(out_t.cpu(), out_c)
  # an out= tensor with elements: resized, with torch's UserWarning
  out_c, out_t = torch.zeros(5), torch.zeros(5, device="tiny")
  with pytest.warns(UserWarning, match="resized"):
    torch.add(a, 1, out=out_c)
  with pytest.warns(UserWarning, match=r"resized since it had shape \[5\]"):
    torch.add(ta, 1, out=out_t)
  _same_meta(out_t, out_c)
  torch.testing.assert_close(out_t.cpu(), out_c)


def test_diag_embed_and_arange_with_out() -> None:
  x = torch.randn(2, 3)
  # (torch's diag_embed decomposition fills an empty arange out= tensor: the OpInfo failure of the README)
  torch.testing.assert_close(torch.diag_embed(x.to("tiny")).cpu(), torch.diag_embed(x))
  torch.testing.assert_close(torch.arange(6.0, device="tiny").cpu(), torch.arange(6.0))
  o = torch.zeros(2, 2, device="tiny")
  with pytest.warns(UserWarning, match="resized"):
    torch.sum(x.to("tiny"), 1, out=o)
  torch.testing.assert_close(o.cpu(), x.sum(1))


def test_max_dim_out_pair_is_resized() -> None:
  x = torch.randn(4, 5)
  v, i = torch.empty(0, device="tiny"), torch.empty(0, dtype=torch.int64, device="tiny")
  torch.max(x.to("tiny"), 1, out=(v, i))
  wv, wi = x.max(1)
  torch.testing.assert_close(v.cpu(), wv)
  torch.testing.assert_close(i.cpu(), wi)


def test_copy_from_and_resize_through_cpu_fallback() -> None:
  """An op tiny lacks run on the CPU: its out= result comes back through _copy_from_and_resize."""
  x = torch.rand(3, 4) + 0.5
  want = torch.special.i0(x)
  tiny_torch.allow_cpu_fallback(True)
  try:
    with warnings.catch_warnings():
      warnings.simplefilter("ignore")
      out = torch.empty(0, device="tiny")
      torch.special.i0(x.to("tiny"), out=out)
  finally:
    tiny_torch.allow_cpu_fallback(False)
  torch.testing.assert_close(out.cpu(), want)
