#!/usr/bin/env python3
"""Two kernel profiles of benchmarks/pytorch/gpt.py bench --profile (the
last JSON line of each file) side by side: each class of kernel (products,
attention, the rest) and the longest kernels, ms a step, and the ratio.

    python3 scripts/profile-diff.py pytorch-bf16.log pytorch-f16.log
"""
import json
import re
import sys


def load(path):
    rows = [json.loads(l) for l in open(path) if l.startswith("{")]
    return {r["kernel"]: r for r in rows[-1]["profile"]}


def kind(name):
    n = name.lower()
    if re.search(r"flash|fmha|cudnn|sdpa|attention", n):
        return "attention"
    if re.search(r"gemm|nvjet|sm90_xmma|cutlass|matmul", n):
        return "products"
    return "the rest"


def main():
    a, b = load(sys.argv[1]), load(sys.argv[2])
    classes = {}
    for prof, i in ((a, 0), (b, 1)):
        for name, r in prof.items():
            classes.setdefault(kind(name), [0.0, 0.0])[i] += r["ms"]
    for c, (x, y) in sorted(classes.items()):
        print(f"{c:10s} {x:8.3f} {y:8.3f} ms  {y / x if x else float('nan'):.3f}")
    print(f"{'all':10s} {sum(v[0] for v in classes.values()):8.3f} {sum(v[1] for v in classes.values()):8.3f} ms")
    # The longest kernels of the first, matched to the second by name with the dtype's name swapped.
    swap = lambda n: n.replace("bf16", "f16").replace("bfloat16", "half").replace("BFloat16", "Half")
    for name, r in sorted(a.items(), key=lambda kv: -kv[1]["ms"])[:15]:
        o = b.get(swap(name)) or b.get(name)
        other = f"{o['ms']:8.3f} {o['ms'] / r['ms']:.3f}" if o else "       –"
        print(f"{r['ms']:8.3f} {other}  {r['calls']:5.1f}×  {name[:110]}")


if __name__ == "__main__":
    main()
