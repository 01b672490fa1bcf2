// Package sgemm is leangrad's single-precision matrix product on the CPU,
// built the way BLIS builds one: the operands are packed into panels that
// fit the caches, and a register-tiled microkernel multiplies a panel of A by
// a panel of B. The microkernels are Go assembly (AVX-512 where the CPU has
// it, AVX2+FMA otherwise) with a plain Go kernel on other CPUs or under the
// purego build tag; the work is split over goroutines, one per core.
//
// Operands are read through packing, so a matrix need not exist in memory:
// the CPU backend's convolutions pack image patches straight into panels
// (see Operand), and F16 matrices are converted as they are packed (Half). Two shapes of operand skip packing with the AVX kernels:
// a Shifted B, whose rows are windows of one array (GemmShifted: a stride-1
// convolution over a padded grid), and rows of A and B contiguous along k
// (GemmRows: its filter gradient, as tiles of dot products). A B that many
// products read unchanged (a served model's weights) can be packed once
// ahead of them (PackB), its panels then read in place.
package sgemm

import (
	"fmt"
	"runtime"
	"sync"
	"time"

	"github.com/leangrad/leangrad/kernels/cpu/internal/par"
)

// microkernel computes C[i·ldc+j] = Σₚ a[p·mr+i]·b[p·nr+j] for one mr×nr
// tile of C (adding to C when add), from an A panel (kc steps of mr values)
// and a B panel (kc steps of nr values).
type microkernel struct {
	name   string
	mr, nr int
	run    func(kc int, a, b, c *float32, ldc int, add bool)
	// shifted is run with row p of B read in place at b[offs[p]:], or nil
	// for a kernel that reads Shifted operands packed.
	shifted func(kc int, a, b *float32, offs *int, c *float32, ldc int, add bool)
	// dot computes a dotM×dotN tile of dot products of rows read in place
	// (see GemmRows), or is nil for a kernel that packs Rows operands.
	dot func(steps int, a *float32, aoffs *[dotM]int, b *float32, boffs *[dotN]int, out *[dotM * dotN]float32)
	// peak runs n rounds of peakFlops independent FMA flops: the core's
	// peak, or nil for the Go kernel.
	peak      func(n int)
	peakFlops int
}

// kernels are the microkernels this CPU can run, fastest first.
var kernels = append(archKernels(), &microkernel{name: "go", mr: 4, nr: 4, run: kernelGo})

// Blocking: a kc×nr panel of B stays in L1 while the microkernel walks an
// mc×kc block of A in L2; a kc×nc block of B lives in L3.
const (
	blockK = 384
	blockM = 144  // a multiple of every kernel's mr (8, 6, 4)
	blockN = 4080 // a multiple of every kernel's nr (48, 16, 4)
)

// minFlopsPerThread is the work (m·n·k) below which another goroutine costs
// more than it saves.
const minFlopsPerThread = 1 << 17

// Kernels lists the microkernels this CPU can run, fastest first; the first
// is the one Default uses.
func Kernels() []string {
	names := make([]string, len(kernels))
	for i, k := range kernels {
		names[i] = k.name
	}
	return names
}

// A Multiplier computes matrix products with one microkernel over a number
// of goroutines. It holds no state between calls: one may be shared.
type Multiplier struct {
	k       *microkernel
	threads int
	stop    <-chan struct{} // WithStop's
}

var defaultMultiplier = &Multiplier{k: kernels[0]}

// Default is the Multiplier with the fastest kernel, running on GOMAXPROCS
// goroutines.
func Default() *Multiplier { return defaultMultiplier }

// New returns a Multiplier with the named kernel (one of Kernels) and up to
// threads goroutines (0 for GOMAXPROCS at each call).
func New(kernel string, threads int) (*Multiplier, error) {
	if threads < 0 {
		return nil, fmt.Errorf("sgemm: %d threads", threads)
	}
	for _, k := range kernels {
		if k.name == kernel {
			return &Multiplier{k: k, threads: threads}, nil
		}
	}
	return nil, fmt.Errorf("sgemm: kernel %q is not available on this CPU (have %v)", kernel, Kernels())
}

// WithThreads is mu running on up to threads goroutines (0 for GOMAXPROCS,
// less the cores kept free: Threads).
func (mu *Multiplier) WithThreads(threads int) *Multiplier {
	if threads < 0 {
		panic(fmt.Sprintf("sgemm: %d threads", threads))
	}
	return &Multiplier{k: mu.k, threads: threads, stop: mu.stop}
}

