"""Test-only package `test`: tinygrad 0.14's hcq.py imports `test.mockgpu.mockgpu` when DEV's interface is MOCK."""
