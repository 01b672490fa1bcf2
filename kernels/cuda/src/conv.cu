// Convolution by im2col and cuBLAS. For a chunk of nb images, im2col gathers
// the input under every filter tap (c, r, s) and output pixel l into a column
// matrix; the layout is given by two strides, so the same kernel writes
// per-image (CRS × L) blocks for the forward and backward-data products, and
// one (CRS × nb·L) matrix for the backward-filter product.

template <typename T>
__device__ void im2col(int nb, int C, int H, int W, int R, int S, int sh, int sw, int ph, int pw, int OH, int OW,
                       const T* x, T* col, i64 sN, i64 sCRS) {
    int L = OH * OW, CRS = C * R * S;
    GRID_STRIDE(i, (i64)nb * CRS * L) {
        int l = (int)(i % L);
        i64 t = i / L;
        int crs = (int)(t % CRS), n = (int)(t / CRS);
        int s = crs % S, r = (crs / S) % R, c = crs / (R * S);
        int ih = (l / OW) * sh - ph + r, iw = (l % OW) * sw - pw + s;
        T v{};
        if (ih >= 0 && ih < H && iw >= 0 && iw < W) v = x[((i64)(n * C + c) * H + ih) * W + iw];
        col[n * sN + crs * sCRS + l] = v;
    }
}

// col2im, as a gather: each input pixel sums the column entries of the taps
// that read it. No atomics, so the result is deterministic.
template <typename T>
__device__ void col2im(int nb, int C, int H, int W, int R, int S, int sh, int sw, int ph, int pw, int OH, int OW,
                       const T* col, T* dx, i64 sN, i64 sCRS) {
    GRID_STRIDE(i, (i64)nb * C * H * W) {
        int iw = (int)(i % W), ih = (int)((i / W) % H), c = (int)((i / ((i64)H * W)) % C), n = (int)(i / ((i64)C * H * W));
        float acc = 0.f;
        for (int r = 0; r < R; r++) {
            int a = ih + ph - r;
            if (a < 0 || a % sh) continue;
            int oh = a / sh;
            if (oh >= OH) continue;
            for (int s = 0; s < S; s++) {
                int b = iw + pw - s;
                if (b < 0 || b % sw) continue;
                int ow = b / sw;
                if (ow >= OW) continue;
                acc += ld(col, n * sN + (i64)((c * R + r) * S + s) * sCRS + oh * OW + ow);
            }
        }
        st(dx, i, acc);
    }
}

// nkl_to_knl rearranges a (nb, K, L) array as (K, nb·L).
template <typename T>
__device__ void nkl_to_knl(int nb, int K, int L, const T* x, T* y) {
    GRID_STRIDE(i, (i64)nb * K * L) {
        int l = (int)(i % L), k = (int)((i / L) % K), n = (int)(i / ((i64)K * L));
        y[((i64)k * nb + n) * L + l] = x[i];
    }
}

// transpose swaps the inner axes of an outer×rows×cols array: a block of
// 32×8 threads moves a 32×32 tile (blockIdx.x: its place among the
// tiles) through shared memory, padded a column against bank conflicts,
// so that both its reads and its writes are coalesced; blockIdx.y strides
// over outer.
template <typename T>
__device__ void transpose(int outer, int rows, int cols, const T* x, T* y) {
    __shared__ T tile[32][33];
    int ct = (cols + 31) / 32, r0 = blockIdx.x / ct * 32, c0 = blockIdx.x % ct * 32;
    int tx = threadIdx.x % 32, ty = threadIdx.x / 32;
    for (int o = blockIdx.y; o < outer; o += gridDim.y) {
        i64 base = (i64)o * rows * cols;
        for (int i = ty; i < 32; i += 8) {
            int r = r0 + i, c = c0 + tx;
            if (r < rows && c < cols) tile[i][tx] = x[base + (i64)r * cols + c];
        }
        __syncthreads();
        for (int i = ty; i < 32; i += 8) {
            int c = c0 + i, r = r0 + tx;
            if (r < rows && c < cols) y[base + (i64)c * rows + r] = tile[tx][i];
        }
        __syncthreads();
    }
}

#define CONV(T, S)                                                                                              \
    extern "C" __global__ void im2col_##S(int nb, int C, int H, int W, int R, int S_, int sh, int sw, int ph,  \
                                          int pw, int OH, int OW, const T* x, T* col, i64 sN, i64 sCRS) {     \
        kernel_entry();                                                                                       \
        im2col(nb, C, H, W, R, S_, sh, sw, ph, pw, OH, OW, x, col, sN, sCRS);                                 \
    }                                                                                                          \
    extern "C" __global__ void col2im_##S(int nb, int C, int H, int W, int R, int S_, int sh, int sw, int ph,  \
                                          int pw, int OH, int OW, const T* col, T* dx, i64 sN, i64 sCRS) {    \
        kernel_entry();                                                                                       \
        col2im(nb, C, H, W, R, S_, sh, sw, ph, pw, OH, OW, col, dx, sN, sCRS);                                \
    }                                                                                                          \
    extern "C" __global__ void nkl_to_knl_##S(int nb, int K, int L, const T* x, T* y) {                        \
        kernel_entry();                                                                                        \
        nkl_to_knl(nb, K, L, x, y);                                                                            \
    }                                                                                                          \
    extern "C" __global__ void transpose_##S(int outer, int rows, int cols, const T* x, T* y) {                \
        kernel_entry();                                                                                        \
        transpose(outer, rows, cols, x, y);                                                                    \
    }
FOR_TYPES(CONV)
