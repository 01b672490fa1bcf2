#!/usr/bin/env python3
"""PyTorch CPU's convolutions at ResNet-20's shapes, beside leangrad's
BenchmarkConvResNet20 (kernels/cpu): the same shapes (batch 32, fp32, NCHW),
the same three passes (forward, data gradient, filter gradient, each alone
through aten.convolution_backward's output mask), in GFLOP/s counted the
same way (2·N·K·C·R·S·OH·OW). Run it under taskset on the CPUs leangrad's
benchmark used; it uses as many threads as it is allowed CPUs.

With --profile, it also prints where PyTorch's own ResNet-20 training step
(ref.py's model, batch 32, SGD) spends its time: the self time of each
operator, summed over a few steps (torch.profiler).

    taskset -c 14,15 python3 conv_cpu.py --reps 30 --profile
"""
import argparse
import os
import sys
import time

import torch
import torch.nn.functional as F

# (C, H, W, R, K, stride, pad): BenchmarkConvResNet20's shapes.
SHAPES = [
    (16, 28, 28, 3, 16, 1, 1),
    (32, 14, 14, 3, 32, 1, 1),
    (64, 7, 7, 3, 64, 1, 1),
    (1, 28, 28, 3, 16, 1, 1),
    (16, 28, 28, 3, 32, 2, 1),
    (32, 14, 14, 3, 64, 2, 1),
    (16, 28, 28, 1, 32, 2, 0),
]


def median_seconds(fn, reps):
    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    times.sort()
    return times[len(times) // 2]


def convs(n, reps):
    g = torch.Generator().manual_seed(1)
    for c, h, w, r, k, stride, pad in SHAPES:
        x = torch.randn(n, c, h, w, generator=g)
        wt = torch.randn(k, c, r, r, generator=g)
        y = F.conv2d(x, wt, stride=stride, padding=pad)
        dy = torch.randn(y.shape, generator=g)
        oh, ow = y.shape[2], y.shape[3]
        flops = 2 * n * k * c * r * r * oh * ow

        def backward(mask):
            return lambda: torch.ops.aten.convolution_backward(
                dy, x, wt, None, [stride, stride], [pad, pad], [1, 1], False, [0, 0], 1, mask)

        passes = [("forward", lambda: F.conv2d(x, wt, stride=stride, padding=pad)),
                  ("data", backward([True, False, False])),
                  ("filter", backward([False, True, False]))]
        for name, fn in passes:
            if c == 1 and name == "data":
                continue  # the first layer's input needs no gradient
            s = median_seconds(fn, reps)
            print(f"pytorch conv {c}x{h}x{w}-{r}/k={k}/stride={stride}/{name}: "
                  f"{s * 1e6:.1f} us {flops / s / 1e9:.1f} GFLOP/s", flush=True)


def profile(n, steps):
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import ref  # the harness's models

    torch.manual_seed(1)
    model = ref.MODELS["resnet20"][1]()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-4, nesterov=True)
    x = torch.randn(n, 1, 28, 28)
    y = torch.randint(0, 10, (n,))

    def step():
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        opt.step()

    for _ in range(3):
        step()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        t = time.perf_counter()
        for _ in range(steps):
            step()
        wall = (time.perf_counter() - t) / steps
    print(f"pytorch resnet20 batch {n} fp32 step: {wall * 1e3:.2f} ms (under the profiler), "
          f"self CPU time per step by operator:")
    rows = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)
    for e in rows[:15]:
        print(f"  {e.key}: {e.self_cpu_time_total / steps / 1e3:.3f} ms ({e.count // steps}x)")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--profile", action="store_true")
    a = ap.parse_args()
    torch.set_num_threads(len(os.sched_getaffinity(0)))
    print(f"pytorch {torch.__version__} on {torch.get_num_threads()} threads", flush=True)
    convs(a.batch, a.reps)
    if a.profile:
        profile(a.batch, 10)


if __name__ == "__main__":
    main()
