// Package fileio is how leangrad's library touches the file system: files
// written so that a reader sees the old content or the new, never a torn
// mix (the data goes to a temporary file in the same folder, is synced, and
// is renamed over the target), and file-system errors worded for messages
// that already name the path. It imports nothing of leangrad's: every
// layer may use it.
package fileio

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// Write creates path (and its folder) with what write produces. On any
// error the target is left untouched and the temporary file removed.
//
// A symbolic link is written through: its target is replaced, the link
// stays. A path that exists and is not a regular file (a device, a FIFO, a
// socket, a folder) is refused, so that a stray -json /dev/sda is an error
// and /dev/stdout is not turned into a file; write to standard output
// directly for that. The temporary files that earlier writes of path left
// when they were killed are removed first (see RemoveStale).
func Write(path string, write func(w io.Writer) error) (err error) {
	path, err = Target(path)
	if err != nil {
		return err
	}
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	RemoveStale(path)
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
	// The lock says the write is alive: RemoveStale leaves a locked file
	// alone, and the kernel drops the lock when the process dies.
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		return fmt.Errorf("locking %s: %w", f.Name(), err)
	}
	bw := bufio.NewWriterSize(f, 1<<20)
	if err := write(bw); err != nil {
		return err
	}
	mode := os.FileMode(0o644)
	if st, err := os.Stat(path); err == nil {
		mode = st.Mode().Perm() // a replaced file keeps its permissions
	}
	if err := errors.Join(bw.Flush(), f.Sync(), f.Chmod(mode)); err != nil {
		return err
	}
	if err := os.Rename(f.Name(), path); err != nil {
		return err
	}
	if err := f.Close(); err != nil { // after the rename: the lock is held until the file is in place
		return err
	}
	// Make the rename itself durable.
	if d, err := os.Open(dir); err == nil {
		d.Sync()
		d.Close()
	}
	return nil
}

// Target is the file a write of path replaces: path itself, or, when path
// is a symbolic link (or a chain of them, dangling or not), the file it
// points to. It is an error when that exists and is not a regular file.
func Target(path string) (string, error) {
	for hops := 0; ; hops++ {
		st, err := os.Lstat(path)
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR) {
			return path, nil // a new file (whose folder the write makes, or fails to)
		}
		if err != nil {
			return "", err
		}
		if st.Mode()&fs.ModeSymlink == 0 {
			if !st.Mode().IsRegular() {
				return "", &NotRegularError{Path: path, Kind: Kind(st.Mode())}
			}
			return path, nil
		}
		if hops == 40 {
			return "", fmt.Errorf("%s: too many levels of symbolic links", path)
		}
		link, err := os.Readlink(path)
		if err != nil {
			return "", err
		}
		if !filepath.IsAbs(link) {
			link = filepath.Join(filepath.Dir(path), link)
		}
		path = link
	}
}

// NotRegularError is Target's error for a path that is not a regular file.
type NotRegularError struct {
	Path string
	Kind string // what it is (Kind)
}

func (e *NotRegularError) Error() string { return e.Path + " is " + e.Kind + ", not a regular file" }

// Kind names what a file mode is: "a folder", "a device", "a FIFO", "a
// socket", "a regular file".
func Kind(m fs.FileMode) string {
	switch {
	case m.IsDir():
		return "a folder"
	case m&(fs.ModeDevice|fs.ModeCharDevice) != 0:
		return "a device"
	case m&fs.ModeNamedPipe != 0:
		return "a FIFO"
	case m&fs.ModeSocket != 0:
		return "a socket"
	case m&fs.ModeSymlink != 0:
		return "a symbolic link"
	case m.IsRegular():
		return "a regular file"
	}
	return "not a regular file"
}

func tempPrefix(path string) string { return "." + filepath.Base(path) + ".tmp-" }

// RemoveStale removes the temporary files that writes of path left behind
// when they were killed, and returns their names. A write in progress
// holds a lock on its file, so it is never among them.
func RemoveStale(path string) []string {
	matches, _ := filepath.Glob(filepath.Join(filepath.Dir(path), globEscape(tempPrefix(path))+"*"))
	var removed []string
	for _, m := range matches {
		st, err := os.Lstat(m)
		if err != nil || !st.Mode().IsRegular() || locked(m) {
			continue
		}
		if os.Remove(m) == nil {
			removed = append(removed, m)
		}
	}
	return removed
}

// locked reports whether another open file holds a lock on path.
func locked(path string) bool {
	f, err := os.Open(path)
	if err != nil {
		return true // not ours to judge
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		return true
	}
	syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
	return false
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
