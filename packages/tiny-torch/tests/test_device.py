"""The `tiny` device against torch's CPU: factories and seeds, views and in-place ops, indexing, dtypes, errors."""
import warnings

import numpy as np
import pytest
import torch

import tiny_torch


def _same(t: torch.Tensor, ref: torch.Tensor) -> None:
  assert t.device.type == "tiny"
  assert t.dtype == ref.dtype and t.shape == ref.shape
  torch.testing.assert_close(t.cpu(), ref, atol=1e-6, rtol=1e-6, equal_nan=True)


def test_factories_and_manual_seed_follow_the_cpu() -> None:
  torch.manual_seed(3)
  a = (torch.randn(4, 5, device="tiny"), torch.rand(3, device="tiny"), torch.randint(0, 9, (6,), device="tiny"))
  torch.manual_seed(3)
  b = (torch.randn(4, 5), torch.rand(3), torch.randint(0, 9, (6,)))
  for x, y in zip(a, b): _same(x, y)
  _same(torch.zeros(2, 3, device="tiny"), torch.zeros(2, 3))
  _same(torch.full((2,), 7, device="tiny"), torch.full((2,), 7))
  _same(torch.arange(1, 10, 3, device="tiny"), torch.arange(1, 10, 3))
  _same(torch.arange(0, 1, 0.1, device="tiny"), torch.arange(0, 1, 0.1))
  _same(torch.tensor([[1.5, 2.0]], device="tiny"), torch.tensor([[1.5, 2.0]]))


def test_views_share_storage_and_inplace_writes_through() -> None:
  ref = torch.arange(24.0).reshape(4, 6)
  t = ref.to("tiny")
  for x in (ref, t):
    v = x[1:3, ::2]           # strided slice
    v.mul_(10)
    x.t()[0].add_(100)        # column 0 through a transposed view
    x.view(-1)[5] = -1        # one element through a flat view
    d = x.diagonal()
    d.zero_()
    x[3].copy_(torch.ones(6, device=x.device))
  _same(t, ref)
  _same(t[1:3, ::2], ref[1:3, ::2])
  base = torch.zeros(3, 4, device="tiny")
  view = base.unsqueeze(0).transpose(1, 2)  # (1, 4, 3) over the same storage
  view[0, 1] = torch.tensor([1.0, 2.0, 3.0]).to("tiny")
  ref2 = torch.zeros(3, 4)
  ref2.unsqueeze(0).transpose(1, 2)[0, 1] = torch.tensor([1.0, 2.0, 3.0])
  _same(base, ref2)


def test_indexing_and_index_assignment() -> None:
  ref = torch.randn(5, 4, 3)
  t = ref.to("tiny")
  idx = torch.tensor([4, 0, 0, -1])
  _same(t[idx], ref[idx])
  j = torch.tensor([3, 0, -2])
  _same(t[:, j], ref[:, j])
  _same(t[idx[:2], :, j[1:]], ref[idx[:2], :, j[1:]])
  _same(t[1:, j[:1], 1:], ref[1:, j[:1], 1:])
  mask = ref > 0
  _same(t[mask.to("tiny")], ref[mask])
  for x in (ref, t):
    x[torch.tensor([1, 3], device=x.device), 2] = 5.0
    x[x < -1] = 0.0
    x.index_put_((torch.tensor([0, 0, 2], device=x.device),), torch.ones(3, 4, 3, device=x.device), accumulate=True)
  _same(t, ref)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.int32, torch.int64, torch.bool])
