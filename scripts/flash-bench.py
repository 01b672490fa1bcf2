#!/usr/bin/env python3
"""Checks and times leangrad's flash-attention kernels on the GPU machine,
beside PyTorch's scaled-dot-product attention at the same shape.

It runs where there is no Go: the kernels' source comes from
`go run ./scripts/kernelsrc` (the CUDA C the backend compiles), and each
variant replaces its flash.cu section with another file (a flash.cu from
git history, or one under test). NVRTC compiles each as the backend does
(for sm_90a unless the variant names an architecture, printing ptxas's
registers, spills and warnings), CuPy launches the kernels as
kernels/cuda/transformer.go does, and PyTorch gives the float32 reference
and the competitor's times (CUDA events, median of --iters).

    python3 scripts/flash-bench.py --source kernels.cu base=old-flash.cu new=flash.cu \
        one=flash.cu@FLASH_WG=1

For each variant: the relative error of o, lse, dq, dk and dv against the
float32 reference on fresh random inputs (outputs poisoned with NaN first),
whether each output equals the first variant's bit for bit, and the median
device time of flash_fwd and of the backward: flash_bwd_kv and flash_bwd_q,
or flash_bwd, the one-kernel backward some variants have. A flash.cu whose flash_bwd_q takes o writes Σ do·o for
flash_bwd_kv, which runs after it; one whose backward kernels also take
the blocks' column sums of dq, dk and dv is also timed writing them
(bwd+sums), and they are checked against the packed gradient's.
"""
import argparse
import json
import re
import sys

import cupy as cp
import numpy as np
import torch
import torch.nn.functional as F
from devtime import nvrtc_module, redefine, rel, timed


def module_source(full, flash):
    """What flash.cu needs of full (the prelude and common.cuh: everything
    before the first src/*.cu), then flash."""
    head = full[: re.search(r"// ---- \w+\.cu ----\n", full).start()]
    return head + "// ---- flash.cu ----\n" + flash + "\n"


# flash_bwd's dynamic shared memory: six padded tiles, four rows of floats, 1024 bytes to align.
BWD_SHARED = 6 * 64 * (64 + 8) * 2 + 4 * 64 * 4 + 1024


