package iopaths

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestProblems(t *testing.T) {
	dir := t.TempDir()
	ckpt := filepath.Join(dir, "run.ckpt")
	data := filepath.Join(dir, "data")
	os.MkdirAll(filepath.Join(data, "sub"), 0o755)
	for _, f := range []string{ckpt, filepath.Join(data, "sub", "images")} {
		os.WriteFile(f, []byte("x"), 0o644)
	}
	os.Symlink(ckpt, filepath.Join(dir, "link"))
	os.Link(ckpt, filepath.Join(dir, "hard"))
	for _, tc := range []struct {
		name    string
		outputs [][2]string // name, path
		want    []string    // one per problem, in order ("" for none)
	}{
		{"a new file", [][2]string{{"-json", filepath.Join(dir, "new", "r.json")}}, nil},
		{"the input", [][2]string{{"-json", ckpt}}, []string{"-json " + ckpt + ": it would replace -resume " + ckpt}},
		{"a link to the input", [][2]string{{"-json", filepath.Join(dir, "link")}}, []string{"it would replace -resume"}},
		{"a hard link to the input", [][2]string{{"-json", filepath.Join(dir, "hard")}}, []string{"it would replace -resume"}},
		{"a file inside an input folder", [][2]string{{"-json", filepath.Join(data, "sub", "images")}},
			[]string{"it would replace sub/images, a file of -data " + data}},
		{"a new file inside an input folder", [][2]string{{"-json", filepath.Join(data, "r.json")}}, nil},
		{"two outputs", [][2]string{{"-json", filepath.Join(dir, "a")}, {"-memlog", filepath.Join(dir, ".", "a")}}, []string{"-memlog " + filepath.Join(dir, "a") + ": -json writes it too"}},
		{"standard output twice", [][2]string{{"-json", "-"}, {"-log", "-"}}, []string{"-log -: -json writes to standard output already"}},
		{"a device", [][2]string{{"-json", "/dev/null"}}, []string{"-json /dev/null: a device, not a regular file (write - for standard output)"}},
		{"a folder", [][2]string{{"-json", dir}}, []string{"a folder, not a regular file"}},
		{"a new folder", [][2]string{{"-save", filepath.Join(dir, "newdir") + "/"}}, []string{"-save " + filepath.Join(dir, "newdir") + "/: names a folder; give a file's path"}},
		{"dot", [][2]string{{"-json", dir + "/new/.."}}, []string{"names a folder"}},
	} {
		var s Set
		s.Input("-resume", ckpt)
		s.Input("-data", data)
		s.Input("-missing", filepath.Join(dir, "nothing"))
		for _, o := range tc.outputs {
			s.Output(o[0], o[1], true)
		}
		got := s.Problems()
		if len(got) != len(tc.want) {
			t.Errorf("%s: %q, want %d problems", tc.name, got, len(tc.want))
			continue
		}
		for i, w := range tc.want {
			if !strings.Contains(got[i], w) {
				t.Errorf("%s: %q, want %q", tc.name, got[i], w)
			}
		}
	}
}

func TestFolder(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "f")
	os.WriteFile(file, nil, 0o644)
	for path, want := range map[string]string{dir: "", filepath.Join(dir, "new", "deeper"): "", file: "not a folder", "/proc/leangrad-x": "cannot write in /proc"} {
		err := Folder(path)
		if (want == "") != (err == nil) || err != nil && !strings.Contains(err.Error(), want) {
			t.Errorf("Folder(%s) = %v, want %q", path, err, want)
		}
	}
}
