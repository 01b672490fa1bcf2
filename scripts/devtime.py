"""Device timing, error measures, source rewriting and NVRTC compilation
shared by the kernel harnesses (flash-bench.py, flash32-bench.py,
x3gemm-bench.py) that run on the GPU machine (scripts/gpu.sh kernels)."""
import ctypes
import os
import re
import sys
import tempfile

import cupy as cp

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


def nvrtc_module(src, arch, name):
    """src compiled by NVRTC for arch as the Go backend compiles it
    (--gpu-architecture, --std=c++17; sm_90a is its target on an H200),
    with ptxas's report of the kernels whose names hold name (registers and
    spills) printed."""
    lib = None
    for name in ("libnvrtc.so.13", "libnvrtc.so.12", "/usr/local/cuda/lib64/libnvrtc.so"):
        try:
            lib = ctypes.CDLL(name)
            break
        except OSError:
            pass
    if lib is None:
        sys.exit("no NVRTC")
    prog = ctypes.c_void_p()
    if lib.nvrtcCreateProgram(ctypes.byref(prog), src.encode(), (name + ".cu").encode(), 0, None, None):
        sys.exit("nvrtcCreateProgram failed")
    opts = [b"--gpu-architecture=" + arch.encode(), b"--std=c++17", b"--ptxas-options=-v"]
    r = lib.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
    size = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetProgramLog(prog, log)
    text = log.value.decode(errors="replace")
    keep = [l for l in text.splitlines() if name in l or "warning" in l or "error" in l or "Used" in l or "spill" in l]
    print("\n".join("  nvrtc %s: %s" % (arch, l.strip()) for l in keep[:60]), flush=True)
    if r:
        sys.exit("NVRTC could not compile for %s:\n%s" % (arch, text))
    lib.nvrtcGetCUBINSize(prog, ctypes.byref(size))
    cubin = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetCUBIN(prog, cubin)
    fd, path = tempfile.mkstemp(suffix=".cubin")
    os.write(fd, cubin.raw)
    os.close(fd)
    return cp.RawModule(path=path)
