package train

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/leangrad/leangrad/nn"
	"github.com/leangrad/leangrad/tensor"
)

// BuildModel makes the named model on dev for inputs of c×h×w and classes
// classes, its parameters drawn from the device's generator seeded with
// seed. The names are the ones checkpoints record and every command takes:
// "resnetN" (a CIFAR-style ResNet of depth N = 6n+2: resnet20, resnet56,
// resnet1202, ...), "resnet18" and "mlp" (two hidden layers of 256).
func BuildModel(dev *tensor.Device, name string, c, h, w, classes int, seed uint64) (nn.Module, error) {
	if c < 1 || h < 1 || w < 1 || classes < 2 {
		return nil, fmt.Errorf("model %s for inputs of %dx%dx%d and %d classes: want positive sizes and at least 2 classes", name, c, h, w, classes)
	}
	depth, err := modelDepth(name)
	if err != nil {
		return nil, err
	}
	dev.Generator().Seed(seed)
	switch {
	case name == "resnet18":
		return nn.NewResNet18(dev, c, classes), nil
	case name == "mlp":
		return nn.NewMLP(dev, []int{c * h * w, 256, 256, classes}, 0), nil
	}
	r, err := nn.NewCIFARResNet(dev, depth, c, classes)
	if err != nil {
		return nil, err
	}
	return r, nil
}

// CheckModel reports whether BuildModel knows the name, before anything is
// built.
func CheckModel(name string) error {
	_, err := modelDepth(name)
	return err
}

// modelDepth checks a model name, and returns the depth of a CIFAR-style
// ResNet (0 for the others).
func modelDepth(name string) (int, error) {
	if name == "resnet18" || name == "mlp" {
		return 0, nil
	}
	if d, ok := strings.CutPrefix(name, "resnet"); ok {
		if depth, err := strconv.Atoi(d); err == nil && depth >= 8 && (depth-2)%6 == 0 {
			return depth, nil
		}
	}
	return 0, fmt.Errorf("model %q: want resnetN (N = 6n+2: resnet20, resnet56, ...), resnet18 or mlp", name)
}
