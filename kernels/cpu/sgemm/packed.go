package sgemm

import "fmt"

// Packed is a product's B packed once, ahead of its products, as a
// Multiplier's products pack it for themselves: a matrix whose every
// product would otherwise pack it again (a served model's weights, read
// by every decoding step, packed at a cost near the product's own when A
// has a few rows). Products of the Multiplier that packed it read its
// panels in place; others read it as any Operand.
//
// Layout: for each stretch of k of blockK steps starting at p₀, the
// ⌈n/nr⌉ panels of that stretch one after another, panel q holding
// columns [q·nr, q·nr+nr) as Pack writes them (kc rows of nr values,
// zeros past n): element (p, j) at Data[p₀·N′ + (j/nr)·nr·kc + (p−p₀)·nr +
// j mod nr], N′ = ⌈n/nr⌉·nr and kc the stretch's length.
type Packed struct {
	Data []float32
	K, N int // the shared and the free dimension: B is K×N
	nr   int // the panels' width: the packing Multiplier's kernel's
}

// PackedLen is how many values PackB writes for a k×n B.
func (mu *Multiplier) PackedLen(k, n int) int { return k * ceil(n, mu.k.nr) * mu.k.nr }

// PackB packs b, a k×n B, into dst (PackedLen(k, n) values) for this
// Multiplier's products: its packing of the whole matrix, done once.
func (mu *Multiplier) PackB(dst []float32, b Operand, k, n int) Packed {
	pk := mu.Packed(dst, k, n)
	np := ceil(n, pk.nr) * pk.nr
	for p0 := 0; p0 < k; p0 += blockK {
		b.Pack(pk.Data[p0*np:], 0, n, p0, min(blockK, k-p0), pk.nr)
	}
	return pk
}

// Packed is data, which PackB wrote (or writes) for a k×n B with this
// Multiplier's kernel, as the Packed PackB returns.
func (mu *Multiplier) Packed(data []float32, k, n int) Packed {
	if k < 0 || n < 0 || len(data) < mu.PackedLen(k, n) {
		panic(fmt.Sprintf("sgemm: %d values as a packed %d×%d B (want %d)", len(data), k, n, mu.PackedLen(k, n)))
	}
	return Packed{Data: data[:mu.PackedLen(k, n)], K: k, N: n, nr: mu.k.nr}
}

// panel is the panel of columns [j, j+nr) of the stretch of k from p0 (of
// length kc), for a reader whose panels are nr wide; j is a multiple of
// nr.
func (pk Packed) panel(p0, kc, j int) []float32 {
	np := ceil(pk.N, pk.nr) * pk.nr
	return pk.Data[p0*np+j*kc:][:kc*pk.nr]
}

// Pack implements Operand, for products that cannot read the panels in
// place: of another Multiplier, or of a block of k that is not one of the
// packed stretches.
func (pk Packed) Pack(dst []float32, f0, nf, p0, kc, w int) {
	if f0 < 0 || nf < 0 || f0+nf > pk.N || p0 < 0 || kc < 0 || p0+kc > pk.K {
		panic(fmt.Sprintf("sgemm: packing columns [%d, %d) and steps [%d, %d) of a packed %d×%d B", f0, f0+nf, p0, p0+kc, pk.K, pk.N))
	}
	np := ceil(pk.N, pk.nr) * pk.nr
	for q := 0; q*w < nf; q++ {
		panel := dst[q*kc*w : (q+1)*kc*w]
		lanes := min(w, nf-q*w)
		for p := range kc {
			s0 := (p0 + p) / blockK * blockK // the stretch holding step p0+p
			skc := min(blockK, pk.K-s0)
			row := pk.Data[s0*np+(p0+p-s0)*pk.nr:]
			d := panel[p*w : (p+1)*w]
			for r := range lanes {
				j := f0 + q*w + r
				d[r] = row[j/pk.nr*pk.nr*skc+j%pk.nr]
			}
			clear(d[lanes:])
		}
	}
}