def test_dtypes_roundtrip_and_compute(dtype: torch.dtype) -> None:
  ref = (torch.arange(-6, 6).reshape(3, 4) * 3 // 2).to(dtype)
  t = ref.to("tiny")
  _same(t, ref)
  if dtype != torch.bool:
    _same(t + t, ref + ref)
    _same(t.sum(1), ref.sum(1))
  _same(t.max(0).values, ref.max(0).values)
  _same((t * 2 == t).to(torch.float32), (ref * 2 == ref).to(torch.float32))


def test_type_promotion_matches_torch() -> None:
  i = torch.tensor([1, 2, 3], dtype=torch.int32)
  h = torch.tensor([0.5, 1.5, 2.5], dtype=torch.float16)
  for a, b in ((i, 1.5), (i, h), (h, 2.0), (i, torch.tensor(2.5)), (i, 2)):
    ta = a.to("tiny")
    tb = b.to("tiny") if isinstance(b, torch.Tensor) and b.dim() else b
    _same(ta + tb, a + b)
    _same(ta / tb, a / b)


def test_errors_are_torchs() -> None:
  a, b = torch.ones(3, device="tiny"), torch.ones(4, device="tiny")
  with pytest.raises(RuntimeError, match="broadcast"):
    a + b
  with pytest.raises(RuntimeError, match="same device"):
    a + torch.ones(3)
  with pytest.raises(RuntimeError, match="cannot be multiplied|same reduction dim"):
    torch.ones(2, 3, device="tiny") @ torch.ones(2, 3, device="tiny")
  _same(a + torch.tensor(2.0), torch.ones(3) + 2)  # a 0-dim CPU tensor is a scalar, as in torch
  with pytest.raises(TypeError, match="complex64"):
    torch.ones(2, dtype=torch.complex64).to("tiny")


def test_missing_op_names_itself_or_falls_back_on_request() -> None:
  x = torch.tensor([0.5, 1.5, 1.7, 3.0])
  with pytest.raises(NotImplementedError, match="histc"):
    torch.histc(x.to("tiny"), bins=3, min=0, max=3)
  tiny_torch.allow_cpu_fallback(True)
  try:
    with warnings.catch_warnings(record=True) as w:
      warnings.simplefilter("always")
      _same(torch.histc(x.to("tiny"), bins=3, min=0, max=3), torch.histc(x, bins=3, min=0, max=3))
    assert any("histc" in str(m.message) for m in w)
    t, ref = x.to("tiny"), x.clone()
    view = t[1:]
    assert view.polygamma_(1) is view  # an in-place op on the CPU: written back through the view, self returned
    ref[1:].polygamma_(1)
    _same(t, ref)
  finally:
    tiny_torch.allow_cpu_fallback(False)
  with pytest.raises(TypeError, match="bool"):
    tiny_torch.allow_cpu_fallback("yes")


def test_second_device_and_module_to() -> None:
  x = torch.ones(3, device="tiny:1")
  assert x.device == torch.device("tiny", 1)
  assert tiny_torch.TinyTensor.tiny(x).device.endswith(":1")
  _same((x * 2).to("tiny:0"), torch.full((3,), 2.0))
  lin = torch.nn.Linear(3, 2)
  ref = lin(torch.ones(1, 3))
  lin.to("tiny")
  assert all(p.device.type == "tiny" and isinstance(p, torch.nn.Parameter) for p in lin.parameters())
  torch.testing.assert_close(lin(torch.ones(1, 3, device="tiny")).cpu(), ref)
  assert np.allclose(lin.weight.detach().cpu().numpy(), lin.weight.detach().cpu().numpy())


def test_aten_index_with_no_index_tensor_is_a_clear_error() -> None:
  # torch's own CPU kernel fails an internal assert here; tiny says what is wrong instead of an IndexError
  x = torch.arange(6.0, device="tiny").reshape(2, 3)
  with pytest.raises(ValueError, match="at least one index tensor"):
    torch.ops.aten.index.Tensor(x, [None])
  # with one given (and a None before it) the values are torch's
  idx = torch.tensor([2, 0])
  _same(torch.ops.aten.index.Tensor(x, [None, idx.to("tiny")]), torch.ops.aten.index.Tensor(x.cpu(), [None, idx]))
