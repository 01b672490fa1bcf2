package cpu

import (
	"slices"

	"github.com/leangrad/leangrad/kernels"
	"github.com/leangrad/leangrad/kernels/cpu/internal/par"
	"github.com/leangrad/leangrad/kernels/cpu/sgemm"
)

// Convolutions are matrix products over the im2col matrix of the images:
// one row per filter tap t = (c, r, s), one column per output pixel
// j = (n, oh, ow) across the batch, holding the input under that tap (zero
// in the padding). That matrix is never built: sgemm packs its panels
// straight from the images (patches.Pack).
//
//	forward          y  (K × N·L)   = w (K × CRS) · patches (CRS × N·L)
//	data gradient    dcol (CRS × N·L) = wᵀ · dy (K × N·L), added back into dx (col2im)
//	filter gradient  dw (K × CRS)   = dy (K × N·L) · patchesᵀ
//
// with L = OH·OW. dy and y are N×K×L in memory, K × N·L only as operands
// (planes); products whose C is K × N·L are computed a chunk of images at a
// time into scratch and copied out. That is the path of strided
// convolutions; stride-1 ones (most of a ResNet) read a padded grid of the
// images in place instead, forward and backward (see shiftable below).

// chunkColumns is about how many output pixels a chunk of images spans: wide
// enough for full tiles, small enough to keep a core's scratch in cache.
const chunkColumns = 4096

// imagesPerChunk is how many images one product covers.
func imagesPerChunk(p kernels.ConvParams) int {
	return max(1, min(p.N, chunkColumns/(p.OutH()*p.OutW())))
}

// patches is the im2col matrix of images x (n×C×H×W, n whole images) as an
// sgemm operand whose free dimension is pixels (the forward's B) or, with
// tapsFree, taps (the filter gradient's B, patchesᵀ).
type patches struct {
	p        kernels.ConvParams
	x        []float32
	tapsFree bool
}

// run is a stretch of consecutive output pixels in one output row: lanes
// [lane, lane+n) of a panel are pixels (img, oh, ow..ow+n).
type run struct{ lane, n, img, oh, ow int }

// runs splits the pixels [j0, j0+n) into runs along output rows.
func runs(dst []run, p kernels.ConvParams, j0, n int) []run {
	ow := p.OutW()
	l := p.OutH() * ow
	for lane := 0; lane < n; {
		j := j0 + lane
		img, rem := j/l, j%l
		oh, col := rem/ow, rem%ow
		k := min(n-lane, ow-col)
		dst = append(dst, run{lane: lane, n: k, img: img, oh: oh, ow: col})
		lane += k
	}
	return dst
}

// Pack implements sgemm.Operand.
func (pa patches) Pack(dst []float32, f0, nf, p0, kc, w int) {
	if pa.tapsFree {
		pa.packTaps(dst, f0, nf, p0, kc, w)
		return
	}
	p := pa.p
	rs, chw := p.R*p.S, p.C*p.H*p.W
	var buf [64]run
	for q := 0; q*w < nf; q++ {
		panel := dst[q*kc*w : (q+1)*kc*w]
		lanes := min(w, nf-q*w)
		rr := runs(buf[:0], p, f0+q*w, lanes)
		for t := 0; t < kc; t++ {
			tap := p0 + t
			c, r, s := tap/rs, tap%rs/p.S, tap%p.S
			row := panel[t*w : (t+1)*w]
			clear(row[lanes:])
			for _, u := range rr {
				d := row[u.lane : u.lane+u.n]
				ih := u.oh*p.StrideH - p.PadH + r
				if ih < 0 || ih >= p.H {
					clear(d)
					continue
				}
				src := pa.x[u.img*chw+(c*p.H+ih)*p.W : u.img*chw+(c*p.H+ih+1)*p.W]
				// Output columns ow+i with an input column iw = (ow+i)·stride − pad + s inside the row.
				j0, j1 := validRange(u.ow+u.n, p.W, p.StrideW, p.PadW, s)
				j0, j1 = max(j0, u.ow)-u.ow, max(j1, u.ow)-u.ow
				j0 = min(j0, j1)
				clear(d[:j0])
				clear(d[j1:])
				if j0 == j1 {
					continue
				}
				iw := (u.ow+j0)*p.StrideW - p.PadW + s
				if p.StrideW == 1 {
					copy(d[j0:j1], src[iw:])
					continue
				}
				for i := j0; i < j1; i++ {
					d[i] = src[iw]
					iw += p.StrideW
				}
			}
		}
	}
}

