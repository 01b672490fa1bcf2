package nn

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sort"

	ag "github.com/leangrad/leangrad/autograd"
	"github.com/leangrad/leangrad/memory"
	"github.com/leangrad/leangrad/tensor"
)

// GPTConfig describes a GPT-2-style decoder-only transformer: Layers blocks
// of causal self-attention (Heads heads) and a 4×Width MLP with GELU, each
// behind a layer norm and a residual connection, over tied token
// embeddings (Vocab×Width) and learned positions (Context×Width).
type GPTConfig struct {
	Layers, Heads, Width int
	Vocab, Context       int
	// Dropout is the probability of the residual and embedding dropouts
	// (0: none, GPT-2's fine-tuning default); attention weights are not
	// dropped.
	Dropout float32
	// ProductWeights is the dtype the blocks' matrix weights (c_attn,
	// attn.c_proj, mlp.c_fc, mlp.c_proj: all but the embeddings' share of
	// the parameters) are held in: F32 (0), or BF16 or F16 as working
	// weights under autocast to that dtype, half the device memory, whose
	// F32 master copies an offloaded optimizer keeps in host memory
	// (optim.Offload). Their gradients come in the same dtype. The
	// embeddings, biases and layer norms stay F32.
	ProductWeights tensor.DType `json:",omitempty"`
}

// String is c as train's -model names a shape, gpt:L12,W768,H12,C1024,V50257
// (layers, width, heads, context, vocabulary), with its dropout and its
// product weights' dtype where they are not the defaults.
func (c GPTConfig) String() string {
	s := fmt.Sprintf("gpt:L%d,W%d,H%d,C%d,V%d", c.Layers, c.Width, c.Heads, c.Context, c.Vocab)
	if c.Dropout != 0 {
		s += fmt.Sprintf(" (dropout %g)", c.Dropout)
	}
	if c.ProductWeights != 0 {
		s += fmt.Sprintf(" (product weights in %v)", c.ProductWeights)
	}
	return s
}

// GPT2Small is GPT-2 small: 12 layers, 12 heads, width 768, GPT-2's BPE
// vocabulary of 50,257, a context of 1024: 124M parameters.
func GPT2Small() GPTConfig {
	return GPTConfig{Layers: 12, Heads: 12, Width: 768, Vocab: 50257, Context: 1024}
}

// Check reports whether the configuration describes a model.
func (c GPTConfig) Check() error {
	switch {
	case c.Layers < 1 || c.Heads < 1 || c.Width < 1 || c.Vocab < 2 || c.Context < 1:
		return fmt.Errorf("%v: want at least one layer, head, width and position, and two tokens", c)
	case c.Width%c.Heads != 0:
		return fmt.Errorf("%v: the width %d is not a multiple of the %d heads", c, c.Width, c.Heads)
	case !(c.Dropout >= 0 && c.Dropout < 1):
		return fmt.Errorf("%v: dropout %v outside [0, 1)", c, c.Dropout)
	case c.ProductWeights != 0 && c.ProductWeights != tensor.F32 && !c.ProductWeights.Half():
		return fmt.Errorf("%v: product weights in %v: want f32, bf16 or f16", c, c.ProductWeights)
	}
	// Params without wrapping: a block holds 12·W² weights and 13·W
	// biases and gains, under 13·W² for any width of 13 or more (and far
	// from an int's limit below).
	blocks, ok1 := memory.Product(13, c.Layers, c.Width, c.Width)
	embed, ok2 := memory.Product(c.Vocab+c.Context, c.Width)
	if !ok1 || !ok2 || blocks > math.MaxInt-embed {
		return fmt.Errorf("%v: more parameters than an int counts", c)
	}
	return nil
}

// Params is the number of trainable parameters of a model of c (the
// embeddings counted once: they are tied).
func (c GPTConfig) Params() int {
	C := c.Width
	block := 2*2*C + (3*C*C + 3*C) + (C*C + C) + (4*C*C + 4*C) + (4*C*C + C)
	return c.Vocab*C + c.Context*C + c.Layers*block + 2*C
}

// TokenFLOPs is a training step's model FLOPs a token of a model of c
// with params parameters, in windows of its context: 6N + 12·L·C·T
// (PaLM's count, attention's products included, a recomputation not).
func (c GPTConfig) TokenFLOPs(params int64) float64 {
	return 6*float64(params) + 12*float64(c.Layers)*float64(c.Width)*float64(c.Context)
}

