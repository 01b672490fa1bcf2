// Package cuda is leangrad's CUDA backend. It binds the CUDA driver
// (libcuda.so.1), cuBLAS, NVRTC and, when installed, cuDNN 9 at run time
// with purego: no cgo, no CUDA headers at build time, and the package
// compiles (and its tests skip) on machines without CUDA.
//
// Kernels are CUDA C (src/*.cu, embedded), compiled by NVRTC for the device's
// compute capability on first use and cached on disk, keyed by the source's
// hash, the architecture and the NVRTC version. GEMMs go to cuBLAS
// (cublasGemmEx: F16 operands on tensor cores with F32 accumulation, F32 in
// F32 unless Options.MatmulTF32). Convolutions go to cuDNN (cudnn.go; F32
// may use TF32 unless Options.StrictConvF32, as in PyTorch), or to im2col
// plus cuBLAS without it (conv.go).
//
// Device memory comes from a memory.Allocator over cuMemAlloc, with the same
// statistics, summary and timeline as on the CPU; host transfers go through
// pinned staging buffers; all work is queued on one stream, which can be
// captured into a CUDA graph and replayed (graph.go).
package cuda