// packTaps packs patchesᵀ: lanes are taps, the shared dimension pixels. A
// pixel whose window lies inside the image reads every tap at a fixed offset
// from its corner; only border pixels test bounds.
func (pa patches) packTaps(dst []float32, f0, nf, p0, kc, w int) {
	p := pa.p
	rs, chw := p.R*p.S, p.C*p.H*p.W
	var off [64]int    // a tap's offset from its window's corner
	var tr, ts [64]int // a tap's row and column in the window
	oh, ow := p.OutH(), p.OutW()
	l := oh * ow
	for q := 0; q*w < nf; q++ {
		panel := dst[q*kc*w : (q+1)*kc*w]
		lanes := min(w, nf-q*w)
		for i := 0; i < lanes; i++ {
			tap := f0 + q*w + i
			c, r, s := tap/rs, tap%rs/p.S, tap%p.S
			off[i], tr[i], ts[i] = (c*p.H+r)*p.W+s, r, s
		}
		for t := 0; t < kc; t++ {
			j := p0 + t
			img, rem := j/l, j%l
			ih, iw := rem/ow*p.StrideH-p.PadH, rem%ow*p.StrideW-p.PadW
			corner := img*chw + ih*p.W + iw
			row := panel[t*w : (t+1)*w]
			clear(row[lanes:])
			if ih >= 0 && iw >= 0 && ih+p.R <= p.H && iw+p.S <= p.W {
				for i, o := range off[:lanes] {
					row[i] = pa.x[corner+o]
				}
				continue
			}
			for i, o := range off[:lanes] {
				y, x := ih+tr[i], iw+ts[i]
				if y < 0 || y >= p.H || x < 0 || x >= p.W {
					row[i] = 0
					continue
				}
				row[i] = pa.x[corner+o]
			}
		}
	}
}

// planes is a batch of row-major matrices (n × rows × cols) as one
// rows × (n·cols) operand, element (r, i·cols + l) at data[(i·rows + r)·cols + l]:
// dy as K × N·L. Its free dimension is the columns (the data gradient's B) or,
// with rowsFree, the rows (the filter gradient's A).
type planes struct {
	data       []float32
	rows, cols int
	rowsFree   bool
}

// Pack implements sgemm.Operand.
func (pl planes) Pack(dst []float32, f0, nf, p0, kc, w int) {
	plane := pl.rows * pl.cols
	for q := 0; q*w < nf; q++ {
		panel := dst[q*kc*w : (q+1)*kc*w]
		lanes := min(w, nf-q*w)
		if pl.rowsFree {
			// Rows are lanes; the shared dimension runs along each plane's
			// rows, which are contiguous, a plane at a time.
			for t := 0; t < kc; {
				j := p0 + t
				img, l := j/pl.cols, j%pl.cols
				n := min(kc-t, pl.cols-l)
				src := pl.data[img*plane+(f0+q*w)*pl.cols+l:]
				sgemm.PackRows(panel[t*w:], w, src, pl.cols, lanes, n)
				t += n
			}
			continue
		}
		for t := 0; t < kc; t++ {
			row := panel[t*w : (t+1)*w]
			clear(row[lanes:])
			for lane := 0; lane < lanes; {
				j := f0 + q*w + lane
				img, l := j/pl.cols, j%pl.cols
				n := min(lanes-lane, pl.cols-l)
				copy(row[lane:lane+n], pl.data[img*plane+(p0+t)*pl.cols+l:])
				lane += n
			}
		}
	}
}