// CheckpointBytes is what one checkpointed block keeps for its
// recomputation at a batch of windows of the model's context, with matrix
// products in amp (0: F32): its F32 input, attention's output (in amp's
// dtype) and attention's F32 log-sum-exps (autograd's Note [what a
// checkpoint keeps]).
func (c GPTConfig) CheckpointBytes(batch int, amp tensor.DType) int64 {
	out := int64(4)
	if amp != 0 {
		out = int64(amp.Size())
	}
	tokens := int64(batch) * int64(c.Context)
	return tokens*int64(c.Width)*(4+out) + tokens*int64(c.Heads)*4
}

// ParamBytes is what the parameters of a model of c take on the device:
// four bytes each, two for the blocks' matrix weights in a 16-bit
// ProductWeights.
func (c GPTConfig) ParamBytes() int64 {
	n, w := int64(c.Params()), c.productWeights()
	if c.ProductWeights.Half() {
		return 4*(n-w) + 2*w
	}
	return 4 * n
}

// productWeights counts the blocks' matrix weights: 12·W² a block.
func (c GPTConfig) productWeights() int64 {
	return 12 * int64(c.Layers) * int64(c.Width) * int64(c.Width)
}

// KeptBytes is what all its checkpointed blocks keep a forward, Layers ×
// CheckpointBytes: what offloaded activations take in host memory.
func (c GPTConfig) KeptBytes(batch int, amp tensor.DType) int64 {
	return int64(c.Layers) * c.CheckpointBytes(batch, amp)
}

// LayerNorm is layer normalisation over the last dimension, with a gain
// and a bias.
type LayerNorm struct {
	Weight, Bias *T
	Eps          float32
}

// NewLayerNorm returns a layer norm over n features: gain 1, bias 0, ε 1e-5.
func NewLayerNorm(dev *tensor.Device, n int) *LayerNorm {
	return &LayerNorm{Weight: newParam(tensor.Ones(dev, tensor.F32, n)), Bias: newParam(tensor.Zeros(dev, tensor.F32, n)), Eps: 1e-5}
}

// Forward normalises x over its last dimension.
func (l *LayerNorm) Forward(x *T) *T { return ag.LayerNorm(x, l.Weight, l.Bias, l.Eps) }

// ForProduct normalises x for a matrix product: under Autocast, an F32 x's
// output is in the autocast dtype (autograd.LayerNormTo), which the product
// would cast it to anyway; otherwise it is Forward.
func (l *LayerNorm) ForProduct(x *T) *T {
	dt := x.DType()
	if a := ag.AutocastDType(ag.ModeOf(x, l.Weight)); a != 0 && dt == tensor.F32 {
		dt = a
	}
	return ag.LayerNormTo(x, l.Weight, l.Bias, l.Eps, dt)
}

// State lists the gain and the bias, neither weight-decayed.
func (l *LayerNorm) State(prefix string) []Named {
	return []Named{{Name: join(prefix, "weight"), T: l.Weight, Param: true, NoDecay: true},
		{Name: join(prefix, "bias"), T: l.Bias, Param: true, NoDecay: true}}
}

// SetTraining does nothing.
func (l *LayerNorm) SetTraining(bool) {}

// GPTBlock is one transformer block: x + attention(ln_1(x)), then
// x + mlp(ln_2(x)).
type GPTBlock struct {
	LN1, LN2       *LayerNorm
	Attn, AttnProj *Linear // c_attn (Width → 3·Width) and c_proj
	FC, Proj       *Linear // mlp.c_fc (Width → 4·Width) and mlp.c_proj
	Heads          int
	Drop           *Dropout
}

// attention is x's causal self-attention before c_proj: ln_1, c_attn and
// the heads' attention, (B·T)×Width.
func (b *GPTBlock) attention(x *T) *T {
	B, Tn, C := x.Dim(0), x.Dim(1), x.Dim(2)
	h := then(b.LN1.ForProduct(x), func(h *T) *T { return ag.Reshape(h, B*Tn, C) })
	h = then(h, func(h *T) *T { return ag.Keepable(ag.ModeOf(h), func() *T { return b.Attn.Forward(h) }) })
	h = then(h, func(h *T) *T { return ag.Reshape(h, B, Tn, 3*C) })
	h = then(h, func(h *T) *T { return ag.CausalAttention(h, b.Heads) })
	return then(h, func(h *T) *T { return ag.Reshape(h, B*Tn, C) })
}

