package memory

import (
	"reflect"
	"testing"
)

// TestTraceRolesAndPhases: the roles and phases the work gives land on its
// trace's buffers and events, the first role stands unless replaced, and
// only the tracing goroutine's calls, while it traces, count.
func TestTraceRolesAndPhases(t *testing.T) {
	a := New(NewHeapSource(), Config{Device: "test"})
	conv := Role{Category: Activation, Op: "conv2d"}
	before, _ := a.Alloc(1<<20, 0)
	a.SetRole(before, conv, false) // not tracing: ignored
	a.Phase("ignored")
	a.StartTrace()
	a.Phase("forward")
	x, _ := a.Alloc(1<<20, 0)   // 0: saved
	tmp, _ := a.Alloc(2<<20, 0) // 1: a temporary
	a.SetRole(x, conv, false)
	a.SetRole(x, Role{Category: Gradient}, false) // the first stands
	a.Free(tmp)
	a.Phase("backward of conv2d")
	g, _ := a.Alloc(3<<20, 0) // 2: the peak: x and g
	a.SetRole(g, Role{Category: Gradient, Op: "relu"}, false)
	a.SetRole(g, Role{Category: ParameterGradient}, true) // replaced
	done := make(chan struct{})
	go func() { // another goroutine's calls are not the trace's
		defer close(done)
		a.SetRole(g, conv, true)
		a.Phase("elsewhere")
	}()
	<-done
	a.Free(x)
	a.Free(g)
	ws, _, _ := a.AllocWorkspace([]WorkspaceOption{{Size: 1 << 10, Time: 1}}, 0, 0) // 3
	a.Free(ws)
	tr, err := a.StopTrace()
	if err != nil {
		t.Fatal(err)
	}
	a.SetRole(before, conv, false) // after the trace: ignored
	a.Free(before)
	roles := make([]Role, len(tr.Buffers))
	for i, b := range tr.Buffers {
		roles[i] = b.Role
	}
	want := []Role{conv, {}, {Category: ParameterGradient}, {Category: Workspace}}
	if !reflect.DeepEqual(roles, want) {
		t.Errorf("roles %v, want %v", roles, want)
	}
	if want := []TracePhase{{0, "forward"}, {3, "backward of conv2d"}}; !reflect.DeepEqual(tr.Phases, want) {
		t.Errorf("phases %v, want %v", tr.Phases, want)
	}
	ev, live := tr.Peak(nil)
	if live != 4<<20 || ev != 3 {
		t.Errorf("peak %d bytes at event %d, want %d at 3", live, ev, 4<<20)
	}
	if got := tr.LiveAt(ev); !reflect.DeepEqual(got, []int{0, 2}) {
		t.Errorf("live at the peak: %v, want [0 2]", got)
	}
	for e, want := range map[int]string{0: "forward", 2: "forward", 3: "backward of conv2d", 9: "backward of conv2d"} {
		if got := tr.PhaseAt(e); got != want {
			t.Errorf("PhaseAt(%d) = %q, want %q", e, got, want)
		}
	}
	if got := (&Trace{}).PhaseAt(0); got != "" {
		t.Errorf("PhaseAt of a trace without phases: %q", got)
	}
}