// validRange is the range [j0, j1) of output columns whose input column
// j·stride − pad + s lies inside a row of width w.
func validRange(ow, w, stride, pad, s int) (j0, j1 int) {
	// j·stride ≥ pad − s  and  j·stride ≤ w − 1 + pad − s
	lo := pad - s
	if lo > 0 {
		j0 = (lo + stride - 1) / stride
	}
	hi := w - 1 + pad - s
	if hi < 0 {
		return 0, 0
	}
	j1 = min(ow, hi/stride+1)
	return min(j0, j1), j1
}

// col2im adds a column matrix (one row per tap, row i of the image's columns
// at col[t·ld:][:L]) back into the image it was gathered from.
func col2im(p kernels.ConvParams, col []float32, ld int, x []float32) {
	oh, ow := p.OutH(), p.OutW()
	for c := 0; c < p.C; c++ {
		plane := x[c*p.H*p.W : (c+1)*p.H*p.W]
		for r := 0; r < p.R; r++ {
			for s := 0; s < p.S; s++ {
				src := col[((c*p.R+r)*p.S+s)*ld:][:oh*ow]
				j0, j1 := validRange(ow, p.W, p.StrideW, p.PadW, s)
				for i := 0; i < oh; i++ {
					ih := i*p.StrideH - p.PadH + r
					if ih < 0 || ih >= p.H || j0 >= j1 {
						continue
					}
					dst := plane[ih*p.W : (ih+1)*p.W]
					row := src[i*ow : (i+1)*ow]
					if p.StrideW == 1 {
						d := dst[j0-p.PadW+s:][:j1-j0]
						for j, v := range row[j0:j1] {
							d[j] += v
						}
						continue
					}
					for j := j0; j < j1; j++ {
						dst[j*p.StrideW-p.PadW+s] += row[j]
					}
				}
			}
		}
	}
}

// Stride-1 convolutions skip the im2col panels altogether. The images are
// laid out in a grid, channel-major (channel c of every image, one under
// the other), each row followed by padW zero columns and each image by padH
// zero rows, after padH rows and padW columns of zeros: a row's right
// padding is the next row's left padding, an image's bottom padding the
// next one's top. Output pixel j of the grid reads tap (c, r, s) at
// j + c·G + r·Wp + s, so the patch matrix's row for a tap is the grid
// shifted by a constant, which the assembly kernels read in place
// (sgemm.Shifted). Outputs are computed for every grid pixel up to the last
// valid one, and only the valid ones (the top-left OH×OW of each image's
// slot) are kept: (H+padH)(W+padW) pixels computed for OH·OW kept, against
// (H+2·padH)(W+2·padW) with padding of their own. The data gradient is the
// same product over dy padded by the filter size minus the padding, with
// the filter flipped and its channels swapped.
//
// Strided convolutions (their forward) run the same way over
// the images' phases: with stride sh×sw, pixel (y, x) belongs to phase
// (y mod sh, x mod sw) at (y div sh, x div sw), each phase an image of its
// own in the grid (sh·sw of them a channel). Output pixel (oy, ox) reads tap
// (r, s) at row oy + (r − padH) div sh of phase (r − padH) mod sh (and so
// for columns): a stride-1 read, so the same shifted products compute it,
// over padding of ⌈padH/sh⌉ rows and ⌈padW/sw⌉ columns.

// gridPixels is about how many grid pixels one shifted product covers: a
// chunk's grid and product stay in a core's L2 (4096 ran 5-35% faster than
// 16384 on the development machine).
const gridPixels = 4096

// shiftable reports whether p's forward is computed by shifted products:
// along each dimension, every tap an output pixel reads lies in its phase
// image or the zeros around it, and the outputs fit in an image's slot; for
// stride 1 that is padding smaller than the filter. A 1×1 filter with a
// stride packs its patches instead: it reads one phase in sh·sw, and dealing
// out the others made it slower (29 against 35 GFLOP/s for ResNet-20's
// shortcut on the development machine). Strides past 8 pack patches too.
func shiftable(p kernels.ConvParams) bool {
	stride1 := p.StrideH == 1 && p.StrideW == 1
	return (stride1 || p.R*p.S > 1) && p.StrideH <= 8 && p.StrideW <= 8 &&
		phasesFit(p.H, p.PadH, p.R, p.StrideH, p.OutH()) && phasesFit(p.W, p.PadW, p.S, p.StrideW, p.OutW())
}

