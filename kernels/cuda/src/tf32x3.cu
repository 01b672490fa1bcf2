// tf32x3_split writes the TF32 parts of F32 matrices for products run as
// three TF32 ones (Note [F32 products as three TF32 ones]), for two
// operands in one launch (an empty one has no rows). Each X3Part is Batch
// matrices of Rows × Cols at a row stride of Ld, Stride apart, each written
// into 3·Rows·Cols floats of Out, its parts in the order SmallMask gives
// (bit p set: part p is the small one, else the big one), side by side
// within each row (Stacked 0: rows of 3·Cols) or one under the other
// (Stacked 1: three Rows × Cols blocks). Blocks stride over both operands'
// rows, threads along them, four columns at a time where Vec4 (Cols, Ld,
// Stride and X multiples of four floats).
template <int V>
__device__ void tf32x3_split_row(X3Part o, i64 br) {
    i64 m = br / o.Rows;
    int r = (int)(br - m * o.Rows);
    const float* src = o.X + m * o.Stride + (i64)r * o.Ld;
    float* dst = o.Out + m * 3 * (i64)o.Rows * o.Cols + (o.Stacked ? (i64)r * o.Cols : (i64)r * 3 * o.Cols);
    i64 part = o.Stacked ? (i64)o.Rows * o.Cols : o.Cols; // from one part's row to the next's
    for (int j = threadIdx.x * V; j < o.Cols; j += blockDim.x * V) {
        float v[V];
        unsigned big[V], small[V];
        if (V == 4) {
            ld4(src, j, v);
        } else {
            v[0] = src[j];
        }
        for (int e = 0; e < V; e++) tf32_split(v[e], big[e], small[e]);
        for (int p = 0; p < 3; p++) {
            const unsigned* w = (o.SmallMask >> p & 1) ? small : big;
            if (V == 4) {
                *(uint4*)(dst + p * part + j) = make_uint4(w[0], w[1], w[2], w[3]);
            } else {
                dst[p * part + j] = __uint_as_float(w[0]);
            }
        }
    }
}
__device__ __forceinline__ void tf32x3_split_one(X3Part o, i64 br) {
    if (o.Vec4) {
        tf32x3_split_row<4>(o, br);
    } else {
        tf32x3_split_row<1>(o, br);
    }
}
extern "C" __global__ void tf32x3_split(X3Part a, X3Part b) {
    kernel_entry();
    i64 ra = (i64)a.Batch * a.Rows, rows = ra + (i64)b.Batch * b.Rows;
    for (i64 br = blockIdx.x; br < rows; br += gridDim.x) {
        if (br < ra) {
            tf32x3_split_one(a, br);
        } else {
            tf32x3_split_one(b, br - ra);
        }
    }
}
