package cuda

import (
	"fmt"
	"sync"
)

// cuBLAS, bound at run time: handle management and the two GEMM entry points
// leangrad uses (cublasGemmEx and its strided-batched form).

const (
	cudaR32F                 = 0
	cudaR16F                 = 2
	cublasComputeF32         = 68
	cublasComputeF32FastTF32 = 77
	cublasGemmDefault        = ^uintptr(0) // CUBLAS_GEMM_DEFAULT = -1
	cublasOpN                = 0
	cublasOpT                = 1
	cublasDefaultMath        = 0
	cublasTF32TensorOpMath   = 3
)

type cublasAPI struct {
	lib *library

	cublasCreate, cublasDestroy, cublasSetStream, cublasSetMathMode, cublasSetWorkspace,
	cublasGemmEx, cublasGemmStridedBatchedEx uintptr
}

var (
	cublasOnce sync.Once
	cublas     *cublasAPI
	cublasErr  error
)

func loadCUBLAS() (*cublasAPI, error) {
	cublasOnce.Do(func() {
		lib, err := openLibrary("cuBLAS (libcublas, from the CUDA toolkit or pip's nvidia-cublas)",
			[]string{"libcublasLt.so.*"}, "libcublas.so.13", "libcublas.so.12", "libcublas.so")
		if err != nil {
			cublasErr = err
			return
		}
		c := &cublasAPI{lib: lib}
		if err := lib.bind(map[string]*uintptr{
			"cublasCreate_v2": &c.cublasCreate, "cublasDestroy_v2": &c.cublasDestroy,
			"cublasSetStream_v2": &c.cublasSetStream, "cublasSetMathMode": &c.cublasSetMathMode,
			"cublasSetWorkspace_v2": &c.cublasSetWorkspace, "cublasGemmEx": &c.cublasGemmEx,
			"cublasGemmStridedBatchedEx": &c.cublasGemmStridedBatchedEx,
		}); err != nil {
			cublasErr = err
			return
		}
		cublas = c
	})
	return cublas, cublasErr
}

func (c *cublasAPI) check(what string, r uintptr) error {
	if r == 0 {
		return nil
	}
	names := map[uintptr]string{1: "CUBLAS_STATUS_NOT_INITIALIZED", 3: "CUBLAS_STATUS_ALLOC_FAILED",
		7: "CUBLAS_STATUS_INVALID_VALUE", 8: "CUBLAS_STATUS_ARCH_MISMATCH", 11: "CUBLAS_STATUS_MAPPING_ERROR",
		13: "CUBLAS_STATUS_EXECUTION_FAILED", 14: "CUBLAS_STATUS_INTERNAL_ERROR", 15: "CUBLAS_STATUS_NOT_SUPPORTED"}
	name := names[r]
	if name == "" {
		name = fmt.Sprintf("CUBLAS_STATUS_%d", r)
	}
	return &Error{Call: what, Code: int(r), Name: name}
}

func (c *cublasAPI) must(what string, r uintptr) {
	if err := c.check(what, r); err != nil {
		panic(err)
	}
}
