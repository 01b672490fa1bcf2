package cpu

import (
	"fmt"
	"math"

	"github.com/leangrad/leangrad/kernels"
	"github.com/leangrad/leangrad/kernels/cpu/sgemm"
)

// checkCE checks the arguments and, on the host, that every label is a class.
func checkCE(op string, logits, labels, lse kernels.Buf, n, k int) []int32 {
	kernels.CheckCrossEntropy(op, logits, labels, lse, n, k)
	ls := i32s(labels)
	for i, l := range ls {
		if l < 0 || int(l) >= k {
			panic(fmt.Sprintf("cpu: %s: label %d of row %d is outside [0, %d)", op, l, i, k))
		}
	}
	return ls
}

// CrossEntropy computes the mean negative log-likelihood of the labels under
// softmax(logits), with each row's log-sum-exp m + log Σ exp(x − m).
func (c *Backend) CrossEntropy(logits, labels, lse, loss kernels.Buf, n, k int) {
	ls := checkCE("cross entropy", logits, labels, lse, n, k)
	kernels.CheckLen("cross entropy loss", 1, loss)
	xs, doneX := view(logits)
	defer doneX()
	lses := f32s(lse)
	var total float64
	for i := 0; i < n; i++ {
		row := xs[i*k : (i+1)*k]
		m := row[0]
		for _, v := range row {
			m = max(m, v)
		}
		var s float64
		for _, v := range row {
			s += math.Exp(float64(v - m))
		}
		l := float64(m) + math.Log(s)
		lses[i] = float32(l)
		total += l - float64(row[ls[i]])
	}
	o, done := out(loss)
	o[0] = float32(total / float64(n))
	done()
}

// CrossEntropyBackward computes dlogits = (softmax − onehot)·dloss/n.
func (c *Backend) CrossEntropyBackward(logits, labels, lse, dloss, dlogits kernels.Buf, n, k int) {
	ls := checkCE("cross entropy backward", logits, labels, lse, n, k)
	kernels.CheckLen("cross entropy backward", n*k, dlogits)
	kernels.CheckLen("cross entropy backward dloss", 1, dloss)
	xs, doneX := view(logits)
	defer doneX()
	lses, g := f32s(lse), in(dloss)[0]/float32(n)
	dxs, done := out(dlogits)
	for i := 0; i < n; i++ {
		for j := 0; j < k; j++ {
			p := float32(math.Exp(float64(xs[i*k+j] - lses[i])))
			if int32(j) == ls[i] {
				p--
			}
			dxs[i*k+j] = p * g
		}
	}
	done()
}

// classifierChunk is how many rows of logits the CPU's fused classifier
// holds at a time.
const classifierChunk = 256

// ClassifierLoss computes a chunk of logits at a time with sgemm: the rows'
// losses and right predictions, and with p.Grad their softmax − one-hot,
// whose products with w and h are the chunk's share of dh and dw.
func (c *Backend) ClassifierLoss(p kernels.ClassifierParams, h, w, labels, loss, right, dh, dw kernels.Buf) {
	kernels.CheckClassifier(p, h, w, labels, loss, right, dh, dw)
	c.classifierLoss(c.mm, p, h, w, labels, loss, right, dh, dw)
}

// ClassifierLossStoppable is ClassifierLoss that stops part way once stop
// is closed (see kernels.Stoppable): its products look at stop before each
// block, and the loss before each chunk of rows. It reports whether it ran
// whole; when it did not, its outputs are partly written.
func (c *Backend) ClassifierLossStoppable(p kernels.ClassifierParams, h, w, labels, loss, right, dh, dw kernels.Buf, stop <-chan struct{}) bool {
	kernels.CheckClassifier(p, h, w, labels, loss, right, dh, dw)
	mm := c.mm.WithStop(stop)
	c.classifierLoss(mm, p, h, w, labels, loss, right, dh, dw)
	return !mm.Stopped()
}

