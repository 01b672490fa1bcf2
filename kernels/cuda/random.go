package cuda

import (
	"fmt"

	"github.com/leangrad/leangrad/kernels"
)

// The random operations (kernels.RandomOps; random.cu).

type randArgs struct {
	N            int64
	Seed, Offset uint64
	Base         uintptr
	A, B         float32 // lo and hi, or mean and std
	Y            uintptr
}

type dropoutArgs struct {
	N            int64
	Seed, Offset uint64
	Base         uintptr
	P            float32
	X, Y         uintptr
}

var (
	kUniform = declareTyped[randArgs]("uniform")
	kNormal  = declareTyped[randArgs]("normal")
	kDropout = declareTyped[dropoutArgs]("dropout")
)

// Uniform fills dst from the Philox state g.
func (b *Backend) Uniform(dst kernels.Buf, lo, hi float32, g kernels.Philox) {
	s := floatType("uniform", dst)
	b.enter()
	defer b.exit()
	kUniform.launch(b, s, b.elems(int64(dst.N+3)/4), randArgs{int64(dst.N), g.Seed, g.Offset, basePtr(g), lo, hi, ptrOf(dst)})
}

// Normal fills dst from the Philox state g.
func (b *Backend) Normal(dst kernels.Buf, mean, std float32, g kernels.Philox) {
	s := floatType("normal", dst)
	b.enter()
	defer b.exit()
	kNormal.launch(b, s, b.elems(int64(dst.N+3)/4), randArgs{int64(dst.N), g.Seed, g.Offset, basePtr(g), mean, std, ptrOf(dst)})
}

// Dropout applies the mask drawn from g.
func (b *Backend) Dropout(dst, x kernels.Buf, p float32, g kernels.Philox) {
	if p < 0 || p >= 1 {
		panic(fmt.Sprintf("cuda: dropout probability %v outside [0, 1)", p))
	}
	kernels.CheckLen("dropout", x.N, dst)
	s := floatType("dropout", dst, x)
	b.enter()
	defer b.exit()
	kDropout.launch(b, s, b.elems(int64(x.N+3)/4), dropoutArgs{int64(x.N), g.Seed, g.Offset, basePtr(g), p, ptrOf(x), ptrOf(dst)})
}

// basePtr is the device address of g's Base counter, or 0.
func basePtr(g kernels.Philox) uintptr {
	if !g.Base.Valid() {
		return 0
	}
	kernels.CheckCounter("philox base", g.Base)
	return ptrOf(g.Base)
}

// The sampling kernel (random.cu): a block of sampleThreads threads a row.
type sampleArgs struct {
	V, TopN                  int32
	Logits, Temperature      uintptr
	TopK, TopP, Seeds, Steps uintptr
	Tokens, Logprobs         uintptr
	TopTokens, TopLogprobs   uintptr
}

var kSample = declareTyped[sampleArgs]("sample")

// sampleThreads is the sampling kernel's block: each thread takes a
// contiguous stretch of the row for the draw's scan.
const sampleThreads = 512

// Sample draws each row's token in a block of its own.
func (b *Backend) Sample(p kernels.SampleParams, logits, temperature, topK, topP, seeds, steps, tokens, logprobs, topTokens, topLogprobs kernels.Buf) {
	kernels.CheckSample(p, logits, temperature, topK, topP, seeds, steps, tokens, logprobs, topTokens, topLogprobs)
	s := floatType("sample", logits)
	b.enter()
	defer b.exit()
	kSample.launch(b, s, dims{gx: uint32(p.Rows), gy: 1, block: sampleThreads}, sampleArgs{int32(p.V), int32(p.TopN),
		ptrOf(logits), ptrOf(temperature), ptrOf(topK), ptrOf(topP), ptrOf(seeds), ptrOf(steps), ptrOf(tokens), ptrOf(logprobs),
		ptrOf(topTokens), ptrOf(topLogprobs)})
}
