package nn

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"hash/crc32"
	"io"
	"math"
	"slices"
	"sort"
	"syscall"

	"github.com/leangrad/leangrad/fileio"
	"github.com/leangrad/leangrad/tensor"
)

// The safetensors format (huggingface/safetensors): an 8-byte little-endian
// header length N, N bytes of JSON mapping each tensor name to its dtype,
// shape and [begin, end) byte offsets into the data that follows, plus an
// optional "__metadata__" object of strings, then the data. Files written
// here are read by Python's safetensors library, and the reverse.

// Stored is one tensor of a safetensors file, on the host.
type Stored struct {
	DType tensor.DType
	Shape []int
	Data  []byte // little-endian elements
}

// Safetensors is the content of a safetensors file.
type Safetensors struct {
	Tensors  map[string]Stored
	Metadata map[string]string
	// Verified says that the file carried checksums (files Encode wrote
	// do; others, Hugging Face's among them, do not) and that every
	// tensor and metadata entry matched its own.
	Verified bool
}

// ChecksumKey is the metadata entry where Encode records the CRC-32C
// (Castagnoli) of every tensor's bytes and of every other metadata entry,
// as JSON {"tensors": {name: "8 hex digits"}, "metadata": {...}}, and
// which ParseSafetensors checks. CRC-32C finds every burst error up to 32
// bits and all but one in 2^32 others, at memory speed.
const ChecksumKey = "leangrad.crc32c"

