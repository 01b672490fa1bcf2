package cpu

import "math"

// expShift replaces z by exp(z − shift) (z ≤ shift) and returns the sum:
// the vector pass's (in float32 lanes) and the scalar tail's.
func expShift(z []float32, shift float32) float64 {
	n, s := expShiftVec(z, shift)
	sum := float64(s)
	for j := n; j < len(z); j++ {
		e := expf(z[j] - shift)
		z[j] = e
		sum += float64(e)
	}
	return sum
}

// expf is e^x in float32 arithmetic (Cephes' expf: x = n·ln 2 + r with
// |r| ≤ ln 2 / 2, a degree-6 polynomial in r, scaled by 2^n), within 2 ulp
// of the exact value, several times cheaper than math.Exp in float64: the
// softmaxes of attention and of the classifier's vocabulary take one a
// logit. Results below the smallest normal float32 flush to 0.
func expf(x float32) float32 {
	// expShift8 (elementwise_amd64.s) is this function, eight lanes at a time.
	switch {
	case x != x:
		return x
	case x > 88.72283:
		return float32(math.Inf(1))
	case x < -87.33654:
		return 0
	}
	fx := x*1.44269504088896341 + 0.5
	n := float32(int32(fx))
	if n > fx {
		n-- // floor
	}
	r := x - n*0.693359375 - n*-2.12194440e-4
	p := ((((1.9875691500e-4*r+1.3981999507e-3)*r+8.3334519073e-3)*r+4.1665795894e-2)*r+1.6666665459e-1)*r + 5.0000001201e-1
	y := p*r*r + r + 1
	e := int32(n)
	if e > 127 { // 2^128 is not a float32: scale by 2 and 2^127
		y, e = 2*y, e-1
	}
	return y * math.Float32frombits(uint32(e+127)<<23)
}
