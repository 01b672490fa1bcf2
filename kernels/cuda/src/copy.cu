// Copies and conversions: casts between storage types (cast_S_D), the
// transpose of a layout (channels first to last and back), and the
// multi-tensor copies, casts and accumulations that move a list of
// tensors in one launch (struct TensorList, optim.cu's header says how).

// cast4 converts n floats between storage types, four at a time where the
// pointers are aligned for it.
template <typename S, typename D> __device__ void cast4(i64 n, const S* x, D* y) {
    if (vec4(x) && vec4(y)) {
        GRID_STRIDE(j, n / 4) {
            float v[4];
            ld4(x, 4 * j, v);
            st4(y, 4 * j, v);
        }
        for (i64 i = n / 4 * 4 + (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x) st(y, i, ld(x, i));
        return;
    }
    GRID_STRIDE(i, n) st(y, i, ld(x, i));
}
extern "C" __global__ void cast_f32_f16(i64 n, const float* x, f16* y) { kernel_entry(); cast4(n, x, y); }
extern "C" __global__ void cast_f16_f32(i64 n, const f16* x, float* y) { kernel_entry(); cast4(n, x, y); }
extern "C" __global__ void cast_i32_f32(i64 n, const int* x, float* y) { kernel_entry(); GRID_STRIDE(i, n) y[i] = (float)x[i]; }
extern "C" __global__ void cast_f32_i32(i64 n, const float* x, int* y) { kernel_entry(); GRID_STRIDE(i, n) y[i] = (int)x[i]; }
extern "C" __global__ void cast_i32_f16(i64 n, const int* x, f16* y) { kernel_entry(); GRID_STRIDE(i, n) y[i] = f2h((float)x[i]); }
extern "C" __global__ void cast_f16_i32(i64 n, const f16* x, int* y) { kernel_entry(); GRID_STRIDE(i, n) y[i] = (int)h2f(x[i]); }
extern "C" __global__ void cast_f32_bf16(i64 n, const float* x, bf16* y) { kernel_entry(); cast4(n, x, y); }
extern "C" __global__ void cast_bf16_f32(i64 n, const bf16* x, float* y) { kernel_entry(); cast4(n, x, y); }
extern "C" __global__ void cast_i32_bf16(i64 n, const int* x, bf16* y) { kernel_entry(); GRID_STRIDE(i, n) y[i] = f2bf((float)x[i]); }
extern "C" __global__ void cast_bf16_i32(i64 n, const bf16* x, int* y) { kernel_entry(); GRID_STRIDE(i, n) y[i] = (int)bf2f(x[i]); }

// copy_multi copies list 1 into list 0.
extern "C" __global__ void copy_multi(TensorList L) {
    kernel_entry();
    MT_LOOP(L, t, i) { L.p[0][t][i] = L.p[1][t][i]; }
}

// cast_multi_S_D converts list 1 (storage type S) into list 0 (D), rounding
// as cast_S_D does; accumulate_multi_S adds list 1 (S), converted, into list
// 0 (float). The lists' pointers are typed float*: these read them as what
// they hold.
template <typename S, typename D> __device__ void cast_multi(const TensorList& L) {
    MT_LOOP(L, t, i) { st((D*)L.p[0][t], i, ld((const S*)L.p[1][t], i)); }
}
template <typename S> __device__ void accumulate_multi(const TensorList& L) {
    MT_LOOP(L, t, i) { L.p[0][t][i] += ld((const S*)L.p[1][t], i); }
}
extern "C" __global__ void cast_multi_f32_f16(TensorList L) { kernel_entry(); cast_multi<float, f16>(L); }
extern "C" __global__ void cast_multi_f32_bf16(TensorList L) { kernel_entry(); cast_multi<float, bf16>(L); }
extern "C" __global__ void cast_multi_f16_f32(TensorList L) { kernel_entry(); cast_multi<f16, float>(L); }
extern "C" __global__ void cast_multi_bf16_f32(TensorList L) { kernel_entry(); cast_multi<bf16, float>(L); }
extern "C" __global__ void accumulate_multi_f16(TensorList L) { kernel_entry(); accumulate_multi<f16>(L); }
extern "C" __global__ void accumulate_multi_bf16(TensorList L) { kernel_entry(); accumulate_multi<bf16>(L); }
