// Package atomicfile writes files so that a reader sees the old content or
// the new, never a torn mix: the data goes to a temporary file in the same
// folder, is synced, and is renamed over the target.
package atomicfile

import (
	"bufio"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// Write creates path (and its folder) with what write produces. On any
// error the target is left untouched and the temporary file removed. The
// temporary files of earlier writes of path that were killed before they
// could remove theirs are removed first (those untouched for a minute: a
// write in progress elsewhere keeps its file fresh).
func Write(path string, write func(w io.Writer) error) (err error) {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	RemoveStale(path, time.Minute)
	f, err := os.CreateTemp(dir, tempPrefix(path)+"*")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(f.Name())
		}
	}()
	bw := bufio.NewWriterSize(f, 1<<20)
	if err := write(bw); err != nil {
		return err
	}
	if err := errors.Join(bw.Flush(), f.Sync(), f.Chmod(0o644)); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(f.Name(), path); err != nil {
		return err
	}
	// Make the rename itself durable.
	if d, err := os.Open(dir); err == nil {
		d.Sync()
		d.Close()
	}
	return nil
}

func tempPrefix(path string) string { return "." + filepath.Base(path) + ".tmp-" }

// RemoveStale removes the temporary files that writes of path left behind
// and that were last modified more than age ago, and returns their names.
func RemoveStale(path string, age time.Duration) []string {
	matches, _ := filepath.Glob(filepath.Join(filepath.Dir(path), globEscape(tempPrefix(path))+"*"))
	var removed []string
	for _, m := range matches {
		if st, err := os.Lstat(m); err == nil && st.Mode().IsRegular() && time.Since(st.ModTime()) > age && os.Remove(m) == nil {
			removed = append(removed, m)
		}
	}
	return removed
}

// globEscape quotes the characters filepath.Match treats specially.
func globEscape(s string) string {
	var b strings.Builder
	for _, r := range s {
		if strings.ContainsRune(`*?[\`, r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}

// WriteFile is Write of a byte slice.
func WriteFile(path string, data []byte) error {
	return Write(path, func(w io.Writer) error {
		_, err := w.Write(data)
		return err
	})
}
