#!/usr/bin/env python3
"""Checks and times flash_fwd_f32 (kernels/cuda/src/flash32.cu: F32 causal
attention's forward as three TF32 products each) on the GPU machine, at
GPT-2 small's shape (batch 16, 12 heads of 64, 1024 tokens, c_attn's packed
layout), beside PyTorch's F32 scaled-dot-product attention.

The source comes from `go run ./scripts/kernelsrc`; each variant rewrites
some of its #defines (F32_FWD_BLOCKS, F32_LD, ...) or, with ONE=1, keeps
only the big·big product (1xTF32: an experiment on where the time goes,
not F32's accuracy). CuPy compiles each with NVRTC for the device in hand
and launches it as kernels/cuda/transformer.go does.

    python3 scripts/flash32-bench.py --source kernels.cu base= b3=F32_FWD_BLOCKS=3 one=ONE=1

For each variant: registers and spilled bytes, the relative error of o and
lse against float64, and the median device time.
"""
import argparse
import re

import cupy as cp
import torch
import torch.nn.functional as F
from devtime import redefine, rel, timed


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--source", required=True, help="the kernels' CUDA C (go run ./scripts/kernelsrc)")
    ap.add_argument("--shape", default="16,12,1024", help="batch,heads,tokens")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("variants", nargs="+", help="name=[MACRO=VALUE,...]")
    a = ap.parse_args()
    B, H, T = map(int, a.shape.split(","))
    D, C = 64, H * 64
    full = open(a.source).read()
    torch.manual_seed(1)
    qkv = torch.randn(B, T, 3 * C, device="cuda")
    q, k, v = (qkv[..., i * C:(i + 1) * C].reshape(B, T, H, D).transpose(1, 2) for i in range(3))
    qd, kd, vd = q.double(), k.double(), v.double()
    s = qd @ kd.transpose(-1, -2) / D ** 0.5
    s = s.masked_fill(torch.ones(T, T, dtype=torch.bool, device="cuda").triu(1), float("-inf"))
    ref_lse = torch.logsumexp(s, -1).reshape(B * H, T)
    ref_o = (torch.softmax(s, -1) @ vd).transpose(1, 2).reshape(B, T, C)
    del s
    print(f"| variant | regs | spills | ms | o err | lse err |")
    print(f"|---|---:|---:|---:|---:|---:|")
    for spec in a.variants:
        name, _, macros = spec.partition("=")
        src = full
        for kv in filter(None, macros.split(",")):
            m, val = kv.split("=")
            if m == "ONE":
                src = re.sub(r"\n.*mma1688\(c\[n\], ab, bs\[n\]\);", "", src)
                src = re.sub(r"\n.*mma1688\(c\[n\], as, bb\[n\]\);", "", src)
                continue
            src = redefine(src, m, val, spec)
        ld = int(re.search(r"#define F32_LD (\d+)", src).group(1))
        mod = cp.RawModule(code=src, options=("--std=c++17",))
        f = mod.get_function("flash_fwd_f32")
        shared = 4 * 64 * ld * 4
        f.max_dynamic_shared_size_bytes = shared
        o = torch.full((B, T, C), float("nan"), device="cuda")
        lse = torch.full((B * H, T), float("nan"), device="cuda")
        ptr = qkv.data_ptr()
        args = (cp.int32(B), cp.int32(H), cp.int32(T), cp.int32(T), cp.float32(1 / D ** 0.5),
                cp.uint64(ptr), cp.int32(3 * C), cp.int64(T * 3 * C),
                cp.uint64(ptr + 4 * C), cp.int32(3 * C), cp.int64(T * 3 * C),
                cp.uint64(ptr + 8 * C), cp.int32(3 * C), cp.int64(T * 3 * C),
                cp.uint64(o.data_ptr()), cp.int32(C), cp.int64(T * C), cp.uint64(lse.data_ptr()))
        grid = ((T + 63) // 64, B * H)

        def run():
            f(grid, (128,), args, shared_mem=shared)

        ms = timed(run, a.iters)
        print(f"| {name} | {f.num_regs} | {f.local_size_bytes} | {ms:.4f} | {rel(o, ref_o):.2e} | {rel(lse, ref_lse):.2e} |")
    sdpa = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)
    for backend in ("MATH", "EFFICIENT_ATTENTION"):
        from torch.nn.attention import SDPBackend, sdpa_kernel
        with sdpa_kernel(getattr(SDPBackend, backend)):
            print(f"PyTorch SDPA F32 {backend}: {timed(sdpa, a.iters):.4f} ms")


if __name__ == "__main__":
    main()