// feedForward is c_proj(GELU(c_fc(h))) for h of N×Width (ag.MLP).
func (b *GPTBlock) feedForward(h *T) *T {
	return ag.MLP(h, b.FC.Weight, b.FC.Bias, b.Proj.Weight, b.Proj.Bias)
}

// dropping reports whether the residual dropout is on.
func (b *GPTBlock) dropping() bool { return b.Drop != nil && b.Drop.Training && b.Drop.P > 0 }

// addProjected is x + c_proj(a): the residual added in the product's
// epilogue (ag.AddLinear), or after the dropout of the projection.
func (b *GPTBlock) addProjected(x, a *T) *T {
	if !b.dropping() {
		return ag.AddLinear(x, a, b.AttnProj.Weight, b.AttnProj.Bias)
	}
	m := then(b.AttnProj.Forward(a), b.Drop.Forward)
	defer m.Release()
	return ag.Add(x, m)
}

// addFeedForward is x + feedForward(h): the residual added in the MLP's
// second product (ag.AddMLP), or after the dropout of its output.
func (b *GPTBlock) addFeedForward(x, h *T) *T {
	if !b.dropping() {
		return ag.AddMLP(x, h, b.FC.Weight, b.FC.Bias, b.Proj.Weight, b.Proj.Bias)
	}
	m := then(b.feedForward(h), b.Drop.Forward)
	defer m.Release()
	return ag.Add(x, m)
}

// Forward computes the block for x of B×T×Width: x + c_proj(attention),
// then that + the MLP of its ln_2, each residual added in its product's
// epilogue when no dropout comes between them. A checkpoint's recomputation of the block skips the MLP's
// output product, which only makes the block's result (autograd.Unread);
// a light one skips c_attn's too, whose result it keeps (autograd.Keepable).
func (b *GPTBlock) Forward(x *T) *T {
	B, Tn, C := x.Dim(0), x.Dim(1), x.Dim(2)
	a := b.attention(x)
	x2 := ag.Reshape(x, B*Tn, C)
	h := b.addProjected(x2, a)
	x2.Release()
	a.Release()
	defer h.Release()
	y := ag.Unread(ag.ModeOf(h), func() *T {
		n := b.LN2.ForProduct(h)
		defer n.Release()
		return b.addFeedForward(h, n)
	})
	return then(y, func(y *T) *T { return ag.Reshape(y, B, Tn, C) })
}

// State lists the block's parameters by GPT-2's names.
func (b *GPTBlock) State(prefix string) []Named {
	s := b.LN1.State(join(prefix, "ln_1"))
	s = append(s, linearState(b.Attn, join(prefix, "attn.c_attn"))...)
	s = append(s, linearState(b.AttnProj, join(prefix, "attn.c_proj"))...)
	s = append(s, b.LN2.State(join(prefix, "ln_2"))...)
	s = append(s, linearState(b.FC, join(prefix, "mlp.c_fc"))...)
	return append(s, linearState(b.Proj, join(prefix, "mlp.c_proj"))...)
}

// linearState is l's state with its bias exempt from weight decay.
func linearState(l *Linear, prefix string) []Named {
	s := l.State(prefix)
	for i := range s {
		s[i].NoDecay = s[i].T == l.Bias
	}
	return s
}

// SetTraining switches the dropouts.
func (b *GPTBlock) SetTraining(on bool) {
	if b.Drop != nil {
		b.Drop.SetTraining(on)
	}
}

// GPT is a GPT-2-style language model. Its input is I32 tokens (B×T, T up
// to Context); Forward gives the logits of every position, Loss the mean
// next-token cross-entropy against I32 targets through the fused
// classifier (no logits are kept), and Generate continues a prompt with a
// key-value cache.
type GPT struct {
	Cfg        GPTConfig
	WTE, WPE   *T // token and position embeddings; WTE is also the output projection
	Blocks     []*GPTBlock
	LNF        *LayerNorm
	Checkpoint CheckpointMode
	// Checkpointed limits CheckpointBlocks (and CheckpointLight) to the first blocks
	// (SetCheckpointed; 0: all).
	Checkpointed int
	Drop         *Dropout
	positions    *T // I32 0 ... Context−1, for the position embeddings
}

