// Package units writes sizes and counts for people: bytes in decimal or
// binary units, counts and rates with metric suffixes, a model's size as
// its parameter count is usually said. Every command, log line and screen
// formats numbers through it, so one quantity reads the same everywhere.
package units

import "fmt"

// GB writes n bytes in decimal gigabytes with the given decimals:
// GB(1234567890, 3) is "1.235 GB".
func GB(n int64, decimals int) string {
	return fmt.Sprintf("%.*f GB", decimals, float64(n)/1e9)
}

// GiB writes n bytes in binary gigabytes, one decimal: "3.8 GiB".
func GiB(n int64) string { return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30)) }

// Bytes writes n bytes in the largest binary unit it reaches, one
// decimal: "512 B", "1.5 KiB", "3.2 GiB".
func Bytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	v, i := float64(n)/unit, 0
	for v >= unit && i < 4 {
		v /= unit
		i++
	}
	return fmt.Sprintf("%.1f %ciB", v, "KMGTP"[i])
}

// BytesShort writes n bytes as nvidia-smi's users read them, for narrow
// columns: "1.5G", "312M", "64K", "900B".
func BytesShort(b int64) string {
	const k = 1 << 10
	switch {
	case b >= k*k*k*k:
		return fmt.Sprintf("%.1fT", float64(b)/(k*k*k*k))
	case b >= k*k*k:
		return fmt.Sprintf("%.1fG", float64(b)/(k*k*k))
	case b >= k*k:
		return fmt.Sprintf("%.0fM", float64(b)/(k*k))
	case b >= k:
		return fmt.Sprintf("%.0fK", float64(b)/k)
	}
	return fmt.Sprintf("%dB", b)
}

// Metric writes a count or a rate with a metric suffix: "1.23G", "4.56M",
// "7.8k", "42".
func Metric(v float64) string {
	switch {
	case v >= 1e9:
		return fmt.Sprintf("%.2fG", v/1e9)
	case v >= 1e6:
		return fmt.Sprintf("%.2fM", v/1e6)
	case v >= 1e3:
		return fmt.Sprintf("%.1fk", v/1e3)
	}
	return fmt.Sprintf("%.0f", v)
}

// Params writes a parameter count as a model's size is said: "124M",
// "1.3B", "96K".
func Params(n float64) string {
	switch {
	case n >= 1e9:
		return fmt.Sprintf("%.1fB", n/1e9)
	case n >= 1e6:
		return fmt.Sprintf("%.0fM", n/1e6)
	case n >= 1e3:
		return fmt.Sprintf("%.0fK", n/1e3)
	}
	return fmt.Sprintf("%.0f", n)
}

// Plural returns word for n == 1 and word+"s" otherwise: "1 shard", "2
// shards".
func Plural(n int, word string) string {
	if n == 1 {
		return word
	}
	return word + "s"
}
