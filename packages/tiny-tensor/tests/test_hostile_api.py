"""Hostile arguments to the Tensor API (issue #36): each is a ValueError that names the bad value and what is valid,
never a ZeroDivisionError/IndexError from deep inside, nor an error about an op the caller never asked for.
torch is the reference for what is valid (and for the values when it is)."""
import numpy as np
import pytest
import torch

from tiny_tensor import Device, Tensor


def _devs(n: int) -> tuple[str, ...]:
  base = Device.DEFAULT.split(":")[0]
  return tuple(f"{base}:{i}" for i in range(n))


@pytest.mark.parametrize("devices", [(), []])
def test_shard_over_no_devices(devices):
  # was a ZeroDivisionError (n % len(devices)) with an axis, an unprintable MULTI of no shards without one
  for axis in (0, None):
    with pytest.raises(ValueError, match="can't shard over no devices: devices is empty"):
      Tensor([1.0, 2.0]).shard(devices, axis=axis)


@pytest.mark.parametrize("axis", [0, -1])
def test_shard_a_0d_tensor_along_an_axis(axis):
  # was an IndexError from u.shape[axis]; a 0-d tensor has no dim to split
  with pytest.raises(ValueError, match=r"can't shard along axis .*shape \(\); valid axes: none .*axis=None"):
    Tensor(3.0).shard(_devs(2), axis=axis)


def test_shard_valid_cases_still_match_numpy():
  a = np.arange(8, dtype=np.float32).reshape(4, 2)
  np.testing.assert_array_equal(Tensor(a).shard(_devs(2), axis=0).numpy(), a)
  np.testing.assert_array_equal(Tensor(a).shard(_devs(2), axis=-1).sum(0).numpy(), a.sum(0))
  assert Tensor(np.float32(3.5)).shard(_devs(2)).item() == 3.5  # a 0-d tensor replicated: valid


# pad/repeat live in tensor.py, which another change owns; the fix is in the report of issue #36 (nn.state part)
@pytest.mark.parametrize("pad", [(-5, 0), (-3, 2), (0, -3)])
def test_pad_removing_more_than_the_dim_names_the_padding(pad):
  with pytest.raises(RuntimeError):  # torch refuses these too (narrow(): length must be non-negative)
    torch.nn.functional.pad(torch.ones(2), pad)
  with pytest.raises(ValueError, match=rf"pad .*dim 0 of size 2 with padding \({pad[0]}, {pad[1]}\)"):
    Tensor([1.0, 2.0]).pad((pad,))


def test_pad_negative_within_the_dim_matches_torch():
  for pad in [(-1, -1), (-2, 0), (-2, 1), (-1, 3)]:
    ref = torch.nn.functional.pad(torch.tensor([1.0, 2.0]), pad).numpy()
    np.testing.assert_array_equal(Tensor([1.0, 2.0]).pad((pad,)).numpy(), ref)


@pytest.mark.parametrize("reps", [(-1,), (2, -3)])
def test_repeat_negative_names_the_repeats(reps):
  with pytest.raises(RuntimeError): torch.ones(2).repeat(*reps)
  with pytest.raises(ValueError, match=r"repeat .*repeats must be non-negative ints"):
    Tensor([1.0, 2.0]).repeat(*reps)


def test_repeat_zero_matches_torch():
  assert Tensor([1.0, 2.0]).repeat(0).shape == tuple(torch.ones(2).repeat(0).shape) == (0,)
