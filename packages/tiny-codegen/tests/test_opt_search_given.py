"""BEAM's search is given to the optimizer (`optimize_kernel(ast, renderer, search)`): the optimizer no longer imports
the search, which imports the compiler, which runs the optimizer (an import circle, issue #33)."""
import pytest
from tiny_uop import AxisType, KernelInfo, Ops, UOp, dtypes
from tiny_uop.helpers import Context
from tiny_uop.plugins import Device

from tiny_codegen.lower import lower
from tiny_codegen.opt import Opt, OptOps, optimize_kernel


def _matmul(M: int, N: int, K: int) -> UOp:
  c, a, b = (UOp(Ops.PARAM, dtypes.float.ptr(n), arg=i) for i, n in enumerate((M * N, M * K, K * N)))
  i, j, k = UOp.range(M, 0), UOp.range(N, 1), UOp.range(K, 2, AxisType.REDUCE)
  val = (a.index(i * K + k).load() * b.index(k * N + j).load()).reduce(k, arg=Ops.ADD)
  return c.index(i * N + j).store(val).sink(arg=KernelInfo())


def test_beam_uses_the_search_it_is_given_and_the_kernel_still_computes_a_matmul():
  ren = Device["CPU"].renderer
  asked = []

  def search(ast, renderer, amt):
    asked.append(amt)
    return (Opt(OptOps.UPCAST, 1, 4),)

  with Context(BEAM=2):
    assert optimize_kernel(_matmul(8, 8, 4), ren, search).arg.applied_opts == (Opt(OptOps.UPCAST, 1, 4),)
  assert asked == [2]
  # BEAM end to end (get_program gives beam_search, compiling with itself): test_opt's
  # test_beam_env_compiles_through_the_search checks the numbers against numpy


def test_beam_without_a_search_is_refused_naming_the_way():
  with Context(BEAM=1), pytest.raises(ValueError, match=r"BEAM=1 needs a search .* tiny_codegen.get_program"):
    lower(_matmul(8, 8, 4), Device["CPU"].renderer)
