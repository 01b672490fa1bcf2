package memory

import (
	"fmt"
	"strings"
)

// Stat is one statistic: its current value, its peak since the last
// ResetPeak, and the totals ever added and subtracted.
type Stat struct {
	Current   int64
	Peak      int64
	Allocated int64 // total ever added ("Tot Alloc")
	Freed     int64 // total ever subtracted ("Tot Freed")
}

// StatArray holds a Stat for all pools together and for each pool,
// indexed by All, Small and Large.
type StatArray [3]Stat

// window tracks the peaks of allocated and reserved bytes since the last
// WindowPeak call, independently of the Stats peaks.
type window struct{ allocated, reserved int64 }

func (s *StatArray) add(k PoolKind, n int64) {
	for _, i := range [2]PoolKind{All, k} {
		st := &s[i]
		st.Current += n
		st.Allocated += n
		if st.Current > st.Peak {
			st.Peak = st.Current
		}
	}
}

func (s *StatArray) sub(k PoolKind, n int64) {
	for _, i := range [2]PoolKind{All, k} {
		s[i].Current -= n
		s[i].Freed += n
	}
}

// Stats are the allocator's statistics, named as in torch.cuda.memory_stats.
// Byte statistics count rounded block sizes except Requested, which counts
// the sizes asked for.
type Stats struct {
	Allocated     StatArray // bytes in allocated blocks
	Active        StatArray // bytes in active blocks: PyTorch counts blocks freed with work still pending on another stream; here a block is freed at once (each block belongs to the stream it was allocated on; a side stream's collectives join the backend's stream before their buffers are freed, and nothing calls record_stream), so Active equals Allocated, kept for memory_summary's layout
	Requested     StatArray // bytes requested by callers of Alloc
	Reserved      StatArray // bytes in segments obtained from the Source
	InactiveSplit StatArray // free bytes in segments that are partly in use: not releasable

	Allocations         StatArray // number of allocated blocks
	ActiveBlocks        StatArray // number of active blocks
	Segments            StatArray // number of segments
	InactiveSplitBlocks StatArray // number of free blocks in segments that are partly in use

	NumAllocRetries int64 // source allocations that failed and were retried after a cache flush
	NumOOMs         int64 // requests that failed with an OOMError
}

func (s *Stats) arrays() []*StatArray {
	return []*StatArray{&s.Allocated, &s.Active, &s.Requested, &s.Reserved, &s.InactiveSplit,
		&s.Allocations, &s.ActiveBlocks, &s.Segments, &s.InactiveSplitBlocks}
}

func (s *Stats) resetPeak() {
	for _, a := range s.arrays() {
		for i := range a {
			a[i].Peak = a[i].Current
		}
	}
}

// Summary returns the allocator's statistics as a table laid out like
// torch.cuda.memory_summary.
func (a *Allocator) Summary() string {
	s := a.Stats()
	return s.Summary(a.cfg.Device)
}

// Summary renders s as a table laid out like torch.cuda.memory_summary,
// headed with the device name.
func (s Stats) Summary(device string) string {
	const width = 75
	var lines []string
	rule := func(c string) { lines = append(lines, strings.Repeat(c, width)) }
	center := func(text string) string {
		pad := width - len(text)
		return strings.Repeat(" ", pad/2) + text + strings.Repeat(" ", pad-pad/2)
	}
	rule("=")
	lines = append(lines, center("leangrad memory summary, device "+device))
	rule("-")
	left := fmt.Sprintf("           OOMs: %-12d", s.NumOOMs)
	right := fmt.Sprintf("       alloc retries: %-8d", s.NumAllocRetries)
	lines = append(lines, fmt.Sprintf("%-36s|%-38s", left, right))
	rule("=")
	lines = append(lines, "        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  ")
	type metric struct {
		name   string
		values *StatArray
		format func(v, pref int64) string
	}
	metrics := []metric{
		{"Allocated memory", &s.Allocated, formatSize},
		{"Active memory", &s.Active, formatSize},
		{"Requested memory", &s.Requested, formatSize},
		{"Reserved memory", &s.Reserved, formatSize},
		{"Non-releasable memory", &s.InactiveSplit, formatSize},
		{"Allocations", &s.Allocations, formatCount},
		{"Active allocs", &s.ActiveBlocks, formatCount},
		{"Reserved segments", &s.Segments, formatCount},
		{"Non-releasable allocs", &s.InactiveSplitBlocks, formatCount},
	}
	for _, m := range metrics {
		rule("-")
		all := m.values[All]
		for _, row := range []struct {
			name string
			k    PoolKind
		}{{m.name, All}, {"      from large pool", Large}, {"      from small pool", Small}} {
			v := m.values[row.k]
			lines = append(lines, fmt.Sprintf(" %-21s | %s | %s | %s | %s ", row.name,
				m.format(v.Current, all.Current), m.format(v.Peak, all.Peak),
				m.format(v.Allocated, all.Allocated), m.format(v.Freed, all.Freed)))
		}
	}
	rule("=")
	return "|" + strings.Join(lines, "|\n|") + "|\n"
}

// formatSize writes a byte count the way memory_summary does: the unit is
// chosen from the row's "all pools" value so that a column's rows line up.
func formatSize(n, pref int64) string {
	units := []string{"B  ", "KiB", "MiB", "GiB", "TiB", "PiB"}
	u := 0
	for u < len(units)-1 && pref >= 768*1024 {
		n /= 1024
		pref /= 1024
		u++
	}
	return fmt.Sprintf("%6d %s", n, units[u])
}

// formatCount writes a count the way memory_summary does.
func formatCount(n, pref int64) string {
	units := []string{" ", "K", "M"}
	u := 0
	for u < len(units)-1 && pref >= 750*1000 {
		n /= 1000
		pref /= 1000
		u++
	}
	return fmt.Sprintf("%7d %s ", n, units[u])
}
