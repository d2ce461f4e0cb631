"""tinygrad 0.14's runtime/support/usb.py imports `MockUSB3` from here under a MOCK interface. No USB GPU is mocked:
the AMD tests use the KFD interface only, so the bus lists no devices."""
from __future__ import annotations


class MockUSB3:
  """A USB bus with no devices on it."""

  def __init__(self, *args: object, **kwargs: object):
    raise RuntimeError("mock USB: no USB devices are modeled (use the KFD interface, DEV=MOCKKFD+AMD)")

  @staticmethod
  def list_devices(vendor: int, dev: int) -> list:
    """No devices match."""
    return []
