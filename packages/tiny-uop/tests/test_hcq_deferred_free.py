"""`HCQCompiled.synchronize` frees only the deferred buffers whose timeline value it waited for: a buffer another
thread defers while the wait runs belongs to a later submission, which may still be reading it."""
from tiny_uop.hcq import HCQCompiled


class _Signal:
  """A timeline signal whose wait lets 'another thread' submit work and defer a free in the middle of it."""
  def __init__(self, dev: "_Dev", value: int): self.dev, self.value = dev, value

  def wait(self, value: int) -> None:
    self.dev.defer_free("late", self.dev.next_timeline())   # submitted after synchronize read its target
    self.value = max(self.value, value)


class _Dev(HCQCompiled):
  def __init__(self):  # no device: only the timeline and the deferred-free bookkeeping
    self.freed: list = []
    self.timeline_value = 1
    self.timeline_signal = _Signal(self, 0)

  def _gpu_free(self, buf) -> None: self.freed.append(buf)


def test_synchronize_frees_only_what_the_timeline_reached():
  dev = _Dev()
  dev.defer_free("early", dev.next_timeline())      # submission 1 reads "early"
  dev.synchronize()                                 # waits for 1; submission 2 ("late") starts during the wait
  assert dev.freed == ["early"]                     # freeing "late" now would pull memory from under submission 2
  dev.timeline_signal.wait = lambda v: setattr(dev.timeline_signal, "value", v)
  dev.synchronize()
  assert dev.freed == ["early", "late"]
