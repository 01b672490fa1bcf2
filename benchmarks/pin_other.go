//go:build !linux

package benchmarks

// onCPUs pins nothing off Linux: it reports false, having run nothing.
func onCPUs(max int, f func(cpu int)) bool { return false }
