"""Kernels that layers, attention and quantization share: the bottom of the package.

    cpu_ops    fused C++ CPU kernels (cadence/csrc/cpu/), compiled once per machine
    fused      Triton kernels: RMSNorm (+ residual), SiLU-and-mul, rotary, argmax, PDL helpers
    gemv       batch-1 Triton GEMVs with the norm or activation before them fused in

Nothing here imports another cadence package: ops sit below layers, attention and quant.
"""
