// Package cuda is leangrad's CUDA backend. It binds the CUDA driver
// (libcuda.so.1), NVRTC, cuBLAS and, when installed, cuDNN 9 and NCCL at run
// time with purego: no cgo, no CUDA headers at build time, and the package
// compiles (and its tests skip) on machines without CUDA. Each C function
// is a typed Go function value, bound by its library's loader (lib.go, Note
// [typed bindings]).
//
// Kernels are CUDA C (src/*.cu, embedded) after a prelude generated from Go
// (source.go: the block size, the storage types, the elementwise ops'
// switches from package kernels' tables, the structs passed by value),
// compiled by NVRTC for the device's compute capability on first use and
// cached on disk, keyed by the source's hash, the architecture and the NVRTC
// version. Every kernel is declared in Go with the struct of its parameters
// and launched through it (launch.go, Note [typed launches]); a CPU test
// holds each declaration to the compiled kernel. GEMMs go to cuBLAS and
// cuBLASLt (16-bit operands on tensor cores with F32 accumulation), and F32
// ones, by default (Options.MatmulF32 is F32TF32x3), to leangrad's own
// kernels as three TF32 products at F32's accuracy (gemm_tf32x3.go), else to
// cuBLAS, strictly or as one TF32 product. Convolutions go to cuDNN (cudnn.go; F32
// may use TF32 unless Options.StrictConvF32, as in PyTorch), or to im2col
// plus cuBLAS without it (conv.go). F32 attention, forward and backward,
// multiplies on tensor cores as three TF32 products each, at about F32's
// accuracy (src/transformer_flash32.cu), as PyTorch's F32 attention does.
//
// Device memory comes from a memory.Allocator over cuMemAlloc, with the same
// statistics, summary and timeline as on the CPU; host transfers go through
// pinned staging buffers; all work is queued on one stream, which can be
// captured into a CUDA graph and replayed (graph.go); NCCL's collectives run
// on it or on a side stream joined back with events (nccl.go).
package cuda
