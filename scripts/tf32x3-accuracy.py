"""F32 products as three TF32 ones, with PyTorch's cuBLAS on the GPU: relative errors against
float64 by inner size, whole and summed in chunks of K, beside strict F32 and one TF32 product; and
whether cuBLAS's TF32 products round F32 inputs or drop their low bits. (The numbers behind Note
[F32 products as three TF32 ones] in kernels/cuda/tf32x3.go.)

    python3 scripts/tf32x3-accuracy.py
"""
import torch

torch.manual_seed(0)
dev = "cuda"


def rna(x):  # round to TF32, to nearest, ties away (cvt.rna.tf32.f32)
    i = x.view(torch.int32)
    return ((i + 0x1000) & ~0x1FFF).view(torch.float32)


def trunc(x):  # TF32 by dropping the low 13 bits
    return (x.view(torch.int32) & ~0x1FFF).view(torch.float32)


def mm(a, b, tf32):
    torch.backends.cuda.matmul.allow_tf32 = tf32
    return a @ b


def x3(a, b, chunk=None, bt=False):
    ab, bb = rna(a), rna(b)
    as_, bs = rna(a - ab), rna(b - bb)
    k = a.shape[1]
    chunk = chunk or k
    c = torch.zeros(a.shape[0], b.shape[1], device=dev)
    for k0 in range(0, k, chunk):
        s = slice(k0, k0 + chunk)
        a3 = torch.cat([as_[:, s], ab[:, s], ab[:, s]], 1)
        b3 = torch.cat([bb[s], bs[s], bb[s]], 0)
        c += mm(a3, b3.t().contiguous().t(), True) if bt else mm(a3, b3, True)
    return c


# Rounding or truncation: 1 + 2⁻¹¹ + 2⁻¹² is 1 + 2⁻¹⁰ rounded, 1 truncated.
a = torch.zeros(16, 16, device=dev)
a[:, 0] = 1 + 2**-11 + 2**-12
one = torch.ones(16, 16, device=dev)
v = mm(a, one, True)[0, 0].item()
print(f"cuBLAS TF32 product of 1+2^-11+2^-12 by 1: {v!r} ({'rounded' if v > 1 else 'truncated'})")

for m, n, k in [(256, 384, 768), (256, 384, 3072), (768, 3072, 16384), (16384, 768, 3072)]:
    a = torch.randn(m, k, device=dev)
    b = torch.randn(k, n, device=dev)
    ref = a.double() @ b.double()

    def err(c):
        return ((c.double() - ref).norm() / ref.norm()).item()

    row = {"strict": err(mm(a, b, False)), "tf32": err(mm(a, b, True)), "x3": err(x3(a, b)), "x3 bᵀ": err(x3(a, b, bt=True))}
    for ch in (256, 1024, 2048, 4096):
        if ch < k:
            row[f"x3/{ch}"] = err(x3(a, b, ch))
    print(f"{m}x{n}x{k}: " + ", ".join(f"{name} {e:.2g}" for name, e in row.items()))