// WithStop is mu whose products (GemmOp, GemmOpTiles, Gemm, GemmShifted)
// stop part way once stop is closed: each goroutine looks at it before
// each block of A it multiplies (blockM rows by blockN columns by blockK
// steps, milliseconds), and leaves the rest of C as it was. A product of
// a large model on a CPU takes seconds; Stopped says afterwards whether C
// may be partly written.
func (mu *Multiplier) WithStop(stop <-chan struct{}) *Multiplier {
	return &Multiplier{k: mu.k, threads: mu.threads, stop: stop}
}

// Stopped reports whether WithStop's channel is closed: a product that
// returned since may have stopped part way.
func (mu *Multiplier) Stopped() bool { return closed(mu.stop) }

// closed reports whether stop is closed (never, for nil).
func closed(stop <-chan struct{}) bool {
	select {
	case <-stop:
		return true
	default:
		return false
	}
}

// Threads is how many goroutines mu's products run on at most, now: with
// threads 0, GOMAXPROCS less the cores kept free (kernels/cpu's LeaveCores).
func (mu *Multiplier) Threads() int {
	if mu.threads == 0 {
		return par.Threads()
	}
	return mu.threads
}

// Kernel is the name of the microkernel in use.
func (mu *Multiplier) Kernel() string { return mu.k.name }

// Gemm computes C = alpha·op(A)·op(B) + beta·C on row-major matrices, BLAS
// style: op(A) is m×k (A is stored k×m when transA), op(B) is k×n (stored
// n×k when transB), and lda, ldb and ldc are the stored rows' strides. With
// beta 0, C is only written.
func (mu *Multiplier) Gemm(transA, transB bool, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) {
	ar, ac := m, k
	if transA {
		ar, ac = k, m
	}
	br, bc := k, n
	if transB {
		br, bc = n, k
	}
	checkMatrix("A", a, ar, ac, lda)
	checkMatrix("B", b, br, bc, ldb)
	mu.GemmOp(m, n, k, alpha, MatrixA(a, lda, transA), MatrixB(b, ldb, transB), beta, c, ldc)
}

func checkMatrix(name string, x []float32, rows, cols, ld int) {
	if rows < 0 || cols < 0 || ld < max(cols, 1) {
		panic(fmt.Sprintf("sgemm: %s is %d×%d with stride %d", name, rows, cols, ld))
	}
	if rows > 0 && cols > 0 && len(x) < (rows-1)*ld+cols {
		panic(fmt.Sprintf("sgemm: %s is %d×%d with stride %d but has %d elements", name, rows, cols, ld, len(x)))
	}
}

// GemmOp computes C = alpha·A·B + beta·C with A (m×k) and B (k×n) read
// through their Pack methods; C is row-major with stride ldc.
func (mu *Multiplier) GemmOp(m, n, k int, alpha float32, a, b Operand, beta float32, c []float32, ldc int) {
	mu.gemm(m, n, k, alpha, a, b, nil, beta, c, ldc, nil)
}

// GemmOpTiles is GemmOp that calls done(i0, i1, j0, j1) as each block of C
// (rows [i0, i1), columns [j0, j1): a column of tiles, up to blockM rows by
// one tile's columns, or a goroutine's share when k or alpha is 0) holds its
// result, on the goroutine that computed it, while it is hot in cache.
// Blocks do not overlap, and cover C once. The CPU backend rounds an F16
// product's float32 blocks into its F16 output there.
func (mu *Multiplier) GemmOpTiles(m, n, k int, alpha float32, a, b Operand, beta float32, c []float32, ldc int, done func(i0, i1, j0, j1 int)) {
	mu.gemm(m, n, k, alpha, a, b, nil, beta, c, ldc, done)
}

// GemmShifted is GemmOp with a Shifted B, which the assembly kernels read in
// place, unpacked.
func (mu *Multiplier) GemmShifted(m, n, k int, alpha float32, a Operand, b Shifted, beta float32, c []float32, ldc int) {
	if len(b.Offsets) != k {
		panic(fmt.Sprintf("sgemm: shifted B has %d row offsets for k = %d", len(b.Offsets), k))
	}
	if n > 0 {
		need := mu.WindowLen(n)
		for p, o := range b.Offsets {
			if o < 0 || o+need > len(b.Data) {
				panic(fmt.Sprintf("sgemm: shifted B row %d at offset %d needs %d elements, has %d", p, o, o+need, len(b.Data)))
			}
		}
	}
	if mu.k.shifted == nil {
		mu.gemm(m, n, k, alpha, a, b, nil, beta, c, ldc, nil)
		return
	}
	mu.gemm(m, n, k, alpha, a, nil, &b, beta, c, ldc, nil)
}

