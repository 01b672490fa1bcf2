package train

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/leangrad/leangrad/nn"
	"github.com/leangrad/leangrad/tensor"
)

// Arch is one model name of the registry, which the commands, the
// benchmark harness, checkpoints and BuildModel all read: what the model
// is fed, whether it has blocks to checkpoint, and how it is built.
type Arch struct {
	Name string
	// Input is the shape of one example (C×H×W images; a language model's
	// window of T tokens) and Classes its classes (a language model's
	// vocabulary), when no dataset says otherwise.
	Input   []int
	Classes int
	// Text says the model is a language model: it is fed I32 windows of
	// tokens, and each position's target is the next token. GPT is its
	// configuration, whose Vocab and Context Build's input overrides.
	Text bool
	GPT  nn.GPTConfig
	// Recipe is a language model's default training recipe, which the
	// commands apply where the user did not choose and the harness times.
	Recipe *Recipe
	// Blocks is the number of blocks the model checkpoints
	// (Config.Checkpoint applies; nn.Checkpointer.Checkpointable; 0:
	// none); Segments is what the harness's checkpointing configurations
	// checkpoint: each block, or √n segments of blocks.
	Blocks   int
	Segments nn.CheckpointMode
	// CNN says the model convolves images: random crops and flips suit
	// it, and convolution workspaces matter.
	CNN bool

	build func(dev *tensor.Device, input []int, classes int) (nn.Model, error)
}

// Recipe is how a language model trains by default: the optimiser and its
// hyper-parameters, the batch and the run's length in steps.
type Recipe struct {
	Optimizer                            string
	LR, Beta2, WeightDecay, ClipNorm     float64
	Batch, Steps, EvalEvery, EvalBatches int
	WarmupSteps                          int
}

// ModelNames says, for messages and -h, which names LookupArch knows.
const ModelNames = "resnet (resnet20), resnetN (N = 6n+2: resnet20, resnet56, ..., resnet1202), resnet18, mlp, gpt (gpt-small), gpt-mini, gpt2, gpt2-medium, gpt2-large, gpt2-xl, gpt3-1.3b, gpt3-2.7b, gpt3-6.7b, or any GPT's shape as gpt:L24,W2048,H16[,C2048][,V50257] (layers, width, heads, context, vocabulary)"

// ModelName is a name LookupArch knows. It is a flag.Value: Set refuses any
// other name, saying which it knows.
type ModelName string

// Set checks s with LookupArch.
func (m *ModelName) Set(s string) error {
	if _, err := LookupArch(s); err != nil {
		return err
	}
	*m = ModelName(s)
	return nil
}

func (m ModelName) String() string { return string(m) }

// Arch is m's entry in the registry (ModelName's Set checked it).
func (m ModelName) Arch() Arch {
	a, err := LookupArch(string(m))
	if err != nil {
		panic(fmt.Sprintf("train: ModelName %q not in the registry: %v", string(m), err))
	}
	return a
}

// The GPT presets and their recipes (AdamW, GPT-2's decoupled decay of
// 0.1 without decay on biases and norms, gradients clipped to norm 1, a
// cosine schedule after a linear warmup): gpt-small is the default text
// job's (nanoGPT's small character model's shape, over GPT-2's tokens; gpt
// names it, and on a CPU the commands train gpt-mini for gpt), gpt-mini
// what a CPU trains in minutes, gpt2 GPT-2 small (124M parameters; no
// dropout, as nanoGPT and llm.c pretrain it).
var gptPresets = map[string]struct {
	cfg    nn.GPTConfig
	recipe Recipe
}{
	"gpt-small": {nn.GPTConfig{Layers: 6, Heads: 6, Width: 384, Vocab: 50257, Context: 256, Dropout: 0.1},
		Recipe{Optimizer: "adamw", LR: 1e-3, Beta2: 0.99, WeightDecay: 0.1, ClipNorm: 1, Batch: 32, Steps: 1000, EvalEvery: 200, WarmupSteps: 100}},
	"gpt-mini": {nn.GPTConfig{Layers: 2, Heads: 2, Width: 128, Vocab: 50257, Context: 64},
		Recipe{Optimizer: "adamw", LR: 2e-3, Beta2: 0.99, WeightDecay: 0.1, ClipNorm: 1, Batch: 16, Steps: 200, EvalEvery: 100, EvalBatches: 20, WarmupSteps: 20}},
	"gpt2": {nn.GPT2Small(),
		Recipe{Optimizer: "adamw", LR: 6e-4, Beta2: 0.95, WeightDecay: 0.1, ClipNorm: 1, Batch: 16, Steps: 1000, EvalEvery: 200, WarmupSteps: 100}},
	// GPT-2's larger shapes (context 1024), and GPT-3's (context 2048; the
	// 1.3B's 16 heads of 128, as Megatron and the released models have
	// them, where the paper's table says 24), with the paper's learning
	// rates.
	"gpt2-medium": {nn.GPTConfig{Layers: 24, Heads: 16, Width: 1024, Vocab: 50257, Context: 1024}, bigRecipe(3e-4)},
	"gpt2-large":  {nn.GPTConfig{Layers: 36, Heads: 20, Width: 1280, Vocab: 50257, Context: 1024}, bigRecipe(2.5e-4)},
	"gpt2-xl":     {nn.GPTConfig{Layers: 48, Heads: 25, Width: 1600, Vocab: 50257, Context: 1024}, bigRecipe(2e-4)},
	"gpt3-1.3b":   {nn.GPTConfig{Layers: 24, Heads: 16, Width: 2048, Vocab: 50257, Context: 2048}, bigRecipe(2e-4)},
	"gpt3-2.7b":   {nn.GPTConfig{Layers: 32, Heads: 32, Width: 2560, Vocab: 50257, Context: 2048}, bigRecipe(1.6e-4)},
	"gpt3-6.7b":   {nn.GPTConfig{Layers: 32, Heads: 32, Width: 4096, Vocab: 50257, Context: 2048}, bigRecipe(1.2e-4)},
}

