"""tiny-runtime-cpu: the devices that run on any machine.

- ``CPU``: kernels compiled to native code (llvmlite JIT, optionally clang).
- ``PYTHON``: an interpreter of linear UOps with GPU semantics: the living definition of the IR.
- ``NULL``: compile-only; renders and compiles for any renderer/arch, runs nothing.
- ``DISK``: mmap-backed buffers, ``DISK:/path/to/file``.

This module holds only the cheap `DevicePlugin` descriptors that the ``tiny.devices`` entry points point to; the
device modules are imported when a device is first opened (``Device["CPU"]``).
"""
from tiny_uop.plugins import DevicePlugin

__all__ = ["CPU_PLUGIN", "PYTHON_PLUGIN", "NULL_PLUGIN", "DISK_PLUGIN", "__version__"]
__version__ = "0.1.0"  # the package version (pyproject.toml reads it from here)

# priority: real GPUs come first (10-40); CPU is the last real device. The others are never the default.
CPU_PLUGIN = DevicePlugin("CPU", "tiny_runtime_cpu.cpu:CPUDevice", priority=90)
PYTHON_PLUGIN = DevicePlugin("PYTHON", "tiny_runtime_cpu.python:PythonDevice", priority=100, default_ok=False)
NULL_PLUGIN = DevicePlugin("NULL", "tiny_runtime_cpu.null:NullDevice", priority=110, default_ok=False)
DISK_PLUGIN = DevicePlugin("DISK", "tiny_runtime_cpu.disk:DiskDevice", priority=120, default_ok=False)