// shiftableGrads reports whether p's gradients are computed by shifted
// products: stride 1 only. A strided filter gradient's patch product is
// larger than its tiles of dot products over the phases (165 against 85
// GFLOP/s for ResNet-20's 32→64 channels on the development machine), and
// a strided data gradient is a transposed convolution.
func shiftableGrads(p kernels.ConvParams) bool {
	return p.StrideH == 1 && p.StrideW == 1 && shiftable(p)
}

// phasesFit is shiftable along one dimension: n pixels, padding pad, a
// filter of r taps, stride st and out outputs.
func phasesFit(n, pad, r, st, out int) bool {
	size, padding := ceil(n, st), ceil(pad, st)
	last := floorDiv(r-1-pad, st) // the furthest shift a tap reads at
	return out <= size+padding && out-1+last <= size-1+padding
}

// floorDiv is ⌊a/b⌋ for b > 0.
func floorDiv(a, b int) int {
	q := a / b
	if a%b < 0 {
		q--
	}
	return q
}

// ceil is ⌈a/b⌉ for a ≥ 0, b > 0.
func ceil(a, b int) int { return (a + b - 1) / b }

// grid is the layout of a chunk of k images of h×w pixels a channel, split
// into sh×sw phases of hs×ws pixels (one phase, the image itself, for
// stride 1) padded by ph rows and pw columns: image i's phase (a, b) of
// channel c is the grid's channel (c·sh + a)·sw + b, its pixel (y, x) at
// channel·plane + origin + (i·hp + y)·wp + x, with hp = hs + ph,
// wp = ws + pw and origin = ph·wp + pw.
type grid struct {
	k, h, w, sh, sw        int
	hs, ws, ph, pw, hp, wp int
	origin                 int
}

// newGrid is the grid of k images of h×w for a convolution with padding
// padH, padW and stride sh, sw.
func newGrid(k, h, w, padH, padW, sh, sw int) grid {
	g := grid{k: k, h: h, w: w, sh: sh, sw: sw, hs: ceil(h, sh), ws: ceil(w, sw), ph: ceil(padH, sh), pw: ceil(padW, sw)}
	g.hp, g.wp = g.hs+g.ph, g.ws+g.pw
	g.origin = g.ph*g.wp + g.pw
	return g
}

// outputs is the grid of a convolution's output (oh×ow a channel) over g:
// output pixel (y, x) of image i at (i·hp + y)·wp + x, where the product
// over g computes it.
func (g grid) outputs(oh, ow int) grid {
	return grid{k: g.k, h: oh, w: ow, sh: 1, sw: 1, hs: oh, ws: ow, hp: g.hp, wp: g.wp}
}

// plane is the size of one (phase) channel of the grid.
func (g grid) plane() int { return g.origin + g.k*g.hp*g.wp }

// cols is how many grid pixels a product runs over: up to the last output
// pixel of an oh×ow output at each slot's corner.
func (g grid) cols(oh, ow int) int { return (g.k-1)*g.hp*g.wp + (oh-1)*g.wp + ow }

// taps sets offs[t] to tap t = (c, r, s)'s shift in the grid, for an r×s
// filter with padding padH, padW: output pixel j reads it at j + offs[t].
func (g grid) taps(offs []int, r, s, padH, padW int) {
	for t := range offs {
		c, rs := t/(r*s), t%(r*s)
		dr, ds := floorDiv(rs/s-padH, g.sh), floorDiv(rs%s-padW, g.sw)
		a, b := rs/s-padH-dr*g.sh, rs%s-padW-ds*g.sw
		offs[t] = ((c*g.sh+a)*g.sw+b)*g.plane() + (dr+g.ph)*g.wp + ds + g.pw
	}
}