// NewGPT builds a GPT of cfg with GPT-2's initialisation from dev's
// generator: weights and embeddings N(0, 0.02), the residual projections
// (attn.c_proj, mlp.c_proj) N(0, 0.02/√(2·Layers)), biases 0, layer norms'
// gains 1. 16-bit ProductWeights are those draws rounded, the same
// numbers drawn.
func NewGPT(dev *tensor.Device, cfg GPTConfig) (*GPT, error) {
	if err := cfg.Check(); err != nil {
		return nil, err
	}
	C := cfg.Width
	normal := func(std float32, shape ...int) *T { return newParam(tensor.Randn(dev, tensor.F32, 0, std, shape...)) }
	linear := func(in, out int, std float32) *Linear {
		w := tensor.Randn(dev, tensor.F32, 0, std, out, in)
		if dt := cfg.ProductWeights; dt.Half() { // drawn as F32 and rounded: a weight's F32 is the most the device holds twice
			h := tensor.Empty(dev, dt, out, in)
			dev.Backend().Cast(h.Buf(), w.Buf())
			w.Release()
			w = h
		}
		return &Linear{Weight: newParam(w), Bias: newParam(tensor.Zeros(dev, tensor.F32, out))}
	}
	resid := float32(0.02 / math.Sqrt(2*float64(cfg.Layers)))
	g := &GPT{Cfg: cfg, WTE: normal(0.02, cfg.Vocab, C), WPE: normal(0.02, cfg.Context, C), LNF: NewLayerNorm(dev, C)}
	for range cfg.Layers {
		b := &GPTBlock{LN1: NewLayerNorm(dev, C), LN2: NewLayerNorm(dev, C), Heads: cfg.Heads,
			Attn: linear(C, 3*C, 0.02), AttnProj: linear(C, C, resid), FC: linear(C, 4*C, 0.02), Proj: linear(4*C, C, resid)}
		if cfg.Dropout > 0 {
			b.Drop = NewDropout(cfg.Dropout)
		}
		g.Blocks = append(g.Blocks, b)
	}
	if cfg.Dropout > 0 {
		g.Drop = NewDropout(cfg.Dropout)
	}
	pos := make([]int32, cfg.Context)
	for i := range pos {
		pos[i] = int32(i)
	}
	g.positions = tensor.FromInt32(dev, pos, cfg.Context).Keep()
	return g, nil
}

// SetCheckpoint chooses what the forward checkpoints: every block (lightly
// or not), ⌈√n⌉ segments of blocks, or nothing.
func (g *GPT) SetCheckpoint(c CheckpointMode) { g.Checkpoint = c }

// SetCheckpointed makes CheckpointBlocks (or CheckpointLight) checkpoint
// the first k blocks only.
func (g *GPT) SetCheckpointed(k int) { g.Checkpointed = checkedFirst(k, len(g.Blocks)) }

// Checkpointable is the number of transformer blocks.
func (g *GPT) Checkpointable() int { return len(g.Blocks) }

// CheckpointShares are equal: every block keeps as much.
func (g *GPT) CheckpointShares([]int) []float64 {
	out := make([]int64, len(g.Blocks))
	for i := range out {
		out[i] = 1
	}
	return shares(out)
}

// hidden is the last layer norm's output for tokens x (B×T), for the
// classifier's product.
func (g *GPT) hidden(x *T) *T {
	if x.NDim() != 2 || x.DType() != tensor.I32 || x.Dim(1) > g.Cfg.Context {
		panic(fmt.Sprintf("nn: GPT input %v %v: want i32 B×T with T at most the context %d", x.DType(), x.Shape(), g.Cfg.Context))
	}
	Tn := x.Dim(1)
	tok := ag.Embedding(g.WTE, x)
	pos := g.positions.Rows(0, Tn)
	pe := ag.Embedding(g.WPE, pos)
	pos.Release()
	h := ag.Add(tok, pe)
	tok.Release()
	pe.Release()
	if g.Drop != nil {
		h = then(h, g.Drop.Forward)
	}
	blocks := make([]Module, len(g.Blocks))
	for i, b := range g.Blocks {
		blocks[i] = b
	}
	h = then(h, func(h *T) *T { return forwardSegments(blocks, g.Checkpoint, g.Checkpointed, h) })
	return then(h, g.LNF.ForProduct)
}

// Forward returns the logits of every position of x (B×T tokens):
// B×T×Vocab, in full (for inference on short inputs: training uses Loss).
// Under autocast without checkpointing, the products' weights and biases
// are cast at once (autograd.CastParameters): every weight's copy is kept
// to the backward anyway, and the biases' are small.
func (g *GPT) Forward(x *T) *T {
	if g.Checkpoint == NoCheckpoint {
		defer ag.CastParameters(ag.ModeOf(x), g.ProductParameters())()
	}
	h := g.hidden(x)
	B, Tn := x.Dim(0), x.Dim(1)
	h = then(h, func(h *T) *T { return ag.Reshape(h, B*Tn, g.Cfg.Width) })
	logits := then(h, func(h *T) *T { return ag.Linear(h, g.WTE, nil) })
	return then(logits, func(l *T) *T { return ag.Reshape(l, B, Tn, g.Cfg.Vocab) })
}