type checksums struct {
	Tensors  map[string]string `json:"tensors"`
	Metadata map[string]string `json:"metadata"`
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

func crcHex(b []byte) string { return fmt.Sprintf("%08x", crc32.Checksum(b, castagnoli)) }

// verify checks st against the checksums in its metadata, if any.
func (st *Safetensors) verify() error {
	raw, ok := st.Metadata[ChecksumKey]
	if !ok {
		return nil
	}
	delete(st.Metadata, ChecksumKey)
	var sums checksums
	if err := json.Unmarshal([]byte(raw), &sums); err != nil {
		return fmt.Errorf("metadata %s is not checksums: %v", ChecksumKey, err)
	}
	for _, name := range sortedKeys(st.Tensors) {
		want, ok := sums.Tensors[name]
		if !ok {
			return fmt.Errorf("tensor %q has no checksum: the header was changed after the file was written", name)
		}
		if got := crcHex(st.Tensors[name].Data); got != want {
			return fmt.Errorf("tensor %q is corrupted: its bytes' CRC-32C is %s, the file recorded %s", name, got, want)
		}
	}
	for _, name := range sortedKeys(st.Metadata) {
		if got := crcHex([]byte(st.Metadata[name])); got != sums.Metadata[name] {
			return fmt.Errorf("metadata %q is corrupted: its CRC-32C is %s, the file recorded %q", name, got, sums.Metadata[name])
		}
	}
	if len(sums.Tensors) != len(st.Tensors) || len(sums.Metadata) != len(st.Metadata) {
		return fmt.Errorf("the file recorded checksums of %d tensors and %d metadata entries, and holds %d and %d: the header was changed after the file was written",
			len(sums.Tensors), len(sums.Metadata), len(st.Tensors), len(st.Metadata))
	}
	st.Verified = true
	return nil
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

const maxHeader = 100 << 20

var dtypeNames = map[tensor.DType]string{tensor.F32: "F32", tensor.F16: "F16", tensor.BF16: "BF16", tensor.I32: "I32", tensor.U8: "U8"}

func dtypeByName(s string) (tensor.DType, bool) {
	for dt, name := range dtypeNames {
		if name == s {
			return dt, true
		}
	}
	return 0, false
}

type headerEntry struct {
	DType   string  `json:"dtype"`
	Shape   []int   `json:"shape"`
	Offsets []int64 `json:"data_offsets"`
}

// ParseSafetensors decodes a safetensors file's bytes, checking every entry
// of the header against the data: known dtype, non-negative shape, offsets
// inside the data, sizes that match the shapes, no overlaps.
func ParseSafetensors(data []byte) (*Safetensors, error) {
	if len(data) < 8 {
		return nil, fmt.Errorf("%d bytes: too short for a safetensors header", len(data))
	}
	n := binary.LittleEndian.Uint64(data[:8])
	if n > maxHeader || n > uint64(len(data)-8) {
		return nil, fmt.Errorf("header length %d does not fit in the %d-byte file", n, len(data))
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(data[8:8+n], &raw); err != nil {
		return nil, fmt.Errorf("header is not a JSON object: %v", err)
	}
	body := data[8+n:]
	st := &Safetensors{Tensors: map[string]Stored{}, Metadata: map[string]string{}}
	type span struct {
		begin, end int64
		name       string
	}
	var spans []span
	for name, msg := range raw {
		if name == "__metadata__" {
			if err := json.Unmarshal(msg, &st.Metadata); err != nil {
				return nil, fmt.Errorf("__metadata__ is not an object of strings: %v", err)
			}
			continue
		}
		var e headerEntry
		if err := json.Unmarshal(msg, &e); err != nil {
			return nil, fmt.Errorf("tensor %q: %v", name, err)
		}
		dt, ok := dtypeByName(e.DType)
		if !ok {
			return nil, fmt.Errorf("tensor %q: dtype %q is not supported (want F32, F16, BF16, I32 or U8)", name, e.DType)
		}
		elems := int64(1)
		for _, d := range e.Shape {
			if d < 0 || (d > 0 && elems > math.MaxInt64/int64(d)/8) {
				return nil, fmt.Errorf("tensor %q: invalid shape %v", name, e.Shape)
			}
			elems *= int64(d)
		}
		if len(e.Offsets) != 2 || e.Offsets[0] < 0 || e.Offsets[1] < e.Offsets[0] || e.Offsets[1] > int64(len(body)) {
			return nil, fmt.Errorf("tensor %q: data offsets %v outside the %d bytes of data", name, e.Offsets, len(body))
		}
		if size := e.Offsets[1] - e.Offsets[0]; size != elems*int64(dt.Size()) {
			return nil, fmt.Errorf("tensor %q: %d bytes of data for a %s tensor of shape %v (%d bytes)",
				name, size, e.DType, e.Shape, elems*int64(dt.Size()))
		}
		spans = append(spans, span{e.Offsets[0], e.Offsets[1], name})
		st.Tensors[name] = Stored{DType: dt, Shape: e.Shape, Data: body[e.Offsets[0]:e.Offsets[1]:e.Offsets[1]]}
	}
	sort.Slice(spans, func(i, j int) bool { return spans[i].begin < spans[j].begin })
	for i := 1; i < len(spans); i++ {
		if spans[i].begin < spans[i-1].end {
			return nil, fmt.Errorf("tensors %q and %q overlap in the data", spans[i-1].name, spans[i].name)
		}
	}
	if err := st.verify(); err != nil {
		return nil, err
	}
	return st, nil
}

// ReadSafetensors reads and checks a safetensors file; errors name it.
func ReadSafetensors(path string) (*Safetensors, error) {
	data, err := fileio.ReadFile(path, fileio.NoLimit)
	if err != nil {
		return nil, err
	}
	st, err := ParseSafetensors(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return st, nil
}

// MapSafetensors memory-maps a safetensors file and checks it (its
// checksums too, reading it once): the tensors' Data are slices of the
// mapping, read-only, valid until close is called. Copying them to a
// device one at a time keeps the program's own memory near one tensor, not
// the file: the mapped pages belong to the page cache.
func MapSafetensors(path string) (st *Safetensors, close func() error, err error) {
	f, err := fileio.Open(path)
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil {
		return nil, nil, err
	}
	if info.Size() == 0 || !info.Mode().IsRegular() {
		return nil, nil, fmt.Errorf("%s: not a safetensors file (%d bytes)", path, info.Size())
	}
	data, err := syscall.Mmap(int(f.Fd()), 0, int(info.Size()), syscall.PROT_READ, syscall.MAP_SHARED)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: mapping it: %w", path, err)
	}
	unmap := func() error { return syscall.Munmap(data) }
	st, err = ParseSafetensors(data)
	if err != nil {
		unmap()
		return nil, nil, fmt.Errorf("%s: %w", path, err)
	}
	return st, unmap, nil
}

// Encode writes st in the safetensors format, tensors in name order, with
// the checksums of its tensors and metadata (ChecksumKey).
func (st *Safetensors) Encode(w io.Writer) error {
	names := sortedKeys(st.Tensors)
	sums := checksums{Tensors: map[string]string{}, Metadata: map[string]string{}}
	meta := map[string]string{}
	for k, v := range st.Metadata {
		if k != ChecksumKey {
			meta[k] = v
			sums.Metadata[k] = crcHex([]byte(v))
		}
	}
	for _, k := range names {
		sums.Tensors[k] = crcHex(st.Tensors[k].Data)
	}
	sj, err := json.Marshal(sums)
	if err != nil {
		return err
	}
	meta[ChecksumKey] = string(sj)
	header := map[string]any{"__metadata__": meta}
	var off int64
	for _, k := range names {
		t := st.Tensors[k]
		shape := t.Shape
		if shape == nil {
			shape = []int{}
		}
		name, ok := dtypeNames[t.DType]
		if !ok {
			panic(fmt.Sprintf("nn: tensor %q of dtype %v has no safetensors name", k, t.DType))
		}
		header[k] = headerEntry{DType: name, Shape: shape, Offsets: []int64{off, off + int64(len(t.Data))}}
		off += int64(len(t.Data))
	}
	hj, err := json.Marshal(header)
	if err != nil {
		return err
	}
	for len(hj)%8 != 0 { // the data starts 8-byte aligned
		hj = append(hj, ' ')
	}
	var n [8]byte
	binary.LittleEndian.PutUint64(n[:], uint64(len(hj)))
	if _, err := w.Write(n[:]); err != nil {
		return err
	}
	if _, err := w.Write(hj); err != nil {
		return err
	}
	for _, k := range names {
		if _, err := w.Write(st.Tensors[k].Data); err != nil {
			return err
		}
	}
	return nil
}

// WriteSafetensors writes st to path atomically.
func WriteSafetensors(path string, st *Safetensors) error {
	return fileio.Write(path, st.Encode)
}

// StateDict copies a module's state to the host.
func StateDict(m Module) *Safetensors {
	st := &Safetensors{Tensors: map[string]Stored{}, Metadata: map[string]string{}}
	for _, n := range m.State("") {
		st.Tensors[n.Name] = Stored{DType: n.T.DType(), Shape: n.T.Shape(), Data: n.T.Raw()}
	}
	return st
}

// LoadStateDict copies st's tensors into m's state. Every tensor of m must be
// present with the same shape and dtype; extra tensors in st are an error
// too, so that a mismatched file is never half-loaded silently. source names
// st in errors.
func LoadStateDict(m Module, st *Safetensors, source string) error {
	state := stateMap(m.State(""))
	for _, name := range sortedNames(state) {
		n := state[name]
		s, ok := st.Tensors[name]
		if !ok {
			return fmt.Errorf("%s: no tensor %q (the model has %d state tensors)", source, name, len(state))
		}
		if s.DType != n.T.DType() || !slices.Equal(s.Shape, n.T.Shape()) {
			return fmt.Errorf("%s: tensor %q is %v %v, the model's is %v %v", source, name, s.DType, s.Shape, n.T.DType(), n.T.Shape())
		}
	}
	for name := range st.Tensors {
		if _, ok := state[name]; !ok {
			return fmt.Errorf("%s: tensor %q is not part of the model", source, name)
		}
	}
	for name, n := range state {
		n.T.Backend().Write(n.T.Buf(), st.Tensors[name].Data)
	}
	return nil
}

// Save writes m's state to path in the safetensors format, atomically.
func Save(m Module, path string) error { return WriteSafetensors(path, StateDict(m)) }

// Load reads m's state from a safetensors file written by Save (or by
// Python's safetensors with the same names and shapes).
func Load(m Module, path string) error {
	st, err := ReadSafetensors(path)
	if err != nil {
		return err
	}
	return LoadStateDict(m, st, path)
}
