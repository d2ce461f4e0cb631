"""DEBUG levels (tinygrad's): 1 a summary per realize with totals, 2 a line per kernel with running totals, 3 the
schedule and opts, 4 each kernel's source once, 5 the linear UOps."""
import random
import re

import pytest
from tiny_tensor import Context, GlobalCounters, Tensor


def _run(level: int, capsys) -> str:
  c = random.Random().random() + 7.0  # a constant no other test uses: a kernel compiled here for the first time
  x = Tensor([1.0, 2.0, 3.0, 4.0], device="CPU").realize()
  GlobalCounters.reset()
  with Context(DEBUG=level, DEV="CPU"):
    capsys.readouterr()
    (x * c + 1).realize()
    (x * c + 1).sum().realize()  # the elementwise kernel again (cached), then a reduce
  return capsys.readouterr().out


def test_debug_0_prints_nothing(capsys):
  assert _run(0, capsys) == ""


def test_debug_1_summary_per_realize_with_totals(capsys):
  out = _run(1, capsys)
  lines = out.strip().splitlines()
  assert len(lines) == 2 and all(line.startswith("realize: ") for line in lines), out
  assert re.match(r"realize: 1 kernels, 0 copies, [\d.]+ ms, .* \| total: 1 kernels, ", lines[0]), lines[0]
  assert re.match(r"realize: 1 kernels, .* \| total: 2 kernels, ", lines[1]), lines[1]
  assert "***" not in out and "define void" not in out


def test_debug_2_line_per_kernel_with_running_totals(capsys):
  out = _run(2, capsys)
  kern = [line for line in out.splitlines() if line.startswith("*** CPU")]
  assert len(kern) == 2, out
  totals = [float(re.search(r"total\s+([\d.]+) ms$", line).group(1)) for line in kern]
  assert [int(line.split()[2]) for line in kern] == [1, 2] and totals[1] >= totals[0]
  assert "schedule:" not in out


def test_debug_3_schedule_and_opts(capsys):
  out = _run(3, capsys)
  assert out.count("schedule: ") == 2 and "opts " in out
  assert "define void" not in out


def test_debug_4_source_once(capsys):
  out = _run(4, capsys)
  heads = re.findall(r"\*\*\* source of (\w+) \(", out)
  assert len(heads) == 2 and len(set(heads)) == 2, out  # two kernels, each source printed once
  assert out.count("define void") == 2


def test_debug_5_linear_uops(capsys):
  out = _run(5, capsys)
  assert re.search(r"^\s+\d+ PARAM\s+dtypes\.float32\.ptr", out, re.M), out
  assert re.search(r"^\s+\d+ STORE\s", out, re.M)
  assert "kernel AST:" not in out  # that is DEBUG=6


@pytest.mark.parametrize("level", [1, 2])
def test_debug_does_not_change_results(level):
  x = Tensor([1.0, -2.0, 3.0])
  with Context(DEBUG=level): assert (x.relu() * 2).tolist() == [2.0, 0.0, 6.0]
