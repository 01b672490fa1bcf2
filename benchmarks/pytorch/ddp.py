#!/usr/bin/env python3
"""PyTorch DDP reference for leangrad's data-parallel benchmark (bench -nproc).

Launched by torchrun, one process per GPU:

    torchrun --nproc-per-node 2 ddp.py --specs resnet18:256 resnet20:256 --configs fp32,amp

Times the same models and configurations as ref.py (its MODELS and
CONFIGS: the identical networks, SGD with Nesterov momentum, autocast +
GradScaler for AMP, cudnn.benchmark, PyTorch's default TF32 policy), with
the model wrapped in DistributedDataParallel (NCCL, PyTorch's default
buckets: 25 MiB and a first of 1 MiB, buffers broadcast every forward) and
the batch per rank. With one process the model is not wrapped: that is the
single-GPU baseline. Each timed step is followed by torch.cuda.synchronize();
rank 0 prints (or writes, --out) a JSON object whose results have the fields
of leangrad's benchmarks.Result, engine "pytorch-ddp" (or "pytorch" with
one process), img_per_s counting every rank's images.
"""
import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ref import CONFIGS, MODELS  # noqa: E402


def bench(model_name, batch, config, warmup, steps, rank, world):
    shape, build = MODELS[model_name]
    amp, ckpt = CONFIGS[config]
    torch.manual_seed(1)
    model = build().cuda()
    if ckpt:
        model.checkpoint = True
    fwd = torch.nn.parallel.DistributedDataParallel(model, device_ids=[torch.cuda.current_device()]) if world > 1 else model
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-4, nesterov=True)
    scaler = torch.amp.GradScaler("cuda", enabled=amp)
    g = torch.Generator(device="cuda").manual_seed(1 + rank)
    x = torch.randn(batch, *shape, device="cuda", generator=g)
    y = torch.randint(0, 10, (batch,), device="cuda", generator=g)

    def step():
        for pg in opt.param_groups:
            pg["lr"] = 0.01
        with torch.autocast("cuda", dtype=torch.float16, enabled=amp):
            loss = F.cross_entropy(fwd(x), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)

    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    if world > 1:
        dist.barrier()
    torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    med = statistics.median(times)
    result = dict(engine="pytorch-ddp" if world > 1 else "pytorch", model=model_name, batch=batch, config=config,
                  device=f"cuda ({torch.cuda.get_device_name()})", steps=steps, median_ms=med,
                  img_per_s=batch * world / (med / 1e3), peak_allocated=torch.cuda.max_memory_allocated(),
                  peak_reserved=torch.cuda.max_memory_reserved(), saving_vs_fp32=0.0, overhead_vs_fp32=0.0,
                  ranks=world)
    del fwd, model, opt, scaler, x, y
    torch.cuda.empty_cache()
    return result


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--specs", nargs="+", default=["resnet18:256", "resnet20:256"], help="model:batch[,batch] (batch per rank)")
    ap.add_argument("--configs", default="fp32,amp")
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--out", help="write the JSON here (rank 0) instead of stdout")
    a = ap.parse_args()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    torch.backends.cudnn.benchmark = True
    if world > 1:
        dist.init_process_group("nccl")
    results = []
    for spec in a.specs:
        name, batches = spec.split(":")
        for b in batches.split(","):
            for c in a.configs.split(","):
                r = bench(name, int(b), c, a.warmup, a.steps, rank, world)
                results.append(r)
                if rank == 0:
                    print(f"{r['engine']} {name} batch {b} per rank x {world} {c}: {r['median_ms']:.2f} ms, "
                          f"{r['img_per_s']:.0f} img/s", file=sys.stderr)
    if rank == 0:
        out = json.dumps({"pytorch": torch.__version__, "nccl": ".".join(map(str, torch.cuda.nccl.version())),
                          "ranks": world, "results": results}, indent=2)
        if a.out:
            with open(a.out, "w") as f:
                f.write(out + "\n")
        else:
            print(out)
    if world > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
