// Package iopaths checks a command's output paths against its inputs and
// against each other before any work starts, so that no output ever
// replaces a file the run reads (the checkpoint it resumes, its dataset)
// or another output, and an output that cannot be written is reported
// before the work, not after it.
package iopaths

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/leangrad/leangrad/fileio"
)

// Stdout is the output path that means standard output.
const Stdout = "-"

// Set is a run's inputs and outputs, each named by what the user wrote it
// as ("-resume", "the dataset").
type Set struct {
	inputs, outputs []entry
}

type entry struct {
	name, path string
	stdout     bool // an output that may be Stdout
}

// Input adds a file or a folder the run reads: no output may replace it,
// nor, for a folder, any file already inside it. A path that does not
// exist is ignored.
func (s *Set) Input(name, path string) {
	if path != "" {
		s.inputs = append(s.inputs, entry{name: name, path: path})
	}
}

// Output adds a file the run writes (ignored when empty); stdout says
// whether it may be Stdout.
func (s *Set) Output(name, path string, stdout bool) {
	if path != "" {
		s.outputs = append(s.outputs, entry{name: name, path: path, stdout: stdout})
	}
}

// Problems checks every output: writable where it is (a regular file or
// none yet, through symbolic links, in a folder where a file can be
// created), not an input or inside an input folder, not another output,
// and at most one on standard output. It returns one line per problem,
// each starting with the output's name and path.
func (s *Set) Problems() []string {
	var bad []string
	say := func(o entry, format string, args ...any) {
		bad = append(bad, fmt.Sprintf("%s %s: %s", o.name, o.path, fmt.Sprintf(format, args...)))
	}
	var onStdout string
	seen := map[string]string{} // real path -> output name
	for _, o := range s.outputs {
		if o.path == Stdout {
			switch {
			case !o.stdout:
				say(o, "standard output is for -json; give a file")
			case onStdout != "":
				say(o, "%s writes to standard output already", onStdout)
			default:
				onStdout = o.name
			}
			continue
		}
		if strings.HasSuffix(o.path, "/") || strings.HasSuffix(o.path, string(filepath.Separator)) || filepath.Base(o.path) == "." || filepath.Base(o.path) == ".." {
			say(o, "names a folder; give a file's path")
			continue
		}
		target, err := fileio.Target(o.path)
		if err != nil {
			why := fileio.Cause(err).Error()
			var nr *fileio.NotRegularError
			if errors.As(err, &nr) {
				why = nr.Kind + ", not a regular file"
				if nr.Path != o.path {
					why = fmt.Sprintf("a link to %s, which is %s", nr.Path, why)
				}
				if o.stdout && nr.Kind != "a folder" {
					why += " (write - for standard output)"
				}
			}
			say(o, "%s", why)
			continue
		}
		if err := creatable(target); err != nil {
			say(o, "%v", err)
			continue
		}
		real := realPath(target)
		if other, ok := seen[real]; ok {
			say(o, "%s writes it too", other)
			continue
		}
		seen[real] = o.name
		if in := s.overwrites(real); in != "" {
			say(o, "it would replace %s, which this run reads", in)
		}
	}
	return bad
}

// overwrites names the input that writing real (a resolved path) would
// replace, or "".
func (s *Set) overwrites(real string) string {
	ost, err := os.Stat(real)
	if err != nil {
		return "" // a new file replaces nothing
	}
	for _, in := range s.inputs {
		ist, err := os.Stat(in.path)
		if err != nil {
			continue
		}
		if os.SameFile(ost, ist) {
			return fmt.Sprintf("%s %s", in.name, in.path)
		}
		if ist.IsDir() {
			dir := realPath(in.path)
			if rel, err := filepath.Rel(dir, real); err == nil && rel != "." && !strings.HasPrefix(rel, "..") {
				return fmt.Sprintf("%s, a file of %s %s", rel, in.name, in.path)
			}
		}
	}
	return ""
}

// realPath is path with its folder's symbolic links resolved (the file
// itself may not exist yet) and made absolute.
func realPath(path string) string {
	abs, err := filepath.Abs(path)
	if err != nil {
		return path
	}
	dir, base := filepath.Dir(abs), filepath.Base(abs)
	if r, err := filepath.EvalSymlinks(dir); err == nil {
		dir = r
	}
	if r, err := filepath.EvalSymlinks(filepath.Join(dir, base)); err == nil {
		return r
	}
	return filepath.Join(dir, base)
}

// creatable checks that a file can be written at path: in a folder (or
// below the nearest existing one, which the write will create folders in)
// where a file can be created, which it tries: permissions, read-only file
// systems and full quotas all show.
func creatable(path string) error {
	dir := filepath.Dir(path)
	for {
		st, err := os.Stat(dir)
		if err == nil {
			if !st.IsDir() {
				return fmt.Errorf("%s is not a folder", dir)
			}
			break
		}
		if !errors.Is(err, fs.ErrNotExist) || filepath.Dir(dir) == dir {
			return fileio.Cause(err)
		}
		dir = filepath.Dir(dir)
	}
	f, err := os.CreateTemp(dir, ".leangrad-write-check-*")
	if err != nil {
		return fmt.Errorf("cannot write in %s: %v", dir, fileio.Cause(err))
	}
	f.Close()
	return os.Remove(f.Name())
}

// Folder checks that path can be an output folder (bench -out): a folder,
// or none yet below one where a file can be created.
func Folder(path string) error {
	st, err := os.Stat(path)
	switch {
	case err == nil && !st.IsDir():
		return errors.New("not a folder")
	case err == nil:
		return creatable(filepath.Join(path, "x"))
	case errors.Is(err, fs.ErrNotExist):
		return creatable(path)
	}
	return fileio.Cause(err)
}
