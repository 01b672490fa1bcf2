package memory

import (
	"bufio"
	"encoding/binary"
	"io"
	"math"
)

// WriteSnapshot writes s as PyTorch's memory snapshots are written
// (torch.cuda.memory._snapshot, pickled): a dict with "segments" (each
// with its blocks, their states and the frames where they were allocated)
// and "device_traces" (one list of events for the device, oldest first).
// pytorch.org/memory_viz opens the file (drag and drop; nothing is
// uploaded), as does torch/cuda/_memory_viz.py. The pickle uses protocol 2
// and only the opcodes the viewer's own unpickler reads. Go call sites
// stand where PyTorch puts Python and C++ frames.
func WriteSnapshot(w io.Writer, s Snapshot) error {
	p := &pickler{w: bufio.NewWriter(w), memo: map[string]uint32{}}
	segments := make(plist, 0, len(s.Segments))
	for _, seg := range s.Segments {
		var allocated, requested int64
		blocks := make(plist, 0, len(seg.Blocks))
		for _, b := range seg.Blocks {
			state := "inactive"
			if b.Allocated {
				state = "active_allocated"
				allocated += b.Size
				requested += b.Requested
			}
			blocks = append(blocks, pdict{
				{"address", int64(b.Addr)}, {"size", b.Size}, {"requested_size", b.Requested},
				{"state", state}, {"frames", pframes(b.Frames)},
			})
		}
		kind := "large"
		if seg.Pool == Small {
			kind = "small"
		}
		segments = append(segments, pdict{
			{"device", int64(0)}, {"address", int64(seg.Addr)}, {"total_size", seg.Size},
			{"allocated_size", allocated}, {"active_size", allocated}, {"requested_size", requested},
			{"stream", int64(0)}, {"segment_type", kind}, {"segment_pool_id", ptuple{int64(0), int64(0)}},
			{"is_expandable", false}, {"frames", pframes(seg.Frames)}, {"blocks", blocks},
		})
	}
	trace := make(plist, 0, len(s.Trace))
	for _, e := range s.Trace {
		d := pdict{{"action", e.Action}, {"addr", int64(e.Addr)}, {"size", e.Size}, {"stream", int64(0)},
			{"time_us", e.Time.Microseconds()}, {"frames", pframes(e.Frames())}}
		if e.Action == "oom" {
			d = append(d, pkv{"device_free", e.Free})
		}
		trace = append(trace, d)
	}
	p.op(opProto, 2)
	p.value(pdict{
		{"segments", segments},
		{"device_traces", plist{trace}},
		{"allocator_settings", pdict{{"device", s.Device}, {"written_by", "leangrad"}}},
	})
	p.op(opStop)
	if p.err != nil {
		return p.err
	}
	return p.w.Flush()
}

func pframes(fs []Frame) plist {
	out := make(plist, len(fs))
	for i, f := range fs {
		out[i] = pdict{{"filename", f.File}, {"line", int64(f.Line)}, {"name", f.Function}}
	}
	return out
}

// The values a pickler writes: dicts keep their keys' order.
type (
	pdict []pkv
	pkv   struct {
		k string
		v any
	}
	plist  []any
	ptuple []any
)

// Pickle opcodes (Python's Lib/pickletools.py names them).
const (
	opProto      = 0x80
	opStop       = '.'
	opMark       = '('
	opEmptyDict  = '}'
	opSetItems   = 'u'
	opEmptyList  = ']'
	opAppends    = 'e'
	opBinUnicode = 'X'
	opBinInt     = 'J'
	opLong1      = 0x8a
	opNewTrue    = 0x88
	opNewFalse   = 0x89
	opNone       = 'N'
	opBinFloat   = 'G'
	opTuple      = 't'
	opBinPut     = 'q'
	opLongBinPut = 'r'
	opBinGet     = 'h'
	opLongBinGet = 'j'
)

// batch is how many items a MARK ... SETITEMS or APPENDS run holds, as
// Python's pickler batches them.
const batch = 1000

type pickler struct {
	w    *bufio.Writer
	err  error
	memo map[string]uint32 // strings written, by memo index: each is written once
}

func (p *pickler) op(b ...byte) {
	if p.err == nil {
		_, p.err = p.w.Write(b)
	}
}

func (p *pickler) u32(op byte, n uint32) {
	var b [5]byte
	b[0] = op
	binary.LittleEndian.PutUint32(b[1:], n)
	p.op(b[:]...)
}

func (p *pickler) value(v any) {
	switch v := v.(type) {
	case nil:
		p.op(opNone)
	case bool:
		if v {
			p.op(opNewTrue)
		} else {
			p.op(opNewFalse)
		}
	case int64:
		p.int(v)
	case float64:
		var b [9]byte
		b[0] = opBinFloat
		binary.BigEndian.PutUint64(b[1:], math.Float64bits(v))
		p.op(b[:]...)
	case string:
		p.string(v)
	case pdict:
		p.op(opEmptyDict)
		for i := 0; i < len(v); i += batch {
			p.op(opMark)
			for _, kv := range v[i:min(len(v), i+batch)] {
				p.string(kv.k)
				p.value(kv.v)
			}
			p.op(opSetItems)
		}
	case plist:
		p.op(opEmptyList)
		for i := 0; i < len(v); i += batch {
			p.op(opMark)
			for _, x := range v[i:min(len(v), i+batch)] {
				p.value(x)
			}
			p.op(opAppends)
		}
	case ptuple:
		p.op(opMark)
		for _, x := range v {
			p.value(x)
		}
		p.op(opTuple)
	default:
		panic("memory: cannot pickle a value of this type")
	}
}

func (p *pickler) int(v int64) {
	if v >= math.MinInt32 && v <= math.MaxInt32 {
		p.u32(opBinInt, uint32(int32(v)))
		return
	}
	// LONG1: little-endian two's complement, as few bytes as hold the sign.
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], uint64(v))
	n := 8
	for n > 1 && ((b[n-1] == 0 && b[n-2] < 0x80) || (b[n-1] == 0xff && b[n-2] >= 0x80)) {
		n--
	}
	p.op(append([]byte{opLong1, byte(n)}, b[:n]...)...)
}

func (p *pickler) string(s string) {
	if i, ok := p.memo[s]; ok {
		if i < 256 {
			p.op(opBinGet, byte(i))
		} else {
			p.u32(opLongBinGet, i)
		}
		return
	}
	p.u32(opBinUnicode, uint32(len(s)))
	if p.err == nil {
		_, p.err = p.w.WriteString(s)
	}
	i := uint32(len(p.memo))
	p.memo[s] = i
	if i < 256 {
		p.op(opBinPut, byte(i))
	} else {
		p.u32(opLongBinPut, i)
	}
}
