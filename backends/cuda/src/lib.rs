//! CUDA backend: NVRTC kernels and cuBLAS GEMMs through cudarc, the high-throughput path on NVIDIA (issue 7).
