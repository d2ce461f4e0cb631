"""The TEMPLATE device's own tests: the package is a well-formed tiny plugin, and the device passes tiny's
conformance suite (ops, views, copies, dtypes, JIT and graphs, all checked against numpy)."""
import numpy as np
import pytest
from tiny_uop.plugins import Device
from tiny_uop.plugins.testing import check_import_is_cheap, check_plugin

DEVICE = "TEMPLATE"


def test_descriptor_and_entry_point():
  """The entry point names this package's descriptor, built for a plugin API this tiny-uop loads."""
  check_plugin("tiny_plugin_template", "plugin", DEVICE, dist="tiny-plugin-template")


def test_import_is_cheap():
  """Importing the package imports no device code: tiny reads the descriptor of every installed plugin."""
  check_import_is_cheap("tiny_plugin_template")


def test_device_opens_and_is_built_from_the_interfaces():
  from tiny_plugin_template.device import TemplateAllocator, TemplateDevice, TemplateProgram
  from tiny_uop.device import Allocator, Compiled
  dev = Device[DEVICE]
  assert type(dev) is TemplateDevice and isinstance(dev, Compiled)
  assert isinstance(dev.allocator, TemplateAllocator) and isinstance(dev.allocator, Allocator)
  assert dev.program_cls is TemplateProgram and type(dev.renderer).__name__ == "TemplateRenderer"


def test_a_tensor_program():
  from tiny_tensor import Tensor
  a = np.arange(12, dtype=np.float32).reshape(3, 4)
  t = Tensor(a, device=DEVICE)
  np.testing.assert_allclose(((t @ t.T).relu() + 1).numpy(), np.maximum(a @ a.T, 0) + 1, rtol=1e-6)
  assert t.device == DEVICE


@pytest.mark.parametrize("group", ["ops", "nn", "views", "copies", "dtypes", "jit", "graph"])
def test_conformance(group):
  """tiny's conformance suite, one group per test: no check may fail (n/a: what the device doesn't do by design)."""
  from tiny_tensor.conformance import format_table, run
  results = run(DEVICE, [group])
  assert results and not [r for r in results if r.status == "FAIL"], "\n" + format_table(results)
