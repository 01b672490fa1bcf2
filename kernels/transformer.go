package kernels

import "fmt"

// TransformerOps are token embeddings and causal scaled dot-product attention.
type TransformerOps interface {
	// Embedding gathers rows of table (vocab×dim) for the I32 ids (n) into
	// y (n×dim, table's dtype): y[i] = table[ids[i]]. An id outside [0,
	// vocab) panics on the CPU and leaves its row unspecified on a GPU.
	Embedding(y, table, ids Buf, n, vocab, dim int)

	// EmbeddingBackward writes into dtable (vocab×dim, F32) the sum of the
	// rows of dy (n×dim) at each id, in the order of the positions (the
	// same bits every run), and zero in the rows of ids that do not occur;
	// with accumulate it adds each id's sum to what its row holds (one
	// addition an element, as adding the tables would) and leaves the other
	// rows be: a tied embedding's gradient added to the classifier's.
	EmbeddingBackward(dtable, dy, ids Buf, n, vocab, dim int, accumulate bool)

	// Attention computes causal scaled dot-product attention, softmax(q·kᵀ
	// ·Scale + mask)·v, into o, and each query's log-sum-exp of its scaled
	// scores into lse (F32, B×H×Tq) for the backward, which recomputes the
	// scores from it: the Tq×Tk matrix is never kept. q, k, v and o share a
	// float dtype.
	Attention(p AttentionParams, q, k, v, o, lse Buf)

	// AttentionBackward writes dq, dk and dv (the strides of q, k, v) from
	// do and what the forward computed; p.Tq must equal p.Tk.
	AttentionBackward(p AttentionParams, q, k, v, o, lse, do, dq, dk, dv Buf)

	// WritePaged copies each row r's key and value (H·D values at row
	// r·p.QRow of k and of v, the strides of a packed qkv) into the paged
	// caches kcache and vcache (one layer's, [Blocks, BlockSize, H·D], k's
	// dtype) at slot slots[r] (I32: block·BlockSize + offset); a negative
	// slot skips its row (a captured batch's padding).
	WritePaged(p PagedParams, k, v, kcache, vcache, slots Buf)
	// PagedAttention computes, for each query row r (H·D values at r·p.QRow
	// of q), causal attention over its sequence's keys and values in the
	// paged caches: the sequence is rowSeq[r] (I32), a row of tables
	// (I32, Seqs×MaxBlocks: the sequence's blocks in order), and the row,
	// at position rowPos[r] (I32), sees the positions 0 to its own, which
	// must have been written. o is Rows×H·D in q's dtype. A decode step's
	// rows are one a sequence; a prefill's, a sequence's new positions
	// after its cached prefix.
	PagedAttention(p PagedParams, q, kcache, vcache, tables, rowSeq, rowPos, o Buf)
}

// PagedParams describes key-value memory cut into Blocks blocks of
// BlockSize positions, H heads of D values a position, and Rows rows of
// queries (or of keys and values to write), QRow elements apart, each of
// one of Seqs sequences whose block tables are MaxBlocks long. MaxLen
// bounds the positions any row sees (its position + 1); Scale multiplies
// the scores.
type PagedParams struct {
	Rows, H, D, QRow  int
	Blocks, BlockSize int
	Seqs, MaxBlocks   int
	MaxLen            int
	Scale             float32
}

// CheckPaged checks a paged operation's caches (Blocks×BlockSize×H·D, of
// one float dtype) and rows (QRow at least H·D, the last row's values
// within rows) against p.
func CheckPaged(op string, p PagedParams, rows, kcache, vcache Buf) {
	if p.Rows <= 0 || p.H <= 0 || p.D <= 0 || p.QRow < p.H*p.D || p.Blocks <= 0 || p.BlockSize <= 0 ||
		p.Seqs <= 0 || p.MaxBlocks <= 0 || p.MaxLen <= 0 || p.MaxLen > p.MaxBlocks*p.BlockSize {
		panic(fmt.Sprintf("kernels: %s: invalid parameters %+v", op, p))
	}
	C := p.H * p.D
	CheckLen(op+" key cache", p.Blocks*p.BlockSize*C, kcache)
	CheckLen(op+" value cache", p.Blocks*p.BlockSize*C, vcache)
	if kcache.DType != vcache.DType || !kcache.DType.Float() || rows.DType != kcache.DType {
		panic(fmt.Sprintf("kernels: %s of %v rows into %v and %v caches: want one float dtype", op, rows.DType, kcache.DType, vcache.DType))
	}
	if need := (p.Rows-1)*p.QRow + C; rows.N < need {
		panic(fmt.Sprintf("kernels: %s: rows of %d elements, their strides reach %d (%+v)", op, rows.N, need, p))
	}
}