// WindowLen is how many elements of a Shifted operand's Data each row's
// window of n columns spans for this Multiplier: the kernels read whole tiles
// of columns, past n in the last one.
func (mu *Multiplier) WindowLen(n int) int { return ceil(n, mu.k.nr) * mu.k.nr }

// The dot kernel's tile: dotM rows of A by dotN rows of B, each dot product
// summed sixteen lanes at a time along the rows.
const (
	dotM, dotN = 4, 6
	dotLanes   = 16
	// dotChunk is the stretch of k one pass over the tiles covers: a tile's
	// dotM rows of A (16 KiB) stay in L1 while it runs along B's rows.
	dotChunk = 1024
)

// GemmRows computes C = A·Bᵀ + beta·C, beta 0 or 1, for A (m×k) and B
// (n×k) whose rows are contiguous along k: C[i·ldc+j] = Σₚ A(i, p)·B(j, p).
// The AVX-512 kernel reads both in place, as tiles of dot products, when k
// is long beside m (see dotted); otherwise, and with other kernels, they
// are packed. A convolution's filter gradient is such a product:
// rows of dy times the padded image shifted by each tap.
func (mu *Multiplier) GemmRows(m, n, k int, a, b Rows, beta float32, c []float32, ldc int) {
	if len(a.Offsets) != m || len(b.Offsets) != n {
		panic(fmt.Sprintf("sgemm: GemmRows of %d×%d by %d×%d has %d and %d row offsets", m, k, n, k, len(a.Offsets), len(b.Offsets)))
	}
	if beta != 0 && beta != 1 {
		panic(fmt.Sprintf("sgemm: GemmRows with beta %v (0 or 1)", beta))
	}
	a.check("A", k)
	b.check("B", k)
	if !mu.dotted(m, k) {
		mu.GemmOp(m, n, k, 1, a, b, beta, c, ldc)
		return
	}
	checkMatrix("C", c, m, n, ldc)
	groups := ceil(n, dotN)
	threads := mu.goroutines(m, n, k, groups)
	fanOut(threads, func(t int) {
		mu.dotTiles(m, n, k, a, b, beta != 0, c, ldc, t*groups/threads*dotN, min(n, (t+1)*groups/threads*dotN))
	})
}

// dotted reports whether GemmRows runs an m×k by k×n product as tiles of
// dot products. Each tile pays a reduction of its sums across lanes, a cost
// per element of C that a long k amortises; packing pays for every element
// of B, which a tall A amortises. Dot tiles won where k ≥ 32·m for the
// filter gradients of ResNet-20 (on the development machine and on a Xeon:
// 64 channels of 7×7 images, k = 1024 a goroutine, ran 35% faster packed on
// the Xeon; 16 and 32 channels, k = 3600, ran as fast as dots or slower).
func (mu *Multiplier) dotted(m, k int) bool {
	return mu.k.dot != nil && k >= dotLanes && k >= 32*m
}

// goroutines is how many goroutines a product of m×k by k×n split into at
// most parts pieces runs on.
func (mu *Multiplier) goroutines(m, n, k, parts int) int {
	return max(1, min(mu.Threads(), parts, m*n*k/minFlopsPerThread))
}

// fanOut runs run(0) … run(threads−1), the first on the calling goroutine,
// the others on par's workers.
func fanOut(threads int, run func(t int)) { par.Do(threads, run) }

