#!/usr/bin/env python3
"""Whether F16 tensor-core products run slower than BF16 ones on this GPU,
and its clocks and power while they do: PyTorch's cuBLAS products at GPT-2
small's shapes, the same N(0, 1) operands in each dtype, each dtype in
turn for --seconds (a steady state under the power limit), alternating
--rounds times. For each run: the median time of a product (CUDA events
around batches of 20), TFLOP/s, and the median SM clock and power
nvidia-smi sampled every 50 ms meanwhile.

    python3 scripts/f16-power.py --seconds 3 --rounds 2
"""
import argparse
import statistics
import subprocess

import torch


def sampled(fn):
    """Runs fn with nvidia-smi sampling the SM clock and power; returns fn's result and the medians."""
    smi = subprocess.Popen(["nvidia-smi", "--query-gpu=clocks.sm,power.draw", "--format=csv,noheader,nounits",
                            "-lms", "50"], stdout=subprocess.PIPE, text=True)
    try:
        r = fn()
    finally:
        smi.terminate()
    rows = []
    for line in smi.communicate()[0].splitlines():
        try:
            rows.append([float(v) for v in line.split(",")])
        except ValueError:
            pass
    rows = rows[len(rows) // 4:]  # past the ramp
    med = lambda i: statistics.median(r[i] for r in rows) if rows else float("nan")
    return r, med(0), med(1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="16384x3072x768,16384x768x3072,4096x50304x768", help="MxNxK, comma-separated")
    ap.add_argument("--seconds", type=float, default=3)
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    g = torch.Generator(device="cuda").manual_seed(1)
    for shape in a.shapes.split(","):
        m, n, k = (int(v) for v in shape.split("x"))
        x = torch.randn(m, k, device="cuda", generator=g)
        w = torch.randn(n, k, device="cuda", generator=g)
        for r in range(a.rounds):
            for dt in ([torch.bfloat16, torch.float16] if r % 2 == 0 else [torch.float16, torch.bfloat16]):
                xa, wa = x.to(dt), w.to(dt)
                out = torch.empty(m, n, device="cuda", dtype=dt)

                def run():
                    times = []
                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    spent = 0.0
                    while spent < a.seconds * 1e3:
                        start.record()
                        for _ in range(20):
                            torch.matmul(xa, wa.t(), out=out)
                        end.record()
                        end.synchronize()
                        ms = start.elapsed_time(end)
                        spent += ms
                        times.append(ms / 20)
                    return statistics.median(times[len(times) // 4:])

                ms, clock, power = sampled(run)
                tflops = 2 * m * n * k / ms / 1e9
                name = str(dt).removeprefix("torch.")
                print(f"{shape} {name:8s} round {r + 1}: {ms * 1e3:7.1f} µs, {tflops:5.0f} TFLOP/s, "
                      f"sm {clock:.0f} MHz, {power:.0f} W", flush=True)


if __name__ == "__main__":
    main()
