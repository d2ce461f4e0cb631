"""The tqdm-like progress bar: counts, total/percent, rate, description, manual update, disable."""
import io

from tiny_tensor.progress import tqdm, trange


def test_iterates_and_draws_final_line():
  f = io.StringIO()
  out = list(tqdm(range(5), desc="work", file=f, ncols=60, mininterval=0))
  assert out == [0, 1, 2, 3, 4]
  last = f.getvalue().split("\r")[-1]
  assert last.startswith("work: 100%|") and "| 5/5 [" in last and last.endswith("it/s]\n")
  assert "█" * 10 in last and len(last.rstrip("\n")) <= 60


def test_manual_update_without_iterable_and_unknown_total():
  f = io.StringIO()
  with tqdm(total=10, file=f, mininterval=0, ncols=80) as bar:
    bar.update(4)
    assert " 40%|" in bar.format() and "4/10" in bar.format()
    bar.set_description("x")
    assert bar.format().startswith("x:  40%|")
  f2 = io.StringIO()
  for _ in tqdm(iter([1, 2, 3]), file=f2, mininterval=0): pass  # no len(): count and rate only
  assert "3it [" in f2.getvalue().split("\r")[-1]


def test_disable_writes_nothing():
  f = io.StringIO()
  assert sum(trange(4, file=f, disable=True)) == 6 and f.getvalue() == ""
