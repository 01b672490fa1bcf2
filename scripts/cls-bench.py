#!/usr/bin/env python3
"""Checks and times the classifier's rows kernels (each row's loss, right
prediction and softmax − one-hot from bf16 logits) at GPT-2 small's chunk
on the GPU machine: cls_rows, which reads a row twice, and cls_rows_stash,
which keeps it in shared memory, each with several block sizes.

The source comes from `go run ./scripts/kernelsrc`. CuPy compiles it with
NVRTC and launches the kernels as kernels/cuda/transformer.go's
ClassifierLoss does; PyTorch gives the float32 reference.

    python3 scripts/cls-bench.py --source kernels.cu cls_rows:512 cls_rows_stash:1024

For each kernel:threads: the relative errors of the losses and of dz, the
right counts' agreement, whether dz equals the first variant's bit for
bit, the median device time and the bandwidth of reading the logits once
and writing dz once.
"""
import argparse

import cupy as cp
import numpy as np
import torch
from devtime import rel, timed


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--source", required=True, help="the kernels' CUDA C (go run ./scripts/kernelsrc)")
    ap.add_argument("--rows", type=int, default=5312, help="a chunk's rows (ClassifierLoss's for GPT-2 small at batch 16)")
    ap.add_argument("--vocab", type=int, default=50304)
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("variants", nargs="+", help="kernel:threads")
    a = ap.parse_args()
    mod = cp.RawModule(code=open(a.source).read(), options=("--std=c++17",))
    rows, V = a.rows, a.vocab
    ld = (V + 15) // 16 * 16
    torch.manual_seed(1)
    z = (3 * torch.randn(rows, ld, device="cuda")).bfloat16()
    labels = torch.randint(0, V, (rows,), device="cuda", dtype=torch.int32)
    zf = z[:, :V].float()
    lse = torch.logsumexp(zf, 1)
    ref_loss = lse - zf.gather(1, labels.long()[:, None])[:, 0]
    ref_dz = torch.softmax(zf, 1)
    ref_dz[torch.arange(rows), labels.long()] -= 1
    ref_right = (zf.argmax(1) == labels.long()).float()
    i32 = np.int32
    ptr = lambda t: np.uint64(t.data_ptr())
    first = None
    print("| kernel | threads | ms | TB/s | loss rel err | dz rel err | right agree | dz bits as first |")
    print("|---|---:|---:|---:|---:|---:|---|---|")
    for spec in a.variants:
        name, threads = spec.split(":")
        threads = int(threads)
        k = mod.get_function(name + "_bf16")
        shared = 0
        if name == "cls_rows_stash":
            shared = V // 8 * 16
            k.max_dynamic_shared_size_bytes = shared
        rowloss, rowright = torch.full((rows,), float("nan"), device="cuda"), torch.full((rows,), float("nan"), device="cuda")
        dz = torch.full((rows, ld), float("nan"), device="cuda").bfloat16()
        run = lambda: k((rows,), (threads,), (i32(V), i32(ld), i32(0), ptr(z), ptr(labels), ptr(rowloss), ptr(rowright), i32(1), ptr(dz)),
                        shared_mem=shared)
        run()
        torch.cuda.synchronize()
        got = dz[:, :V].float()
        if first is None:
            first = got.clone()
        ms = timed(run, a.iters)
        print("| %s | %d | %.4f | %.2f | %.1e | %.1e | %s | %s |" % (name, threads, ms, 2 * rows * V * 2 / ms / 1e9, rel(rowloss, ref_loss),
                                                               rel(got, ref_dz), bool(torch.equal(rowright, ref_right)),
                                                               bool(torch.equal(got, first))), flush=True)


if __name__ == "__main__":
    main()