// fill writes images n0..n0+k of src (ch channels each) into dst, zero
// elsewhere, and zeroes dst past the last channel, its channels spread
// over goroutines by spread (parallel, or serial). With stride 1 only the
// padding is cleared, and F16 images are converted row by row into place
// (values.readRows); with a stride, each image's rows are dealt out to its
// phases.
func (g grid) fill(dst []float32, src values, n0, ch int, spread func(n, grain int, f func(lo, hi int))) {
	phases := g.sh * g.sw
	clear(dst[ch*phases*g.plane():])
	spread(ch, 1, func(lo, hi int) {
		if phases > 1 {
			img := getScratch(g.h * g.w)
			defer putScratch(img)
			for c := lo; c < hi; c++ {
				clear(dst[c*phases*g.plane() : (c+1)*phases*g.plane()])
				for i := 0; i < g.k; i++ {
					g.deal(dst, src, ((n0+i)*ch+c)*g.h*g.w, c, i, img)
				}
			}
			return
		}
		for c := lo; c < hi; c++ {
			base := c * g.plane()
			clear(dst[base : base+g.origin])
			for i := 0; i < g.k; i++ {
				slot := dst[base+g.origin+i*g.hp*g.wp:][:g.hp*g.wp]
				src.readRows(slot, g.wp, ((n0+i)*ch+c)*g.h*g.w, g.w, g.h)
				for y := 0; y < g.hs; y++ {
					for x := y*g.wp + g.ws; x < (y+1)*g.wp; x++ {
						slot[x] = 0 // a value or two: no call to clear
					}
				}
				clear(slot[g.hs*g.wp:])
			}
		}
	})
}

// deal writes the image at src[off:] (channel c of slot i) into its phases
// over zeros, through buf (h·w values) for F16 images: with stride 2 in
// assembly where the CPU has it (dealVec), otherwise a row at a time.
func (g grid) deal(dst []float32, src values, off, c, i int, buf []float32) {
	first := c*g.sh*g.sw*g.plane() + g.origin + i*g.hp*g.wp // phase (0, 0)'s row 0
	if g.sh == 2 && g.sw == 2 && dealVec(dst[first:], g.wp, g.plane(), src.span(off, g.h*g.w, buf), g.w, g.h) {
		return
	}
	for y := 0; y < g.h; y++ {
		v := src.span(off+y*g.w, g.w, buf)
		a := y % g.sh
		for b := 0; b < g.sw; b++ {
			at := ((c*g.sh+a)*g.sw+b)*g.plane() + g.origin + (i*g.hp+y/g.sh)*g.wp
			d := dst[at : at+g.ws]
			for x := 0; x*g.sw+b < g.w; x++ {
				d[x] = v[x*g.sw+b]
			}
		}
	}
}

// maxOffset is the largest of offs (with a stride, the last tap's need not
// be: taps of one channel spread over its phases).
func maxOffset(offs []int) int { return slices.Max(offs) }

// imagesPerGrid is how many images one product over g's slots covers.
func imagesPerGrid(n int, g grid) int { return max(1, min(n, gridPixels/(g.hp*g.wp))) }

// stretches splits n images into one stretch per goroutine and runs
// f(mm, t, i0, i1) for stretch t, images [i0, i1), on each, with mm the
// products' Multiplier: each goroutine keeps its data in its core's caches
// from the first pass over its images to the last, and the goroutines meet
// once per call. With fewer images than goroutines, each stretch's products
// run on the goroutines left over.
func (c *Backend) stretches(n int, f func(mm *sgemm.Multiplier, t, i0, i1 int)) {
	parts := c.stretchCount(n)
	mm := c.mm.WithThreads(max(1, c.mm.Threads()/parts))
	par.Do(parts, func(t int) { f(mm, t, t*n/parts, (t+1)*n/parts) })
}

// stretchCount is how many stretches stretches splits n images into.
func (c *Backend) stretchCount(n int) int { return max(1, min(n, c.mm.Threads())) }

