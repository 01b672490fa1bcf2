package sgemm

import (
	"fmt"

	"github.com/leangrad/leangrad/kernels/cpu/internal/half"
)

// An Operand is a matrix the product reads by packing it into panels. Its
// free dimension is A's rows or B's columns; its shared dimension is the k
// of the product.
//
// Pack writes the block of free indices [f0, f0+nf) and shared indices
// [p0, p0+kc) into dst as ⌈nf/w⌉ panels of width w, one after another:
//
//	dst[(q·kc + p)·w + r] = op(f0 + q·w + r, p0 + p)
//
// for panel q, shared offset p and lane r, with zeros for lanes at or past
// nf. dst has room for the panels.
type Operand interface {
	Pack(dst []float32, f0, nf, p0, kc, w int)
}

// Strided is a matrix in memory with element (f, p) at Data[f·Free + p·Shared]:
// the strides along the free and the shared dimension.
type Strided struct {
	Data         []float32
	Free, Shared int
}

// MatrixA is A of a product as Gemm takes it: m×k row-major with stride lda,
// or stored k×m when trans.
func MatrixA(a []float32, lda int, trans bool) Strided {
	if trans {
		return Strided{Data: a, Free: 1, Shared: lda}
	}
	return Strided{Data: a, Free: lda, Shared: 1}
}

// MatrixB is B of a product as Gemm takes it: k×n row-major with stride ldb,
// or stored n×k when trans.
func MatrixB(b []float32, ldb int, trans bool) Strided {
	if trans {
		return Strided{Data: b, Free: ldb, Shared: 1}
	}
	return Strided{Data: b, Free: 1, Shared: ldb}
}

// Pack implements Operand: row copies when the free dimension is contiguous,
// a gather along each free index's contiguous run otherwise.
func (s Strided) Pack(dst []float32, f0, nf, p0, kc, w int) {
	for q := 0; q*w < nf; q++ {
		panel := dst[q*kc*w : (q+1)*kc*w]
		lanes := min(w, nf-q*w)
		base := (f0+q*w)*s.Free + p0*s.Shared
		switch {
		case s.Free == 1:
			for p := 0; p < kc; p++ {
				d := panel[p*w : (p+1)*w]
				copy(d, s.Data[base+p*s.Shared:][:lanes])
				clear(d[lanes:])
			}
		case s.Shared == 1:
			PackRows(panel, w, s.Data[base:], s.Free, lanes, kc)
		default:
			for p := 0; p < kc; p++ {
				d := panel[p*w : (p+1)*w]
				for r := 0; r < lanes; r++ {
					d[r] = s.Data[base+p*s.Shared+r*s.Free]
				}
				clear(d[lanes:])
			}
		}
	}
}

// Rows is a matrix whose rows lie anywhere in one array, each contiguous
// along the shared dimension: element (f, p) is Data[Offsets[f]+p]. As an
// Operand its free dimension is the rows.
type Rows struct {
	Data    []float32
	Offsets []int
}

// check panics unless every row has k elements.
func (r Rows) check(name string, k int) {
	for f, o := range r.Offsets {
		if o < 0 || o+k > len(r.Data) {
			panic(fmt.Sprintf("sgemm: %s row %d at offset %d needs %d elements, has %d", name, f, o, o+k, len(r.Data)))
		}
	}
}

// Pack implements Operand.
func (r Rows) Pack(dst []float32, f0, nf, p0, kc, w int) {
	var at [64]int
	for q := 0; q*w < nf; q++ {
		lanes := min(w, nf-q*w)
		for i, o := range r.Offsets[f0+q*w:][:lanes] {
			at[i] = o + p0
		}
		packRowsAt(dst[q*kc*w:(q+1)*kc*w], w, r.Data, at[:lanes], kc)
	}
}

// PackRows writes kc values of each of lanes rows of src (row stride ld)
// across a panel of width w, a row to a lane: panel[p·w + r] = src[r·ld + p]
// for p < kc, r < lanes, and zero in lanes at or past lanes. It is the
// packing of an operand whose shared dimension is contiguous in memory;
// panel may start anywhere in a larger panel (at row p₀, as panel[p₀·w:]).
func PackRows(panel []float32, w int, src []float32, ld, lanes, kc int) {
	var at [64]int
	for r := range lanes {
		at[r] = r * ld
	}
	packRowsAt(panel, w, src, at[:lanes], kc)
}

// packRowsAt is PackRows with lane r's values at src[at[r]:].
func packRowsAt(panel []float32, w int, src []float32, at []int, kc int) {
	lanes := len(at)
	r := 0
	for ; r+8 <= lanes; r += 8 {
		transpose8(panel, r, w, src, at[r:r+8], kc)
	}
	for ; r < lanes; r++ {
		for p, v := range src[at[r]:][:kc] {
			panel[p*w+r] = v
		}
	}
	if lanes < w {
		for p := 0; p < kc; p++ {
			clear(panel[p*w+lanes : p*w+w])
		}
	}
}