// Loss is the mean cross-entropy of every position's next-token prediction
// against the I32 targets y (B×T), through the fused classifier, and the
// positions predicted right. Its products' parameters are cast as Forward's.
func (g *GPT) Loss(x, y *T) (loss, right *T, n int) {
	if g.Checkpoint == NoCheckpoint {
		defer ag.CastParameters(ag.ModeOf(x), g.ProductParameters())()
	}
	h := g.hidden(x)
	defer h.Release()
	loss, right = ag.ClassifierLoss(h, g.WTE, y)
	return loss, right, y.Numel()
}

// ProductParameters are what the matrix products read of the parameters:
// the blocks' linear layers' weights and the biases their epilogues add,
// and the tied token embedding, the classifier's: what an autocast casts
// at once (autograd.CastParameters), per forward or, serving, once.
func (g *GPT) ProductParameters() []*T {
	ps := []*T{g.WTE}
	for _, b := range g.Blocks {
		for _, l := range []*Linear{b.Attn, b.AttnProj, b.FC, b.Proj} {
			ps = append(ps, l.Weight, l.Bias)
		}
	}
	return ps
}

// State lists the parameters by Hugging Face GPT-2's names
// (transformer.wte.weight, transformer.h.0.attn.c_attn.weight, ...), the
// weights in Linear's layout (out×in; SaveGPT2 writes Conv1D's in×out).
// Biases and layer norms are exempt from weight decay; the embeddings are
// decayed, as nanoGPT does.
func (g *GPT) State(prefix string) []Named {
	p := join(prefix, "transformer")
	s := []Named{{Name: join(p, "wte.weight"), T: g.WTE, Param: true}, {Name: join(p, "wpe.weight"), T: g.WPE, Param: true}}
	for i, b := range g.Blocks {
		s = append(s, b.State(join(p, fmt.Sprintf("h.%d", i)))...)
	}
	return append(s, g.LNF.State(join(p, "ln_f"))...)
}

// SetTraining switches the dropouts.
func (g *GPT) SetTraining(on bool) {
	if g.Drop != nil {
		g.Drop.SetTraining(on)
	}
	for _, b := range g.Blocks {
		b.SetTraining(on)
	}
}

// releaseOwned frees the position table, which is not state (Release).
func (g *GPT) releaseOwned() { g.positions.Release() }

// forwardSegments runs modules in order, checkpointed as mode and first
// say (each module, or only the first `first`, lightly under
// CheckpointLight; segments of ⌈√n⌉; or none: checkpointSpans), releasing
// the intermediates.
func forwardSegments(mods []Module, mode CheckpointMode, first int, x *T) *T {
	h := ag.Identity(x) // a new handle, the graph unbroken
	spans, checkpointed := checkpointSpans(mode, first, len(mods), 0, nil)
	checkpoint := ag.Checkpoint
	if mode == CheckpointLight {
		checkpoint = ag.CheckpointLight
	}
	for i, sp := range spans {
		seg := mods[sp[0]:sp[1]]
		if i >= checkpointed {
			h = then(h, func(h *T) *T { return forwardAll(seg, h) })
			continue
		}
		h = then(h, func(h *T) *T { return checkpoint(func(in []*T) *T { return forwardAll(seg, in[0]) }, h) })
	}
	return h
}

// Sampling says how Generate picks each next token.
type Sampling struct {
	// Temperature divides the logits (0: the most likely token, greedily).
	Temperature float64
	// TopK keeps only the K most likely tokens (0: all).
	TopK int
	Rand *rand.Rand // the draws (nil: a fixed seed)
	// OnToken, if set, hears each token as soon as it is drawn (to stream
	// it); returning false stops the generation there.
	OnToken func(tok int32) bool
}

// MaxGenerate is the most tokens one Generate call draws.
const MaxGenerate = 1 << 24

