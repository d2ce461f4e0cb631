"""The examples in the docstrings of Tensor, the engine and the package run and give what they show."""
import doctest

import tiny_tensor
import tiny_tensor.creation
import tiny_tensor.engine
import tiny_tensor.indexing
import tiny_tensor.mathops
import tiny_tensor.multi
import tiny_tensor.nn
import tiny_tensor.nn.lr_scheduler
import tiny_tensor.nn.optim
import tiny_tensor.tensor


def test_docstring_examples():
  attempted = 0
  for mod in (tiny_tensor, tiny_tensor.tensor, tiny_tensor.creation, tiny_tensor.indexing, tiny_tensor.engine,
              tiny_tensor.mathops, tiny_tensor.multi, tiny_tensor.nn, tiny_tensor.nn.optim,
              tiny_tensor.nn.lr_scheduler):
    res = doctest.testmod(mod, extraglobs={"Tensor": tiny_tensor.Tensor}, optionflags=doctest.ELLIPSIS)
    assert res.failed == 0, f"{mod.__name__}: {res.failed} of {res.attempted} examples failed"
    attempted += res.attempted
  assert attempted >= 20
