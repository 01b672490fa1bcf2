package main

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/leangrad/leangrad/cmd/internal/cmdenv"
	"github.com/leangrad/leangrad/nn"
	"github.com/leangrad/leangrad/run"
)

// trainCmd is the train command as its own process: this test binary,
// which TestMain makes the command when LEANGRAD_TEST_TRAIN is set.
func trainCmd(args ...string) *exec.Cmd {
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), "LEANGRAD_TEST_TRAIN=1")
	return cmd
}

// runBinary runs the command to its end.
func runBinary(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var o, e bytes.Buffer
	cmd := trainCmd(args...)
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.ExitCode(), o.String(), e.String()
	} else if err != nil {
		t.Fatal(err)
	}
	return 0, o.String(), e.String()
}

// fakeFashionMNIST writes a small Fashion-MNIST of 32 images a split under
// root/fashion-mnist and returns its training images' file.
func fakeFashionMNIST(t *testing.T, root string) string {
	dir := filepath.Join(root, "fashion-mnist")
	os.MkdirAll(dir, 0o755)
	for _, p := range []string{"train", "t10k"} {
		writeIDX(t, filepath.Join(dir, p+"-images-idx3-ubyte"), []int{32, 28, 28}, bytes.Repeat([]byte{7}, 32*28*28))
		labels := make([]byte, 32)
		for i := range labels {
			labels[i] = byte(i % 10)
		}
		writeIDX(t, filepath.Join(dir, p+"-labels-idx1-ubyte"), []int{32}, labels)
	}
	return filepath.Join(dir, "train-images-idx3-ubyte")
}

// No output replaces an input or another output, writes through a device
// or turns one into a file: each case is refused before any work (exit
// 64), and the file it names is byte for byte intact.
func TestOutputsNeverDestroyInputs(t *testing.T) {
	dir := t.TempDir()
	ck := filepath.Join(dir, "run.ckpt")
	if code, _, stderr := runCLI(slices.Concat(smallRun, []string{"-epochs", "1", "-save", ck})...); code != 0 {
		t.Fatalf("the first run: %d\n%s", code, stderr)
	}
	root := t.TempDir()
	images := fakeFashionMNIST(t, root)
	link := filepath.Join(dir, "link.json")
	os.Symlink(images, link)
	fifo := filepath.Join(dir, "fifo")
	syscall.Mkfifo(fifo, 0o644)
	fmnist := []string{"-model", "mlp", "-dataset", "fashion-mnist", "-device", "cpu", "-batch", "16", "-measure=false"}
	resume := slices.Concat(smallRun, []string{"-epochs", "2", "-resume", ck})
	for _, tc := range []struct {
		name   string
		args   []string
		intact string // the file that must not change
		want   string
	}{
		{"-json over the checkpoint resumed", slices.Concat(resume, []string{"-json", ck}), ck, "-json " + ck + ": it would replace -resume " + ck},
		{"-memlog over the checkpoint resumed", slices.Concat(resume, []string{"-memlog", ck}), ck, "-memlog " + ck + ": it would replace -resume"},
		{"-json -save -resume the same", slices.Concat(resume, []string{"-json", ck, "-save", ck}), ck, "-json " + ck + ": -save writes it too"},
		{"-json over a dataset file", slices.Concat(fmnist, []string{"-json", images}), images, "it would replace train-images-idx3-ubyte, a file of the dataset in"},
		{"-memsnapshot over a dataset file", slices.Concat(fmnist, []string{"-memsnapshot", images}), images, "-memsnapshot " + images + ": it would replace"},
		{"-json through a link to a dataset file", slices.Concat(fmnist, []string{"-json", link}), images, "-json " + link + ": it would replace"},
		{"-json on a device", slices.Concat(smallRun, []string{"-json", "/dev/null"}), "/dev/null", "-json /dev/null: a device, not a regular file (write - for standard output)"},
		{"-save on a device", slices.Concat(smallRun, []string{"-save", "/dev/full"}), "/dev/full", "-save /dev/full: a device, not a regular file"},
		{"-memlog on a FIFO", slices.Concat(smallRun, []string{"-memlog", fifo}), fifo, "-memlog " + fifo + ": a FIFO, not a regular file"},
		{"-memlog on standard output", slices.Concat(smallRun, []string{"-memlog", "-"}), "", "-memlog -: standard output is for -json"},
		{"-save into a new folder", slices.Concat(smallRun, []string{"-save", dir + "/newdir/"}), "", "-save " + dir + "/newdir/: names a folder; give a file's path"},
		{"-json into a new folder", slices.Concat(smallRun, []string{"-json", dir + "/newdir/"}), "", "-json " + dir + "/newdir/: names a folder"},
	} {
		var before []byte
		var mode os.FileMode
		if tc.intact != "" {
			st, _ := os.Lstat(tc.intact)
			mode = st.Mode()
			if mode.IsRegular() {
				before, _ = os.ReadFile(tc.intact)
			}
		}
		cmd := trainCmd(tc.args...)
		cmd.Env = append(cmd.Env, "LEANGRAD_DATA="+root)
		var o, e bytes.Buffer
		cmd.Stdout, cmd.Stderr = &o, &e
		err := cmd.Run()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		}
		if code != cmdenv.ExitUsage || !strings.Contains(e.String(), tc.want) || o.Len() != 0 {
			t.Errorf("%s: exit %d, stdout %q, stderr %q; want exit %d, nothing done and %q", tc.name, code, o.String(), e.String(), cmdenv.ExitUsage, tc.want)
		}
		if tc.intact != "" {
			st, _ := os.Lstat(tc.intact)
			var after []byte
			if mode.IsRegular() { // reading a FIFO or /dev/full would not end
				after, _ = os.ReadFile(tc.intact)
			}
			if st.Mode() != mode || !bytes.Equal(before, after) {
				t.Errorf("%s: %s changed (mode %v -> %v)", tc.name, tc.intact, mode, st.Mode())
			}
		}
	}
	// A link to a new file is written through: the link stays.
	out := filepath.Join(dir, "reports", "r.json")
	os.MkdirAll(filepath.Dir(out), 0o755)
	os.Symlink(out, filepath.Join(dir, "r-link.json"))
	if code, _, stderr := runCLI(slices.Concat(smallRun, []string{"-epochs", "1", "-json", filepath.Join(dir, "r-link.json")})...); code != 0 {
		t.Fatalf("-json through a link: %d\n%s", code, stderr)
	}
	if st, err := os.Lstat(filepath.Join(dir, "r-link.json")); err != nil || st.Mode()&os.ModeSymlink == 0 {
		t.Errorf("the link was replaced by a file")
	}
	var r run.Report
	if data, err := os.ReadFile(out); err != nil || json.Unmarshal(data, &r) != nil || r.Final == nil {
		t.Errorf("the link's target holds no report: %v", err)
	}
	// -json - writes the report alone on standard output.
	code, stdout, stderr := runBinary(t, slices.Concat(smallRun, []string{"-epochs", "1", "-json", "-"})...)
	if code != 0 || json.Unmarshal([]byte(stdout), &r) != nil || !strings.Contains(stderr, "test accuracy") {
		t.Errorf("-json -: exit %d, stdout %.200q is not the JSON alone (stderr %.200q)", code, stdout, stderr)
	}
}

