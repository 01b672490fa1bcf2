package launch

import (
	"bytes"
	"strings"
	"sync"
	"testing"
)

func TestWithoutFlag(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"-nproc 2 -model mlp", "-model mlp"},
		{"--nproc=4 -epochs 3", "-epochs 3"},
		{"-model mlp -nproc 2", "-model mlp"},
		{"-amp -nprocs 2", "-amp -nprocs 2"},
	} {
		if got := strings.Join(WithoutFlag(strings.Fields(tc.in), "nproc"), " "); got != tc.want {
			t.Errorf("%q: %q, want %q", tc.in, got, tc.want)
		}
	}
}

// Lines from several ranks come out whole, each after its rank's prefix,
// also a last line without a newline.
func TestPrefixed(t *testing.T) {
	var out bytes.Buffer
	var mu sync.Mutex
	a := &prefixed{w: &out, mu: &mu, prefix: "[rank 0] "}
	b := &prefixed{w: &out, mu: &mu, prefix: "[rank 1] "}
	a.Write([]byte("one\ntw"))
	b.Write([]byte("three\n"))
	a.Write([]byte("o\nfour"))
	a.Flush()
	want := "[rank 0] one\n[rank 1] three\n[rank 0] two\n[rank 0] four\n"
	if out.String() != want {
		t.Errorf("got %q, want %q", out.String(), want)
	}
}
