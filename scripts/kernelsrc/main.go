// Command kernelsrc prints the CUDA C that leangrad's CUDA backend compiles
// with NVRTC (cuda.Source): the Go-generated prelude, common.cuh and every
// src/*.cu, each file after a "// ---- name ----" line. Kernel harnesses
// that run on a GPU machine without Go (scripts/flash-bench.py) start from
// it.
package main

import (
	"fmt"

	"github.com/leangrad/leangrad/kernels/cuda"
)

func main() { fmt.Print(cuda.Source()) }