// bigRecipe is the recipe of the larger GPTs: GPT-2's, at learning rate lr
// and batches of 8.
func bigRecipe(lr float64) Recipe {
	return Recipe{Optimizer: "adamw", LR: lr, Beta2: 0.95, WeightDecay: 0.1, ClipNorm: 1, Batch: 8, Steps: 1000, EvalEvery: 200, WarmupSteps: 100}
}

// gptShape reads "gpt:L24,W2048,H16[,C2048][,V50257]": a GPT of that
// shape (context 1024 and GPT-2's vocabulary unless given) with the
// larger GPTs' recipe.
func gptShape(name string) (nn.GPTConfig, Recipe, error) {
	spec, _ := strings.CutPrefix(name, "gpt:")
	c := nn.GPTConfig{Vocab: 50257, Context: 1024}
	fields := map[byte]*int{'L': &c.Layers, 'W': &c.Width, 'H': &c.Heads, 'C': &c.Context, 'V': &c.Vocab}
	for _, f := range strings.Split(spec, ",") {
		if len(f) < 2 || fields[f[0]] == nil {
			return c, Recipe{}, fmt.Errorf("model %q: %q is not one of L (layers), W (width), H (heads), C (context), V (vocabulary) and a number, as gpt:L24,W2048,H16", name, f)
		}
		n, err := strconv.Atoi(f[1:])
		if err != nil || n < 1 || n > 1<<24 {
			return c, Recipe{}, fmt.Errorf("model %q: %q: want a positive number", name, f)
		}
		*fields[f[0]] = n
	}
	if c.Layers == 0 || c.Width == 0 || c.Heads == 0 {
		return c, Recipe{}, fmt.Errorf("model %q: want at least L (layers), W (width) and H (heads), as gpt:L24,W2048,H16", name)
	}
	if err := c.Check(); err != nil {
		return c, Recipe{}, fmt.Errorf("model %q: %w", name, err)
	}
	return c, bigRecipe(3e-4), nil
}

// LanguageModels lists the names of the registry's language models.
func LanguageModels() []string {
	names := []string{"gpt"}
	for name := range gptPresets {
		names = append(names, name)
	}
	slices.Sort(names[1:])
	return names
}

// GPTFamily is the GPT presets of GPT-2's and GPT-3's shapes, from GPT-2
// small to GPT-3 6.7B: what the largest-model search tries unless told.
func GPTFamily() []string {
	return []string{"gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl", "gpt3-1.3b", "gpt3-2.7b", "gpt3-6.7b"}
}

// PresetDefaults says a language-model preset setting for each preset,
// the presets that share a value together, for flags' help: "64 for
// gpt-mini, 256 for gpt-small, 1024 for gpt2, gpt2-large, ...".
func PresetDefaults(of func(Arch) string) string {
	var values []string
	names := map[string][]string{}
	for _, name := range LanguageModels()[1:] {
		a, _ := LookupArch(name)
		v := of(a)
		if names[v] == nil {
			values = append(values, v)
		}
		names[v] = append(names[v], name)
	}
	parts := make([]string, len(values))
	for i, v := range values {
		parts[i] = v + " for " + strings.Join(names[v], ", ")
	}
	return strings.Join(parts, "; ")
}

