"""tiny-plugin-template: the descriptor of the TEMPLATE device. Importing this is cheap: it imports no driver code.

tiny reads `plugin` through the ``tiny.devices`` entry point (pyproject.toml) the first time a device is looked up;
`tiny_plugin_template.device` is imported only when someone opens the device (``Device["TEMPLATE"]``).
"""
from tiny_uop.plugins import DevicePlugin

__all__ = ["plugin", "__version__"]
__version__ = "0.1.0"

plugin = DevicePlugin(
  "TEMPLATE",                                     # the device name users write: DEV=TEMPLATE, Device["TEMPLATE"]
  "tiny_plugin_template.device:TemplateDevice",   # module:class, imported when the device is opened
  api=(0, 2),        # the tiny PLUGIN_API this was written against (a literal: the version you built and tested with)
  priority=200,      # when tiny picks a default device: lower first (GPUs 10-40, CPU 90)
  default_ok=False,  # never chosen as the default: users ask for it with DEV=TEMPLATE
)
