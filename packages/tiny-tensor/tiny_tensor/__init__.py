"""tiny-tensor: `Tensor` (a lazy array over the UOp graph), autograd, and the engine that runs it on devices.

>>> from tiny_tensor import Tensor, dtypes
>>> Tensor([1, 2, 3], dtype=dtypes.float32).shape
(3,)
"""
from tiny_uop import Context, Variable, dtypes
from tiny_tensor.device import Device
from tiny_tensor.engine import GlobalCounters
from tiny_tensor.tensor import Tensor

__all__ = ["Tensor", "dtypes", "Device", "Variable", "Context", "GlobalCounters", "__version__"]
__version__ = "0.1.0"  # the package version (pyproject.toml reads it from here)

# subpackages reachable as attributes without their own import (`tiny_tensor.nn.Linear`, as `tinygrad.nn`), imported
# on first use so that `import tiny_tensor` stays light
_LAZY_SUBMODULES = ("nn",)


def __getattr__(name: str) -> object:
  """Import a lazy subpackage (`nn`) on first attribute access; any other missing name is an AttributeError."""
  if name in _LAZY_SUBMODULES:
    import importlib
    return importlib.import_module(f"{__name__}.{name}")
  raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
  return sorted({*globals(), *_LAZY_SUBMODULES})

try:
  from tiny_tensor.jit import TinyJit  # noqa: F401
except ImportError as _e:  # only while tiny_tensor.jit is being written: any other error must surface
  if getattr(_e, "name", None) != "tiny_tensor.jit": raise
else:
  __all__.append("TinyJit")

from tiny_uop.helpers import VIZ as _VIZ  # noqa: E402

if _VIZ:  # VIZ=1: record schedules, kernels and their rewrites from here on (tiny_tensor.viz)
  from tiny_tensor.viz import start_from_env as _start_viz
  _start_viz()
