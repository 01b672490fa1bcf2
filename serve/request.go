package serve

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/leangrad/leangrad/kernels"
)

// Request is a generation for an Engine to run.
type Request struct {
	Prompt    []int32 // tokens, at least one
	MaxTokens int     // the most tokens each sample generates
	// Temperature divides the logits (0: the most likely token each time);
	// TopK keeps the K most likely tokens (0: all); TopP then the most
	// likely whose probability reaches it (1 or 0: all). Seed chooses the
	// draws: the same request with the same seed generates the same tokens.
	Temperature float64
	TopK        int
	TopP        float64
	Seed        uint64
	// Stop ends a sample before the first of these strings its text would
	// contain (the string itself is not sent); IgnoreEOS lets a sample run
	// past the model's end-of-text token, to MaxTokens.
	Stop      []string
	IgnoreEOS bool
	// N is the samples of the prompt (0: 1), which share its keys and
	// values; TopLogprobs asks each token's most likely alternatives
	// (0 to kernels.MaxTopN) with their log-probabilities.
	N           int
	TopLogprobs int
}

// Finish reasons, as OpenAI's API names them.
const (
	FinishLength = "length" // MaxTokens generated, or the context full
	FinishStop   = "stop"   // a stop string, or the end-of-text token
)

// Event is what a generation sends on its channel: a token of one of its
// samples, or a sample's end (Finish set, or Err when it failed).
type Event struct {
	Index   int    // the sample
	Token   int32  // -1 on an end without a token
	Text    string // the text this token completes: "" while a character spans tokens
	Logprob float32
	Top     []TopLogprob // with Request.TopLogprobs
	Finish  string       // set on a sample's last event
	Err     error
}

// TopLogprob is one of a position's most likely tokens.
type TopLogprob struct {
	Token   int32
	Text    string
	Logprob float32
}

// RequestError is a request the engine refuses before it runs: what is
// wrong with it, naming the field.
type RequestError struct{ Msg string }

func (e *RequestError) Error() string { return e.Msg }

func badReq(format string, args ...any) error { return &RequestError{fmt.Sprintf(format, args...)} }

// ErrOverloaded is a request refused because a queue is full (an image
// server's, or a GPT engine's).
var ErrOverloaded = errors.New("the server is overloaded: its queue is full; try again")

// MaxN bounds Request.N.
const MaxN = 16

// check validates r for a model of context positions and vocab tokens whose
// memory holds blocks blocks of size positions, on an engine that runs
// maxSeqs sequences at once, and fills its defaults.
func (r *Request) check(context, vocab, blocks, size, maxSeqs int) error {
	if r.N == 0 {
		r.N = 1
	}
	if r.TopP == 0 {
		r.TopP = 1
	}
	switch {
	case len(r.Prompt) == 0:
		return badReq("prompt: empty: give the text to continue")
	case len(r.Prompt) >= context:
		return badReq("prompt: %d tokens, and the model's context is %d: leave room for one to generate", len(r.Prompt), context)
	case r.MaxTokens < 1 || r.MaxTokens > context-len(r.Prompt):
		return badReq("max_tokens: %d after a prompt of %d tokens: want 1 to %d (the context is %d)", r.MaxTokens, len(r.Prompt), context-len(r.Prompt), context)
	case !(r.Temperature >= 0) || math.IsInf(r.Temperature, 0):
		return badReq("temperature: %v: want 0 (the most likely token) or more", r.Temperature)
	case r.TopK < 0:
		return badReq("top_k: %d: want 0 (all) or more", r.TopK)
	case !(r.TopP > 0 && r.TopP <= 1):
		return badReq("top_p: %v: want more than 0, at most 1", r.TopP)
	case r.N < 1 || r.N > min(MaxN, maxSeqs):
		return badReq("n: %d: want 1 to %d", r.N, min(MaxN, maxSeqs))
	case r.TopLogprobs < 0 || r.TopLogprobs > kernels.MaxTopN:
		return badReq("logprobs: %d: want 0 to %d", r.TopLogprobs, kernels.MaxTopN)
	case len(r.Stop) > 4:
		return badReq("stop: %d strings: want at most 4", len(r.Stop))
	}
	for i, t := range r.Prompt {
		if t < 0 || int(t) >= vocab {
			return badReq("prompt: token %d at position %d is outside the vocabulary of %d", t, i, vocab)
		}
	}
	for i, s := range r.Stop {
		if s == "" || !utf8.ValidString(s) {
			return badReq("stop: string %d is empty or not UTF-8", i)
		}
	}
	if need := (len(r.Prompt) + r.MaxTokens + size - 1) / size * r.N; need > blocks-1 {
		return badReq("prompt and max_tokens: %d positions in %d samples need %d key-value blocks, and the server's memory has %d: ask for fewer", len(r.Prompt)+r.MaxTokens, r.N, need, blocks-1)
	}
	return nil
}

// sequence is one sample of a request as the engine runs it.
type sequence struct {
	ctx     context.Context
	req     *Request
	index   int
	out     chan<- Event
	tokens  []int32 // the prompt and what has been generated
	prompt  int     // len of the prompt in tokens (the request's)
	table   *BlockTable
	done    int // positions whose keys and values are in the memory
	arrived time.Time
	last    time.Time // the last token's, for inter-token latency
	text    textState
	forks   []*sequence // the request's other samples, forked from this one once its prompt is in
	order   uint64      // admission order: the newest is preempted first
}

// generated is the tokens the sequence has made.
func (s *sequence) generated() int { return len(s.tokens) - s.prompt }

// textState turns a sample's tokens into text as they come: a character
// split across tokens waits for the rest, and stop strings are held back
// until they can no longer begin in what was sent.
type textState struct {
	sent int    // bytes of text sent
	text []byte // the text of the generated tokens so far
}

// next takes a new token's text (its bytes: both tokenizers are byte
// level, so a sequence's text is its tokens' texts one after the other)
// and returns what can be sent, and whether a stop string ended the
// sample (what is returned then is the text before it). What was sent
// never ends with the beginning of a stop string, so a stop string begins
// after it.
func (t *textState) next(piece string, stop []string) (send string, stopped bool) {
	t.text = append(t.text, piece...)
	tail := string(t.text[t.sent:])
	first := -1
	for _, s := range stop {
		if i := strings.Index(tail, s); i >= 0 && (first < 0 || i < first) {
			first = i
		}
	}
	if first >= 0 {
		t.sent += first
		t.text = t.text[:t.sent] // nothing after the stop string is sent
		return tail[:first], true
	}
	hold := len(tail)
	for j := len(tail) - 1; j >= max(0, len(tail)-utf8.UTFMax); j-- { // a character still coming
		if utf8.RuneStart(tail[j]) {
			if !utf8.FullRuneInString(tail[j:]) {
				hold = j
			}
			break
		}
	}
	for _, s := range stop { // a stop string's beginning at the end: wait for the rest
		for k := min(len(s)-1, hold); k > 0; k-- {
			if strings.HasSuffix(tail[:hold], s[:k]) {
				hold -= k
				break
			}
		}
	}
	t.sent += hold
	return tail[:hold], false
}

// rest is the text held back, sent when the sample ends otherwise.
func (t *textState) rest() string {
	r := string(t.text[t.sent:])
	t.sent = len(t.text)
	return strings.ToValidUTF8(r, "\uFFFD")
}
