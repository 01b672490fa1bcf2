package nn

import (
	"fmt"
	"slices"

	ag "github.com/leangrad/leangrad/autograd"
	"github.com/leangrad/leangrad/tensor"
)

// then applies f to h and releases h.
func then(h *T, f func(*T) *T) *T {
	y := f(h)
	h.Release()
	return y
}

// BasicBlock is ResNet's residual block: relu(bn(conv(relu(bn(conv(x))))) +
// shortcut(x)), the shortcut a 1×1 convolution with batch norm where the
// shape changes and the identity otherwise.
type BasicBlock struct {
	Conv1, Conv2 *Conv2d
	BN1, BN2     *BatchNorm2d
	ShortConv    *Conv2d // nil for the identity
	ShortBN      *BatchNorm2d
	Dropout      *Dropout // between the two convolutions, as in wide ResNets; nil for none
}

// NewBasicBlock returns a block from in to out channels, the first
// convolution with the given stride.
func NewBasicBlock(dev *tensor.Device, in, out, stride int) *BasicBlock {
	b := &BasicBlock{
		Conv1: NewConv2d(dev, in, out, 3, stride, 1, false), BN1: NewBatchNorm2d(dev, out),
		Conv2: NewConv2d(dev, out, out, 3, 1, 1, false), BN2: NewBatchNorm2d(dev, out),
	}
	if stride != 1 || in != out {
		b.ShortConv, b.ShortBN = NewConv2d(dev, in, out, 1, stride, 0, false), NewBatchNorm2d(dev, out)
	}
	return b
}

// Forward computes the block. Each batch norm is fused with what follows
// it: the first with its ReLU, the second with the shortcut's addition and
// the block's final ReLU. Neither keeps its output for the backward where
// it is written again more cheaply (Note [a batch norm's output written
// again] in package autograd).
func (b *BasicBlock) Forward(x *T) *T {
	h := then(b.Conv1.Forward(x), func(h *T) *T { return b.BN1.ForwardAct(h, nil, true) })
	if b.Dropout != nil {
		h = then(h, b.Dropout.Forward)
	}
	h = then(h, b.Conv2.Forward)
	s := x
	if b.ShortConv != nil {
		s = then(b.ShortConv.Forward(x), b.ShortBN.Forward)
	}
	y := b.BN2.ForwardAct(h, s, true)
	h.Release()
	if s != x {
		s.Release()
	}
	return y
}

// State lists the block's convolutions and batch norms.
func (b *BasicBlock) State(prefix string) []Named {
	s := append(b.Conv1.State(join(prefix, "conv1")), b.BN1.State(join(prefix, "bn1"))...)
	s = append(s, b.Conv2.State(join(prefix, "conv2"))...)
	s = append(s, b.BN2.State(join(prefix, "bn2"))...)
	if b.ShortConv != nil {
		s = append(s, b.ShortConv.State(join(prefix, "shortcut.0"))...)
		s = append(s, b.ShortBN.State(join(prefix, "shortcut.1"))...)
	}
	return s
}

// SetTraining sets the batch norms' mode.
func (b *BasicBlock) SetTraining(on bool) {
	b.BN1.SetTraining(on)
	b.BN2.SetTraining(on)
	if b.Dropout != nil {
		b.Dropout.SetTraining(on)
	}
	if b.ShortBN != nil {
		b.ShortBN.SetTraining(on)
	}
}

// CheckpointMode says which of a model's blocks are checkpointed, and how.
type CheckpointMode int

// The checkpointing modes.
const (
	NoCheckpoint     CheckpointMode = iota
	CheckpointBlocks                // every residual block
	CheckpointSqrt                  // segments of consecutive blocks, their number growing as √n (Note [checkpoint segments by size])
	// CheckpointLight checkpoints every block keeping its products'
	// results too, recomputing only the rest (a GPT's; Note [light
	// checkpoints] in package autograd).
	CheckpointLight
)

// String is the mode's name, as ParseCheckpointMode reads it.
func (c CheckpointMode) String() string {
	switch c {
	case NoCheckpoint:
		return "none"
	case CheckpointBlocks:
		return "blocks"
	case CheckpointSqrt:
		return "sqrt"
	case CheckpointLight:
		return "light"
	}
	return fmt.Sprintf("CheckpointMode(%d)", int(c))
}

