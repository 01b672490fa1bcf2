package memory

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// unpickle reads the opcodes WriteSnapshot uses, as PyTorch's memory
// viewer's unpickler does, into maps, slices, strings, int64s, float64s,
// bools and nils. It fails on any other opcode.
func unpickle(data []byte) (any, error) {
	var stack []any
	var marks []int
	memo := map[uint32]any{}
	pos := 0
	u32 := func() uint32 { v := binary.LittleEndian.Uint32(data[pos:]); pos += 4; return v }
	popMark := func() int { m := marks[len(marks)-1]; marks = marks[:len(marks)-1]; return m }
	for pos < len(data) {
		op := data[pos]
		pos++
		switch op {
		case opProto:
			if v := data[pos]; v < 2 || v > 4 {
				return nil, fmt.Errorf("protocol %d", v)
			}
			pos++
		case opStop:
			if len(stack) != 1 || len(marks) != 0 || pos != len(data) {
				return nil, fmt.Errorf("STOP with %d values, %d marks, %d bytes left", len(stack), len(marks), len(data)-pos)
			}
			return stack[0], nil
		case opMark:
			marks = append(marks, len(stack))
		case opEmptyDict:
			stack = append(stack, map[string]any{})
		case opEmptyList:
			stack = append(stack, &[]any{})
		case opSetItems:
			m := popMark()
			d := stack[m-1].(map[string]any)
			for i := m; i < len(stack); i += 2 {
				d[stack[i].(string)] = stack[i+1]
			}
			stack = stack[:m]
		case opAppends:
			m := popMark()
			l := stack[m-1].(*[]any)
			*l = append(*l, stack[m:]...)
			stack = stack[:m]
		case opTuple:
			m := popMark()
			t := append([]any(nil), stack[m:]...)
			stack = append(stack[:m], t)
		case opBinUnicode:
			n := int(u32())
			stack = append(stack, string(data[pos:pos+n]))
			pos += n
		case opBinInt:
			stack = append(stack, int64(int32(u32())))
		case opLong1:
			n := int(data[pos])
			pos++
			var b [8]byte
			copy(b[:], data[pos:pos+n])
			if data[pos+n-1] >= 0x80 {
				for i := n; i < 8; i++ {
					b[i] = 0xff
				}
			}
			pos += n
			stack = append(stack, int64(binary.LittleEndian.Uint64(b[:])))
		case opNewTrue, opNewFalse:
			stack = append(stack, op == opNewTrue)
		case opNone:
			stack = append(stack, nil)
		case opBinFloat:
			stack = append(stack, math.Float64frombits(binary.BigEndian.Uint64(data[pos:])))
			pos += 8
		case opBinPut:
			memo[uint32(data[pos])] = stack[len(stack)-1]
			pos++
		case opLongBinPut:
			memo[u32()] = stack[len(stack)-1]
		case opBinGet:
			stack = append(stack, memo[uint32(data[pos])])
			pos++
		case opLongBinGet:
			stack = append(stack, memo[u32()])
		default:
			return nil, fmt.Errorf("opcode %#x at %d: not one the viewer reads", op, pos-1)
		}
	}
	return nil, fmt.Errorf("no STOP")
}

func list(v any) []any { return *v.(*[]any) }

// A snapshot after some allocations, a free, an OOM and an EmptyCache holds
// the live segments with their blocks laid end to end, the events in order
// with Go frames naming this test, and reads back as PyTorch's format.
func TestSnapshotPickle(t *testing.T) {
	a := New(Limit(NewHeapSource(), 64<<20), Config{Device: "cpu"})
	a.RecordHistory(true)
	b1, _ := a.Alloc(3<<20, 0)  // large pool: a 20 MiB segment
	b2, _ := a.Alloc(1000, 0)   // small pool
	b3, _ := a.Alloc(25<<20, 0) // a segment of its own, cached once freed
	a.Free(b3)
	if _, err := a.Alloc(100<<20, 0); err == nil {
		t.Fatal("a 100 MiB allocation fit in 64 MiB")
	}
	b4, _ := a.Alloc(600<<10, 0)
	a.Free(b4)
	a.EmptyCache() // nothing to release: the OOM's retry released b3's segment, and b2 lives in b4's
	a.RecordHistory(false)

	var buf bytes.Buffer
	if err := WriteSnapshot(&buf, a.Snapshot()); err != nil {
		t.Fatal(err)
	}
	v, err := unpickle(buf.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	snap := v.(map[string]any)
	segs := list(snap["segments"])
	if len(segs) != 2 {
		t.Fatalf("%d segments, want 2 (one large, one small)", len(segs))
	}
	live := map[int64]int64{int64(b1.Addr()): b1.Requested(), int64(b2.Addr()): b2.Requested()}
	for _, s := range segs {
		seg := s.(map[string]any)
		addr, size := seg["address"].(int64), seg["total_size"].(int64)
		var sum, allocated int64
		for _, b := range list(seg["blocks"]) {
			blk := b.(map[string]any)
			if blk["address"].(int64) != addr+sum {
				t.Errorf("block at %#x, want %#x: blocks must lie end to end", blk["address"], addr+sum)
			}
			sum += blk["size"].(int64)
			if blk["state"] == "active_allocated" {
				allocated += blk["size"].(int64)
				if req, ok := live[blk["address"].(int64)]; !ok || req != blk["requested_size"].(int64) {
					t.Errorf("allocated block %v is not one of the live ones %v", blk, live)
				}
				fr := list(blk["frames"])
				if len(fr) == 0 || !strings.Contains(fr[0].(map[string]any)["name"].(string), "TestSnapshotPickle") {
					t.Errorf("block frames %v do not start at this test", fr)
				}
			}
		}
		if sum != size || allocated != seg["allocated_size"].(int64) {
			t.Errorf("segment of %d bytes: blocks add up to %d, allocated %d vs %d", size, sum, allocated, seg["allocated_size"])
		}
	}
	traces := list(snap["device_traces"])
	var actions []string
	for _, e := range list(traces[0]) {
		actions = append(actions, e.(map[string]any)["action"].(string))
	}
	want := "segment_alloc alloc segment_alloc alloc segment_alloc alloc free_completed segment_free oom alloc free_completed"
	if got := strings.Join(actions, " "); got != want {
		t.Errorf("trace:\n %s\nwant\n %s", got, want)
	}

	// Python's own pickle reads it, where Python is (CI installs it).
	py, err := exec.LookPath("python3")
	if err != nil {
		if os.Getenv("LEANGRAD_REQUIRE_PYTHON") != "" {
			t.Fatal("python3 not found, and LEANGRAD_REQUIRE_PYTHON is set")
		}
		t.Log("python3 not found: the snapshot was checked by the Go unpickler only")
		return
	}
	path := filepath.Join(t.TempDir(), "snap.pickle")
	os.WriteFile(path, buf.Bytes(), 0o644)
	out, err := exec.Command(py, "-c", `import pickle, sys
d = pickle.load(open(sys.argv[1], "rb"))
segs, trace = d["segments"], d["device_traces"][0]
assert all(sum(b["size"] for b in s["blocks"]) == s["total_size"] for s in segs)
print(len(segs), len(trace), trace[-1]["action"], max(s["address"] for s in segs) > 2**32)`, path).CombinedOutput()
	if err != nil || !strings.HasPrefix(string(out), "2 11 free_completed True") {
		t.Errorf("python3 pickle.load: %v\n%s", err, out)
	}
}