def macro(text, name, default):
    m = re.search(r"#define %s (\d+)" % name, text)
    return int(m.group(1)) if m else default


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--source", required=True, help="the kernels' CUDA C (go run ./scripts/kernelsrc)")
    ap.add_argument("--shape", default="16,12,1024,64", help="B,H,T,D")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "f16"])
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--torch", action="store_true", help="time PyTorch's SDPA backends too")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--carveout", type=int, help="flash_bwd's preferred shared memory carveout, percent")
    ap.add_argument("variants", nargs="+",
                    help="name=flash.cu[@MACRO=VALUE,...][%%arch]: each MACRO's #define rewritten; arch sm_90a unless named")
    a = ap.parse_args()
    B, H, T, D = map(int, a.shape.split(","))
    C = H * D
    dt = torch.bfloat16 if a.dtype == "bf16" else torch.float16
    full = open(a.source).read()
    torch.manual_seed(1)
    # q, k and v are views of one [B, T, 3, H, D] tensor, as c_attn's output is.
    qkv = torch.randn(B, T, 3, H, D, device="cuda", dtype=dt)
    do = torch.randn(B, T, H, D, device="cuda", dtype=dt)
    scale = 1.0 / D**0.5
    q, k, v = (qkv[:, :, i].permute(0, 2, 1, 3) for i in range(3))  # [B, H, T, D] views
    qf, kf, vf = (x.float().requires_grad_() for x in (q, k, v))
    of = F.scaled_dot_product_attention(qf, kf, vf, is_causal=True, scale=scale)
    of.backward(do.float().permute(0, 2, 1, 3))
    s = (qf @ kf.transpose(-1, -2)).detach() * scale
    s.masked_fill_(torch.ones(T, T, device="cuda", dtype=torch.bool).triu(1), float("-inf"))
    ref = {"o": of.detach(), "lse": torch.logsumexp(s, -1), "dq": qf.grad, "dk": kf.grad, "dv": vf.grad}
    del s
    fwd_flop = 4 * B * H * T * T * D / 2  # causal: half the square
    i32, i64, f32 = np.int32, np.int64, np.float32
    ptr = lambda t, off=0: np.uint64(t.data_ptr() + off * t.element_size())
    results, first = {}, None
    for spec in a.variants:
        name, path = spec.split("=", 1)
        path, _, arch = path.partition("%")
        path, _, defs = path.partition("@")
        flash = open(path).read()
        src = module_source(full, flash)
        for d in filter(None, defs.split(",")):  # MACRO=VALUE: rewrite its #define
            m, val = d.split("=")
            src = redefine(src, m, val, spec)
        # Warpgroups a block: FLASH_WG (the prelude's) where flash.cu's blocks have them, else one.
        wg = macro(src, "FLASH_WG", 1) if "FLASH_ROWS" in flash else 1
        rows, threads = 64 * wg, (128 * wg,)
        # The forward's own warpgroups (FLASH_FWD_WG) where flash.cu's forward
        # has them, and its dynamic shared memory where it takes some (a
        # variant that steps through 128 keys at a time).
        fwd_wg, fwd_shared = wg, 0
        if "FWD_ROWS" in flash:
            fwd_wg = macro(src, "FLASH_FWD_WG", 1)
        if "flash_fwd_shared" in flash:
            ld = D if (arch or "sm_90a") == "sm_90a" else D + 8
            fwd_shared = 2 * 2 * macro(src, "FLASH_FWD_KEYS", 64) * ld * 2 + 1024
        mod = nvrtc_module(src, arch or "sm_90a", "flash")
        fwd = mod.get_function("flash_fwd_" + a.dtype)
        if fwd_shared > 48 * 1024:
            fwd.max_dynamic_shared_size_bytes = fwd_shared
        # Two backward kernels (flash_bwd_kv, then flash_bwd_q) or one
        # (flash_bwd: dq's shares added in turn).
        try:
            bwd = mod.get_function("flash_bwd_" + a.dtype)
            bwd.max_dynamic_shared_size_bytes = BWD_SHARED
            if a.carveout is not None:
                bwd.preferred_shared_memory_carveout = a.carveout
            try:
                occ = cp.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(bwd.kernel.ptr, 128, BWD_SHARED)
                print("%s: flash_bwd holds %d blocks a multiprocessor at most" % (name, occ), flush=True)
            except Exception as e:
                print("%s: no occupancy: %s" % (name, e), flush=True)
        except cp.cuda.driver.CUDADriverError:
            bwd = None
            bkv = mod.get_function("flash_bwd_kv_" + a.dtype)
            bq = mod.get_function("flash_bwd_q_" + a.dtype)
        o = torch.full((B, T, H, D), float("nan"), device="cuda", dtype=dt)
        lse = torch.full((B * H, T), float("nan"), device="cuda")
        dqkv = torch.full((B, T, 3, H, D), float("nan"), device="cuda", dtype=dt)
        row, batch = 3 * C, T * 3 * C
        qa = (ptr(qkv), i32(row), i64(batch))
        ka = (ptr(qkv, C), i32(row), i64(batch))
        va = (ptr(qkv, 2 * C), i32(row), i64(batch))
        doa = (ptr(do), i32(C), i64(T * C))

        def run_fwd():
            fwd(((T + 64 * fwd_wg - 1) // (64 * fwd_wg), B * H), (128 * fwd_wg,),
                (i32(B), i32(H), i32(T), i32(T), f32(scale)) + qa + ka + va + (ptr(o), i32(C), i64(T * C), ptr(lse)),
                shared_mem=fwd_shared)

        run_fwd()
        torch.cuda.synchronize()
        dvec = (do.float() * o.float()).sum(-1).permute(0, 2, 1).contiguous()  # [B, H, T], attn_rowdot's
        common = (i32(B), i32(H), i32(T), f32(scale)) + qa + ka + va + doa + (ptr(lse), ptr(dvec))
        grid = ((T + rows - 1) // rows, B * H)

        tiles = (T + 63) // 64
        dqacc = torch.full((B * H * T * D,), float("nan"), device="cuda")
        # flash_bwd's counters: one a warp's rows of a tile, and one more for
        # the ticket probe of a one-kernel backward's variants.
        turn = torch.zeros(B * H * tiles * 4 + 1, device="cuda", dtype=torch.int32)

        def run_bwd():  # the turns zeroed as the Go side does, then flash_bwd
            turn.zero_()
            bwd((tiles, B * H), (128,),
                common + (ptr(dqkv), i32(row), i64(batch), ptr(dqkv, C), i32(row), i64(batch), ptr(dqkv, 2 * C), i32(row),
                          i64(batch), ptr(dqacc), ptr(turn)), shared_mem=BWD_SHARED)

        # flash_bwd_q writing dvec for flash_bwd_kv (then launched first),
        # and both the blocks' column sums (rows of 3·C for each batch and
        # block), or the kernels before them.
        qfirst = "FlashOperand o," in flash
        sums_arg = "float* sums" in flash
        dvw = torch.full((B * H * T,), float("nan"), device="cuda")
        parts = torch.full((B * grid[0], 3 * C), float("nan"), device="cuda")
        sums_on = [False]

        def run_kv():
            args = common if not qfirst else common[:-1] + (ptr(dvw),)
            args += (ptr(dqkv, C), i32(row), i64(batch), ptr(dqkv, 2 * C), i32(row), i64(batch))
            if sums_arg:
                args += (ptr(parts) if sums_on[0] else np.uint64(0),)
            bkv(grid, threads, args)

        def run_q():
            if not qfirst:
                bq(grid, threads, common + (ptr(dqkv), i32(row), i64(batch)))
                return
            args = common[:-2] + (ptr(o), i32(C), i64(T * C), ptr(lse), ptr(dvw), ptr(dqkv), i32(row), i64(batch))
            if sums_arg:
                args += (ptr(parts) if sums_on[0] else np.uint64(0),)
            bq(grid, threads, args)

        def run_two():
            if qfirst:
                run_q()
                run_kv()
            else:
                run_kv()
                run_q()

        if bwd:
            run_bwd()
        else:
            run_two()
        torch.cuda.synchronize()
        out = {"o": o.permute(0, 2, 1, 3), "lse": lse.view(B, H, T)}
        for i, g in enumerate(("dq", "dk", "dv")):
            out[g] = dqkv[:, :, i].permute(0, 2, 1, 3)
        r = {"wg": wg, "fwd_wg": fwd_wg, "fwd_shared": fwd_shared, "err": {n: rel(x, ref[n]) for n, x in out.items()}}
        if first is None:
            first = {n: x.clone() for n, x in out.items()}
        r["same_bits_as_first"] = {n: bool(torch.equal(x, first[n])) for n, x in out.items()}
        if qfirst:
            r["err"]["dvec"] = rel(dvw.view(B, H, T), dvec.view(B, H, T))
        if sums_arg:
            sums_on[0] = True
            dqkv.fill_(float("nan"))
            run_two()
            torch.cuda.synchronize()
            got = parts.sum(0, dtype=torch.float64)
            want = dqkv.view(B * T, 3 * C).double().sum(0)
            r["err"]["sums"] = float((got - want).norm() / want.norm())
            r["ms_sums"] = timed(run_two, a.iters)
            sums_on[0] = False
        r["max_diff_vs_first"] = {n: float((x.float() - first[n].float()).abs().max()) for n, x in out.items()}
        if bwd:
            r["ms"] = {"fwd": timed(run_fwd, a.iters), "bwd": timed(run_bwd, a.iters)}
        else:
            r["ms"] = {"fwd": timed(run_fwd, a.iters), "bwd_kv": timed(run_kv, a.iters), "bwd_q": timed(run_q, a.iters)}
            r["ms"]["bwd"] = r["ms"]["bwd_kv"] + r["ms"]["bwd_q"]
            if "ms_sums" in r:
                r["ms"]["bwd_sums"] = r.pop("ms_sums")
        r["tflops"] = {"fwd": fwd_flop / r["ms"]["fwd"] / 1e9, "bwd": 2.5 * fwd_flop / r["ms"]["bwd"] / 1e9}
        results[name] = r
        print(name, json.dumps(r), flush=True)
    if a.torch:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        qt, kt, vt = (x.detach().clone().requires_grad_() for x in (q, k, v))
        dot = do.permute(0, 2, 1, 3)
        for be in ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION"):
            try:
                with sdpa_kernel(getattr(SDPBackend, be)):
                    f = lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=True, scale=scale)
                    ms_f = timed(f, a.iters)
                    y = f()
                    ms_b = timed(lambda: torch.autograd.grad(y, (qt, kt, vt), dot, retain_graph=True), a.iters)
                r = {"ms": {"fwd": ms_f, "bwd": ms_b}, "tflops": {"fwd": fwd_flop / ms_f / 1e9, "bwd": 2.5 * fwd_flop / ms_b / 1e9}}
            except Exception as e:  # a backend that refuses the shape
                r = {"error": str(e).splitlines()[0]}
            results["torch " + be] = r
            print("torch", be, json.dumps(r), flush=True)
    print("\n| variant | fwd ms | bwd ms (kv + q) | fwd TFLOP/s | bwd TFLOP/s | max rel err | bits as first |")
    print("|---|---:|---:|---:|---:|---:|---|")
    for name, r in results.items():
        if "error" in r:
            print("| %s | %s |" % (name, r["error"]))
            continue
        ms = r["ms"]
        bwd = "%.3f" % ms["bwd"] + (" (%.3f + %.3f)" % (ms["bwd_kv"], ms["bwd_q"]) if "bwd_kv" in ms else "")
        if "bwd_sums" in ms:
            bwd += ", with sums %.3f" % ms["bwd_sums"]
        err = "%.2e" % max(r["err"].values(), key=lambda e: e if e == e else float("inf")) if "err" in r else "–"
        same = ",".join(n for n, v in r.get("same_bits_as_first", {}).items() if v) or "–"
        print("| %s | %.3f | %s | %.1f | %.1f | %s | %s |" % (name, ms["fwd"], bwd, r["tflops"]["fwd"], r["tflops"]["bwd"], err, same))
    if a.json:
        json.dump(results, open(a.json, "w"), indent=1)
    bad = [n for n, r in results.items() if "err" in r and not all(e < 3e-2 for e in r["err"].values())]
    if bad:
        print("too far from the float32 reference:", ", ".join(bad))
        sys.exit(1)


if __name__ == "__main__":
    main()
