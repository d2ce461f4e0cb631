"""tiny-plugin-template: the descriptor of the TEMPLATE device. Importing this is cheap: it imports no driver."""
from tiny_uop.plugins import PLUGIN_API, DevicePlugin

__all__ = ["plugin"]

# never the default device (default_ok=False): users ask for it with DEV=TEMPLATE or Device["TEMPLATE"]
plugin = DevicePlugin("TEMPLATE", "tiny_plugin_template.device:TemplateDevice", api=PLUGIN_API, priority=200,
                      default_ok=False)
