#!/usr/bin/env python3
"""Whether cuBLAS's FP32 emulation on BF16 tensor cores
(CUBLAS_COMPUTE_32F_EMULATED_16BFX9, cuBLAS 12.9 and later) runs on this
GPU and how fast, beside strict FP32 (CUBLAS_COMPUTE_32F), for GPT-2
small's products: cublasGemmEx through ctypes on the cuBLAS PyTorch
loaded, operands N(0, 1), each emulation strategy cuBLAS offers; the
median time of 20 products (CUDA events), TFLOP/s, and the largest
relative error against a float64 product.

    python3 scripts/f32-emulation.py
"""
import ctypes
import os
import statistics

import torch

COMPUTE_32F, COMPUTE_32F_EMULATED_16BFX9 = 68, 78  # cublasComputeType_t
R_32F = 0  # cudaDataType_t
STRATEGIES = {"default": 0, "performant": 1, "eager": 2}  # cublasEmulationStrategy_t


def cublas():
    """The libcublas PyTorch loaded (a matmul loads it)."""
    a = torch.randn(8, 8, device="cuda")
    a @ a
    for line in open("/proc/self/maps"):
        p = line.split()[-1]
        if os.path.basename(p).startswith("libcublas.so"):
            return ctypes.CDLL(p)
    return ctypes.CDLL("libcublas.so.13")


def main():
    lib = cublas()
    handle = ctypes.c_void_p()
    assert lib.cublasCreate_v2(ctypes.byref(handle)) == 0
    ver = ctypes.c_int()
    lib.cublasGetVersion_v2(handle, ctypes.byref(ver))
    print("cuBLAS", ver.value, torch.cuda.get_device_name())
    has_strategy = hasattr(lib, "cublasSetEmulationStrategy")
    for m, n, k in ((16384, 3072, 768), (16384, 768, 3072), (4096, 50304, 768)):
        a = torch.randn(m, k, device="cuda")
        b = torch.randn(n, k, device="cuda")
        ref = (a.double() @ b.double().t())
        c = torch.empty(m, n, device="cuda")
        alpha, beta = ctypes.c_float(1), ctypes.c_float(0)
        runs = [("f32", COMPUTE_32F, None)]
        for name, s in STRATEGIES.items():
            if has_strategy or name == "default":
                runs.append((f"bf16x9 {name}", COMPUTE_32F_EMULATED_16BFX9, s if has_strategy else None))
        for label, compute, strategy in runs:
            if strategy is not None:
                lib.cublasSetEmulationStrategy(handle, strategy)
            # Row-major C = A·Bᵀ as column-major Cᵀ = B·Aᵀ: op(B) = B (n×k stored k-major), op(A) = Aᵀ.

            def gemm():
                return lib.cublasGemmEx(handle, 1, 0, n, m, k, ctypes.byref(alpha), ctypes.c_void_p(b.data_ptr()), R_32F, k,
                                        ctypes.c_void_p(a.data_ptr()), R_32F, k, ctypes.byref(beta),
                                        ctypes.c_void_p(c.data_ptr()), R_32F, n, compute, -1)

            st = gemm()
            if st != 0:
                print(f"{m}x{n}x{k} {label}: cublasGemmEx status {st}")
                continue
            torch.cuda.synchronize()
            err = ((c.double() - ref).abs().max() / ref.abs().max()).item()
            times = []
            for _ in range(5):
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                for _ in range(20):
                    gemm()
                e.record()
                e.synchronize()
                times.append(s.elapsed_time(e) / 20)
            ms = statistics.median(times)
            print(f"{m}x{n}x{k} {label:18s}: {ms * 1e3:8.1f} µs, {2 * m * n * k / ms / 1e9:6.1f} TFLOP/s, "
                  f"max error {err:.2e} of the largest", flush=True)
        if has_strategy:
            lib.cublasSetEmulationStrategy(handle, 0)
    lib.cublasDestroy_v2(handle)


if __name__ == "__main__":
    main()
