package memory

import "fmt"

// Bytes is a byte count: the one formatter of sizes in leangrad. Its String
// writes it the way PyTorch's messages do, in the largest binary unit under
// 1024 with two decimals ("20.00 MiB", "512 B"); MiB gives the number that
// tables, plots and JSON carry.
//
// memory_summary's cells are the one other layout of a size (Allocator.Summary
// writes whole units chosen by the row's total, as PyTorch's table does) and
// stay private to it.
type Bytes int64

// String writes n as "20.00 MiB".
func (n Bytes) String() string {
	units := []string{"B", "KiB", "MiB", "GiB", "TiB"}
	f := float64(n)
	i := 0
	for i < len(units)-1 && (f >= 1024 || f <= -1024) {
		f /= 1024
		i++
	}
	if i == 0 {
		return fmt.Sprintf("%d B", int64(n))
	}
	return fmt.Sprintf("%.2f %s", f, units[i])
}

// MiB is n in mebibytes.
func (n Bytes) MiB() float64 { return float64(n) / (1 << 20) }