// sumOverStretches computes dw as the sum over the images of their
// contributions: f(mm, i0, i1, dst) overwrites dst with that of images
// [i0, i1), a stretch per goroutine (stretches); the stretches' partial sums
// are added up in stretch order, so the result depends on the number of
// goroutines but not on their timing.
func (c *Backend) sumOverStretches(n int, dw []float32, f func(mm *sgemm.Multiplier, i0, i1 int, dst []float32)) {
	partials := make([][]float32, c.stretchCount(n))
	partials[0] = dw
	defer func() {
		for _, d := range partials[1:] {
			putScratch(d)
		}
	}()
	c.stretches(n, func(mm *sgemm.Multiplier, t, i0, i1 int) {
		if t > 0 {
			partials[t] = getScratch(len(dw))
		}
		f(mm, i0, i1, partials[t])
	})
	parallel(len(dw), 1<<12, func(lo, hi int) {
		for _, d := range partials[1:] {
			for i, v := range d[lo:hi] {
				dw[lo+i] += v
			}
		}
	})
}

// chunks runs f over the images of p a chunk at a time (imagesPerChunk: the
// patches path), a stretch of chunks per goroutine (stretches), with
// scratch that a goroutine's calls share: f(mm, n0, n, scratch) for images
// [n0, n0+n).
func (c *Backend) chunks(p kernels.ConvParams, f func(mm *sgemm.Multiplier, n0, n int, scratch *[]float32)) {
	c.stretches(p.N, func(mm *sgemm.Multiplier, _, i0, i1 int) {
		var scratch []float32
		defer func() { putScratch(scratch) }()
		for n0, nb := i0, imagesPerChunk(p); n0 < i1; n0 += nb {
			f(mm, n0, min(nb, i1-n0), &scratch)
		}
	})
}

// shiftConv computes dst (n×m×OH×OW) = wmat (m × cin·r·s) ⊛ src (n×cin×h×w
// padded by padH, padW) for an r×s filter with stride sh×sw (shiftable),
// a stretch of images per goroutine, each filling its own grid,
// multiplying and copying its outputs out a chunk of images at a time.
func (c *Backend) shiftConv(n, cin, h, w, padH, padW, r, s, sh, sw, m int, wmat []float32, src, dst values) {
	oh, ow := (h+2*padH-r)/sh+1, (w+2*padW-s)/sw+1
	c.stretches(n, func(mm *sgemm.Multiplier, _, i0, i1 int) {
		nb := imagesPerGrid(i1-i0, newGrid(1, h, w, padH, padW, sh, sw))
		offs := make([]int, cin*r*s)
		var xg, out []float32
		defer func() {
			putScratch(xg)
			putScratch(out)
		}()
		for n0 := i0; n0 < i1; n0 += nb {
			g := newGrid(min(nb, i1-n0), h, w, padH, padW, sh, sw)
			cols := g.cols(oh, ow)
			g.taps(offs, r, s, padH, padW)
			xg = growScratch(xg, max(cin*sh*sw*g.plane(), maxOffset(offs)+mm.WindowLen(cols)))
			g.fill(xg, src, n0, cin, serial)
			out = growScratch(out, m*cols)
			mm.GemmShifted(m, cols, len(offs), 1, sgemm.MatrixA(wmat, len(offs), false),
				sgemm.Shifted{Data: xg, Offsets: offs}, 0, out, cols)
			for ch := 0; ch < m; ch++ {
				for i := 0; i < g.k; i++ {
					dst.writeRows(((n0+i)*m+ch)*oh*ow, ow, oh, out[ch*cols+i*g.hp*g.wp:], g.wp)
				}
			}
		}
	})
}