// transpose8 writes kc values of eight rows of src, row i at at[i], into
// lanes r..r+7 of a panel of width w: panel[p·w + r + i] = src[at[i] + p].
func transpose8(panel []float32, r, w int, src []float32, at []int, kc int) {
	s0, s1 := src[at[0]:][:kc], src[at[1]:][:kc]
	s2, s3 := src[at[2]:][:kc], src[at[3]:][:kc]
	s4, s5 := src[at[4]:][:kc], src[at[5]:][:kc]
	s6, s7 := src[at[6]:][:kc], src[at[7]:][:kc]
	for p := transposeVec(panel, r, w, src, at, kc); p < kc; p++ {
		d := panel[p*w+r : p*w+r+8 : p*w+r+8]
		d[0], d[1], d[2], d[3] = s0[p], s1[p], s2[p], s3[p]
		d[4], d[5], d[6], d[7] = s4[p], s5[p], s6[p], s7[p]
	}
}

// Shifted is a matrix B (k×n) whose rows are windows of one array: row p is
// Data[Offsets[p] : Offsets[p]+n]. A stride-1 convolution over a padded
// image is such a product (row p is the image shifted by tap p), and the
// assembly kernels read it in place; Data must extend to a whole tile past
// each window (GemmShifted checks).
type Shifted struct {
	Data    []float32
	Offsets []int
}

// Pack implements Operand (for kernels that do not read B in place): its
// free dimension is the columns.
func (s Shifted) Pack(dst []float32, f0, nf, p0, kc, w int) {
	for q := 0; q*w < nf; q++ {
		lanes := min(w, nf-q*w)
		for p := 0; p < kc; p++ {
			d := dst[(q*kc+p)*w : (q*kc+p+1)*w]
			copy(d, s.Data[s.Offsets[p0+p]+f0+q*w:][:lanes])
			clear(d[lanes:])
		}
	}
}

// Half is Strided's layout over IEEE binary16 values (AMP's F16 tensors),
// Data holding their bits: element (f, p) is Data[f·Free + p·Shared]. Pack
// converts each block to float32 (exactly) as it packs it, loading halves
// straight into the transposes, so no float32 copy of the matrix is made and
// a product of F16 operands moves half the bytes of an F32 one.
type Half struct {
	Data         []uint16
	Free, Shared int
}

// Pack implements Operand.
func (h Half) Pack(dst []float32, f0, nf, p0, kc, w int) {
	table := half.Table()
	for q := 0; q*w < nf; q++ {
		panel := dst[q*kc*w : (q+1)*kc*w]
		lanes := min(w, nf-q*w)
		base := (f0+q*w)*h.Free + p0*h.Shared
		switch {
		case h.Free == 1:
			half.ToFloat32Rows(panel, w, h.Data[base:], h.Shared, kc, lanes)
			if lanes < w {
				for p := 0; p < kc; p++ {
					clear(panel[p*w+lanes : p*w+w])
				}
			}
		case h.Shared == 1:
			r := 0
			for ; r+8 <= lanes; r += 8 {
				var at [8]int
				for i := range at {
					at[i] = base + (r+i)*h.Free
				}
				for p := transposeVecHalf(panel, r, w, h.Data, &at, kc); p < kc; p++ {
					for i, o := range at {
						panel[p*w+r+i] = table[h.Data[o+p]]
					}
				}
			}
			for ; r < lanes; r++ {
				for p, v := range h.Data[base+r*h.Free:][:kc] {
					panel[p*w+r] = table[v]
				}
			}
			if lanes < w {
				for p := 0; p < kc; p++ {
					clear(panel[p*w+lanes : p*w+w])
				}
			}
		default:
			for p := 0; p < kc; p++ {
				d := panel[p*w : (p+1)*w]
				for r := 0; r < lanes; r++ {
					d[r] = table[h.Data[base+p*h.Shared+r*h.Free]]
				}
				clear(d[lanes:])
			}
		}
	}
}

// BF16 is Strided's layout over bfloat16 values (AMP's BF16 tensors), Data
// holding their bits: element (f, p) is Data[f·Free + p·Shared]. Pack
// converts each block to float32 (exactly: a shift) as it packs it.
type BF16 struct {
	Data         []uint16
	Free, Shared int
}

// Pack implements Operand.
func (h BF16) Pack(dst []float32, f0, nf, p0, kc, w int) {
	for q := 0; q*w < nf; q++ {
		panel := dst[q*kc*w : (q+1)*kc*w]
		lanes := min(w, nf-q*w)
		base := (f0+q*w)*h.Free + p0*h.Shared
		for p := 0; p < kc; p++ {
			d := panel[p*w : (p+1)*w]
			for r := 0; r < lanes; r++ {
				d[r] = half.BF16Value(h.Data[base+p*h.Shared+r*h.Free])
			}
			clear(d[lanes:])
		}
	}
}
