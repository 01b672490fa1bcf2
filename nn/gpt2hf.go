package nn

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"unsafe"

	"github.com/leangrad/leangrad/tensor"
	"github.com/x448/float16"
)

// GPT-2 weights in Hugging Face's layout: the names of transformers'
// GPT2LMHeadModel (transformer.h.0.attn.c_attn.weight, ...; files saved
// from GPT2Model have them without "transformer."), the four projections
// of each block stored as Conv1D's in×out (the transpose of Linear's
// out×in), the output projection tied to transformer.wte.weight. A user
// with GPT-2's model.safetensors can load it with LoadGPT2 and fine-tune
// it; SaveGPT2 writes a file Hugging Face loads.

// gptMetaKey holds the configuration in a file's metadata (JSON).
const gptMetaKey = "leangrad.gpt"

// conv1D reports whether a GPT state name is a Conv1D weight, stored
// transposed in Hugging Face's files.
func conv1D(name string) bool {
	for _, s := range []string{".attn.c_attn.weight", ".attn.c_proj.weight", ".mlp.c_fc.weight", ".mlp.c_proj.weight"} {
		if strings.HasSuffix(name, s) {
			return true
		}
	}
	return false
}

// SaveGPT2 writes g's parameters to path in Hugging Face GPT-2's layout
// (F32), its configuration in the metadata, atomically.
func SaveGPT2(path string, g *GPT) error {
	st := &Safetensors{Tensors: map[string]Stored{}, Metadata: map[string]string{"format": "pt"}}
	meta, err := json.Marshal(g.Cfg)
	if err != nil {
		return err
	}
	st.Metadata[gptMetaKey] = string(meta)
	for _, n := range g.State("") {
		shape, data := n.T.Shape(), n.T.Float32s()
		if conv1D(n.Name) {
			data = transposed(data, shape[0], shape[1])
			shape = []int{shape[1], shape[0]}
		}
		st.Tensors[n.Name] = Stored{DType: tensor.F32, Shape: shape, Data: f32Bytes(data)}
	}
	return WriteSafetensors(path, st)
}

var layerName = regexp.MustCompile(`^h\.(\d+)\.`)

// LoadGPT2 builds a GPT on dev from a safetensors file in Hugging Face
// GPT-2's layout (F32, F16 or BF16 values, converted to F32). The
// configuration comes from the file's metadata when SaveGPT2 wrote it, and
// otherwise from the tensors' shapes, with GPT-2's 64 values per head.
// The attention masks some files carry (h.N.attn.bias, masked_bias) and a
// separate lm_head.weight (tied to the embeddings) are ignored; any other
// tensor the model lacks, or any it has and the file does not, is an
// error naming it.
func LoadGPT2(path string, dev *tensor.Device) (*GPT, error) {
	st, err := ReadSafetensors(path)
	if err != nil {
		return nil, err
	}
	ts := map[string]Stored{}
	layers := 0
	for name, s := range st.Tensors {
		name = strings.TrimPrefix(name, "transformer.")
		if strings.HasSuffix(name, ".attn.bias") || strings.HasSuffix(name, ".attn.masked_bias") || name == "lm_head.weight" {
			continue
		}
		if m := layerName.FindStringSubmatch(name); m != nil {
			l, _ := strconv.Atoi(m[1])
			layers = max(layers, l+1)
		}
		ts["transformer."+name] = s
	}
	wte, ok1 := ts["transformer.wte.weight"]
	wpe, ok2 := ts["transformer.wpe.weight"]
	if !ok1 || !ok2 || len(wte.Shape) != 2 || len(wpe.Shape) != 2 {
		return nil, fmt.Errorf("%s: not a GPT-2 file: no 2-D wte.weight and wpe.weight", path)
	}
	cfg := GPTConfig{Layers: layers, Width: wte.Shape[1], Vocab: wte.Shape[0], Context: wpe.Shape[0]}
	if raw, ok := st.Metadata[gptMetaKey]; ok {
		if err := json.Unmarshal([]byte(raw), &cfg); err != nil {
			return nil, fmt.Errorf("%s: %s metadata: %v", path, gptMetaKey, err)
		}
	} else {
		if cfg.Width%64 != 0 {
			return nil, fmt.Errorf("%s: width %d is not a multiple of GPT-2's 64 values per head, and the file does not say how many heads", path, cfg.Width)
		}
		cfg.Heads = cfg.Width / 64
	}
	g, err := NewGPT(dev, cfg)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	ok := false
	defer func() {
		if !ok {
			Release(g)
		}
	}()
	state := stateMap(g.State(""))
	for name := range ts {
		if _, in := state[name]; !in {
			return nil, fmt.Errorf("%s: tensor %q is not part of a GPT of %v", path, name, cfg)
		}
	}
	for _, name := range sortedNames(state) {
		n := state[name]
		s, in := ts[name]
		if !in {
			return nil, fmt.Errorf("%s: no tensor %q (a GPT of %v has %d)", path, name, cfg, len(state))
		}
		want := n.T.Shape()
		if conv1D(name) {
			want = []int{want[1], want[0]}
		}
		if !slices.Equal(s.Shape, want) {
			return nil, fmt.Errorf("%s: tensor %q is %v, a GPT of %v has %v there", path, name, s.Shape, cfg, want)
		}
		vals, err := float32sOf(s)
		if err != nil {
			return nil, fmt.Errorf("%s: tensor %q: %v", path, name, err)
		}
		if conv1D(name) {
			vals = transposed(vals, s.Shape[0], s.Shape[1])
		}
		n.T.Backend().Write(n.T.Buf(), f32Bytes(vals))
	}
	ok = true
	return g, nil
}

// float32sOf converts a stored tensor's values to float32.
func float32sOf(s Stored) ([]float32, error) {
	n := len(s.Data) / s.DType.Size()
	out := make([]float32, n)
	for i := range out {
		switch s.DType {
		case tensor.F32:
			out[i] = math.Float32frombits(binary.LittleEndian.Uint32(s.Data[4*i:]))
		case tensor.F16:
			out[i] = float16.Frombits(binary.LittleEndian.Uint16(s.Data[2*i:])).Float32()
		case tensor.BF16:
			out[i] = math.Float32frombits(uint32(binary.LittleEndian.Uint16(s.Data[2*i:])) << 16)
		default:
			return nil, fmt.Errorf("%v values: want f32, f16 or bf16", s.DType)
		}
	}
	return out, nil
}

// transposed is the r×c row-major array v transposed (c×r).
func transposed(v []float32, r, c int) []float32 {
	out := make([]float32, len(v))
	for i := 0; i < r; i++ {
		for j := 0; j < c; j++ {
			out[j*r+i] = v[i*c+j]
		}
	}
	return out
}

func f32Bytes(v []float32) []byte {
	if len(v) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&v[0])), 4*len(v))
}
