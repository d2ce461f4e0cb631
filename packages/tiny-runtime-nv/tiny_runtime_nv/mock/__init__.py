"""In-process stand-ins for NVIDIA's kernel driver (`MOCK+NV`: /dev/nvidiactl, /dev/nvidia-uvm, /dev/nvidia0) and
for `libcuda.so.1` (`MOCK+CUDA`), whose GPU runs kernels on the PTX executor (`tiny_runtime_nv.ptx`)."""
