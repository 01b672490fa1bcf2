package main

import (
	"strings"
	"testing"
)

func TestSummary(t *testing.T) {
	in := strings.Join([]string{
		`{"Action":"run","Package":"p","Test":"TestA"}`,
		`{"Action":"pass","Package":"p","Test":"TestA"}`,
		`{"Action":"output","Package":"p","Test":"TestCUDAB","Output":"    b_test.go:9: no CUDA device: none here\n"}`,
		`{"Action":"output","Package":"p","Test":"TestCUDAB","Output":"--- SKIP: TestCUDAB (0.00s)\n"}`,
		`{"Action":"skip","Package":"p","Test":"TestCUDAB"}`,
		`{"Action":"output","Package":"p","Test":"TestC","Output":"    c_test.go:3: got 2, want 3\n"}`,
		`{"Action":"fail","Package":"p","Test":"TestC"}`,
		`{"Action":"fail","Package":"p"}`,
		`{"Action":"skip","Package":"q"}`,
		`# q [build failed]`,
	}, "\n")
	var out strings.Builder
	s, err := read(strings.NewReader(in), &out)
	if err != nil {
		t.Fatal(err)
	}
	s.print(&out)
	if s.pass != 1 || s.fail != 1 || s.skip != 1 || s.pkgFail != 1 || s.pkgNoTests != 1 {
		t.Errorf("counts %+v", *s)
	}
	for _, want := range []string{"FAIL p.TestC\n    c_test.go:3: got 2, want 3", "1  no CUDA device: none here\n       p.TestCUDAB",
		"tests:    1 passed, 1 failed, 1 skipped", "# q [build failed]", "FAILED p.TestC"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}
