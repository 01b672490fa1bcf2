package tensor

import "sync"

// Scope collects the tensors created while it is open and releases them when
// it closes, except those taken out with Keep (or released before). Scopes
// nest; the innermost open one collects.
//
// The stack of open scopes is per process, not per goroutine: open and close
// scopes on the goroutine that runs the model, and create tensors on other
// goroutines only while no scope is open, or Keep them.
type Scope struct {
	parent  *Scope
	tensors []*Tensor
	closed  bool
}

var (
	scopeMu sync.Mutex
	current *Scope
)

// NewScope opens a scope; Close it (typically with defer).
func NewScope() *Scope {
	scopeMu.Lock()
	defer scopeMu.Unlock()
	s := &Scope{parent: current}
	current = s
	return s
}

// WithScope runs f in a new scope and closes it, even if f panics.
func WithScope(f func()) {
	s := NewScope()
	defer s.Close()
	f()
}

// Close releases the scope's tensors. Scopes must close innermost first.
func (s *Scope) Close() {
	scopeMu.Lock()
	if s.closed {
		scopeMu.Unlock()
		panic("tensor: scope closed twice")
	}
	if current != s {
		scopeMu.Unlock()
		panic("tensor: scope closed while an inner scope is still open")
	}
	current = s.parent
	s.closed = true
	ts := s.tensors
	s.tensors = nil
	for _, t := range ts {
		if t != nil {
			t.scope = nil
		}
	}
	scopeMu.Unlock()
	for _, t := range ts {
		if t != nil && !t.Released() {
			t.Release()
		}
	}
}

// Len is the number of tensors the scope will release.
func (s *Scope) Len() int {
	scopeMu.Lock()
	defer scopeMu.Unlock()
	n := 0
	for _, t := range s.tensors {
		if t != nil {
			n++
		}
	}
	return n
}

// Escape moves t from s to the scope around s (or out of every scope if s is
// the outermost), so that a function can return a result made in its own
// scope. It returns t.
func (s *Scope) Escape(t *Tensor) *Tensor {
	scopeMu.Lock()
	defer scopeMu.Unlock()
	if t.scope != s {
		panic("tensor: Escape of a tensor that is not in this scope")
	}
	s.tensors[t.scopeIdx] = nil
	t.scope = nil
	if p := s.parent; p != nil {
		t.scope, t.scopeIdx = p, len(p.tensors)
		p.tensors = append(p.tensors, t)
	}
	return t
}

// Keep takes t out of its scope: the caller now owns its reference and must
// Release it. It returns t.
func (t *Tensor) Keep() *Tensor {
	unregister(t)
	return t
}

func register(t *Tensor) {
	scopeMu.Lock()
	if s := current; s != nil {
		t.scope, t.scopeIdx = s, len(s.tensors)
		s.tensors = append(s.tensors, t)
	}
	scopeMu.Unlock()
}

func unregister(t *Tensor) {
	scopeMu.Lock()
	if s := t.scope; s != nil {
		s.tensors[t.scopeIdx] = nil
		t.scope = nil
	}
	scopeMu.Unlock()
}
