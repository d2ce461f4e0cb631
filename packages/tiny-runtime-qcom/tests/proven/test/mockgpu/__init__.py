"""The adapter from tinygrad 0.14's FileIOInterface to tiny-runtime-qcom's mock KGSL (`mockgpu.py`)."""
