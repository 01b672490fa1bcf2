package kernels

import "fmt"

// RandomOps draw from a Philox generator: the same state gives the same
// numbers on every backend.
type RandomOps interface {
	// Uniform fills dst with numbers uniform in [lo, hi) drawn from g.
	Uniform(dst Buf, lo, hi float32, g Philox)

	// Normal fills dst with normal numbers drawn from g.
	Normal(dst Buf, mean, std float32, g Philox)

	// Dropout computes dst = x·mask/(1-p), the mask keeping each element with
	// probability 1-p, drawn from g. The same g gives the same mask, which is
	// how the backward (and a checkpoint's recompute) reproduce it.
	Dropout(dst, x Buf, p float32, g Philox)

	// Sample draws a token from each of p.Rows rows of p.V logits (F32,
	// F16 or BF16), on the device, as SampleParams describes, writing it
	// into tokens (I32, Rows) and its log-probability under the model
	// (the log-softmax of the row, at temperature 1) into logprobs (F32,
	// Rows); with p.TopN, also each row's TopN most likely tokens, the most
	// likely first and ties by index (topTokens, I32 Rows×TopN), and their
	// log-probabilities (topLogprobs, F32 Rows×TopN).
	Sample(p SampleParams, logits, temperature, topK, topP, seeds, steps, tokens, logprobs, topTokens, topLogprobs Buf)
}

// MaxTopN bounds SampleParams.TopN.
const MaxTopN = 5

// SampleParams describes drawing a token from each of Rows rows of V
// logits, each row r under its own settings, read on the device:
// temperature[r] (F32; 0 or less: the most likely token, the first on
// ties), topK[r] (I32; the K most likely tokens, or all for 0 or V or
// more; a tie at the K-th value keeps every tied token), topP[r] (F32; of
// those, the most likely whose probabilities sum to at least P of theirs,
// all for P of 1 or more), and the draw: word 0 of the Philox block
// steps[r] (I32) of the stream seeds[2r] + seeds[2r+1]<<32 (I32 pairs).
// The thresholds are found by bisection on the scaled logits (SampleRounds
// halvings each), the same on every backend; the draw then walks the kept
// tokens in index order.
type SampleParams struct {
	Rows, V int
	TopN    int // 0 to MaxTopN
}

// SampleRounds is the halvings of each bisection Sample makes.
const SampleRounds = 32

// CheckSample checks Sample's buffers against p.
func CheckSample(p SampleParams, logits, temperature, topK, topP, seeds, steps, tokens, logprobs, topTokens, topLogprobs Buf) {
	if p.Rows <= 0 || p.V <= 0 || p.TopN < 0 || p.TopN > MaxTopN || p.TopN > p.V {
		panic(fmt.Sprintf("kernels: sample: invalid parameters %+v", p))
	}
	CheckLen("sample logits", p.Rows*p.V, logits)
	if !logits.DType.Float() {
		panic(fmt.Sprintf("kernels: sample of %v logits", logits.DType))
	}
	CheckLen("sample settings", p.Rows, temperature, topK, topP, steps, tokens, logprobs)
	CheckLen("sample seeds", 2*p.Rows, seeds)
	CheckF32("sample", temperature, topP, logprobs)
	for _, b := range []Buf{topK, seeds, steps, tokens} {
		if b.DType != I32 {
			panic(fmt.Sprintf("kernels: sample: %v settings or tokens: want i32", b.DType))
		}
	}
	if p.TopN > 0 {
		CheckLen("sample top tokens", p.Rows*p.TopN, topTokens, topLogprobs)
		CheckF32("sample top log-probabilities", topLogprobs)
		if topTokens.DType != I32 {
			panic(fmt.Sprintf("kernels: sample: %v top tokens: want i32", topTokens.DType))
		}
	}
}

// Philox is the state of a counter-based Philox4x32-10 generator: a key and
// a position in its stream. Random operations take it by value, so that the
// same state always yields the same numbers, on every backend.
type Philox struct {
	Seed   uint64
	Offset uint64 // in blocks of four 32-bit words
	// Base, when valid, is a device counter (see Counter) whose value the
	// operation adds to Offset when it runs, not when it is queued: a
	// captured training step replayed many times draws new numbers at every
	// replay because the step advances its Base on the device.
	Base Buf `json:"-"`
}

func (o *Observed) Uniform(dst Buf, lo, hi float32, g Philox) {
	defer o.op("Uniform", "Uniform", dst)()
	o.B.Uniform(dst, lo, hi, g)
}

func (o *Observed) Normal(dst Buf, mean, std float32, g Philox) {
	defer o.op("Normal", "Normal", dst)()
	o.B.Normal(dst, mean, std, g)
}

func (o *Observed) Dropout(dst, x Buf, p float32, g Philox) {
	defer o.op("Dropout", "Dropout", x)()
	o.B.Dropout(dst, x, p, g)
}

func (o *Observed) Sample(p SampleParams, logits, temperature, topK, topP, seeds, steps, tokens, logprobs, topTokens, topLogprobs Buf) {
	defer o.op("Sample", "Sample", logits)()
	o.B.Sample(p, logits, temperature, topK, topP, seeds, steps, tokens, logprobs, topTokens, topLogprobs)
}
