#!/usr/bin/env python3
"""PyTorch reference for leangrad's benchmark harness.

Runs the same models (ResNet-20 on 1x28x28 with 1x1 projection shortcuts,
ResNet-18 CIFAR variant on 3x32x32, an MLP 784-256-256-10), batch sizes and
configurations (fp32, amp, checkpoint, amp+checkpoint, and AMP named by
its dtype: bf16, f16, bf16+checkpoint, f16+checkpoint; for a GPT, light
checkpoints too: checkpoint-light, ..., as selective checkpointing,
gpt.light_contexts) in PyTorch eager:
torch.autocast to --amp-dtype (float16 by default, with a
torch.amp.GradScaler; bfloat16 without), or the dtype the configuration
names, for AMP, torch.utils.checkpoint
per residual block with use_reentrant=False, cudnn.benchmark on, PyTorch's
default TF32 policy (cuDNN convolutions may use TF32, matmuls may not: the
same as leangrad's default), SGD with Nesterov momentum and a learning rate
set every step (as a schedule does). With --compile-configs, those
configurations also run with the model under
torch.compile(mode="reduce-overhead") (Inductor, CUDA graphs), the loss,
scaler and optimiser as in eager; the first --compile-warmup steps compile
and are timed apart (compile_seconds).

Language models (--lm: their shapes and recipes, as leangrad's registry
gives them) are gpt.py's GPT trained as gpt.py trains it: AdamW (fused on
a GPU), the recipe's learning rate, betas, decay and clipping, autocast to
--amp-dtype, checkpointing every block, random tokens; they run under
torch.compile in its default mode, as the issues' held-out measurements
did, not "reduce-overhead".

Each timed step is followed by torch.cuda.synchronize(); the median is
reported, and the peaks come from torch.cuda.max_memory_allocated and
max_memory_reserved over the timed steps. Prints a JSON object
{"pytorch": version, "results": [...]} whose results have the fields of
leangrad's benchmarks.Result (engine "pytorch" or "pytorch-compile").

    python3 ref.py --specs resnet20:256,1024 resnet18:256 mlp:256 --steps 30 --compile-configs fp32,amp
"""
import argparse
import contextlib
import gc
import json
import math
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

import gpt


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, 0, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class ResNet(nn.Module):
    def __init__(self, cin, classes, widths, blocks):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, widths[0], 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(widths[0])
        layers, c = [], widths[0]
        for s, (w, n) in enumerate(zip(widths, blocks)):
            for i in range(n):
                layers.append(BasicBlock(c, w, 2 if (i == 0 and s > 0) else 1))
                c = w
        self.layers = nn.ModuleList(layers)
        self.fc = nn.Linear(c, classes)
        self.checkpoint = False
        self.segments = "blocks"
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        if not self.checkpoint:
            for b in self.layers:
                x = b(x)
        else:
            # one block per segment, or ceil(sqrt(n)) blocks per segment
            size = math.ceil(math.sqrt(len(self.layers))) if self.segments == "sqrt" else 1
            for i in range(0, len(self.layers), size):
                seg = nn.Sequential(*self.layers[i:i + size])
                x = checkpoint(seg, x, use_reentrant=False)
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


MODELS = {
    "resnet20": ((1, 28, 28), lambda: ResNet(1, 10, [16, 32, 64], [3, 3, 3])),
    "resnet18": ((3, 32, 32), lambda: ResNet(3, 10, [64, 128, 256, 512], [2, 2, 2, 2])),
    "resnet1202": ((1, 28, 28), lambda: ResNet(1, 10, [16, 32, 64], [200, 200, 200])),
    "mlp": ((1, 28, 28), lambda: nn.Sequential(nn.Flatten(), nn.Linear(784, 256), nn.ReLU(),
                                                nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))),
}
# Each configuration: AMP, checkpointing ("light": a GPT's blocks by gpt.light_contexts), AMP's dtype
# where the name gives it (else --amp-dtype), and whether what the backward keeps goes to page-locked host
# memory (torch.autograd.graph.save_on_cpu: with checkpointing, the checkpoints' inputs), the harness's
# "+offload".
CONFIGS = {"fp32": (False, False, None, False), "amp": (True, False, None, False), "bf16": (True, False, "bf16", False),
           "f16": (True, False, "f16", False), "checkpoint": (False, True, None, False),
           "checkpoint+offload": (False, True, None, True), "amp+checkpoint": (True, True, None, False),
           "bf16+checkpoint": (True, True, "bf16", False), "f16+checkpoint": (True, True, "f16", False),
           "amp+checkpoint+offload": (True, True, None, True), "bf16+checkpoint+offload": (True, True, "bf16", True),
           "f16+checkpoint+offload": (True, True, "f16", True), "checkpoint-light": (False, "light", None, False),
           "amp+checkpoint-light": (True, "light", None, False), "bf16+checkpoint-light": (True, "light", "bf16", False),
           "f16+checkpoint-light": (True, "light", "f16", False)}