// Checkpointer is a model whose blocks can be checkpointed: recomputed in
// the backward from their saved inputs instead of keeping their
// activations (ResNet, GPT).
type Checkpointer interface {
	SetCheckpoint(CheckpointMode)
	// SetCheckpointed makes CheckpointBlocks (and CheckpointLight)
	// checkpoint only the first k blocks, the rest keeping their
	// activations (0: every block; Note [checkpointing some blocks]). It
	// panics for k outside 0 to Checkpointable().
	SetCheckpointed(k int)
	// Checkpointable is the number of blocks checkpointing recomputes.
	Checkpointable() int
	// CheckpointShares is about what checkpointing each block saves, for
	// examples of shape in, as shares of what checkpointing every block
	// does: Checkpointable() of them, summing to 1 (Note [checkpointing
	// some blocks]).
	CheckpointShares(in []int) []float64
}

// ChannelsLaster is a model whose activations can run channels last
// (ResNet): the layout is the runner's choice, not part of the model's
// state.
type ChannelsLaster interface {
	SetChannelsLast(bool)
	ChannelsLast() bool
}

// CheckpointModes names the modes, for messages and -h.
const CheckpointModes = "none, blocks, light or sqrt"

// ParseCheckpointMode reads "none", "blocks", "light" or "sqrt".
func ParseCheckpointMode(s string) (CheckpointMode, error) {
	switch s {
	case "none", "":
		return NoCheckpoint, nil
	case "blocks", "block":
		return CheckpointBlocks, nil
	case "sqrt":
		return CheckpointSqrt, nil
	case "light":
		return CheckpointLight, nil
	}
	return 0, fmt.Errorf("checkpoint mode %q: want %s", s, CheckpointModes)
}

// MarshalText is the mode's String: JSON and flag.TextVar write it so.
func (c CheckpointMode) MarshalText() ([]byte, error) { return []byte(c.String()), nil }

// UnmarshalText reads a mode as ParseCheckpointMode does.
func (c *CheckpointMode) UnmarshalText(text []byte) error {
	m, err := ParseCheckpointMode(string(text))
	if err == nil {
		*c = m
	}
	return err
}

// ResNet is a residual network: a 3×3 stem convolution, stages of basic
// blocks, global average pooling and a linear classifier.
type ResNet struct {
	Stem       *Conv2d
	StemBN     *BatchNorm2d
	Blocks     []*BasicBlock
	FC         *Linear
	Checkpoint CheckpointMode
	// Checkpointed limits CheckpointBlocks to the first blocks
	// (SetCheckpointed; 0: all).
	Checkpointed int
	Name         string
}

// NewResNet builds a ResNet with blocks[i] blocks of widths[i] channels per
// stage (every stage after the first halves the resolution).
func NewResNet(dev *tensor.Device, name string, inChannels, classes int, widths, blocks []int) *ResNet {
	r := &ResNet{Name: name, Stem: NewConv2d(dev, inChannels, widths[0], 3, 1, 1, false), StemBN: NewBatchNorm2d(dev, widths[0])}
	in := widths[0]
	for s, w := range widths {
		for i := 0; i < blocks[s]; i++ {
			stride := 1
			if i == 0 && s > 0 {
				stride = 2
			}
			r.Blocks = append(r.Blocks, NewBasicBlock(dev, in, w, stride))
			in = w
		}
	}
	r.FC = NewLinear(dev, in, classes, true)
	return r
}

// NewCIFARResNet builds the CIFAR-style ResNet of He et al. (2016) of the
// given depth, 6n+2 (20, 32, 44, 56, 110, 1202, ...): three stages of n
// blocks with 16, 32 and 64 channels. Shortcuts that change shape are 1×1
// convolutions (option B).
func NewCIFARResNet(dev *tensor.Device, depth, inChannels, classes int) (*ResNet, error) {
	if depth < 8 || (depth-2)%6 != 0 {
		return nil, fmt.Errorf("ResNet depth %d: want 6n+2 (20, 32, 44, 56, 110, 1202, ...)", depth)
	}
	n := (depth - 2) / 6
	return NewResNet(dev, fmt.Sprintf("resnet%d", depth), inChannels, classes, []int{16, 32, 64}, []int{n, n, n}), nil
}

