"""A fixed, fast subset of torch's OpInfo samples on `tiny` vs the CPU (the full table: python -m tiny_torch.opinfo)."""
import pytest
import torch

from tiny_torch import opinfo

# a few of each kind, including ones whose tiny code is tiny_torch's own (erfc, lgamma, hypot, masked_scatter)
SUBSET = ["exp", "sigmoid", "erfc", "lgamma", "round", "add", "div.floor_rounding", "remainder", "hypot", "fmax",
          "sum", "amax", "var", "argmax", "prod", "cat", "permute", "gather", "index_put", "masked_scatter", "roll",
          "tril", "nn.functional.pad.constant", "diag_embed"]


def _ops() -> list:
  return [op for op in opinfo._op_db()
          if op.name + (f".{op.variant_test_name}" if op.variant_test_name else "") in SUBSET]


def _name(op) -> str: return op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")


@pytest.mark.parametrize("op", _ops(), ids=_name)
def test_opinfo_samples(op) -> None:
  for i, sample in enumerate(op.sample_inputs("cpu", torch.float32, requires_grad=False)):
    if i >= 2: break
    assert opinfo.run_sample(op, sample) is None, (op.name, i)


def test_subset_is_found() -> None:
  assert len(_ops()) >= len(SUBSET) - 1  # (nn.functional.pad.constant is a shape op outside SHAPE_OPS' names)


def test_table_counts() -> None:
  res = [opinfo.Result("a", "unary", 2, 1, "error X", failures=["error X"]), opinfo.Result("b", "shape", 3, 3),
         opinfo.Result("c", "shape", 1, 0, "mismatch: y", failures=["mismatch: y"])]
  text = opinfo.table(res)
  assert "| all | 3 | 6 | 4 | 66.7 | 1 |" in text and "| a (unary) | 1/2 | error X |" in text
