#!/usr/bin/env python3
"""Does channels-last (NHWC) pay for ResNet-1202's F16 convolutions?

On the GPU machine: times, with CUDA events and cuDNN benchmark on, each
3×3 convolution shape of ResNet-1202 at batch 128 (16, 32 and 64 channels
at 28, 14 and 7 pixels) forward, data gradient and filter gradient in
three ways: F32 (TF32 allowed, NCHW: leangrad's fp32), F16 NCHW
(leangrad's AMP) and F16 NHWC; then PyTorch's whole ResNet-1202 step with
AMP in both layouts beside fp32.

    python3 scripts/nhwc-bench.py [--model]
"""
import sys

import torch
import torch.nn.functional as F

torch.backends.cudnn.benchmark = True
torch.backends.cudnn.allow_tf32 = True
dev = "cuda"


def timed(fn, iters=200):
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(iters):
        fn()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) / iters * 1e3  # µs


def conv_times(n, c, k, hw, stride, dtype, layout):
    fmt = torch.channels_last if layout == "nhwc" else torch.contiguous_format
    x = torch.randn(n, c, hw, hw, device=dev, dtype=dtype).to(memory_format=fmt)
    w = torch.randn(k, c, 3, 3, device=dev, dtype=dtype).to(memory_format=fmt)
    y = F.conv2d(x, w, stride=stride, padding=1)
    dy = torch.randn_like(y).to(memory_format=fmt)
    fwd = timed(lambda: F.conv2d(x, w, stride=stride, padding=1))
    dgrad = timed(lambda: torch.ops.aten.convolution_backward(dy, x, w, None, [stride] * 2, [1, 1], [1, 1], False, [0, 0], 1, [True, False, False]))
    wgrad = timed(lambda: torch.ops.aten.convolution_backward(dy, x, w, None, [stride] * 2, [1, 1], [1, 1], False, [0, 0], 1, [False, True, False]))
    return fwd, dgrad, wgrad


def convs():
    shapes = [(16, 16, 28, 1), (16, 32, 28, 2), (32, 32, 14, 1), (32, 64, 14, 2), (64, 64, 7, 1)]
    print("| C→K at H, stride | way | forward µs | data grad µs | filter grad µs | sum |")
    print("|---|---|---:|---:|---:|---:|")
    for c, k, hw, s in shapes:
        for name, dt, lay in [("fp32 NCHW", torch.float32, "nchw"), ("fp16 NCHW", torch.float16, "nchw"), ("fp16 NHWC", torch.float16, "nhwc")]:
            f, d, w = conv_times(128, c, k, hw, s, dt, lay)
            print(f"| {c}→{k} at {hw}, {s} | {name} | {f:.1f} | {d:.1f} | {w:.1f} | {f + d + w:.1f} |", flush=True)


def model():
    sys.path.insert(0, "benchmarks/pytorch")
    from ref import MODELS

    shape, build = MODELS["resnet1202"]
    for name, amp, fmt in [("fp32", False, torch.contiguous_format), ("amp NCHW", True, torch.contiguous_format),
                           ("amp NHWC", True, torch.channels_last), ("fp32 NHWC", False, torch.channels_last)]:
        torch.manual_seed(1)
        m = build().to(dev).to(memory_format=fmt)
        opt = torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9, nesterov=True)
        scaler = torch.amp.GradScaler("cuda", enabled=amp)
        x = torch.randn(128, *shape, device=dev).to(memory_format=fmt)
        y = torch.randint(0, 10, (128,), device=dev)

        def step():
            with torch.autocast("cuda", dtype=torch.float16, enabled=amp):
                loss = F.cross_entropy(m(x), y)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            opt.zero_grad(set_to_none=True)

        print(f"PyTorch eager ResNet-1202 b128 {name}: {timed(step, 10) / 1e3:.2f} ms", flush=True)


if __name__ == "__main__":
    convs()
    if "--model" in sys.argv:
        model()
