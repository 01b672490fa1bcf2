// tf32x3_split writes the TF32 parts of F32 matrices for a product run as
// three TF32 ones (Note [F32 products as three TF32 ones]): batch matrices
// of rows × cols at a row stride of ld, stride apart, each into 3·rows·cols
// floats of out, its parts in the order small_mask gives (bit p set: part
// p is the small one, else the big one), side by side within each row
// (stacked 0: rows of 3·cols) or one under the other (stacked 1: three
// rows × cols blocks). Threads stride over the elements, four at a time
// where vec4 (cols, ld, stride and x multiples of four floats).
template <int V>
__device__ void tf32x3_split_rows(int batch, int rows, int cols, int ld, i64 stride, const float* x, float* out,
                                  int stacked, int small_mask) {
    i64 row_vecs = cols / V, n = (i64)batch * rows * row_vecs;
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x) {
        i64 br = i / row_vecs, m = br / rows;
        int r = (int)(br - m * rows), j = (int)(i - br * row_vecs) * V;
        float v[V];
        unsigned big[V], small[V];
        if (V == 4) {
            ld4(x + m * stride + (i64)r * ld, j, v);
        } else {
            v[0] = x[m * stride + (i64)r * ld + j];
        }
        for (int e = 0; e < V; e++) tf32_split(v[e], big[e], small[e]);
        // Part p of the element: rows × cols blocks one under the other, or
        // side by side in rows of 3·cols.
        float* dst = out + m * 3 * (i64)rows * cols + (stacked ? (i64)r * cols : (i64)r * 3 * cols) + j;
        i64 part = stacked ? (i64)rows * cols : cols;
        for (int p = 0; p < 3; p++) {
            const unsigned* w = (small_mask >> p & 1) ? small : big;
            if (V == 4) {
                *(uint4*)(dst + p * part) = make_uint4(w[0], w[1], w[2], w[3]);
            } else {
                dst[p * part] = __uint_as_float(w[0]);
            }
        }
    }
}
extern "C" __global__ void tf32x3_split(int batch, int rows, int cols, int ld, i64 stride, const float* x, float* out,
                                        int stacked, int small_mask, int vec4) {
    kernel_entry();
    if (vec4) {
        tf32x3_split_rows<4>(batch, rows, cols, ld, stride, x, out, stacked, small_mask);
    } else {
        tf32x3_split_rows<1>(batch, rows, cols, ld, stride, x, out, stacked, small_mask);
    }
}