// SetCheckpoint chooses what the forward checkpoints. A ResNet has no
// products a light checkpoint keeps: CheckpointLight panics.
func (r *ResNet) SetCheckpoint(c CheckpointMode) {
	if c == CheckpointLight {
		panic("nn: a ResNet has no products a light checkpoint keeps: checkpoint its blocks instead")
	}
	r.Checkpoint = c
}

// SetCheckpointed makes CheckpointBlocks checkpoint the first k blocks only.
func (r *ResNet) SetCheckpointed(k int) { r.Checkpointed = checkedFirst(k, len(r.Blocks)) }

// Checkpointable is the number of residual blocks.
func (r *ResNet) Checkpointable() int { return len(r.Blocks) }

// CheckpointShares are the blocks' output sizes for C×H×W images of shape
// in, as shares of their sum: a block keeps about keepPerBlock tensors of
// its output's size.
func (r *ResNet) CheckpointShares(in []int) []float64 {
	if len(in) != 3 {
		panic(fmt.Sprintf("nn: ResNet checkpoint shares for examples of shape %v: want C×H×W", in))
	}
	_, out := r.blockSizes(in[1], in[2])
	return shares(out)
}

// SetChannelsLast chooses the layout of the activations: channels last
// (N×H×W×C) or first (N×C×H×W, the default). The input and the parameters
// are the same either way; Forward transposes the input. Channels last is
// where 16-bit convolutions run fastest on cuDNN (Note [channels last] in
// package kernels; kernels.Info.ChannelsLast).
func (r *ResNet) SetChannelsLast(on bool) {
	r.Stem.ChannelsLast, r.StemBN.ChannelsLast = on, on
	for _, b := range r.Blocks {
		b.Conv1.ChannelsLast, b.BN1.ChannelsLast = on, on
		b.Conv2.ChannelsLast, b.BN2.ChannelsLast = on, on
		if b.ShortConv != nil {
			b.ShortConv.ChannelsLast, b.ShortBN.ChannelsLast = on, on
		}
	}
}

// ChannelsLast reports whether the activations run channels last.
func (r *ResNet) ChannelsLast() bool { return r.Stem.ChannelsLast }

// SetDropout puts dropout with probability p between the two convolutions
// of every block (p = 0 removes it).
func (r *ResNet) SetDropout(p float32) {
	for _, b := range r.Blocks {
		b.Dropout = nil
		if p > 0 {
			b.Dropout = NewDropout(p)
		}
	}
}

// NewResNet18 builds ResNet-18 in its CIFAR variant: a 3×3 stem without max
// pooling and four stages of two blocks with 64, 128, 256 and 512 channels.
func NewResNet18(dev *tensor.Device, inChannels, classes int) *ResNet {
	return NewResNet(dev, "resnet18", inChannels, classes, []int{64, 128, 256, 512}, []int{2, 2, 2, 2})
}

// segments groups the blocks for checkpointing (checkpointSpans), for an
// input of h×w pixels: the first checkpointed of them are checkpointed.
func (r *ResNet) segments(h, w int) (segs [][]Module, checkpointed int) {
	in, out := r.blockSizes(h, w)
	spans, checkpointed := checkpointSpans(r.Checkpoint, r.Checkpointed, len(r.Blocks), in, out)
	for _, sp := range spans {
		var seg []Module
		for _, b := range r.Blocks[sp[0]:sp[1]] {
			seg = append(seg, b)
		}
		segs = append(segs, seg)
	}
	return segs, checkpointed
}

// blockSizes are the stem's output size, in, and each block's, out, per
// image of h×w pixels.
func (r *ResNet) blockSizes(h, w int) (in int64, out []int64) {
	in = int64(r.StemBN.Weight.Dim(0) * h * w)
	for _, b := range r.Blocks {
		if s := b.Conv1.Stride; s > 1 {
			h, w = (h-1)/s+1, (w-1)/s+1 // a 3×3 convolution padded by 1
		}
		out = append(out, int64(b.Conv2.Weight.Dim(0)*h*w))
	}
	return in, out
}

