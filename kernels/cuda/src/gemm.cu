// Matrix products run through cuBLAS; what leangrad runs around them here
// is the epilogue of a product stored without one. Its own F32 products
// (three TF32 ones) are gemm_tf32x3.cu's.

// gemm_epilogue is kernels.Epilogue on a product stored without it, by
// cuBLAS or x3_gemm (Note [the fused epilogues]). Forward: pre = C + bias (F32 of cols,
// rounded to T, or null); with an op, aux = pre as stored and C = op(aux).
// Backward (grad): C = C·op′(aux). C and aux are rows × cols at a row
// stride of stride. Blocks stride over rows, threads along them.
template <typename T>
__device__ void gemm_epilogue(int rows, int cols, int stride, T* c, const float* bias, T* aux, int op, int grad) {
    for (int r = blockIdx.x; r < rows; r += gridDim.x) {
        i64 row = (i64)r * stride;
        for (int j = threadIdx.x; j < cols; j += blockDim.x) {
            float v = ld(c, row + j);
            if (grad) {
                v = unary_grad(op, v, ld(aux, row + j), 0.f);
            } else {
                if (bias) {
                    T bt;
                    st(&bt, 0, bias[j]);
                    v += ld(&bt, 0);
                }
                if (op) {
                    st(aux, row + j, v);
                    v = unary_f(op, ld(aux, row + j));
                }
            }
            st(c, row + j, v);
        }
    }
}
#define GEMM_EPILOGUE(T, S)                                                                                   \
    extern "C" __global__ void gemm_epilogue_##S(int rows, int cols, int stride, T* c, const float* bias, T* aux, \
                                                 int op, int grad) {                                          \
        kernel_entry();                                                                                       \
        gemm_epilogue(rows, cols, stride, c, bias, aux, op, grad);                                            \
    }
FOR_TYPES(GEMM_EPILOGUE)