// LookupArch returns the registry's entry for a model name: "resnetN" (a
// CIFAR-style ResNet of depth N = 6n+2: resnet20, resnet56, resnet1202,
// ...; "resnet" is resnet20), "resnet18", "mlp" (two hidden layers of 256), or the GPTs
// "gpt-small" (6 layers of width 384, context 256; "gpt" is its other
// name), "gpt-mini" (2 of 128, context 64) and "gpt2" (GPT-2 small).
func LookupArch(name string) (Arch, error) {
	preset := name
	switch name {
	case "gpt":
		preset = "gpt-small"
	case "resnet":
		name = "resnet20"
	}
	p, ok := gptPresets[preset]
	if strings.HasPrefix(name, "gpt:") {
		var err error
		if p.cfg, p.recipe, err = gptShape(name); err != nil {
			return Arch{}, err
		}
		ok = true
	}
	if ok {
		g, recipe := p.cfg, p.recipe
		return Arch{Name: name, Input: []int{g.Context}, Classes: g.Vocab, Text: true, GPT: g, Recipe: &recipe, Blocks: g.Layers, Segments: nn.CheckpointBlocks}, nil
	}
	switch name {
	case "resnet18":
		return Arch{Name: name, Input: []int{3, 32, 32}, Classes: 10, Blocks: 8, Segments: nn.CheckpointBlocks, CNN: true,
			build: func(dev *tensor.Device, in []int, classes int) (nn.Model, error) {
				return nn.NewResNet18(dev, in[0], classes), nil
			}}, nil
	case "mlp":
		return Arch{Name: name, Input: []int{1, 28, 28}, Classes: 10,
			build: func(dev *tensor.Device, in []int, classes int) (nn.Model, error) {
				return nn.NewMLP(dev, []int{in[0] * in[1] * in[2], 256, 256, classes}, 0), nil
			}}, nil
	}
	if d, ok := strings.CutPrefix(name, "resnet"); ok {
		if depth, err := strconv.Atoi(d); err == nil && depth >= 8 && (depth-2)%6 == 0 {
			// The deep ones checkpoint √n segments: a block each would keep
			// hundreds of boundaries.
			segments := nn.CheckpointBlocks
			if depth > 200 {
				segments = nn.CheckpointSqrt
			}
			return Arch{Name: name, Input: []int{1, 28, 28}, Classes: 10, Blocks: (depth - 2) / 2, Segments: segments, CNN: true,
				build: func(dev *tensor.Device, in []int, classes int) (nn.Model, error) {
					return model(nn.NewCIFARResNet(dev, depth, in[0], classes))
				}}, nil
		}
	}
	return Arch{}, fmt.Errorf("model %q: want %s", name, ModelNames)
}

// model is m as an nn.Model, or nil (not a nil *M) with err.
func model[M nn.Model](m M, err error) (nn.Model, error) {
	if err != nil {
		return nil, err
	}
	return m, nil
}

// Build makes the model on dev for examples of the input shape (C×H×W
// images, or [T] token windows for a language model) and classes classes
// (a language model's vocabulary), its parameters drawn from a generator of
// their own seeded with seed: the generator dev shares with its sessions is
// neither reseeded nor advanced, so a model built beside a training run (a
// server's) leaves the run's random stream alone.
func (a Arch) Build(dev *tensor.Device, input []int, classes int, seed uint64) (nn.Model, error) {
	return a.BuildWith(dev, input, classes, tensor.NewGenerator(seed))
}

// BuildWith is Build with the parameters drawn from gen, which is left
// where the initialisation ends.
func (a Arch) BuildWith(dev *tensor.Device, input []int, classes int, gen *tensor.Generator) (m nn.Model, err error) {
	want := "C×H×W images"
	if a.Text {
		want = "windows of T tokens"
	}
	if len(input) != len(a.Input) || slices.ContainsFunc(input, func(n int) bool { return n < 1 }) || classes < 2 {
		return nil, fmt.Errorf("model %s for inputs of %v and %d classes: want %s and at least 2 classes", a.Name, input, classes, want)
	}
	build := a.build
	if a.Text { // the GPT of a.GPT's shape and weights' dtype
		build = func(dev *tensor.Device, input []int, classes int) (nn.Model, error) {
			c := a.GPT
			c.Context, c.Vocab = input[0], classes
			return model(nn.NewGPT(dev, c))
		}
	}
	dev.WithGenerator(gen, func() { m, err = build(dev, input, classes) })
	return m, err
}

// For is a as cfg trains it: a GPT's product weights in BF16 for
// cfg.BF16Weights. Only a GPT has them.
func (a Arch) For(cfg Config) (Arch, error) {
	if !cfg.BF16Weights {
		return a, nil
	}
	if !a.Text {
		return a, fmt.Errorf("model %s: -bf16-weights holds a GPT's product weights in bf16, and it is not a GPT", a.Name)
	}
	a.GPT.ProductWeights = tensor.BF16
	return a, nil
}

// BuildModel is LookupArch(name) and its Build.
func BuildModel(dev *tensor.Device, name string, input []int, classes int, seed uint64) (nn.Model, error) {
	a, err := LookupArch(name)
	if err != nil {
		return nil, err
	}
	return a.Build(dev, input, classes, seed)
}
