"""Streaming (non-temporal) stores through the CPU device: a big elementwise kernel compiled by tiny-codegen, placed by
the CPU loader and run on the thread pool writes exactly numpy's result into a fresh buffer, into a reused one, and
into a view that starts off a cache line (where the kernel must fall back to plain stores)."""
import numpy as np
import pytest

from tiny_uop import KernelInfo, Ops, UOp
from tiny_uop.device import Buffer
from tiny_uop.dtype import dtypes
from tiny_uop.plugins import Device

N = 1 << 16


def _add(n: int, name: str) -> UOp:
  out, a, b = (UOp(Ops.PARAM, dtypes.float32.ptr(n), arg=i) for i in range(3))
  r = UOp.range(n, 0)
  return out.index(r).store(a.index(r).load() * 3.0 + b.index(r).load()).sink(arg=KernelInfo(name))


@pytest.mark.parametrize("offset", [0, 4, 60], ids=lambda o: f"offset{o}B")
def test_streamed_add_through_the_device(monkeypatch, offset: int) -> None:
  from tiny_codegen import get_program
  dev = Device["CPU:LLVM"]
  ren = type(dev.renderer)()
  ren.nontemporal_min_bytes = N * 4  # this kernel's output streams (its default needs 16 MB)
  ren.thread_min_work = 0
  spec = get_program(_add(N, f"stream_dev_{offset}"), ren)
  assert "!nontemporal" in spec.src and spec.global_size[0] == ren.threads
  prg = dev.get_program(spec.name, spec.lib)
  rng = np.random.default_rng(offset)
  a, b = rng.standard_normal(N).astype(np.float32), rng.standard_normal(N).astype(np.float32)
  ins = [Buffer("CPU", N, dtypes.float32, initial_value=x.tobytes()) for x in (a, b)]
  base = Buffer("CPU", N + 32, dtypes.float32, initial_value=np.full(N + 32, 7.0, np.float32).tobytes())
  out = base.view(N, dtypes.float32, offset)
  bufs = [out, *ins]
  for _ in range(2):  # a second launch into the same (now cached) memory
    prg(*[bufs[s].ensure_allocated()._buf for s in spec.globals], global_size=spec.global_size, wait=True)
    want = a * np.float32(3.0) + b
    np.testing.assert_array_equal(np.frombuffer(out.as_buffer(), np.float32), want)
  whole = np.frombuffer(base.as_buffer(), np.float32)
  k = offset // 4
  assert (whole[:k] == 7.0).all() and (whole[k + N:] == 7.0).all()  # nothing written outside the view
  assert (out._buf.addr % 64 == 0) == (offset == 0)