// classifierLoss is ClassifierLoss on mm's goroutines.
func (c *Backend) classifierLoss(mm *sgemm.Multiplier, p kernels.ClassifierParams, h, w, labels, loss, right, dh, dw kernels.Buf) {
	lab := i32s(labels)
	checkIDs("classifier loss", lab, p.V)
	m := min(classifierChunk, p.N)
	logits := getScratch(m * p.V)
	defer putScratch(logits)
	var total float64
	count := 0
	inv := 1 / float32(p.N)
	if p.GradScale.Valid() && p.Grad { // the logits' gradient stays F32 here: the scale joins 1/N
		inv *= f32s(p.GradScale)[0]
	}
	for r0 := 0; r0 < p.N && !mm.Stopped(); r0 += m {
		rows := min(m, p.N-r0)
		// logits = h[r0:r0+rows]·wᵀ
		mm.GemmOp(rows, p.V, p.C, 1, operand(h, r0*p.C, p.C, false, true), operand(w, 0, p.C, true, false), 0, logits, p.V)
		losses := make([]float64, rows)
		hits := make([]bool, rows)
		parallel(rows, max(1, elemGrain/p.V), func(lo, hi int) {
			var tmp []uint16
			if h.DType == kernels.F16 {
				tmp = make([]uint16, p.V)
			}
			for r := lo; r < hi; r++ {
				z := logits[r*p.V : (r+1)*p.V]
				roundLike(h.DType, z, tmp)
				mx, arg := float32(math.Inf(-1)), 0
				for j, v := range z {
					if v > mx {
						mx, arg = v, j
					}
				}
				y := int(lab[r0+r])
				zy := z[y]
				sum := expShift(z, mx)
				lse := float64(mx) + math.Log(sum)
				losses[r], hits[r] = lse-float64(zy), arg == y
				if p.Grad {
					inv := float32(1 / sum)
					for j := range z {
						z[j] *= inv
					}
					z[y]--
				}
			}
		})
		for r := range rows {
			total += losses[r]
			if hits[r] {
				count++
			}
		}
		if !p.Grad {
			continue
		}
		// dh[r0:] = (1/N)·dlogits·w;  dw += (1/N)·dlogitsᵀ·h[r0:]
		mm.GemmOp(rows, p.C, p.V, inv, sgemm.MatrixA(logits, p.V, false), operand(w, 0, p.C, false, false), 0, f32s(dh)[r0*p.C:], p.C)
		beta := float32(1)
		if r0 == 0 {
			beta = 0
		}
		mm.GemmOp(p.V, p.C, rows, inv, sgemm.MatrixA(logits, p.V, true), operand(h, r0*p.C, p.C, false, false), beta, f32s(dw), p.C)
	}
	f32s(loss)[0] = float32(total / float64(p.N))
	f32s(right)[0] = float32(count)
}

// CountCorrect counts the rows whose first maximum is at their label.
func (c *Backend) CountCorrect(right, logits, labels kernels.Buf, n, k int) {
	kernels.CheckCountCorrect(right, logits, labels, n, k)
	xs, doneX := view(logits)
	defer doneX()
	ys := i32s(labels)
	count := 0
	for r := 0; r < n; r++ {
		best, bi := float32(math.Inf(-1)), 0
		for j, v := range xs[r*k : (r+1)*k] {
			if v > best {
				best, bi = v, j
			}
		}
		if int32(bi) == ys[r] {
			count++
		}
	}
	f32s(right)[0] = float32(count)
}

// AccumulateMetrics adds the batch's summed loss, its right predictions
// and their number to sums.
func (c *Backend) AccumulateMetrics(sums, loss, right kernels.Buf, n int) {
	kernels.CheckMetrics(sums, loss, right, n)
	s := f32s(sums)
	s[0] += f32s(loss)[0] * float32(n)
	s[1] += f32s(right)[0]
	s[2] += float32(n)
}