// shiftFilterGrad computes a stride-1 convolution's filter gradient over
// the grid: dw[k][t] = Σⱼ dy_grid[k][j] · x_grid[j + offs[t]], dy laid out
// where the forward product computes it (zero elsewhere, so pixels without
// an output add nothing), one product of rows read in place
// (sgemm.GemmRows) per chunk of images, summed over stretches of images
// (sumOverStretches).
func (c *Backend) shiftFilterGrad(p kernels.ConvParams, xs, dys values, dws []float32) {
	oh, ow := p.OutH(), p.OutW()
	c.sumOverStretches(p.N, dws, func(mm *sgemm.Multiplier, i0, i1 int, dst []float32) {
		nb := imagesPerGrid(i1-i0, newGrid(1, p.H, p.W, p.PadH, p.PadW, 1, 1))
		offs := make([]int, p.C*p.R*p.S)
		rowsOfDY := make([]int, p.K)
		var xg, dyg []float32
		defer func() {
			putScratch(xg)
			putScratch(dyg)
		}()
		for n0 := i0; n0 < i1; n0 += nb {
			g := newGrid(min(nb, i1-n0), p.H, p.W, p.PadH, p.PadW, 1, 1)
			gy := g.outputs(oh, ow)
			cols := g.cols(oh, ow)
			g.taps(offs, p.R, p.S, p.PadH, p.PadW)
			for k := range rowsOfDY {
				rowsOfDY[k] = k * gy.plane()
			}
			xg = growScratch(xg, max(p.C*g.plane(), offs[len(offs)-1]+cols))
			g.fill(xg, xs, n0, p.C, serial)
			dyg = growScratch(dyg, p.K*gy.plane())
			gy.fill(dyg, dys, n0, p.K, serial)
			beta := float32(1)
			if n0 == i0 {
				beta = 0
			}
			mm.GemmRows(p.K, len(offs), cols, sgemm.Rows{Data: dyg, Offsets: rowsOfDY},
				sgemm.Rows{Data: xg, Offsets: offs}, beta, dst, len(offs))
		}
	})
}

// Conv2d computes y from x and w.
func (c *Backend) Conv2d(p kernels.ConvParams, x, w, y kernels.Buf) {
	kernels.CheckConv("conv2d", p, x, w, y)
	if p.ChannelsLast {
		c.channelsFirst(p, [3]kernels.Buf{x, w, y}, 2, func(q kernels.ConvParams, o [3]kernels.Buf) { c.Conv2d(q, o[0], o[1], o[2]) })
		return
	}
	ws, doneW := view(w)
	defer doneW()
	if shiftable(p) {
		c.shiftConv(p.N, p.C, p.H, p.W, p.PadH, p.PadW, p.R, p.S, p.StrideH, p.StrideW, p.K, ws, valuesOf(x), valuesOf(y))
		return
	}
	xs, doneX := view(x)
	defer doneX()
	ys, done := out(y)
	chw, crs, l := p.C*p.H*p.W, p.C*p.R*p.S, p.OutH()*p.OutW()
	c.chunks(p, func(mm *sgemm.Multiplier, n0, n int, scratch *[]float32) {
		q := p
		q.N = n
		b := patches{p: q, x: xs[n0*chw : (n0+n)*chw]}
		if n == 1 {
			mm.GemmOp(p.K, l, crs, 1, sgemm.MatrixA(ws, crs, false), b, 0, ys[n0*p.K*l:], l)
			return
		}
		*scratch = growScratch(*scratch, p.K*n*l)
		mm.GemmOp(p.K, n*l, crs, 1, sgemm.MatrixA(ws, crs, false), b, 0, *scratch, n*l)
		for i := 0; i < n; i++ {
			for k := 0; k < p.K; k++ {
				copy(ys[((n0+i)*p.K+k)*l:][:l], (*scratch)[k*n*l+i*l:])
			}
		}
	})
	done()
}

