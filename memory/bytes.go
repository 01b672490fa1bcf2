package memory

import (
	"errors"
	"fmt"
	"math"
	"regexp"
	"strconv"
	"strings"
)

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

// Product is the product of counts (a shape's dimensions, elements times
// their size, windows times their length), or false when one is negative
// or the product does not fit an int: the one place where sizes are
// multiplied, so that none wraps.
func Product(xs ...int) (int, bool) {
	n := 1
	for _, x := range xs {
		if x < 0 {
			return 0, false
		}
		if x != 0 && n > math.MaxInt/x {
			for _, y := range xs { // a zero makes any product fit
				if y == 0 {
					return 0, true
				}
			}
			return 0, false
		}
		n *= x
	}
	return n, true
}

// Budget is an amount of memory given as a size ("200MiB", "1.5GiB",
// "500MB", or plain bytes, at least 1 MiB) or as a fraction of a device's
// memory in (0, 1] ("0.5"). It is a flag.Value: Set refuses anything else,
// and sizes that do not fit an int64, naming what is wrong.
type Budget struct {
	Bytes    int64   // a size; 0 when Fraction is set
	Fraction float64 // of the device's memory; 0 when Bytes is set
}

// Set reads s as ParseBudget does.
func (b *Budget) Set(s string) error {
	v, err := ParseBudget(s)
	if err == nil {
		*b = v
	}
	return err
}

// String writes b as Set reads it ("" when unset).
func (b Budget) String() string {
	switch {
	case b.Fraction > 0:
		return fmt.Sprint(b.Fraction)
	case b.Bytes > 0:
		return fmt.Sprint(b.Bytes)
	}
	return ""
}

// IsSet reports whether b was given.
func (b Budget) IsSet() bool { return b.Bytes > 0 || b.Fraction > 0 }

// Of is b in bytes of a device of total bytes.
func (b Budget) Of(total int64) int64 {
	if b.Fraction > 0 {
		return int64(b.Fraction * float64(total))
	}
	return b.Bytes
}

var (
	budgetSyntax = regexp.MustCompile(`^([0-9.]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)$`)
	budgetUnits  = map[string]float64{"": 1, "b": 1, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40,
		"kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
)

// ParseBudget reads a Budget: a size with a unit (200MiB, 1.5GiB, 64KiB,
// 500MB, or plain bytes) or a fraction of the device's memory in (0, 1].
func ParseBudget(s string) (Budget, error) {
	m := budgetSyntax.FindStringSubmatch(strings.TrimSpace(s))
	if m == nil {
		return Budget{}, errors.New("want a size such as 200MiB or 2GiB, or a fraction of the device's memory such as 0.5")
	}
	v, err := strconv.ParseFloat(m[1], 64)
	if err != nil || math.IsNaN(v) || math.IsInf(v, 0) || v <= 0 {
		return Budget{}, errors.New("want a positive size such as 200MiB or 2GiB, or a fraction of the device's memory such as 0.5")
	}
	unit := strings.ToLower(m[2])
	if unit == "" && v <= 1 {
		return Budget{Fraction: v}, nil
	}
	mult, ok := budgetUnits[unit]
	if !ok {
		return Budget{}, fmt.Errorf("unknown unit %q: want B, KiB, MiB, GiB (or KB, MB, GB), or a fraction such as 0.5", m[2])
	}
	if unit == "" && v < 1<<20 {
		return Budget{}, fmt.Errorf("a number without a unit is a fraction of the device's memory, at most 1, or bytes, at least 1 MiB: want %sGiB or %sMiB, or a fraction such as 0.5", m[1], m[1])
	}
	bytes := v * mult
	if bytes < 1<<20 {
		return Budget{}, errors.New("less than 1 MiB: too little for a model; did you mean MiB or GiB?")
	}
	if bytes >= math.MaxInt64 {
		return Budget{}, fmt.Errorf("%s is more bytes than a 64-bit count holds", s)
	}
	return Budget{Bytes: int64(bytes)}, nil
}
