package cpu

import (
	"fmt"
	"math"

	"github.com/leangrad/leangrad/kernels"
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