// dotTiles computes columns [j0, j1) of GemmRows' C: for each stretch of k,
// each group of dotM rows of A against every group of dotN rows of B in
// turn, so that the rows of A are read from L1 (a convolution's filter
// gradient: A is dy, B the image under each tap).
func (mu *Multiplier) dotTiles(m, n, k int, a, b Rows, add bool, c []float32, ldc, j0, j1 int) {
	var ao [dotM]int
	var bo [dotN]int
	var tile [dotM * dotN]float32
	body := k &^ (dotLanes - 1)
	for p0 := 0; p0 < body; p0 += dotChunk {
		steps := min(dotChunk, body-p0) / dotLanes
		acc := add || p0 > 0
		for i := 0; i < m; i += dotM {
			for ii := range ao {
				ao[ii] = a.Offsets[min(i+ii, m-1)] + p0 // rows past the end repeat the last
			}
			for j := j0; j < j1; j += dotN {
				for jj := range bo {
					bo[jj] = b.Offsets[min(j+jj, j1-1)] + p0
				}
				mu.k.dot(steps, &a.Data[0], &ao, &b.Data[0], &bo, &tile)
				for ii := 0; ii < min(dotM, m-i); ii++ {
					row := c[(i+ii)*ldc+j:][:min(dotN, j1-j)]
					src := tile[ii*dotN:]
					if acc {
						for jj := range row {
							row[jj] += src[jj]
						}
					} else {
						copy(row, src)
					}
				}
			}
		}
	}
	if body == k {
		return
	}
	// The last k mod 16 terms, in Go.
	for i := 0; i < m; i++ {
		ar := a.Data[a.Offsets[i]+body : a.Offsets[i]+k]
		for j := j0; j < j1; j++ {
			br := b.Data[b.Offsets[j]+body:][:len(ar)]
			var s float32
			for p, v := range ar {
				s += v * br[p]
			}
			c[i*ldc+j] += s
		}
	}
}

// gemm is the product with B packed from b or, when sh is given, read in
// place by the kernel, calling done (when given) as GemmOpTiles says.
func (mu *Multiplier) gemm(m, n, k int, alpha float32, a, b Operand, sh *Shifted, beta float32, c []float32, ldc int, done func(i0, i1, j0, j1 int)) {
	if m < 0 || n < 0 || k < 0 {
		panic(fmt.Sprintf("sgemm: product of %d×%d by %d×%d", m, k, k, n))
	}
	checkMatrix("C", c, m, n, ldc)
	if m == 0 || n == 0 {
		return
	}
	kern := mu.k
	// Split one dimension, in whole tiles, over the goroutines. Each packs
	// the operand along the other whole: split the one that leaves each
	// goroutine the least packing. A Shifted B is not packed, but every
	// goroutine reading all of it doubles its traffic: split its columns.
	tilesM, tilesN := ceil(m, kern.mr), ceil(n, kern.nr)
	threads := mu.goroutines(m, n, k, max(tilesM, tilesN))
	splitN := tilesN >= tilesM
	if sh == nil && threads > 1 && min(tilesM, tilesN) >= threads {
		t := float64(threads)
		splitN = float64(m*k)+float64(k*n)/t <= float64(m*k)/t+float64(k*n)
	}
	tiles := tilesM
	if splitN {
		tiles = tilesN
	}
	threads = min(threads, tiles)
	fanOut(threads, func(t int) {
		lo, hi := t*tiles/threads, (t+1)*tiles/threads
		i0, i1, j0, j1 := 0, m, 0, n
		if splitN {
			j0, j1 = lo*kern.nr, min(n, hi*kern.nr)
		} else {
			i0, i1 = lo*kern.mr, min(m, hi*kern.mr)
		}
		if k == 0 || alpha == 0 {
			scaleC(c, i0, i1, j0, j1, ldc, beta)
			if done != nil {
				done(i0, i1, j0, j1)
			}
			return
		}
		if beta != 0 {
			scaleC(c, i0, i1, j0, j1, ldc, beta)
		}
		block(kern, i0, i1, j0, j1, k, alpha, a, b, sh, beta != 0, c, ldc, done, mu.stop)
	})
}

func ceil(a, b int) int { return (a + b - 1) / b }

// scaleC sets C's block [i0, i1)×[j0, j1) to beta·C (to zero for beta 0,
// whatever C held).
func scaleC(c []float32, i0, i1, j0, j1, ldc int, beta float32) {
	if beta == 1 {
		return
	}
	for i := i0; i < i1; i++ {
		row := c[i*ldc+j0 : i*ldc+j1]
		if beta == 0 {
			clear(row)
			continue
		}
		for j := range row {
			row[j] *= beta
		}
	}
}

// buffers are one goroutine's packed panels, and the tile an edge of C is
// computed in whole.
type buffers struct {
	a, b []float32
	edge [8 * 48]float32
}

var bufferPool = sync.Pool{New: func() any { return new(buffers) }}

// grow returns x with room for n values.
func grow(x []float32, n int) []float32 {
	if cap(x) < n {
		return make([]float32, n)
	}
	return x[:n]
}

