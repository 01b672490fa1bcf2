package cuda

import (
	"embed"
	"fmt"
	"io/fs"
	"reflect"
	"sort"
	"strings"

	"github.com/leangrad/leangrad/kernels"
)

// The kernels' CUDA C: a prelude generated from Go (what the two sides
// share: constants, the float storage types, the reduction codes, the
// structs kernels take by value), common.cuh, the elementwise ops'
// switches generated from package kernels' tables, then every src/*.cu in
// name order, compiled together by NVRTC as one module: a new file of
// kernels needs no list to join.

//go:embed src/*.cu src/*.cuh
var sources embed.FS

// cStructs are the structs kernels take by value, by their C names.
var cStructs = []struct {
	name string
	t    reflect.Type
}{
	{"Bcast", reflect.TypeFor[bcast]()},
	{"Pool", reflect.TypeFor[poolArgs]()},
	{"TensorList", reflect.TypeFor[tensorList]()},
	{"X3Gemm", reflect.TypeFor[x3Gemm]()},
}

// cTypeNames are the C storage type of each float dtype (common.cuh
// defines them and their loads and stores).
var cTypeNames = map[kernels.DType]string{kernels.F32: "float", kernels.F16: "f16", kernels.BF16: "bf16"}

// Source returns the CUDA C source of every kernel: the generated prelude
// and the hand-written files.
func Source() string {
	var b strings.Builder
	file := func(name string) {
		data, err := sources.ReadFile("src/" + name)
		if err != nil {
			panic(err) // embedded: cannot happen
		}
		fmt.Fprintf(&b, "// ---- %s ----\n", name)
		b.Write(data)
		b.WriteString("\n")
	}
	b.WriteString(prelude())
	file("common.cuh")
	b.WriteString(elementwisePrelude())
	names, err := fs.Glob(sources, "src/*.cu")
	if err != nil {
		panic(err) // a constant pattern
	}
	sort.Strings(names)
	for _, name := range names {
		file(strings.TrimPrefix(name, "src/"))
	}
	return b.String()
}

// prelude is the CUDA C generated from Go.
func prelude() string {
	var b strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	w("// ---- generated from Go by package cuda's Source: edit the Go side ----\n")
	w("#define THREADS %d\n#define MT_MAX %d\n#define MAX_DIMS %d\n", blockSize, mtMax, kernels.MaxDims)
	w("#define MAX_TOPN %d\n#define SAMPLE_ROUNDS %d\n", kernels.MaxTopN, kernels.SampleRounds)
	w("#define QUANT8_BLOCK %d\n", kernels.Quant8Block)
	w("#define FLASH_D %d\n#define FLASH_TILE %d\n#define FLASH_WG %d\n#define FLASH_FWD_WG %d\n#define F32_LD %d\n", flashD, flashTile,
		flashWarpgroups, flashFwdWarpgroups, flash32LD)
	w("#define LN_WARPS %d\n#define LN_BLOCKS %d\n#define LN_REG_COLS %d\n", lnWarps, lnBlocksPerSM, lnRegCols)
	w("#define X3_TILE %d\n#define X3_BK %d\n#define X3_STAGES %d\n#define X3_THREADS %d\n#define X3_GROUP %d\n", x3Tile, x3BK, x3Stages,
		x3Threads, x3Group)
	w("typedef unsigned short f16;\nstruct bf16 { unsigned short x; };\ntypedef long long i64;\n")
	w("#define FOR_TYPES(M)")
	for _, dt := range floatTypes {
		w(" M(%s, %s)", cTypeNames[dt], dt)
	}
	w("\n")
	w("enum {")
	for i, op := range kernels.Reductions() {
		if i > 0 {
			w(",")
		}
		w(" R_%s = %d", strings.ToUpper(op.String()), op)
	}
	w(" };\n")
	for _, s := range cStructs {
		w("struct %s {\n", s.name)
		for i := range s.t.NumField() {
			f := s.t.Field(i)
			w("    %s;\n", cField(s.name, f))
		}
		w("};\n")
	}
	return b.String()
}

// elementwisePrelude is the elementwise ops' switches, which need
// common.cuh's device functions: it is generated after common.cuh.
func elementwisePrelude() string {
	var b strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	w("// ---- generated from package kernels' op tables ----\n")
	w("__device__ __forceinline__ float unary_f(int op, float x) {\n    switch (op) {\n")
	for _, op := range kernels.UnaryOps() {
		w("    case %d: return %s; // %s\n", op, op.Def().CUDA, op)
	}
	w("    }\n    return __int_as_float(0x7fc00000);\n}\n")
	w("// dy·op'(·) from the forward input x or output y.\n")
	w("__device__ __forceinline__ float unary_grad(int op, float dy, float x, float y) {\n    switch (op) {\n")
	for _, op := range kernels.UnaryOps() {
		w("    case %d: return %s; // %s\n", op, op.Def().CUDAGrad, op)
	}
	w("    }\n    return __int_as_float(0x7fc00000);\n}\n")
	w("__device__ __forceinline__ float binary_f(int op, float a, float b) {\n    switch (op) {\n")
	for _, op := range kernels.BinaryOps() {
		w("    case %d: return %s; // %s\n", op, op.Def().CUDA, op)
	}
	w("    }\n    return __int_as_float(0x7fc00000);\n}\n")
	return b.String()
}

// cField is the C declaration of a Go field of a by-value struct: its
// scalar type (a uintptr field names its pointer type in its tag c) and
// its array dimensions.
func cField(structName string, f reflect.StructField) string {
	t, dims := f.Type, ""
	for t.Kind() == reflect.Array {
		dims += fmt.Sprintf("[%d]", t.Len())
		t = t.Elem()
	}
	var ct string
	switch t.Kind() {
	case reflect.Int32:
		ct = "int"
	case reflect.Uint32:
		ct = "unsigned"
	case reflect.Int64:
		ct = "long long"
	case reflect.Uint64:
		ct = "unsigned long long"
	case reflect.Float32:
		ct = "float"
	case reflect.Uintptr:
		ct = f.Tag.Get("c")
	}
	if ct == "" {
		panic(fmt.Sprintf("cuda: struct %s field %s of type %v has no C type (a uintptr field names its pointer type in a c tag)", structName, f.Name, f.Type))
	}
	return ct + " " + f.Name + dims
}
