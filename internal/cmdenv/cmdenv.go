// Package cmdenv is where the commands read the environment. The library
// reads no environment variable of its own: every setting below reaches it
// as an option or an argument, set here by cmd/train and cmd/bench.
//
//	LEANGRAD_DATA   a folder holding one folder per dataset, searched
//	                before the system folders (datasets.Source.Roots)
//	LEANGRAD_CACHE  where NVRTC's compiled kernels are kept
//	                (kernels.Options.KernelCache)
//	LEANGRAD_DEBUG  1 records every tensor's creation site (tensor.SetDebug)
//	RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT,
//	TORCHELASTIC_USE_AGENT_STORE
//	                this process's place in a data-parallel job, as
//	                torchrun sets them (dist.ConfigFromEnv)
//
// The CUDA backend's library search still follows the loader's conventions
// (LD_LIBRARY_PATH through dlopen, then $CUDA_HOME, $CUDA_PATH and
// $VIRTUAL_ENV's wheels), as every CUDA program does: see Note [finding the
// CUDA libraries] in kernels/cuda.
package cmdenv

import (
	"os"

	"github.com/leangrad/leangrad/dist"
	"github.com/leangrad/leangrad/tensor"
)

// Setup applies the process-wide settings: LEANGRAD_DEBUG.
func Setup() {
	if v := os.Getenv("LEANGRAD_DEBUG"); v != "" && v != "0" {
		tensor.SetDebug(true)
	}
}

// DeviceOptions returns o with the kernel cache from LEANGRAD_CACHE.
func DeviceOptions(o tensor.Options) tensor.Options {
	if d := os.Getenv("LEANGRAD_CACHE"); d != "" {
		o.KernelCache = d
	}
	return o
}

// Job is this process's place in a data-parallel job; ok is false when
// WORLD_SIZE is unset.
func Job() (cfg dist.Config, ok bool, err error) { return dist.ConfigFromEnv(os.Getenv) }

// DataRoots lists the folders from LEANGRAD_DATA (none when it is unset).
func DataRoots() []string {
	if d := os.Getenv("LEANGRAD_DATA"); d != "" {
		return []string{d}
	}
	return nil
}
