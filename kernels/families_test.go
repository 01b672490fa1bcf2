package kernels

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"reflect"
	"testing"
)

// TestFamiliesHaveOneShape holds the kernel families to one shape: every
// Backend method but the device's own belongs to exactly one family; each
// family X has kernels/X.go (its interface), kernels/cpu/X.go and
// kernels/cuda/X.go (which define every method of the family),
// kernels/cuda/src/X.cu and kernels/kerneltest/X.go (its conformance
// cases, which kerneltest.Run checks cover every method).
func TestFamiliesHaveOneShape(t *testing.T) {
	device := map[string]bool{"Name": true, "Info": true, "Allocator": true, "Stream": true, "Synchronize": true}
	owner := map[string]string{}
	for _, f := range Families {
		methods := map[string]bool{}
		for i := range f.Ops.NumMethod() {
			m := f.Ops.Method(i).Name
			if o, ok := owner[m]; ok {
				t.Errorf("%s is in both the %s and the %s family", m, o, f.Name)
			}
			owner[m], methods[m] = f.Name, true
		}
		for _, path := range []string{f.Name + ".go", "cuda/src/" + f.Name + ".cu", "kerneltest/" + f.Name + ".go"} {
			if _, err := os.Stat(path); err != nil {
				t.Errorf("the %s family has no kernels/%s: %v", f.Name, path, err)
			}
		}
		for _, backend := range []string{"cpu", "cuda"} {
			path := backend + "/" + f.Name + ".go"
			defined, err := backendMethods(path)
			if err != nil {
				t.Errorf("the %s family: %v", f.Name, err)
				continue
			}
			for m := range methods {
				if !defined[m] {
					t.Errorf("kernels/%s does not define the %s family's %s", path, f.Name, m)
				}
			}
		}
	}
	b := reflect.TypeFor[Backend]()
	for i := range b.NumMethod() {
		if m := b.Method(i).Name; owner[m] == "" && !device[m] {
			t.Errorf("Backend.%s belongs to no family", m)
		}
	}
}

// backendMethods lists the exported methods a Go file defines on *Backend.
func backendMethods(path string) (map[string]bool, error) {
	f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.SkipObjectResolution)
	if err != nil {
		return nil, err
	}
	out := map[string]bool{}
	for _, d := range f.Decls {
		fn, ok := d.(*ast.FuncDecl)
		if !ok || fn.Recv == nil || !fn.Name.IsExported() {
			continue
		}
		if star, ok := fn.Recv.List[0].Type.(*ast.StarExpr); ok {
			if id, ok := star.X.(*ast.Ident); ok && id.Name == "Backend" {
				out[fn.Name.Name] = true
			}
		}
	}
	return out, nil
}
