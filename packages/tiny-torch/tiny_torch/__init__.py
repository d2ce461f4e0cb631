"""tiny-torch: tiny as a PyTorch backend.

`import tiny_torch` registers the `tiny` device (PyTorch's PrivateUse1 backend, renamed) and the `torch.compile`
backend `"tiny"`. `tiny` is tiny's default device (`DEV=AMD`, `DEV=QCOM`, ...), `tiny:1` the second one.

>>> import torch, tiny_torch
>>> x = torch.arange(4.0, device="tiny")
>>> (x * 2).sum().item()
12.0

How ops reach tiny, and what views and in-place ops mean here: `tiny_torch.backend`. The compile backend:
`tiny_torch.dynamo`. Which aten ops run natively: `tiny_torch.ops`.
"""
from tiny_torch.backend import TinyTensor, allow_cpu_fallback, flush, from_torch, register, to_cpu

__all__ = ["TinyTensor", "allow_cpu_fallback", "flush", "from_torch", "to_cpu", "__version__"]
__version__ = "0.1.0"  # the package version (pyproject.toml reads it from here)

register()  # the brief of this package: importing it makes device="tiny" and backend="tiny" work

from tiny_torch import dynamo as _dynamo  # noqa: E402  (registers the torch.compile backend)

_dynamo.register_backend()
