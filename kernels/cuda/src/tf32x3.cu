// tf32x3_split writes the TF32 parts of F32 matrices for a product run as
// three TF32 ones (Note [F32 products as three TF32 ones]): batch matrices
// of rows × cols at a row stride of ld, stride apart, each into 3·rows·cols
// floats of out, its parts in the order small_mask gives (bit p set: part
// p is the small one, else the big one), side by side within each row
// (stacked 0: rows of 3·cols) or one under the other (stacked 1: three
// rows × cols blocks). Blocks stride over the rows, threads along them, four
// columns at a time where vec4 (cols, ld, stride and x multiples of four
// floats).
template <int V>
__device__ void tf32x3_split_rows(int batch, int rows, int cols, int ld, i64 stride, const float* x, float* out,
                                  int stacked, int small_mask) {
    for (i64 br = blockIdx.x; br < (i64)batch * rows; br += gridDim.x) {
        i64 m = br / rows;
        int r = (int)(br % rows);
        const float* src = x + m * stride + (i64)r * ld;
        float* dst = out + m * 3 * (i64)rows * cols;
        i64 part = stacked ? (i64)rows * cols : cols; // from one part's row to the next's
        dst += stacked ? (i64)r * cols : (i64)r * 3 * cols;
        for (int j = threadIdx.x * V; j < cols; j += blockDim.x * V) {
            float v[V];
            unsigned big[V], small[V];
            if (V == 4) {
                ld4(src, j, v);
            } else {
                v[0] = src[j];
            }
            for (int e = 0; e < V; e++) tf32_split(v[e], big[e], small[e]);
            for (int p = 0; p < 3; p++) {
                const unsigned* w = (small_mask >> p & 1) ? small : big;
                if (V == 4) {
                    *(uint4*)(dst + p * part + j) = make_uint4(w[0], w[1], w[2], w[3]);
                } else {
                    dst[p * part + j] = __uint_as_float(w[0]);
                }
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
