package tensor

import "sync"

// Scope collects the tensors created on its device handle while it is open
// and releases them when it closes, except those taken out with Keep (or
// released before). Scopes nest; the innermost open one of a handle
// collects. Each handle (a Device, or one of its Sessions) has its own
// stack of scopes: open and close them on the goroutine that uses the handle.
type Scope struct {
	dev     *Device
	parent  *Scope
	tensors []*Tensor
	closed  bool
}

// scopeMu guards every scope's tensor list and every tensor's scope link:
// Keep and Release may run on another goroutine than the scope's.
var scopeMu sync.Mutex

// NewScope opens a scope on d; Close it (typically with defer).
func (d *Device) NewScope() *Scope {
	scopeMu.Lock()
	defer scopeMu.Unlock()
	s := &Scope{dev: d, parent: d.scope}
	d.scope = s
	return s
}

// WithScope runs f in a new scope on d and closes it, even if f panics.
func (d *Device) WithScope(f func()) {
	s := d.NewScope()
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
	if s.dev.scope != s {
		scopeMu.Unlock()
		panic("tensor: scope closed while an inner scope is still open (scopes close innermost first; two goroutines that use one device handle interleave theirs: give each goroutine its own dev.Session())")
	}
	s.dev.scope = s.parent
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
	if s := t.dev.scope; s != nil {
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
