package datasets

import (
	"math"
	"math/rand/v2"
)

// Synthetic returns n deterministic, learnable 1×28×28 examples of 10
// classes: each class is a fixed random arrangement of soft blobs (drawn
// from seed 0, so training and test sets share the classes), and each
// example is its class's pattern shifted by up to two pixels, with its
// contrast varied and noise added (drawn from seed).
func Synthetic(n int, seed uint64) *Dataset { return SyntheticSize(n, seed, 28) }

// SyntheticSize is Synthetic with size×size images.
func SyntheticSize(n int, seed uint64, size int) *Dataset {
	const classes = 10
	h, w := size, size
	protos := make([][]float64, classes)
	prng := rand.New(rand.NewPCG(0, 0x5EED))
	for c := range protos {
		p := make([]float64, h*w)
		for b := 0; b < 4; b++ {
			f := float64(size) / 28
			cy, cx, r := f*(4+prng.Float64()*20), f*(4+prng.Float64()*20), f*(2+prng.Float64()*4)
			for y := 0; y < h; y++ {
				for x := 0; x < w; x++ {
					d := (float64(y)-cy)*(float64(y)-cy) + (float64(x)-cx)*(float64(x)-cx)
					p[y*w+x] += math.Exp(-d / (2 * r * r))
				}
			}
		}
		protos[c] = p
	}
	rng := rand.New(rand.NewPCG(seed, 0xDA7A))
	d := &Dataset{Name: SyntheticSet, N: n, C: 1, H: h, W: w, Classes: classes,
		Images: make([]uint8, n*h*w), Labels: make([]int32, n)}
	for i := 0; i < n; i++ {
		c := rng.IntN(classes)
		d.Labels[i] = int32(c)
		dy, dx := rng.IntN(5)-2, rng.IntN(5)-2
		contrast := 0.7 + 0.6*rng.Float64()
		img := d.Images[i*h*w : (i+1)*h*w]
		for y := 0; y < h; y++ {
			for x := 0; x < w; x++ {
				v := 0.0
				if sy, sx := y-dy, x-dx; sy >= 0 && sy < h && sx >= 0 && sx < w {
					v = protos[c][sy*w+sx]
				}
				v = 255*min(1, contrast*v) + 25*rng.NormFloat64()
				img[y*w+x] = uint8(max(0, min(255, v)))
			}
		}
	}
	return d
}
