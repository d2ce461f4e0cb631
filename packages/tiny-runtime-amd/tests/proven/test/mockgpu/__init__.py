"""The adapter from tinygrad 0.14's FileIOInterface to tiny-runtime-amd's mock KFD (`mockgpu.py`)."""
