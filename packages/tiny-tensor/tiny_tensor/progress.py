"""A small tqdm-like progress bar (no dependency); also `tiny_tensor.helpers.tqdm`.

>>> from tiny_tensor.progress import tqdm
>>> total = 0
>>> for i in tqdm(range(3), desc="demo", disable=True): total += i
>>> total
3

Writes to stderr (or `file=`), redrawing at most every `mininterval` seconds: `desc: 42%|████      | 42/100
[00:01<00:02, 30.5it/s]`. Without a `total` (an iterable with no `len`) it shows the count and rate only.
"""
from __future__ import annotations

import math
import shutil
import sys
import time
from typing import Any, Generic, Iterable, Iterator, TextIO, TypeVar

__all__ = ["tqdm", "trange"]
T = TypeVar("T")


def _fmt_time(s: float) -> str:
  if not math.isfinite(s): return "?"
  s = int(s)
  h, m, sec = s // 3600, (s // 60) % 60, s % 60
  return f"{h}:{m:02d}:{sec:02d}" if h else f"{m:02d}:{sec:02d}"


def _fmt_num(n: float, unit_scale: bool) -> str:
  if not unit_scale: return str(int(n)) if float(n).is_integer() else f"{n:.2f}"
  for suffix in ("", "k", "M", "G", "T"):
    if abs(n) < 999.5: return f"{n:.0f}{suffix}" if float(n).is_integer() and not suffix else f"{n:.2f}{suffix}"
    n /= 1000
  return f"{n:.2f}P"


class tqdm(Generic[T]):
  """Progress over `iterable` (or manual `update(n)` calls toward `total`).

  Arguments follow tqdm's: `desc`, `total`, `disable`, `unit`, `unit_scale`, `leave`, `file`, `mininterval`, `ncols`.
  `set_description(desc)` changes the label; `close()` (automatic at the end of iteration or a `with` block)
  finishes the line.
  """

  def __init__(self, iterable: Iterable[T] | None = None, desc: str = "", total: float | None = None,
               disable: bool = False, unit: str = "it", unit_scale: bool = False, leave: bool = True,
               file: TextIO | None = None, mininterval: float = 0.1, ncols: int | None = None):
    self.iterable, self.desc, self.disable, self.unit, self.unit_scale = iterable, desc, disable, unit, unit_scale
    self.leave, self.file, self.mininterval, self.ncols = leave, file, mininterval, ncols
    if total is None and iterable is not None:
      try: total = len(iterable)  # type: ignore[arg-type]
      except (TypeError, AttributeError): total = None
    self.total = total
    self.n: float = 0
    self.start_t = self.last_print_t = time.perf_counter()
    self.closed = False
    self.refresh()

  def __iter__(self) -> Iterator[T]:
    if self.iterable is None: raise TypeError("tqdm() without an iterable can't be iterated; call update() instead")
    try:
      for x in self.iterable:
        yield x
        self.update(1)
    finally: self.close()

  def __len__(self) -> int: return int(self.total) if self.total is not None else 0
  def __enter__(self) -> tqdm[T]: return self
  def __exit__(self, *exc: Any) -> None: self.close()

  def update(self, n: float = 1) -> None:
    """Advance by `n` and redraw if `mininterval` has passed."""
    self.n += n
    if self.disable: return
    now = time.perf_counter()
    if now - self.last_print_t >= self.mininterval or (self.total is not None and self.n >= self.total):
      self.last_print_t = now
      self.refresh()

  def set_description(self, desc: str = "", refresh: bool = True) -> None:
    """Change the label shown before the bar."""
    self.desc = desc
    if refresh: self.refresh()

  @property
  def rate(self) -> float:
    """Units per second so far."""
    el = time.perf_counter() - self.start_t
    return self.n / el if el > 0 else 0.0

  def format(self) -> str:
    """The current line (without the carriage return)."""
    el = time.perf_counter() - self.start_t
    rate = self.n / el if el > 0 else 0.0
    rate_s = f"{_fmt_num(rate, self.unit_scale) if rate else '?'}{self.unit}/s"
    prefix = f"{self.desc}: " if self.desc else ""
    n = _fmt_num(self.n, self.unit_scale)
    if self.total is None: return f"{prefix}{n}{self.unit} [{_fmt_time(el)}, {rate_s}]"
    frac = min(max(self.n / self.total, 0.0), 1.0) if self.total else 1.0
    eta = (self.total - self.n) / rate if rate else float("inf")
    suffix = f"| {n}/{_fmt_num(self.total, self.unit_scale)} [{_fmt_time(el)}<{_fmt_time(eta)}, {rate_s}]"
    head = f"{prefix}{frac * 100:3.0f}%|"
    width = self.ncols if self.ncols is not None else shutil.get_terminal_size((80, 20)).columns
    bar_w = max(1, width - len(head) - len(suffix) - 1)
    filled = frac * bar_w
    full = int(filled)
    part = " ▏▎▍▌▋▊▉"[int((filled - full) * 8)] if full < bar_w else ""
    return head + ("█" * full + part).ljust(bar_w) + suffix

  def refresh(self) -> None:
    """Redraw the line now."""
    if self.disable or self.closed: return
    f = self.file if self.file is not None else sys.stderr
    f.write("\r" + self.format())
    f.flush()

  def close(self) -> None:
    """Draw the final state and end the line (or erase it when `leave=False`)."""
    if self.closed: return
    if not self.disable:
      f = self.file if self.file is not None else sys.stderr
      if self.leave: f.write("\r" + self.format() + "\n")
      else: f.write("\r" + " " * len(self.format()) + "\r")
      f.flush()
    self.closed = True


def trange(n: int, **kwargs: Any) -> tqdm[int]:
  """`tqdm(range(n), **kwargs)`."""
  return tqdm(range(n), **kwargs)