// AttentionParams describes causal attention of B batches of Tq queries
// over Tk keys and values, H heads of D values each. Query i of a batch
// sits at position Tk−Tq+i and sees the keys at positions up to its own
// (decoding a new token: Tq = 1 over a cache of Tk). The buffers are
// strided: a position (row) of q is QRow elements after the previous one,
// a batch QBatch after the previous one, and head h's values lie at
// [h·D, h·D+D) of a row; likewise for k, v and o. A packed [B, T, 3, H, D]
// qkv gives q, k and v as views of one buffer, C = H·D and 2C elements
// apart, all with row stride 3C.
type AttentionParams struct {
	B, H, D, Tq, Tk                int
	Scale                          float32
	QRow, KRow, VRow, ORow         int
	QBatch, KBatch, VBatch, OBatch int
}

// CheckEmbedding checks an embedding's table (vocab×dim), I32 ids (n) and
// output or gradient (n×dim).
func CheckEmbedding(op string, rows, table, ids Buf, n, vocab, dim int) {
	if n <= 0 || vocab <= 0 || dim <= 0 {
		panic(fmt.Sprintf("kernels: %s of %d ids into a table of %d×%d", op, n, vocab, dim))
	}
	CheckLen(op+" table", vocab*dim, table)
	CheckLen(op+" ids", n, ids)
	CheckLen(op+" rows", n*dim, rows)
	if ids.DType != I32 {
		panic(fmt.Sprintf("kernels: %s ids are %v, want i32", op, ids.DType))
	}
}

// CheckAttention checks p and that every buffer holds the extent its
// strides reach: lse F32 of B·H·Tq, the others of one float dtype.
func CheckAttention(op string, p AttentionParams, q, k, v, o, lse Buf) {
	if p.B <= 0 || p.H <= 0 || p.D <= 0 || p.Tq <= 0 || p.Tk < p.Tq || !(p.Scale > 0) {
		panic(fmt.Sprintf("kernels: %s: invalid parameters %+v", op, p))
	}
	extent := func(name string, b Buf, row, batch, rows int) {
		if row < p.H*p.D || (p.B > 1 && batch < (rows-1)*row+p.H*p.D) {
			panic(fmt.Sprintf("kernels: %s: %s strides (row %d, batch %d) overlap rows of %d heads of %d", op, name, row, batch, p.H, p.D))
		}
		if need := (p.B-1)*batch + (rows-1)*row + p.H*p.D; b.N < need {
			panic(fmt.Sprintf("kernels: %s: %s holds %d elements, its strides reach %d (%+v)", op, name, b.N, need, p))
		}
		if b.DType != q.DType || !q.DType.Float() {
			panic(fmt.Sprintf("kernels: %s: %s is %v beside %v q", op, name, b.DType, q.DType))
		}
	}
	extent("q", q, p.QRow, p.QBatch, p.Tq)
	extent("k", k, p.KRow, p.KBatch, p.Tk)
	extent("v", v, p.VRow, p.VBatch, p.Tk)
	extent("o", o, p.ORow, p.OBatch, p.Tq)
	CheckLen(op+" log-sum-exp", p.B*p.H*p.Tq, lse)
	CheckF32(op+" log-sum-exp", lse)
}

func (o *Observed) Embedding(y, table, ids Buf, n, vocab, dim int) {
	defer o.op("Embedding", "Embedding", table)()
	o.B.Embedding(y, table, ids, n, vocab, dim)
}

func (o *Observed) EmbeddingBackward(dtable, dy, ids Buf, n, vocab, dim int, accumulate bool) {
	defer o.op("EmbeddingBackward", "EmbeddingBackward", dy)()
	o.B.EmbeddingBackward(dtable, dy, ids, n, vocab, dim, accumulate)
}

func (ob *Observed) Attention(p AttentionParams, q, k, v, o, lse Buf) {
	defer ob.op("Attention", "Attention", q)()
	ob.B.Attention(p, q, k, v, o, lse)
}

func (ob *Observed) AttentionBackward(p AttentionParams, q, k, v, o, lse, do, dq, dk, dv Buf) {
	defer ob.op("AttentionBackward", "AttentionBackward", q)()
	ob.B.AttentionBackward(p, q, k, v, o, lse, do, dq, dk, dv)
}

func (o *Observed) WritePaged(p PagedParams, k, v, kcache, vcache, slots Buf) {
	defer o.op("WritePaged", "WritePaged", k)()
	o.B.WritePaged(p, k, v, kcache, vcache, slots)
}

func (ob *Observed) PagedAttention(p PagedParams, q, kcache, vcache, tables, rowSeq, rowPos, o Buf) {
	defer ob.op("PagedAttention", "PagedAttention", q)()
	ob.B.PagedAttention(p, q, kcache, vcache, tables, rowSeq, rowPos, o)
}