// A checkpoint with bytes flipped in a tensor is refused before any work,
// naming the tensor; one written before checksums (none in its metadata)
// resumes with a warning.
func TestCorruptedCheckpointIsRefused(t *testing.T) {
	dir := t.TempDir()
	ck := filepath.Join(dir, "run.ckpt")
	if code, _, stderr := runCLI(slices.Concat(smallRun, []string{"-epochs", "1", "-save", ck})...); code != 0 {
		t.Fatalf("the first run: %d\n%s", code, stderr)
	}
	good, _ := os.ReadFile(ck)
	bad := bytes.Clone(good)
	mid := len(bad) / 2
	for i := range 16 {
		bad[mid+i] ^= 0x5a
	}
	os.WriteFile(ck, bad, 0o644)
	code, stdout, stderr := runBinary(t, slices.Concat(smallRun, []string{"-epochs", "2", "-resume", ck})...)
	if code != cmdenv.ExitUsage || !strings.Contains(stderr, "-resume "+ck+": tensor ") || !strings.Contains(stderr, "is corrupted") || stdout != "" {
		t.Errorf("a corrupted checkpoint: exit %d\n%s%s", code, stdout, stderr)
	}
	os.WriteFile(ck, withoutChecksums(t, good), 0o644)
	code, stdout, stderr = runBinary(t, slices.Concat(smallRun, []string{"-epochs", "2", "-resume", ck})...)
	if code != 0 || !strings.Contains(stdout, "warning: "+ck+" carries no checksums") {
		t.Errorf("a checkpoint without checksums: exit %d\n%s%s", code, stdout, stderr)
	}
}

