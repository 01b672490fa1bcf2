package fileio

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
)

// NoLimit is ReadFile's limit for a file that may be as large as it is.
const NoLimit = -1

// Open opens path for reading after checking, without opening it, that it
// names a regular file (through any symbolic links), so that a FIFO does
// not block and a device such as /dev/zero is not read without end. Its
// errors are a *NotRegularError or the file system's *fs.PathError: Cause
// words either for a message that names the path.
func Open(path string) (*os.File, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if err := regular(path, st); err != nil {
		return nil, err
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	if now, err := f.Stat(); err != nil || !os.SameFile(st, now) {
		f.Close()
		return nil, &fs.PathError{Op: "open", Path: path, Err: errors.New("replaced while it was opened")}
	}
	return f, nil
}

// ReadFile reads the regular file at path, refusing what is not one (see
// Open) and a file larger than limit bytes (NoLimit: any size) before it
// reads anything. Errors are Open's or *fs.PathError, for Cause.
func ReadFile(path string, limit int64) ([]byte, error) {
	f, err := Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if limit >= 0 && st.Size() > limit {
		return nil, &fs.PathError{Op: "read", Path: path, Err: fmt.Errorf("%d bytes, more than the %d that such a file may hold", st.Size(), limit)}
	}
	var r io.Reader = f
	if limit >= 0 {
		r = io.LimitReader(f, limit+1) // a file that grows past its size as it is read
	}
	var buf bytes.Buffer
	buf.Grow(int(min(st.Size(), 1<<30)) + 512) // grown further as it is read; a file of the kernel's (size 0) is read to its end, as os.ReadFile does
	if _, err := buf.ReadFrom(r); err != nil {
		return nil, &fs.PathError{Op: "read", Path: path, Err: err}
	}
	data := buf.Bytes()
	if limit >= 0 && int64(len(data)) > limit {
		return nil, &fs.PathError{Op: "read", Path: path, Err: fmt.Errorf("more than the %d bytes that such a file may hold", limit)}
	}
	return data, nil
}

// regular is nil when st is a regular file's, else a *NotRegularError
// saying what path is.
func regular(path string, st fs.FileInfo) error {
	if st.Mode().IsRegular() {
		return nil
	}
	return &NotRegularError{Path: path, Kind: Kind(st.Mode())}
}

// CheckInput is nil when path names a regular file or a folder (through
// any symbolic links): what an input may be.
func CheckInput(path string) error {
	st, err := os.Stat(path)
	if err != nil {
		return err
	}
	if st.IsDir() {
		return nil
	}
	return regular(path, st)
}
