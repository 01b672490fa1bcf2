package kernels

import "math"

// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3",
// SC'11), the generator cuRAND and PyTorch use on GPUs. It is counter based:
// block c of stream (seed) is a pure function of (seed, c), so any element of
// a random tensor can be computed independently, on any backend, and a saved
// (Seed, Offset) pair replays a sequence exactly. Element i of a random
// operation run at state g uses word i%4 of block g.Offset + i/4.
//
// The CUDA kernels implement the same function; the tests hold them to it.

const (
	philoxM0 = 0xD2511F53
	philoxM1 = 0xCD9E8D57
	philoxW0 = 0x9E3779B9
	philoxW1 = 0xBB67AE85
)

// PhiloxBlock returns the four 32-bit words of block ctr of the stream keyed by seed.
func PhiloxBlock(seed, ctr uint64) [4]uint32 {
	return philox4x32([4]uint32{uint32(ctr), uint32(ctr >> 32), 0, 0}, uint32(seed), uint32(seed>>32))
}

// philox4x32 is ten Philox rounds over counter c with key (k0, k1).
func philox4x32(c [4]uint32, k0, k1 uint32) [4]uint32 {
	for r := 0; r < 10; r++ {
		p0 := uint64(philoxM0) * uint64(c[0])
		p1 := uint64(philoxM1) * uint64(c[2])
		c = [4]uint32{
			uint32(p1>>32) ^ c[1] ^ k0,
			uint32(p1),
			uint32(p0>>32) ^ c[3] ^ k1,
			uint32(p0),
		}
		k0 += philoxW0
		k1 += philoxW1
	}
	return c
}

// Blocks is the number of Philox blocks an operation over n elements uses:
// the amount by which a generator's Offset advances.
func (Philox) Blocks(n int) uint64 { return uint64((n + 3) / 4) }

// Word returns the 32-bit random word of element i.
func (g Philox) Word(i int) uint32 {
	return PhiloxBlock(g.Seed, g.Offset+uint64(i/4))[i%4]
}

// ToUniform maps a random word to a float32 uniform in [0, 1) with 24 bits.
func ToUniform(u uint32) float32 { return float32(u>>8) * (1.0 / (1 << 24)) }

// BoxMuller turns two random words into two independent standard normals.
func BoxMuller(u0, u1 uint32) (float32, float32) {
	// (u+1)/2^32 lies in (0, 1], so the log is finite.
	a := (float64(u0) + 1) / (1 << 32)
	b := float64(u1) / (1 << 32)
	r := math.Sqrt(-2 * math.Log(a))
	s, c := math.Sincos(2 * math.Pi * b)
	return float32(r * c), float32(r * s)
}

// NormalAt returns the standard normal of element i: elements 2j and 2j+1
// share the Box–Muller pair of words (2j)%4, (2j+1)%4 of their block.
func (g Philox) NormalAt(i int) float32 {
	w := PhiloxBlock(g.Seed, g.Offset+uint64(i/4))
	j := i % 4 &^ 1
	z0, z1 := BoxMuller(w[j], w[j+1])
	if i%2 == 0 {
		return z0
	}
	return z1
}