// withoutChecksums is a safetensors file as leangrad wrote it before it
// recorded checksums: the same, less that metadata entry.
func withoutChecksums(t *testing.T, file []byte) []byte {
	n := binary.LittleEndian.Uint64(file)
	var header map[string]json.RawMessage
	if err := json.Unmarshal(file[8:8+n], &header); err != nil {
		t.Fatal(err)
	}
	var meta map[string]string
	json.Unmarshal(header["__metadata__"], &meta)
	delete(meta, nn.ChecksumKey)
	header["__metadata__"], _ = json.Marshal(meta)
	h, _ := json.Marshal(header)
	for len(h)%8 != 0 {
		h = append(h, ' ')
	}
	out := binary.LittleEndian.AppendUint64(nil, uint64(len(h)))
	return append(append(out, h...), file[8+n:]...)
}

// SIGTERM in epoch 2 stops the run at a step boundary: it saves a
// checkpoint there, writes the JSON (which says where it stopped), prints
// one line and exits 143; resuming it ends with the very weights of a run
// that was never interrupted.
func TestSIGTERMSavesAndResumesToTheSameWeights(t *testing.T) {
	dir := t.TempDir()
	args := []string{"-model", "mlp", "-dataset", "synthetic", "-device", "cpu", "-batch", "8", "-epochs", "3",
		"-limit", "1000", "-test-limit", "64", "-measure=false"}
	whole, stopped := filepath.Join(dir, "whole.ckpt"), filepath.Join(dir, "stopped.ckpt")
	if code, _, stderr := runBinary(t, slices.Concat(args, []string{"-save", whole})...); code != 0 {
		t.Fatalf("the whole run: %d\n%s", code, stderr)
	}
	js := filepath.Join(dir, "r.json")
	cmd := trainCmd(slices.Concat(args, []string{"-save", stopped, "-json", js})...)
	var o bytes.Buffer
	cmd.Stdout = &o
	pipe, _ := cmd.StderrPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var e strings.Builder
	sc := bufio.NewScanner(pipe)
	for sc.Scan() {
		line := sc.Text()
		e.WriteString(line + "\n")
		if strings.HasPrefix(line, "epoch 2/3") { // the first progress line of epoch 2
			cmd.Process.Signal(syscall.SIGTERM)
			break
		}
	}
	for sc.Scan() {
		e.WriteString(sc.Text() + "\n")
	}
	err := cmd.Wait()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	}
	if code != 143 || !strings.Contains(e.String(), "training interrupted after step") || !strings.Contains(e.String(), stopped+" holds the run there") || !strings.Contains(e.String(), "train: -resume "+stopped+" goes on from there") {
		t.Fatalf("SIGTERM: exit %d\n%s%s", code, o.String(), e.String())
	}
	var r run.Report
	data, err := os.ReadFile(js)
	if err != nil || json.Unmarshal(data, &r) != nil || r.Interrupted == nil || r.Interrupted.Epoch != 2 || r.Interrupted.Batch == 0 || len(r.Epochs) != 1 {
		t.Fatalf("-json after SIGTERM: %v %s", err, data)
	}
	code, stdout, stderr := runBinary(t, slices.Concat(args, []string{"-save", stopped, "-resume", stopped})...)
	if code != 0 || !strings.Contains(stdout, "resumed from "+stopped+" at epoch 2, batch ") {
		t.Fatalf("resume: exit %d\n%s%s", code, stdout, stderr)
	}
	a, b := modelTensors(t, whole), modelTensors(t, stopped)
	for name, w := range a {
		if !bytes.Equal(w, b[name]) {
			t.Errorf("%s differs between the whole run and the interrupted one resumed", name)
		}
	}
	if len(a) == 0 || len(a) != len(b) {
		t.Errorf("%d and %d tensors", len(a), len(b))
	}
}

// modelTensors are a checkpoint's model and optimiser tensors.
func modelTensors(t *testing.T, path string) map[string][]byte {
	st, err := nn.ReadSafetensors(path)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]byte{}
	for name, s := range st.Tensors {
		out[name] = s.Data
	}
	return out
}

