// tf32x3_split writes the TF32 parts of F32 matrices for products run as
// three TF32 ones (Note [F32 products as three TF32 ones]), for two
// operands in one launch (an empty one has no rows). Each X3Part is Batch
// matrices of Rows × Cols at a row stride of Ld, Stride apart, each written
// into 3·Rows·Cols floats of Out, its parts in the order SmallMask gives
// (bit p set: part p is the small one, else the big one), side by side
// within each row (Stacked 0: rows of 3·Cols) or one under the other
// (Stacked 1: three Rows × Cols blocks). Threads stride over both
// operands' elements, four at a time where Vec4 (Cols, Ld, Stride and X
// multiples of four floats).
template <int V>
__device__ void tf32x3_split_at(const X3Part& o, i64 i) {
    i64 row_vecs = o.Cols / V, br = i / row_vecs, m = br / o.Rows;
    int r = (int)(br - m * o.Rows), j = (int)(i - br * row_vecs) * V;
    float v[V];
    unsigned big[V], small[V];
    if (V == 4) {
        ld4(o.X + m * o.Stride + (i64)r * o.Ld, j, v);
    } else {
        v[0] = o.X[m * o.Stride + (i64)r * o.Ld + j];
    }
    for (int e = 0; e < V; e++) tf32_split(v[e], big[e], small[e]);
    float* dst = o.Out + m * 3 * (i64)o.Rows * o.Cols + (o.Stacked ? (i64)r * o.Cols : (i64)r * 3 * o.Cols) + j;
    i64 part = o.Stacked ? (i64)o.Rows * o.Cols : o.Cols; // from one part's element to the next's
    for (int p = 0; p < 3; p++) {
        const unsigned* w = (o.SmallMask >> p & 1) ? small : big;
        if (V == 4) {
            *(uint4*)(dst + p * part) = make_uint4(w[0], w[1], w[2], w[3]);
        } else {
            dst[p * part] = __uint_as_float(w[0]);
        }
    }
}
__device__ __forceinline__ i64 tf32x3_vecs(const X3Part& o) {
    return (i64)o.Batch * o.Rows * o.Cols / (o.Vec4 ? 4 : 1);
}
extern "C" __global__ void tf32x3_split(X3Part a, X3Part b) {
    kernel_entry();
    i64 na = tf32x3_vecs(a), n = na + tf32x3_vecs(b);
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x) {
        const X3Part& o = i < na ? a : b;
        i64 k = i < na ? i : i - na;
        if (o.Vec4) {
            tf32x3_split_at<4>(o, k);
        } else {
            tf32x3_split_at<1>(o, k);
        }
    }
}
