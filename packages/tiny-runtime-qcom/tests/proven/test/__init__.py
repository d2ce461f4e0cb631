"""Test-only package named `test` so that tinygrad 0.14's `from test.mockgpu.mockgpu import MockFileIOInterface`
(runtime/support/hcq.py, when DEV's interface starts with MOCK) finds our adapter. Put `tests/proven` on sys.path
only in a subprocess that runs tinygrad (see tests/test_qcom_proven.py)."""
