"""`test.mockgpu`: routes tinygrad's NV driver file interface to tiny-runtime-nv's mock RM/UVM driver."""
