//go:build !amd64 || purego

package sgemm

// archKernels is empty: without amd64 assembly (another architecture, or the
// purego build tag) the plain Go kernel is the only one.
func archKernels() []*microkernel { return nil }
