package serve

import (
	"strings"
	"testing"
)

// TestTextStreamsWhatIsSure: text goes out as it comes, but for a
// character still arriving and the beginning of a stop string, which wait;
// a stop string ends the sample with the text before it; bytes that are
// not UTF-8 in the middle do not stop the stream.
func TestTextStreamsWhatIsSure(t *testing.T) {
	for _, c := range []struct {
		name   string
		pieces []string // the text after each token
		stop   []string
		sent   []string
		halt   int // the piece that stops (-1: none)
		rest   string
	}{
		{"plain", []string{"He", "Hello", "Hello wor", "Hello world"}, nil, []string{"He", "llo", " wor", "ld"}, -1, ""},
		{"a character in two tokens", []string{"caf", "caf\xc3", "caf\xc3\xa9"}, nil, []string{"caf", "", "\xc3\xa9"}, -1, ""},
		{"a stop string", []string{"one", "one two", "one two\n\nthree"}, []string{"\n\n"}, []string{"one", " two", ""}, 2, ""},
		{"a stop string's beginning waits", []string{"a#", "a#b", "a#b#", "a#b##"}, []string{"##"}, []string{"a", "#b", "", ""}, 3, ""},
		{"held at the end", []string{"x#"}, []string{"##"}, []string{"x"}, -1, "#"},
		{"bytes that are not UTF-8", []string{"a\xff", "a\xffb", "a\xffbc"}, nil, []string{"a\xff", "b", "c"}, -1, ""},
	} {
		var ts textState
		halted := -1
		for i, p := range c.pieces {
			prev := ""
			if i > 0 {
				prev = c.pieces[i-1]
			}
			got, stopped := ts.next(p[len(prev):], c.stop)
			if got != c.sent[i] {
				t.Errorf("%s: piece %d sent %q, want %q", c.name, i, got, c.sent[i])
			}
			if stopped {
				halted = i
				break
			}
		}
		if halted != c.halt {
			t.Errorf("%s: stopped at piece %d, want %d", c.name, halted, c.halt)
		}
		if halted < 0 {
			if r := ts.rest(); r != strings.ToValidUTF8(c.rest, "\uFFFD") {
				t.Errorf("%s: rest %q, want %q", c.name, r, c.rest)
			}
		}
	}
}
