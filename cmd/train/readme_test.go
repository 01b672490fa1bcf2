package main

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/leangrad/leangrad/cmd/internal/cmdenv"
	"github.com/leangrad/leangrad/datasets"
	"github.com/leangrad/leangrad/internal/race"
)

// readmeTrain matches the README's train commands: the arguments after
// "go run ./cmd/train", up to a comment.
var readmeTrain = regexp.MustCompile(`(?m)^\s+go run \./cmd/train ([^#\n]*?)\s*(?:#.*)?$`)

// TestREADMECommands runs every train command the README shows, as
// written, in a short form: the same flags with a few steps or images
// more (a step, a subset, batches of 1), on the CPU; -data mytexts/ is a
// folder of text. Each must finish and print its report. It trains GPT-2
// small for a step, a minute under the race detector's instrumentation of
// the CPU kernels: CI runs it in a step of its own, without it.
func TestREADMECommands(t *testing.T) {
	if testing.Short() {
		t.Skip("trains each README command for a step")
	}
	race.Skip(t, "go test ./cmd/train -run TestREADMECommands")
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	cmds := readmeTrain.FindAllStringSubmatch(string(readme), -1)
	if len(cmds) < 3 {
		t.Fatalf("%d train commands in the README: the pattern no longer finds them", len(cmds))
	}
	texts := t.TempDir()
	for i := 0; i < 3; i++ {
		line := strings.Repeat("The jury further said in term-end presentments that the City Executive Committee deserves praise.\n", 1000)
		if err := os.WriteFile(filepath.Join(texts, string(rune('a'+i))+".txt"), []byte(line), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv("XDG_CACHE_HOME", t.TempDir())
	for _, m := range cmds {
		args := strings.Fields(m[1])
		t.Run(m[1], func(t *testing.T) {
			for i, a := range args {
				if a == "mytexts/" {
					args[i] = texts + "/"
				}
			}
			short := []string{"-device", "cpu", "-measure=false"}
			if slices.Contains(args, "gpt") || slices.Contains(args, "gpt2") {
				if !slices.Contains(args, "-data") {
					if _, err := datasets.FindBrown(datasets.Source{Roots: cmdenv.DataRoots()}); err != nil {
						t.Skip("no Brown corpus here:", err)
					}
				}
				short = append(short, "-steps", "1", "-eval-every", "1", "-eval-batches", "1", "-batch", "1")
			} else {
				short = append(short, "-limit", "64", "-test-limit", "32", "-epochs", "1")
			}
			code, stdout, stderr := runCLI(slices.Concat(args, short)...)
			if code != 0 {
				t.Fatalf("train %s: exit %d\n%s%s", strings.Join(args, " "), code, stdout, stderr)
			}
			if !strings.Contains(stdout, "leangrad memory summary") {
				t.Errorf("train %s: no memory report\n%s", strings.Join(args, " "), stdout)
			}
			if slices.Contains(args, "-sample") && !strings.Contains(stdout, "\nsample (") {
				t.Errorf("train %s: no sample\n%s", strings.Join(args, " "), stdout)
			}
		})
	}
}