def bench(model_name, batch, config, warmup, steps, device, amp_dtype, lm=None, compiled=False):
    """Times one spec's training steps; lm is a language model's shape and recipe (None: a CNN or the MLP)."""
    amp, ckpt, named, offload = CONFIGS[config]
    kind = torch.device(device).type
    dtype = torch.bfloat16 if (named or amp_dtype) == "bf16" else torch.float16
    scaler = torch.amp.GradScaler(kind, enabled=amp and dtype == torch.float16)
    torch.manual_seed(1)
    if lm is None:
        shape, build = MODELS[model_name]
        model = build().to(device)
        if ckpt:
            model.checkpoint = True
            if model_name == "resnet1202":
                model.segments = "sqrt"
        lr = 0.01
        opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, weight_decay=5e-4, nesterov=True)
        x = torch.randn(batch, *shape, device=device)
        y = torch.randint(0, 10, (batch,), device=device)
        fwd = torch.compile(model, mode="reduce-overhead") if compiled else model

        def loss():
            return F.cross_entropy(fwd(x), y)
    else:
        model = gpt.GPT(lm["layers"], lm["heads"], lm["width"], lm["vocab"], lm["context"], lm["dropout"], ckpt).to(device)
        lr = lm["lr"]
        recipe = argparse.Namespace(lr=lr, beta2=lm["beta2"], wd=lm["wd"])
        opt = gpt.optimizer(model, recipe, fused=kind == "cuda")
        x = torch.randint(0, lm["vocab"], (batch, lm["context"]), device=device)
        y = torch.randint(0, lm["vocab"], (batch, lm["context"]), device=device)
        fwd = torch.compile(model) if compiled else model

        def loss():
            return fwd(x, y)

    def step():
        for g in opt.param_groups:
            g["lr"] = lr  # set every step, as a schedule does
        saved = torch.autograd.graph.save_on_cpu(pin_memory=True) if offload else contextlib.nullcontext()
        with torch.autocast(kind, dtype=dtype, enabled=amp), saved:
            l = loss()
        scaler.scale(l).backward()
        if lm is not None and lm["clip"] > 0:
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(model.parameters(), lm["clip"])
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)

    cuda = kind == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    t0 = time.perf_counter()
    for _ in range(warmup):
        step()
    sync()
    warm_s = time.perf_counter() - t0
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        sync()
        times.append((time.perf_counter() - t0) * 1e3)
    med = statistics.median(times)
    name = torch.cuda.get_device_name() if cuda else f"{torch.get_num_threads()} threads"
    result = dict(engine="pytorch-compile" if compiled else "pytorch", model=model_name, batch=batch, config=config,
                  device=f"{device} ({name})", steps=steps, median_ms=med, img_per_s=batch / (med / 1e3),
                  peak_allocated=torch.cuda.max_memory_allocated() if cuda else 0,
                  peak_reserved=torch.cuda.max_memory_reserved() if cuda else 0,
                  saving_vs_fp32=0.0, overhead_vs_fp32=0.0)
    if compiled:
        result["compile_seconds"] = warm_s
    del model, fwd, opt, scaler, x, y
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
    return result


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--specs", nargs="+", default=["resnet20:256,1024", "resnet18:256", "mlp:256"],
                    help="model:batch[,batch...]")
    ap.add_argument("--configs", default="fp32,amp,checkpoint,amp+checkpoint")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--compile-configs", default="", help="configurations also run under torch.compile (comma separated)")
    ap.add_argument("--compile-warmup", type=int, default=10, help="untimed steps under torch.compile (they compile)")
    ap.add_argument("--out", help="write the JSON here instead of stdout")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--threads", type=int, default=0, help="on the CPU, intra-op threads (0: PyTorch's default)")
    ap.add_argument("--amp-dtype", default="f16", choices=["f16", "bf16"], help="what the amp configurations compute in")
    ap.add_argument("--lm", default="{}", help="the language models among --specs, as JSON: {name: {layers, heads, width, "
                    "vocab, context, dropout, lr, beta2, wd, clip}}")
    args = ap.parse_args()
    lms = json.loads(args.lm)
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("ref.py: PyTorch sees no CUDA device")
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = True  # PyTorch's default
    torch.backends.cuda.matmul.allow_tf32 = False  # PyTorch's default
    results = []
    for spec in args.specs:
        name, batches = spec.split(":")
        for b in batches.split(","):
            for c in args.configs.split(","):
                if c not in CONFIGS:
                    sys.exit(f"ref.py: unknown config {c}")
                if CONFIGS[c][1] and name == "mlp":
                    continue
                if name not in MODELS and name not in lms:
                    sys.exit(f"ref.py: unknown model {name}")
                lm = lms.get(name)
                try:
                    r = bench(name, int(b), c, args.warmup, args.steps, args.device, args.amp_dtype, lm)
                except RuntimeError as e:  # e.g. an autocast dtype this device does not support
                    print(f"pytorch {name} batch {b} {c}: failed: {e}", file=sys.stderr, flush=True)
                    continue
                print(f"pytorch {name} batch {b} {c}: {r['median_ms']:.2f} ms, {r['peak_allocated'] / 2**20:.1f} MiB",
                      file=sys.stderr, flush=True)
                results.append(r)
                if c in args.compile_configs.split(","):
                    r = bench(name, int(b), c, args.compile_warmup, args.steps, args.device, args.amp_dtype, lm,
                              compiled=True)
                    print(f"pytorch-compile {name} batch {b} {c}: {r['median_ms']:.2f} ms, "
                          f"{r['peak_allocated'] / 2**20:.1f} MiB, compiled in {r['compile_seconds']:.0f} s",
                          file=sys.stderr, flush=True)
                    results.append(r)
    out = json.dumps({"pytorch": torch.__version__, "results": results}, indent=1)
    if args.out:
        with open(args.out, "w") as f:
            f.write(out)
    else:
        print(out)


if __name__ == "__main__":
    main()
