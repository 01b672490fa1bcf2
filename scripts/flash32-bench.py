#!/usr/bin/env python3
"""Checks and times the F32 flash kernels (kernels/cuda/src/flash32.cu: F32
causal attention as three TF32 products each: flash_fwd_f32, and the
backward's flash_bwd_q_f32 then flash_bwd_kv_f32) on the GPU machine, at
GPT-2 small's shape (batch 16, 12 heads of 64, 1024 tokens, c_attn's packed
layout), beside PyTorch's F32 scaled-dot-product attention.

The source comes from `go run ./scripts/kernelsrc`; each variant rewrites
some of its #defines (F32_FWD_BLOCKS, F32_BWD_KV_BLOCKS, F32_LD, ...) or,
with ONE=1, keeps only the big·big products (1xTF32: an experiment on where
the time goes, not F32's accuracy). CuPy compiles each with NVRTC for the
device in hand and launches it as kernels/cuda/transformer.go does.

    python3 scripts/flash32-bench.py --source kernels.cu base= f2=F32_FWD_BLOCKS=2 one=ONE=1

For each variant and kernel: registers and spilled bytes, the relative
errors against float64 (o and lse for the forward; dq, dk and dv for the
backward, whose two kernels are timed together), and the median device
time.
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
    do = torch.randn(B, T, C, device="cuda")
    heads = lambda x: x.reshape(B, T, H, D).transpose(1, 2)
    q, k, v = (heads(qkv[..., i * C:(i + 1) * C]) for i in range(3))
    # float64 references: o, lse and the gradients of q, k and v.
    q64, k64, v64 = (x.double().requires_grad_() for x in (q, k, v))
    s = q64 @ k64.transpose(-1, -2) / D ** 0.5
    s = s.masked_fill(torch.ones(T, T, dtype=torch.bool, device="cuda").triu(1), float("-inf"))
    ref_lse = torch.logsumexp(s, -1).reshape(B * H, T).detach()
    o64 = torch.softmax(s, -1) @ v64
    ref_o = o64.transpose(1, 2).reshape(B, T, C).detach()
    ref_grads = [g.transpose(1, 2).reshape(B, T, C) for g in torch.autograd.grad(o64, (q64, k64, v64), heads(do).double())]
    del s, o64, q64, k64, v64
    print("| variant | kernel | regs | spills | ms | errors |")
    print("|---|---|---:|---:|---:|---|")
    ptr, row, batch = qkv.data_ptr(), cp.int32(3 * C), cp.int64(T * 3 * C)
    operands = tuple(x for i in range(3) for x in (cp.uint64(ptr + 4 * i * C), row, batch))
    head = (cp.int32(B), cp.int32(H), cp.int32(T))
    scale = cp.float32(1 / D ** 0.5)
    grid = ((T + 63) // 64, B * H)
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
        shared = 4 * 64 * ld * 4
        fns = {}
        bwd_shared = 6 * 64 * ld * 4  # flash32BwdShared
        for fn, sh in (("flash_fwd_f32", shared), ("flash_bwd_q_f32", bwd_shared), ("flash_bwd_kv_f32", bwd_shared + 2 * 64 * 4)):
            try:
                f = mod.get_function(fn)
            except cp.cuda.driver.CUDADriverError:  # a source from before the kernel
                continue
            f.max_dynamic_shared_size_bytes = sh
            fns[fn] = (f, sh)

        def launch(fn, *args):
            f, sh = fns[fn]
            f(grid, (128,), args, shared_mem=sh)

        def regs(fn):
            f = fns[fn][0]
            return f"{f.num_regs} | {f.local_size_bytes}"

        # Outputs poisoned first.
        o = torch.full((B, T, C), float("nan"), device="cuda")
        lse = torch.full((B * H, T), float("nan"), device="cuda")
        fwd = lambda: launch("flash_fwd_f32", *head, cp.int32(T), scale, *operands,
                             cp.uint64(o.data_ptr()), cp.int32(C), cp.int64(T * C), cp.uint64(lse.data_ptr()))
        ms = timed(fwd, a.iters)
        print(f"| {name} | forward | {regs('flash_fwd_f32')} | {ms:.4f} | o {rel(o, ref_o):.2e}, lse {rel(lse, ref_lse):.2e} |")
        if "flash_bwd_kv_f32" not in fns:
            continue
        dqkv = torch.full_like(qkv, float("nan"))
        dvec = torch.full((B * H, T), float("nan"), device="cuda")
        dptr = dqkv.data_ptr()
        grads = tuple(x for i in range(3) for x in (cp.uint64(dptr + 4 * i * C), row, batch))
        outs = (cp.uint64(do.data_ptr()), cp.int32(C), cp.int64(T * C))

        def bwd():
            launch("flash_bwd_q_f32", *head, scale, *operands, *outs, cp.uint64(o.data_ptr()), cp.int32(C), cp.int64(T * C),
                   cp.uint64(lse.data_ptr()), cp.uint64(dvec.data_ptr()), *grads[:3])
            launch("flash_bwd_kv_f32", *head, scale, *operands, *outs, cp.uint64(lse.data_ptr()), cp.uint64(dvec.data_ptr()),
                   *grads[3:])

        ms = timed(bwd, a.iters)
        errs = ", ".join(f"{n} {rel(dqkv[..., i * C:(i + 1) * C], ref_grads[i]):.2e}" for i, n in enumerate(("dq", "dk", "dv")))
        print(f"| {name} | backward | q {regs('flash_bwd_q_f32')}; kv {regs('flash_bwd_kv_f32')} | {ms:.4f} | {errs} |")
    from torch.nn.attention import SDPBackend, sdpa_kernel
    for backend in ("MATH", "EFFICIENT_ATTENTION"):
        with sdpa_kernel(getattr(SDPBackend, backend)):
            qg, kg, vg = (x.detach().requires_grad_() for x in (q, k, v))
            out = F.scaled_dot_product_attention(qg, kg, vg, is_causal=True)
            fwd_ms = timed(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), a.iters)
            bwd_ms = timed(lambda: torch.autograd.grad(out, (qg, kg, vg), heads(do), retain_graph=True), a.iters)
            grads = torch.autograd.grad(out, (qg, kg, vg), heads(do))
            flat = lambda x: x.transpose(1, 2).reshape(B, T, C)
            errs = ", ".join(f"{n} {rel(flat(g), ref_grads[i]):.2e}" for i, (n, g) in enumerate(zip(("dq", "dk", "dv"), grads)))
            print(f"PyTorch SDPA F32 {backend}: forward {fwd_ms:.4f} ms, backward {bwd_ms:.4f} ms; "
                  f"o {rel(flat(out), ref_o):.2e}, {errs}")


if __name__ == "__main__":
    main()