// Conv2dBackwardData computes dx = col2im(wᵀ·dy), a stretch of images a
// goroutine (stretches), a chunk of images at a time.
func (c *Backend) Conv2dBackwardData(p kernels.ConvParams, dy, w, dx kernels.Buf) {
	kernels.CheckConv("conv2d backward data", p, dx, w, dy)
	if p.ChannelsLast {
		c.channelsFirst(p, [3]kernels.Buf{dx, w, dy}, 0, func(q kernels.ConvParams, o [3]kernels.Buf) { c.Conv2dBackwardData(q, o[2], o[1], o[0]) })
		return
	}
	ws, doneW := view(w)
	defer doneW()
	if shiftableGrads(p) {
		// w′[c][k][r][s] = w[k][c][R−1−r][S−1−s]
		rs, crs := p.R*p.S, p.C*p.R*p.S
		flipped := getScratch(len(ws))
		defer putScratch(flipped)
		for k := 0; k < p.K; k++ {
			for ch := 0; ch < p.C; ch++ {
				for t := 0; t < rs; t++ {
					flipped[(ch*p.K+k)*rs+t] = ws[k*crs+ch*rs+rs-1-t]
				}
			}
		}
		c.shiftConv(p.N, p.K, p.OutH(), p.OutW(), p.R-1-p.PadH, p.S-1-p.PadW, p.R, p.S, 1, 1, p.C, flipped, valuesOf(dy), valuesOf(dx))
		return
	}
	dys, doneDY := view(dy)
	defer doneDY()
	dxs, done := out(dx)
	chw, crs, l := p.C*p.H*p.W, p.C*p.R*p.S, p.OutH()*p.OutW()
	c.chunks(p, func(mm *sgemm.Multiplier, n0, n int, scratch *[]float32) {
		b := planes{data: dys[n0*p.K*l : (n0+n)*p.K*l], rows: p.K, cols: l}
		*scratch = growScratch(*scratch, crs*n*l)
		mm.GemmOp(crs, n*l, p.K, 1, sgemm.MatrixA(ws, crs, true), b, 0, *scratch, n*l)
		for i := 0; i < n; i++ {
			img := dxs[(n0+i)*chw : (n0+i+1)*chw]
			clear(img)
			col2im(p, (*scratch)[i*l:], n*l, img)
		}
	})
	done()
}

// Conv2dBackwardFilter computes dw = dy · patchesᵀ (over the grid for
// stride 1), summed over stretches of images (sumOverStretches): the
// result is deterministic for a given number of goroutines.
func (c *Backend) Conv2dBackwardFilter(p kernels.ConvParams, x, dy, dw kernels.Buf) {
	kernels.CheckConv("conv2d backward filter", p, x, dw, dy)
	if p.ChannelsLast {
		c.channelsFirst(p, [3]kernels.Buf{x, dw, dy}, 1, func(q kernels.ConvParams, o [3]kernels.Buf) { c.Conv2dBackwardFilter(q, o[0], o[2], o[1]) })
		return
	}
	dws, done := out(dw)
	defer done()
	if shiftableGrads(p) {
		c.shiftFilterGrad(p, valuesOf(x), valuesOf(dy), dws)
		return
	}
	xs, doneX := view(x)
	defer doneX()
	dys, doneDY := view(dy)
	defer doneDY()
	chw, crs, l := p.C*p.H*p.W, p.C*p.R*p.S, p.OutH()*p.OutW()
	c.sumOverStretches(p.N, dws, func(mm *sgemm.Multiplier, i0, i1 int, dst []float32) {
		q := p
		q.N = i1 - i0
		a := planes{data: dys[i0*p.K*l : i1*p.K*l], rows: p.K, cols: l, rowsFree: true}
		mm.GemmOp(p.K, crs, q.N*l, 1, a, patches{p: q, x: xs[i0*chw : i1*chw], tapsFree: true}, 0, dst, crs)
	})
}

// growScratch returns scratch x, or new scratch in its place, with room for
// n values.
func growScratch(x []float32, n int) []float32 {
	if cap(x) >= n {
		return x[:n]
	}
	putScratch(x)
	return getScratch(n)
}

// channelsFirst runs a direction of a channels-last convolution on
// channels-first copies (kernels.ConvChannelsFirst): the CPU's kernels
// read channels first, and a network chooses channels-last only where
// the backend says it pays (Info.ChannelsLast).
func (c *Backend) channelsFirst(p kernels.ConvParams, ops [3]kernels.Buf, out int, conv func(kernels.ConvParams, [3]kernels.Buf)) {
	kernels.ConvChannelsFirst(p, ops, out, c.temp, c.Transpose, conv)
}

// temp is a scratch buffer of n elements of dt from the pool, and its
// release.
func (c *Backend) temp(n int, dt kernels.DType) (kernels.Buf, func()) {
	blk, err := c.alloc.Alloc(int64(n*dt.Size()), c.Stream())
	if err != nil {
		panic(err)
	}
	return kernels.Buf{Block: blk, N: n, DType: dt}, func() { c.alloc.Free(blk) }
}
