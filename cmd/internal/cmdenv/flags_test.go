package cmdenv

import (
	"errors"
	"flag"
	"io"
	"slices"
	"strings"
	"testing"

	"github.com/leangrad/leangrad/tensor"
	"github.com/leangrad/leangrad/train"
)

// TestParseFlagsReportsEveryProblemOnce: every refused value is reported,
// one line each naming the flag and the value once, in the owner's words;
// the flag keeps its default and is marked refused, so that what follows
// from it can be left unsaid; bool flags still take no value; -h is
// ErrHelp, and its usage names each flag's type and default.
func TestParseFlagsReportsEveryProblemOnce(t *testing.T) {
	newSet := func() (*flag.FlagSet, *tensor.DeviceSpec, *train.ModelName, *bool, *int) {
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		dev, model := tensor.DeviceSpec("auto"), train.ModelName("mlp")
		fs.Var(&dev, "device", "")
		fs.Var(&model, "model", "")
		b := fs.Bool("amp", false, "")
		n := fs.Int("batch", 8, "")
		return fs, &dev, &model, b, n
	}
	fs, dev, model, amp, batch := newSet()
	problems, refused, err := ParseFlags(fs, []string{"-device", "tpu", "-model", "vgg", "-amp", "-batch", "x", "file"})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{`-device "tpu": want cpu, cuda, cuda:N or auto`, `-model "vgg": want resnet`, `-batch "x": not a number`}
	if len(problems) != len(want) {
		t.Fatalf("problems %q, want %d", problems, len(want))
	}
	for i, w := range want {
		if !strings.HasPrefix(problems[i], w) || strings.Count(problems[i], "tpu") > 1 || strings.Count(problems[i], "vgg") > 1 {
			t.Errorf("problem %d: %q, want %q first, the value once", i, problems[i], w)
		}
	}
	if *dev != "auto" || *model != "mlp" || !*amp || *batch != 8 || !refused["device"] || !refused["model"] || fs.Arg(0) != "file" {
		t.Errorf("after the refusals: %v %v %v %v %v, args %v", *dev, *model, *amp, *batch, refused, fs.Args())
	}
	if got := Unsaid([]string{"-context: -model mlp classifies images", "-epochs 0: want at least 1"}, refused); !slices.Equal(got, []string{"-epochs 0: want at least 1"}) {
		t.Errorf("Unsaid kept %q", got)
	}
	fs, _, _, _, _ = newSet()
	var usage strings.Builder
	fs.SetOutput(&usage)
	if _, _, err := ParseFlags(fs, []string{"-h"}); !errors.Is(err, flag.ErrHelp) {
		t.Errorf("-h: %v", err)
	}
	if u := usage.String(); strings.Contains(u, "panic") || !strings.Contains(u, "-batch int") || !strings.Contains(u, "(default 8)") || strings.Contains(u, "default false") {
		t.Errorf("-h wrote a usage without each flag's type and default:\n%s", u)
	}
	fs, _, _, _, _ = newSet()
	usages := 0
	fs.Usage = func() { usages++ } // a command's own usage, written where it pleases
	if problems, _, _ := ParseFlags(fs, []string{"-nope"}); len(problems) != 1 || !strings.Contains(problems[0], "-nope") || usages != 0 {
		t.Errorf("an unknown flag: %q, the usage written %d times", problems, usages)
	}
	if _, _, err := ParseFlags(fs, []string{"-h"}); !errors.Is(err, flag.ErrHelp) || usages != 1 {
		t.Errorf("-h: %v, the usage written %d times", err, usages)
	}
}