// The smaller cases: each is a clear line with its own exit status, and
// -json is valid JSON whatever happened.
func TestSmallerCases(t *testing.T) {
	t.Setenv("XDG_CACHE_HOME", t.TempDir()) // the token files
	dir := t.TempDir()
	js := filepath.Join(dir, "r.json")
	ck := filepath.Join(dir, "run.ckpt")
	text := filepath.Join(dir, "text.txt")
	if err := os.WriteFile(text, bytes.Repeat([]byte("The jury further said in term-end presentments.\n"), 200), 0o644); err != nil {
		t.Fatal(err)
	}
	first := filepath.Join(dir, "first.json")
	if code, stdout, stderr := runCLI(slices.Concat(smallRun, []string{"-epochs", "1", "-save", ck, "-json", first})...); code != 0 ||
		!strings.HasSuffix(stdout, "wrote "+ck+" (the training checkpoint: -resume goes on from it, serve serves it)\nwrote "+first+" (the run's report)\n") {
		t.Fatalf("the first run: %d, its last lines not one per file written\n%s%s", code, stdout, stderr)
	}
	for _, tc := range []struct {
		name string
		args []string
		code int
		want string
	}{
		{"a batch larger than the dataset", []string{"-model", "mlp", "-dataset", "synthetic", "-device", "cpu", "-batch", "1000000", "-limit", "64", "-max-memory", "1GiB", "-json", js},
			cmdenv.ExitNothingRan, "batch 1000000: more than the 64 training images"},
		{"a GPT batch past the host's memory", []string{"-model", "gpt-mini", "-device", "cpu", "-tokenizer", "bytes", "-data", text, "-batch", "2000000000", "-json", js},
			cmdenv.ExitNothingRan, "train: batch 2000000000 of 64-token windows: its host buffers alone take 953.67 GiB, more than the "},
		{"a GPT whose state alone passes the budget", []string{"-model", "gpt2-medium", "-device", "cpu", "-tokenizer", "bytes", "-data", text, "-max-memory", "1GiB", "-json", js},
			cmdenv.ExitNothingRan, "train: model gpt2-medium: its 303,622,144 parameters take 4.52 GiB in F32 with their gradients and adamw's state, more than the 1.00 GiB of the budget (-max-memory)"},
		{"bad flags", []string{"-epochs", "0", "-batch", "-3", "-json", js}, cmdenv.ExitUsage, "train: -epochs 0: want at least 1\ntrain: -batch -3: want at least 1\n"},
		{"-download beside -data", []string{"-download", "-data", dir}, cmdenv.ExitUsage, "-download fetches into the user cache folder, and -data " + dir},
		{"-max-memory without a unit", []string{"-max-memory", "1.5"}, cmdenv.ExitUsage, "want 1.5GiB or 1.5MiB"},
		{"resuming a finished run", slices.Concat(smallRun, []string{"-epochs", "1", "-resume", ck, "-json", js}),
			cmdenv.ExitNothingRan, "the run it holds has done 1 epoch, and this one asks for 1 epoch: nothing is left to train"},
		{"-limit changed on resume", slices.Concat(smallRun, []string{"-epochs", "2", "-resume", ck, "-limit", "256", "-json", js}),
			cmdenv.ExitNothingRan, "examples: 512 -> 256"},
	} {
		os.Remove(js)
		code, stdout, stderr := runCLI(tc.args...)
		if code != tc.code || !strings.Contains(stderr, tc.want) || strings.Contains(stdout, "training mlp") {
			t.Errorf("%s: exit %d\n%s%s\nwant exit %d and %q", tc.name, code, stdout, stderr, tc.code, tc.want)
		}
		if slices.Contains(tc.args, js) {
			var r run.Report
			if data, err := os.ReadFile(js); err != nil || json.Unmarshal(data, &r) != nil || r.Error == "" {
				t.Errorf("%s: -json %v %q", tc.name, err, data)
			}
		}
	}
	// A GPT resumes with the preset's context left unsaid, and a resume
	// whose configuration differs is refused before the text is read.
	gpt := []string{"-model", "gpt-mini", "-device", "cpu", "-tokenizer", "bytes", "-data", text, "-eval-every", "2", "-measure=false"}
	gck := filepath.Join(dir, "gpt.ckpt")
	if code, _, stderr := runCLI(slices.Concat(gpt, []string{"-steps", "2", "-save", gck})...); code != 0 {
		t.Fatalf("the GPT's first run: %d\n%s", code, stderr)
	}
	if code, stdout, stderr := runCLI(slices.Concat(gpt, []string{"-steps", "4", "-resume", gck})...); code != 0 || !strings.Contains(stdout, "resumed from "+gck+" at step 3") {
		t.Errorf("resuming the GPT: exit %d\n%s%s", code, stdout, stderr)
	}
	if code, stdout, stderr := runCLI(slices.Concat(gpt, []string{"-steps", "4", "-context", "32", "-resume", gck})...); code != cmdenv.ExitNothingRan ||
		!strings.Contains(stderr, "context: 64 -> 32") || strings.Contains(stdout, "text: ") {
		t.Errorf("resuming the GPT with another context: exit %d\n%s%s", code, stdout, stderr)
	}
	// A longer run resumed says that the schedule stretches from there.
	if code, stdout, stderr := runCLI(slices.Concat(smallRun, []string{"-epochs", "2", "-resume", ck})...); code != 0 ||
		!strings.Contains(stdout, "resuming a run of 1 epoch as one of 2 epochs: the cosine schedule takes the new length from here") {
		t.Errorf("resuming with more epochs: exit %d\n%s%s", code, stdout, stderr)
	}
	// -batch without -lr scales the learning rate as the CPU defaults do,
	// and says so; one epoch is "1 epoch".
	code, stdout, _ := runCLI(slices.Concat(smallRun, []string{"-epochs", "1", "-batch", "64"})...)
	if code != 0 || !strings.Contains(stdout, "lr 0.05: -lr's 0.1 for a batch of 128, scaled to -batch 64") || !strings.Contains(stdout, "1 epoch of 8 steps") {
		t.Errorf("-batch 64: exit %d\n%s", code, stdout)
	}
	var help bytes.Buffer
	command([]string{"-h"}, &help, &help)
	for _, want := range []string{"On a CPU, unless given: -limit 2000", "64 bad flags", "143 stopped by SIGINT or SIGTERM"} {
		if !strings.Contains(help.String(), want) {
			t.Errorf("-h lacks %q", want)
		}
	}
}

