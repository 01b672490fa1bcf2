package kernels

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
