"""tiny-uop: the IR of tiny — dtypes, `Ops`, `UOp`, pattern rewriting, symbolic algebra, and the device interfaces.

Pure Python, no dependencies. Everything else in tiny (codegen, runtimes, tensors) is built on this package.

>>> from tiny_uop import UOp, Variable, dtypes
>>> n = Variable("n", 1, 64)
>>> (n * 4 + 3).render()
'((n*4)+3)'
"""
from tiny_uop.dtype import AddrSpace, DType, ImageDType, PtrDType, dtypes, least_upper_dtype, to_dtype
from tiny_uop.helpers import DEBUG, Context, ContextVar, getenv
from tiny_uop.pattern import PatternMatcher, UPat, graph_rewrite, graph_rewrite_map
from tiny_uop.uop import AxisType, GroupOp, KernelInfo, Ops, UOp, Variable, sint

__version__ = "0.1.0"  # the package version (pyproject.toml reads it from here)
from tiny_uop.plugins import PLUGIN_API  # noqa: E402  (the registry module is cheap: it scans nothing at import)

__all__ = ["AddrSpace", "AxisType", "Context", "ContextVar", "DEBUG", "DType", "GroupOp", "ImageDType", "KernelInfo",
           "Ops", "PLUGIN_API", "PatternMatcher", "PtrDType", "UOp", "UPat", "Variable", "dtypes", "getenv",
           "graph_rewrite", "graph_rewrite_map", "least_upper_dtype", "sint", "to_dtype", "__version__"]
