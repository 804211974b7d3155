"""Building a kernel: PTX/CUDA C++ through nvcc and ptxas, resources and SASS, the toolchain's versions."""
