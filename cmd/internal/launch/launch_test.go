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

func TestRankEnv(t *testing.T) {
	got := strings.Join(rankEnv([]string{"PATH=/bin"}, 1, 2, 29500, 16), " ")
	if want := "PATH=/bin RANK=1 WORLD_SIZE=2 LOCAL_RANK=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 GOMAXPROCS=8"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	got = strings.Join(rankEnv([]string{"GOMAXPROCS=3"}, 0, 4, 1, 2), " ")
	if want := "GOMAXPROCS=3 RANK=0 WORLD_SIZE=4 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=1"; got != want {
		t.Errorf("got %q, want %q (the user's GOMAXPROCS kept, at least 1)", got, want)
	}
}