// Generate continues prompt (token ids) by n tokens (at most MaxGenerate)
// and returns them. It runs on the device handle dev (a Session of the
// model's device, for a serving goroutine) with recording off, keeping a
// key-value cache of every layer's packed queries, keys and values
// (len(prompt)+n positions, at most the context) in the pool, released
// when it returns; several goroutines may generate at once on sessions of
// their own. The prompt is run in one pass, then each new token in one.
//
// The model sees at most its context: a longer prompt is cut to its last
// Context tokens, and when the window is full, its last half begins the
// next one (run again in one pass at positions from 0), as nanoGPT's
// generate crops the sequence to the block size.
func (g *GPT) Generate(dev *tensor.Device, prompt []int32, n int, s Sampling) (out []int32, err error) {
	W := g.Cfg.Context
	if len(prompt) == 0 || n < 0 || n > MaxGenerate {
		return nil, fmt.Errorf("generate: a prompt of %d tokens and %d more: want a prompt and at most %d tokens more", len(prompt), n, MaxGenerate)
	}
	for i, t := range prompt {
		if t < 0 || int(t) >= g.Cfg.Vocab {
			return nil, fmt.Errorf("generate: prompt token %d at position %d is outside the vocabulary of %d", t, i, g.Cfg.Vocab)
		}
	}
	if s.Rand == nil {
		s.Rand = rand.New(rand.NewPCG(1, 2))
	}
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("generate: %w", tensor.AsError(r))
		}
	}()
	prompt = prompt[max(0, len(prompt)-W):]
	C := g.Cfg.Width
	total := min(len(prompt)+n, W)
	ag.NoGrad(dev, func() {
		dev.WithScope(func() {
			caches := make([]*T, len(g.Blocks))
			for i := range caches {
				caches[i] = tensor.Empty(dev, tensor.F32, total, 3*C)
			}
			seq := slices.Clone(prompt) // the window's tokens
			next := prompt
			for pos := 0; len(out) < n; {
				logits := g.decode(dev, caches, next, pos)
				pos += len(next)
				tok := sample(logits.Float32s(), s)
				logits.Release()
				out, seq = append(out, tok), append(seq, tok)
				if s.OnToken != nil && !s.OnToken(tok) {
					break
				}
				next = []int32{tok}
				if pos == W { // full: its last half begins the next window
					seq = seq[len(seq)-max(1, W/2):]
					next, pos = seq, 0
				}
			}
		})
	})
	return out, nil
}

// decode runs tokens at positions [pos, pos+len) through the model with
// the caches, and returns the last position's logits (V).
func (g *GPT) decode(dev *tensor.Device, caches []*T, tokens []int32, pos int) *T {
	C, m := g.Cfg.Width, len(tokens)
	ids := tensor.FromInt32(dev, tokens, m)
	positions := g.positions.On(dev).Rows(pos, pos+m) // handles of dev's scope only
	h := ag.Add(ag.Embedding(g.WTE.On(dev), ids), ag.Embedding(g.WPE.On(dev), positions))
	be := dev.Backend()
	for i, b := range g.Blocks {
		qkv := b.Attn.Forward(b.LN1.ForProduct(h))
		cb := caches[i].Buf()
		be.Copy(cb.Slice(pos*3*C, m*3*C), qkv.Buf())
		h = b.addProjected(h, ag.CachedAttention(caches[i], pos, m, b.Heads))
		h = b.addFeedForward(h, b.LN2.ForProduct(h))
	}
	last := g.LNF.ForProduct(h.Rows(m-1, m))
	return ag.Linear(last, g.WTE, nil).Keep() // WTE's own handle, which finds its copy cast once (or packed)
}

// sample draws a token from logits under s.
func sample(logits []float32, s Sampling) int32 {
	if s.Temperature <= 0 {
		best := 0
		for j, v := range logits {
			if v > logits[best] {
				best = j
			}
		}
		return int32(best)
	}
	idx := make([]int, len(logits))
	for i := range idx {
		idx[i] = i
	}
	if s.TopK > 0 && s.TopK < len(idx) {
		sort.Slice(idx, func(a, b int) bool { return logits[idx[a]] > logits[idx[b]] })
		idx = idx[:s.TopK]
	}
	mx := math.Inf(-1)
	for _, i := range idx {
		mx = math.Max(mx, float64(logits[i]))
	}
	w := make([]float64, len(idx))
	var z float64
	for k, i := range idx {
		w[k] = math.Exp((float64(logits[i]) - mx) / s.Temperature)
		z += w[k]
	}
	u := s.Rand.Float64() * z
	for k, i := range idx {
		if u -= w[k]; u < 0 {
			return int32(i)
		}
	}
	return int32(idx[len(idx)-1])
}
