"""tinygrad 0.14's runtime/support/usb.py (imported by ops_qcom through support/system.py) imports `MockUSB3` from
here under a MOCK interface. No USB device is mocked: the QCOM driver talks to KGSL only, so the bus lists none."""
from __future__ import annotations


class MockUSB3:
  """A USB bus with no devices on it."""

  def __init__(self, *args: object, **kwargs: object):
    raise RuntimeError("mock USB: no USB devices are modeled (tinygrad's QCOM driver uses /dev/kgsl-3d0 only)")

  @staticmethod
  def list_devices(vendor: int, dev: int) -> list:
    """No devices match."""
    return []
