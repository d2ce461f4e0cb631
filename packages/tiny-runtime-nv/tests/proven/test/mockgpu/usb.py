"""`test.mockgpu.usb`: tinygrad 0.14's `runtime/support/usb.py` imports `MockUSB3` from here under a MOCK interface.

The NV mock has no USB (ASM24xx) bridge: opening one fails with a clear error; importing it succeeds.
"""
from __future__ import annotations

from typing import Any


class MockUSB3:
  """No USB bridge behind the mock NV driver: constructing one raises."""

  def __init__(self, *args: Any, **kwargs: Any):
    raise RuntimeError("mock NV driver: no USB3 (ASM24xx) bridge; tinygrad's NV over USB is not mocked")
