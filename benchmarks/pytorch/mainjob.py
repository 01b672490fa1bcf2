#!/usr/bin/env python3
"""PyTorch twin of leangrad's main job: ResNet-20 on Fashion-MNIST, its recipe.

The recipe of `train -model resnet -amp` (train.Config's defaults and
run.Job's loaders): ResNet-20 for 1x28x28 (ref.py's: 1x1 projection
shortcuts, Kaiming-normal convolutions by fan out, torch's default linear
and batch norm initialisation, which leangrad's are), 15 epochs of batch
128 with the last, smaller batch of each epoch kept; SGD with Nesterov
momentum 0.9 and weight decay 5e-4 on every parameter; a learning rate
rising linearly over the first epoch's steps to 0.1 (lr·(s+1)/warmup) then
a half cosine to 0 at the last step, set before each step; F16 autocast
with a GradScaler; each training image shifted by a random offset in
[-2, 2] in both directions (the uncovered pixels black) and flipped
horizontally with probability 1/2, then normalised by the training set's
mean and standard deviation; the test set evaluated after every epoch
with the running statistics. leangrad checkpoints its blocks in the main
job, which changes its memory, not its arithmetic; this twin does not
(torch.utils.checkpoint would update batch norm's running statistics a
second time in each recomputation).

    python3 mainjob.py --data .gpu/data/fashion-mnist --seed 1

Prints one JSON object: the seed, each epoch's test accuracy, the final one
and the training time.
"""
import argparse
import gzip
import json
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ref import MODELS  # noqa: E402


def idx(path):
    """An IDX file (gzipped or not) as a numpy array."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    dims = data[3]
    shape = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(dims)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)


def load(folder, split):
    def find(name):
        for n in (name + ".gz", name):
            if os.path.exists(os.path.join(folder, n)):
                return os.path.join(folder, n)
        raise SystemExit(f"{folder}: no {name}[.gz]")
    images = idx(find(f"{split}-images-idx3-ubyte"))
    labels = idx(find(f"{split}-labels-idx1-ubyte"))
    return torch.from_numpy(images.copy()).float().div_(255).unsqueeze(1), torch.from_numpy(labels.astype(np.int64))


def augment(x, pad, g, fill):
    """Random shifts in [-pad, pad] (uncovered pixels = fill) and horizontal flips, per image."""
    n, c, h, w = x.shape
    xp = F.pad(x, (pad, pad, pad, pad), value=fill)
    dy = torch.randint(-pad, pad + 1, (n,), device=x.device, generator=g)
    dx = torch.randint(-pad, pad + 1, (n,), device=x.device, generator=g)
    flip = torch.randint(0, 2, (n,), device=x.device, generator=g).bool()
    ys = torch.arange(h, device=x.device)[None, :] + dy[:, None] + pad  # n×h
    xs = torch.arange(w, device=x.device)[None, :]
    xs = torch.where(flip[:, None], w - 1 - xs, xs) + dx[:, None] + pad  # n×w
    rows = xp.gather(2, ys[:, None, :, None].expand(n, c, h, w + 2 * pad))
    return rows.gather(3, xs[:, None, None, :].expand(n, c, h, w))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", required=True, help="the folder of Fashion-MNIST's IDX files")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--epochs", type=int, default=15)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--lr", type=float, default=0.1)
    a = p.parse_args()
    dev = "cuda"
    torch.manual_seed(a.seed)
    torch.backends.cudnn.benchmark = True
    xtr, ytr = load(a.data, "train")
    xte, yte = load(a.data, "t10k")
    mean, std = xtr.mean().item(), xtr.std(unbiased=False).item()
    xtr, ytr = ((xtr - mean) / std).to(dev), ytr.to(dev)
    xte, yte = ((xte - mean) / std).to(dev), yte.to(dev)
    fill = (0 - mean) / std
    model = MODELS["resnet20"][1]().to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=0.9, weight_decay=5e-4, nesterov=True)
    scaler = torch.amp.GradScaler("cuda")
    g = torch.Generator(device=dev).manual_seed(a.seed)
    n = xtr.shape[0]
    per_epoch = math.ceil(n / a.batch)
    total, warmup = a.epochs * per_epoch, min(per_epoch, a.epochs * per_epoch // 10)
    step, accs = 0, []
    t0 = time.perf_counter()
    for epoch in range(a.epochs):
        model.train()
        order = torch.randperm(n, device=dev, generator=g)
        for b in range(per_epoch):
            idx_b = order[b * a.batch:(b + 1) * a.batch]
            x, y = augment(xtr[idx_b], 2, g, fill), ytr[idx_b]
            lr = a.lr * (step + 1) / warmup if step < warmup else a.lr * 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, total - warmup)))
            for pg in opt.param_groups:
                pg["lr"] = lr
            with torch.autocast("cuda", dtype=torch.float16):
                loss = F.cross_entropy(model(x), y)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            opt.zero_grad(set_to_none=True)
            step += 1
        model.eval()
        right = 0
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.float16):
            for i in range(0, xte.shape[0], 500):
                right += (model(xte[i:i + 500]).argmax(1) == yte[i:i + 500]).sum().item()
        accs.append(right / xte.shape[0])
        print(f"seed {a.seed} epoch {epoch + 1}: test accuracy {100 * accs[-1]:.2f}%", file=sys.stderr)
    torch.cuda.synchronize()
    print(json.dumps({"engine": "pytorch", "pytorch": torch.__version__, "seed": a.seed, "epochs": a.epochs,
                      "test_acc": accs[-1], "test_acc_per_epoch": accs, "train_seconds": time.perf_counter() - t0}))


if __name__ == "__main__":
    main()
