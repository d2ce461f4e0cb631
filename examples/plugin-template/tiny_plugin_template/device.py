"""The TEMPLATE device: tiny's CPU device under another name. Imported only when the device is opened."""
from tiny_runtime_cpu.cpu import CPUDevice


class TemplateDevice(CPUDevice):
  """Runs kernels exactly like ``CPU``; a real backend would build its own `Compiled` here."""