// block adds alpha·A·B to C's block [i0, i1)×[j0, j1), or, unless add,
// overwrites the block with it. B is packed from b, or read in place from
// sh or from b's panels when b is Packed for this kernel.
// done, when given, is called with each column of tiles (the block's rows
// by one tile's columns) as its last step of k is added. Once stop is
// closed it returns before the next block of A.
func block(kern *microkernel, i0, i1, j0, j1, k int, alpha float32, a, b Operand, sh *Shifted, add bool, c []float32, ldc int, done func(i0, i1, j0, j1 int), stop <-chan struct{}) {
	buf := bufferPool.Get().(*buffers)
	defer bufferPool.Put(buf)
	mr, nr := kern.mr, kern.nr
	buf.a = grow(buf.a, ceil(min(blockM, i1-i0), mr)*mr*min(blockK, k))
	pk, packed := b.(Packed) // its panels read in place
	packed = packed && sh == nil && pk.nr == nr
	if sh == nil && !packed {
		buf.b = grow(buf.b, ceil(min(blockN, j1-j0), nr)*nr*min(blockK, k))
	}
	for jc := j0; jc < j1; jc += blockN {
		nc := min(blockN, j1-jc)
		for pc := 0; pc < k; pc += blockK {
			kc := min(blockK, k-pc)
			acc := add || pc > 0
			last := done != nil && pc+kc == k
			if sh == nil && !packed {
				b.Pack(buf.b, jc, nc, pc, kc, nr)
			}
			for ic := i0; ic < i1; ic += blockM {
				if stop != nil && closed(stop) {
					return
				}
				mc := min(blockM, i1-ic)
				a.Pack(buf.a, ic, mc, pc, kc, mr)
				if alpha != 1 {
					pa := buf.a[:ceil(mc, mr)*mr*kc]
					for i := range pa {
						pa[i] *= alpha
					}
				}
				for jr := 0; jr < nc; jr += nr {
					var bp *float32
					var offs *int // B's rows, read in place
					switch {
					case packed:
						bp = &pk.panel(pc, kc, jc+jr)[0]
					case sh == nil:
						bp = &buf.b[jr*kc]
					default:
						bp, offs = &sh.Data[jc+jr], &sh.Offsets[pc]
					}
					w := min(nr, nc-jr)
					for ir := 0; ir < mc; ir += mr {
						ap := &buf.a[ir*kc]
						h := min(mr, mc-ir)
						ci := (ic+ir)*ldc + jc + jr
						tile(kern, kc, ap, bp, offs, c[ci:], ldc, acc, h, w, &buf.edge)
					}
					if last {
						done(ic, ic+mc, jc+jr, jc+jr+w)
					}
				}
			}
		}
	}
}

// tile adds (or, unless acc, writes) one h×w tile of the product into c,
// with row stride ldc: from an A panel at ap and a B panel at bp, or B's rows
// read in place at bp[offs[p]:] when offs is given. A partial tile is
// computed whole into edge and added in part.
func tile(kern *microkernel, kc int, ap, bp *float32, offs *int, c []float32, ldc int, acc bool, h, w int, edge *[8 * 48]float32) {
	mr, nr := kern.mr, kern.nr
	if h == mr && w == nr {
		if offs == nil {
			kern.run(kc, ap, bp, &c[0], ldc, acc)
		} else {
			kern.shifted(kc, ap, bp, offs, &c[0], ldc, acc)
		}
		return
	}
	t := edge[:mr*nr]
	if offs == nil {
		kern.run(kc, ap, bp, &t[0], nr, false)
	} else {
		kern.shifted(kc, ap, bp, offs, &t[0], nr, false)
	}
	for i := 0; i < h; i++ {
		row := c[i*ldc : i*ldc+w]
		src := t[i*nr : i*nr+w]
		if !acc {
			copy(row, src)
			continue
		}
		for j, v := range src {
			row[j] += v
		}
	}
}

// PeakGFLOPS measures the FMA peak of one core with this Multiplier's
// instructions: a loop of independent FMAs with no memory operands, run for
// about d on a goroutine locked to its thread, so it counts the clock the
// core actually holds under this load. It is 0 for the Go kernel, which has
// no such loop.
func (mu *Multiplier) PeakGFLOPS(d time.Duration) float64 {
	if mu.k.peak == nil {
		return 0
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	mu.k.peak(1 << 16) // warm up the vector units
	const rounds = 1 << 20
	var n int
	t0 := time.Now()
	for time.Since(t0) < d {
		mu.k.peak(rounds)
		n += rounds
	}
	return float64(n) * float64(mu.k.peakFlops) / time.Since(t0).Seconds() / 1e9
}
