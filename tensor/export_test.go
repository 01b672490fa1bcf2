package tensor

import (
	"github.com/leangrad/leangrad/kernels"
	"github.com/leangrad/leangrad/kernels/cpu"
	"github.com/leangrad/leangrad/memory"
)

func cpuBackend(a *memory.Allocator) kernels.Backend { return cpu.NewWithAllocator(a) }
