"""Device timing, error measures and source rewriting shared by the kernel
harnesses (flash-bench.py, flash32-bench.py, ln-bench.py) that run on the
GPU machine."""
import re
import sys

import numpy as np
import torch


def timed(fn, iters):
    """The median device time of fn in ms, each call between two events."""
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return float(np.median(times))


def rel(x, ref):
    """The relative error of x against ref in the L2 norm (NaN if x holds a
    non-finite value)."""
    x, ref = x.double(), ref.double()
    if not torch.isfinite(x).all():
        return float("nan")
    return float((x - ref).norm() / ref.norm())


def redefine(src, macro, value, spec):
    """src with its one #define of macro set to value; exits naming the
    variant spec if src has no such #define, or more than one."""
    out, n = re.subn(r"#define %s \S+" % macro, "#define %s %s" % (macro, value), src)
    if n != 1:
        sys.exit("%s: the source has %d #defines of %s, want one" % (spec, n, macro))
    return out
