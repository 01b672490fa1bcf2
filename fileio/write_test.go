package fileio

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

func TestWriteReplacesOrKeeps(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "sub", "f.txt")
	if err := WriteFile(path, []byte("one")); err != nil {
		t.Fatal(err)
	}
	boom := errors.New("boom")
	err := Write(path, func(w io.Writer) error {
		w.Write([]byte("half-written"))
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("err = %v", err)
	}
	if b, _ := os.ReadFile(path); string(b) != "one" {
		t.Errorf("a failed write changed the file to %q", b)
	}
	if err := WriteFile(path, []byte("two")); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(path); string(b) != "two" {
		t.Errorf("file = %q", b)
	}
	entries, _ := os.ReadDir(filepath.Dir(path))
	if len(entries) != 1 {
		t.Errorf("temporary files left behind: %v", entries)
	}
}

func TestWriteRemovesKilledWritesTemporaries(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "run[1].ckpt")
	killed := filepath.Join(dir, ".run[1].ckpt.tmp-123") // fresh, but no write holds it
	live := filepath.Join(dir, ".run[1].ckpt.tmp-456")
	other := filepath.Join(dir, ".other.ckpt.tmp-789")
	for _, f := range []string{killed, live, other} {
		if err := os.WriteFile(f, []byte("torn"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	hold, err := os.Open(live) // a write in progress elsewhere
	if err != nil {
		t.Fatal(err)
	}
	defer hold.Close()
	if err := syscall.Flock(int(hold.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	if err := WriteFile(path, []byte("whole")); err != nil {
		t.Fatal(err)
	}
	for f, want := range map[string]bool{killed: false, live: true, other: true, path: true} {
		if _, err := os.Stat(f); (err == nil) != want {
			t.Errorf("%s exists: %v, want %v", filepath.Base(f), err == nil, want)
		}
	}
}

func TestWriteThroughSymlinks(t *testing.T) {
	dir := t.TempDir()
	target := filepath.Join(dir, "data", "real.json")
	os.MkdirAll(filepath.Dir(target), 0o755)
	if err := os.WriteFile(target, []byte("old"), 0o600); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link.json")
	chain := filepath.Join(dir, "chain.json")
	os.Symlink("data/real.json", link)
	os.Symlink(link, chain)
	dangling := filepath.Join(dir, "dangling.json")
	os.Symlink("data/new.json", dangling)
	for _, tc := range []struct{ path, target, data string }{
		{link, target, "via link"},
		{chain, target, "via chain"},
		{dangling, filepath.Join(dir, "data", "new.json"), "via dangling"},
	} {
		if err := WriteFile(tc.path, []byte(tc.data)); err != nil {
			t.Fatalf("%s: %v", tc.path, err)
		}
		if st, err := os.Lstat(tc.path); err != nil || st.Mode()&os.ModeSymlink == 0 {
			t.Errorf("%s is no longer a symbolic link", tc.path)
		}
		if b, _ := os.ReadFile(tc.target); string(b) != tc.data {
			t.Errorf("%s: target holds %q, want %q", tc.path, b, tc.data)
		}
	}
	if st, _ := os.Stat(target); st.Mode().Perm() != 0o600 {
		t.Errorf("the replaced file's mode is %v, want its own 0600", st.Mode().Perm())
	}
}

func TestWriteRefusesWhatIsNotAFile(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	for path, kind := range map[string]string{"/dev/null": "a device", fifo: "a FIFO", dir: "a folder"} {
		err := WriteFile(path, []byte("x"))
		if err == nil || !strings.Contains(err.Error(), kind) {
			t.Errorf("%s: err = %v, want one saying it is %s", path, err, kind)
		}
	}
	if st, err := os.Stat("/dev/null"); err != nil || st.Mode()&os.ModeDevice == 0 {
		t.Errorf("/dev/null is no longer a device: %v", st.Mode())
	}
}