// Forward computes the logits for x (N×C×H×W, whatever the layout). Under
// autocast without checkpointing, the convolutions' parameters are cast at
// once (autograd.CastParameters): every copy is kept to the backward anyway.
func (r *ResNet) Forward(x *T) *T {
	if r.Checkpoint == NoCheckpoint {
		defer ag.CastParameters(ag.ModeOf(x), r.autocastParameters())()
	}
	height, width := x.Dim(2), x.Dim(3)
	pool := ag.GlobalAvgPool
	if r.ChannelsLast() {
		x = ag.ToNHWC(x)
		defer x.Release()
		pool = ag.GlobalAvgPoolNHWC
	}
	h := then(r.Stem.Forward(x), func(h *T) *T { return r.StemBN.ForwardAct(h, nil, true) })
	segs, checkpointed := r.segments(height, width)
	for i, seg := range segs {
		if i >= checkpointed {
			h = then(h, func(h *T) *T { return forwardAll(seg, h) })
			continue
		}
		h = then(h, func(h *T) *T {
			return ag.Checkpoint(func(in []*T) *T { return forwardAll(seg, in[0]) }, h)
		})
	}
	h = then(h, pool)
	return then(h, r.FC.Forward)
}

// autocastParameters are the convolutions' parameters, which autocast
// copies (the classifier's product reads its F32 weight through a cast of
// its own and returns the gradient in F32: autograd.Linear).
func (r *ResNet) autocastParameters() []*T {
	ps := []*T{r.Stem.Weight, r.Stem.Bias}
	for _, b := range r.Blocks {
		ps = append(ps, b.Conv1.Weight, b.Conv1.Bias, b.Conv2.Weight, b.Conv2.Bias)
		if b.ShortConv != nil {
			ps = append(ps, b.ShortConv.Weight, b.ShortConv.Bias)
		}
	}
	return slices.DeleteFunc(ps, func(p *T) bool { return p == nil })
}

// Loss is Classify: the cross-entropy of the logits against the labels.
func (r *ResNet) Loss(x, y *T) (loss, right *T, n int) { return Classify(r, x, y) }

// State lists the stem, the blocks (layers.i) and the classifier.
func (r *ResNet) State(prefix string) []Named {
	s := append(r.Stem.State(join(prefix, "conv1")), r.StemBN.State(join(prefix, "bn1"))...)
	for i, b := range r.Blocks {
		s = append(s, b.State(join(prefix, fmt.Sprintf("layers.%d", i)))...)
	}
	return append(s, r.FC.State(join(prefix, "fc"))...)
}

// SetTraining sets every batch norm's mode.
func (r *ResNet) SetTraining(on bool) {
	r.StemBN.SetTraining(on)
	for _, b := range r.Blocks {
		b.SetTraining(on)
	}
}

// MLP is a multilayer perceptron on flattened inputs: Linear layers with
// ReLU (and dropout, if asked) between them.
type MLP struct {
	Layers  []*Linear
	Dropout *Dropout
}

// NewMLP returns an MLP through the given sizes (input first, classes last).
func NewMLP(dev *tensor.Device, sizes []int, dropout float32) *MLP {
	m := &MLP{}
	for i := 0; i+1 < len(sizes); i++ {
		m.Layers = append(m.Layers, NewLinear(dev, sizes[i], sizes[i+1], true))
	}
	if dropout > 0 {
		m.Dropout = NewDropout(dropout)
	}
	return m
}

// Forward flattens x and runs the layers.
func (m *MLP) Forward(x *T) *T {
	h := ag.Flatten(x)
	for i, l := range m.Layers {
		h = then(h, l.Forward)
		if i+1 < len(m.Layers) {
			h = then(h, ag.ReLU)
			if m.Dropout != nil {
				h = then(h, m.Dropout.Forward)
			}
		}
	}
	return h
}

// Loss is Classify: the cross-entropy of the logits against the labels.
func (m *MLP) Loss(x, y *T) (loss, right *T, n int) { return Classify(m, x, y) }

// State lists the layers (layers.i).
func (m *MLP) State(prefix string) []Named {
	var s []Named
	for i, l := range m.Layers {
		s = append(s, l.State(join(prefix, fmt.Sprintf("layers.%d", i)))...)
	}
	return s
}

// SetTraining switches dropout.
func (m *MLP) SetTraining(on bool) {
	if m.Dropout != nil {
		m.Dropout.SetTraining(on)
	}
}
