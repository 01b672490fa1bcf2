package train

import (
	"fmt"
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
	// Input is the shape of one example the harness feeds it (C×H×W), and
	// Classes its classes, when no dataset says otherwise.
	Input   []int
	Classes int
	// Blocks says the model has blocks to checkpoint (Config.Checkpoint
	// applies); Segments is what the harness's checkpointing configurations
	// checkpoint: "blocks" (each block) or "sqrt" (√n segments of blocks).
	Blocks   bool
	Segments string
	// CNN says the model convolves images: random crops and flips suit
	// it, and convolution workspaces matter.
	CNN bool

	build func(dev *tensor.Device, c, h, w, classes int) nn.Model
}

// ModelNames says, for messages, which names LookupArch knows.
const ModelNames = "resnetN (N = 6n+2: resnet20, resnet56, ...), resnet18 or mlp"

// LookupArch returns the registry's entry for a model name: "resnetN" (a
// CIFAR-style ResNet of depth N = 6n+2: resnet20, resnet56, resnet1202,
// ...), "resnet18" or "mlp" (two hidden layers of 256).
func LookupArch(name string) (Arch, error) {
	switch name {
	case "resnet18":
		return Arch{Name: name, Input: []int{3, 32, 32}, Classes: 10, Blocks: true, Segments: "blocks", CNN: true,
			build: func(dev *tensor.Device, c, h, w, classes int) nn.Model { return nn.NewResNet18(dev, c, classes) }}, nil
	case "mlp":
		return Arch{Name: name, Input: []int{1, 28, 28}, Classes: 10,
			build: func(dev *tensor.Device, c, h, w, classes int) nn.Model {
				return nn.NewMLP(dev, []int{c * h * w, 256, 256, classes}, 0)
			}}, nil
	}
	if d, ok := strings.CutPrefix(name, "resnet"); ok {
		if depth, err := strconv.Atoi(d); err == nil && depth >= 8 && (depth-2)%6 == 0 {
			// The deep ones checkpoint √n segments: a block each would keep
			// hundreds of boundaries.
			segments := "blocks"
			if depth > 200 {
				segments = "sqrt"
			}
			return Arch{Name: name, Input: []int{1, 28, 28}, Classes: 10, Blocks: true, Segments: segments, CNN: true,
				build: func(dev *tensor.Device, c, h, w, classes int) nn.Model {
					r, _ := nn.NewCIFARResNet(dev, depth, c, classes) // the depth is checked above
					return r
				}}, nil
		}
	}
	return Arch{}, fmt.Errorf("model %q: want %s", name, ModelNames)
}

// Build makes the model on dev for inputs of c×h×w and classes classes,
// its parameters drawn from the device's generator seeded with seed.
func (a Arch) Build(dev *tensor.Device, c, h, w, classes int, seed uint64) (nn.Model, error) {
	if c < 1 || h < 1 || w < 1 || classes < 2 {
		return nil, fmt.Errorf("model %s for inputs of %dx%dx%d and %d classes: want positive sizes and at least 2 classes", a.Name, c, h, w, classes)
	}
	dev.Generator().Seed(seed)
	return a.build(dev, c, h, w, classes), nil
}

// BuildModel is LookupArch(name) and its Build.
func BuildModel(dev *tensor.Device, name string, c, h, w, classes int, seed uint64) (nn.Model, error) {
	a, err := LookupArch(name)
	if err != nil {
		return nil, err
	}
	return a.Build(dev, c, h, w, classes, seed)
}
