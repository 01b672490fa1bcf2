package cuda

import (
	"fmt"
	"unsafe"
)

// cuBLAS, bound at run time: handle management and the two GEMM entry points
// leangrad uses (cublasGemmEx and its strided-batched form).

type cublasStatus uintptr

const (
	cudaR32F                 = 0
	cudaR16F                 = 2
	cudaR16BF                = 14
	cublasComputeF32         = 68
	cublasComputeF32FastTF32 = 77
	cublasGemmDefault        = -1 // CUBLAS_GEMM_DEFAULT
	cublasOpN                = 0
	cublasOpT                = 1
	cublasDefaultMath        = 0
	cublasTF32TensorOpMath   = 3
)

// cublasAPI is libcublas's functions; see Note [typed bindings].
type cublasAPI struct {
	lib *library

	create       func(handle unsafe.Pointer) cublasStatus
	destroy      func(handle uintptr) cublasStatus
	setStream    func(handle, stream uintptr) cublasStatus
	setMathMode  func(handle uintptr, mode int32) cublasStatus
	setWorkspace func(handle, ws uintptr, size uintptr) cublasStatus
	// gemmEx and gemmStridedBatchedEx take, after the handle: the two
	// operations, m, n, k, α, A, its type, lda, (its stride), B, its type,
	// ldb, (its stride), β, C, its type, ldc, (its stride, the batch), the
	// compute type and the algorithm.
	gemmEx func(handle uintptr, opA, opB int32, m, n, k int32, alpha unsafe.Pointer,
		a uintptr, aType int32, lda int32, b uintptr, bType int32, ldb int32, beta unsafe.Pointer,
		c uintptr, cType int32, ldc int32, compute int32, algo int32) cublasStatus
	gemmStridedBatchedEx func(handle uintptr, opA, opB int32, m, n, k int32, alpha unsafe.Pointer,
		a uintptr, aType int32, lda int32, strideA int64, b uintptr, bType int32, ldb int32, strideB int64,
		beta unsafe.Pointer, c uintptr, cType int32, ldc int32, strideC int64, batch int32, compute int32, algo int32) cublasStatus
}

func (c *cublasAPI) symbols() []symbol {
	return []symbol{
		fn1("cublasCreate_v2", &c.create), fn1("cublasDestroy_v2", &c.destroy),
		fn2("cublasSetStream_v2", &c.setStream), fn2("cublasSetMathMode", &c.setMathMode),
		fn3("cublasSetWorkspace_v2", &c.setWorkspace), fn19("cublasGemmEx", &c.gemmEx),
		fn23("cublasGemmStridedBatchedEx", &c.gemmStridedBatchedEx),
	}
}

func (c *cublasAPI) init(lib *library) error { c.lib = lib; return nil }

var cublasLib = loader[*cublasAPI]{what: "cuBLAS (libcublas, from the CUDA toolkit or pip's nvidia-cublas)",
	names: []string{"libcublas.so.13", "libcublas.so.12", "libcublas.so"}, companions: []string{"libcublasLt.so.*"},
	constructor: func() *cublasAPI { return new(cublasAPI) }}

func loadCUBLAS() (*cublasAPI, error) { return cublasLib.load() }

func (c *cublasAPI) check(what string, r cublasStatus) error {
	if r == 0 {
		return nil
	}
	names := map[cublasStatus]string{1: "CUBLAS_STATUS_NOT_INITIALIZED", 3: "CUBLAS_STATUS_ALLOC_FAILED",
		7: "CUBLAS_STATUS_INVALID_VALUE", 8: "CUBLAS_STATUS_ARCH_MISMATCH", 11: "CUBLAS_STATUS_MAPPING_ERROR",
		13: "CUBLAS_STATUS_EXECUTION_FAILED", 14: "CUBLAS_STATUS_INTERNAL_ERROR", 15: "CUBLAS_STATUS_NOT_SUPPORTED"}
	name := names[r]
	if name == "" {
		name = fmt.Sprintf("CUBLAS_STATUS_%d", r)
	}
	return &Error{Call: what, Code: int(r), Name: name}
}

func (c *cublasAPI) must(what string, r cublasStatus) {
	if err := c.check(what, r); err != nil {
		panic(err)
	}
}
