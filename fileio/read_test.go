package fileio

import (
	"errors"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestReadFileRefusesWhatIsNotARegularFile: a FIFO without a writer, a
// link to /dev/zero, a socket and a folder are refused at once, naming
// what they are, and a file over its limit before it is read; a regular
// file, through a link too, is read whole.
func TestReadFileRefusesWhatIsNotARegularFile(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "data")
	if err := os.WriteFile(file, []byte("0123456789"), 0o644); err != nil {
		t.Fatal(err)
	}
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Skip("no FIFOs here:", err)
	}
	zero := filepath.Join(dir, "zero")
	if err := os.Symlink("/dev/zero", zero); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link")
	if err := os.Symlink(file, link); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	for _, c := range []struct {
		name, path string
		limit      int64
		want       string // the error's Cause, or "" to read the file
	}{
		{"a regular file", file, NoLimit, ""},
		{"at its limit", file, 10, ""},
		{"through a link", link, 10, ""},
		{"over its limit", file, 9, "10 bytes, more than the 9 that such a file may hold"},
		{"a FIFO without a writer", fifo, NoLimit, "a FIFO, not a regular file"},
		{"a link to /dev/zero", zero, NoLimit, "a device, not a regular file"},
		{"a socket", sock, NoLimit, "a socket, not a regular file"},
		{"a folder", dir, NoLimit, "a folder, not a regular file"},
		{"nothing", filepath.Join(dir, "none"), NoLimit, "no such file or directory"},
	} {
		t.Run(c.name, func(t *testing.T) {
			done := make(chan struct{})
			var data []byte
			var err error
			go func() { data, err = ReadFile(c.path, c.limit); close(done) }()
			select {
			case <-done:
			case <-time.After(5 * time.Second):
				t.Fatalf("ReadFile(%s) still blocks after 5 s", c.path)
			}
			if c.want == "" {
				if err != nil || string(data) != "0123456789" {
					t.Fatalf("ReadFile = %q, %v", data, err)
				}
				return
			}
			if err == nil {
				t.Fatalf("ReadFile(%s) read %d bytes", c.path, len(data))
			}
			if got := Cause(err).Error(); got != c.want {
				t.Errorf("Cause(%v) = %q, want %q", err, got, c.want)
			}
			if !strings.Contains(err.Error(), c.path) {
				t.Errorf("%v does not name %s", err, c.path)
			}
			var nr *NotRegularError
			if strings.Contains(c.want, "not a regular file") != errors.As(err, &nr) {
				t.Errorf("%v: a *NotRegularError is %v", err, errors.As(err, &nr))
			}
			if c.want == "no such file or directory" && !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("%v is not fs.ErrNotExist", err)
			}
		})
	}
	for _, c := range []struct {
		path string
		ok   bool
	}{{file, true}, {dir, true}, {link, true}, {fifo, false}, {zero, false}, {sock, false}} {
		if err := CheckInput(c.path); (err == nil) != c.ok {
			t.Errorf("CheckInput(%s) = %v", c.path, err)
		}
	}
}

// TestReadFileReadsTheKernelsFiles: a file that reports size 0 but has
// content (/proc) is read to its end, as os.ReadFile does.
func TestReadFileReadsTheKernelsFiles(t *testing.T) {
	want, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Skip("no /proc here")
	}
	got, err := ReadFile("/proc/self/status", 1<<20)
	if err != nil || len(got) == 0 || !strings.HasPrefix(string(got), strings.SplitN(string(want), "\n", 2)[0]) {
		t.Errorf("ReadFile(/proc/self/status) = %d bytes, %v", len(got), err)
	}
}