// TestInputsThatAreNotFiles: a text that is a FIFO without a writer, or a
// link to /dev/zero, is refused at once with one line that says what it
// is, and the JSON report says why.
func TestInputsThatAreNotFiles(t *testing.T) {
	dir := t.TempDir()
	fifo, zero := filepath.Join(dir, "fifo"), filepath.Join(dir, "zero")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Skip("no FIFOs here:", err)
	}
	if err := os.Symlink("/dev/zero", zero); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ path, want string }{
		{fifo, "train: -data: text " + fifo + ": a FIFO, not a regular file"},
		{zero, "train: -data: text " + zero + ": a device, not a regular file"},
	} {
		js := filepath.Join(dir, "r.json")
		code, _, stderr := runBinary(t, "-model", "gpt-mini", "-device", "cpu", "-data", c.path, "-json", js)
		if code != cmdenv.ExitNothingRan || strings.TrimSpace(stderr) != c.want {
			t.Errorf("-data %s: exit %d\n%s\nwant %q", c.path, code, stderr, c.want)
		}
		var r run.Report
		if data, err := os.ReadFile(js); err != nil || json.Unmarshal(data, &r) != nil || !strings.Contains(r.Error, "not a regular file") {
			t.Errorf("-json after -data %s: %v %s", c.path, err, data)
		}
	}
}

// TestSIGINTWhileReadingTheText: a signal while the text is tokenized stops
// the run there (it does not wait for the tokens), with one line, the
// signal's exit status, no promise of a -resume file that was never
// written, and the JSON report.
func TestSIGINTWhileReadingTheText(t *testing.T) {
	t.Setenv("XDG_CACHE_HOME", t.TempDir())
	dir := t.TempDir()
	text := filepath.Join(dir, "text.txt")
	line := []byte("The jury further said in term-end presentments that the City Executive Committee deserves praise.\n")
	if err := os.WriteFile(text, bytes.Repeat(line, 400_000), 0o644); err != nil { // 40 MB: a minute of GPT-2 tokenizing
		t.Fatal(err)
	}
	js, save := filepath.Join(dir, "r.json"), filepath.Join(dir, "s.ckpt")
	cmd := trainCmd("-model", "gpt-mini", "-device", "cpu", "-tokenizer", "gpt2", "-data", text, "-json", js, "-save", save)
	out, _ := cmd.StdoutPipe()
	var e bytes.Buffer
	cmd.Stderr = &e
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), "device: ") { // the device is open: the text is read next
			cmd.Process.Signal(os.Interrupt)
			break
		}
	}
	for sc.Scan() {
	}
	err := cmd.Wait()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	}
	if code != 130 || !strings.Contains(e.String(), "train: training interrupted while reading the text, before any training") || strings.Contains(e.String(), "-resume") {
		t.Fatalf("SIGINT while tokenizing: exit %d\n%s", code, e.String())
	}
	if _, err := os.Stat(save); err == nil {
		t.Errorf("%s written by a run that never trained", save)
	}
	var r run.Report
	if data, err := os.ReadFile(js); err != nil || json.Unmarshal(data, &r) != nil || !strings.Contains(r.Error, "interrupted") {
		t.Errorf("-json after SIGINT: %v %s", err, data)
	}
}
