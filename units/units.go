// Package units writes sizes, counts and rates for people. Every command,
// log line and screen formats numbers through it, so that one quantity
// reads the same everywhere.
//
// A memory size — RAM, a device's memory, a process's resident memory,
// the memory of a model's parameters, gradients, optimizer state or
// activations, a checkpoint — is in binary units, always labelled: B,
// KiB, MiB, GiB, TiB. Bytes writes it in the largest unit it reaches, with
// one decimal below 100 and none from 100 on, never wider than 8
// characters: "900 B", "8.8 KiB", "57.3 MiB", "312 MiB", "23.5 GiB",
// "131 GiB". BytesOf writes a used/total pair in the total's unit,
// labelled once: "0.8/23.5 GiB". A table whose column head names the unit
// ("total GiB") holds figures of InGiB.
//
// Rates — bandwidths ("GB/s"), tokens/s, FLOP/s — and counts are decimal,
// with metric suffixes (Metric); a model's size is said by its parameter
// count (Params).
package units

import (
	"fmt"
	"strconv"
)

// binary are the units of a memory size, each 1024 times the one before.
var binary = [...]string{"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"}

// scale returns n bytes as the figure v of the largest unit binary[i]
// that v reaches once written: 1023.6 MiB is written "1.0 GiB", never
// "1024 MiB".
func scale(n int64) (v float64, i int) {
	v = float64(n)
	for i+1 < len(binary) && (v >= 1023.5 || v <= -1023.5) {
		v /= 1024
		i++
	}
	return v, i
}

// appendFigure appends v, a figure of unit binary[i]: whole bytes, one
// decimal below 100 of the larger units, none from 100 on; 0 as "0".
func appendFigure(b []byte, v float64, i int) []byte {
	switch {
	case v == 0:
		return append(b, '0')
	case i > 0 && v < 99.95 && v > -99.95:
		return strconv.AppendFloat(b, v, 'f', 1, 64)
	}
	return strconv.AppendFloat(b, v, 'f', 0, 64)
}

// Bytes writes n bytes as a memory size: "0 B", "900 B", "8.8 KiB",
// "57.3 MiB", "312 MiB", "1.5 GiB", "131 GiB", "2.0 TiB".
func Bytes(n int64) string {
	var buf [16]byte
	v, i := scale(n)
	b := append(appendFigure(buf[:0], v, i), ' ')
	return string(append(b, binary[i]...))
}

// BytesOf writes used of total bytes, for narrow columns, as a pair in
// the total's unit labelled once: "0.8/23.5 GiB", "57.3/512 MiB",
// "0/64.0 GiB". A used figure that would read 0 in that unit though it
// is not is written in its own: "3.0 MiB/64.0 GiB". Without a total
// (total ≤ 0) it is Bytes(used).
func BytesOf(used, total int64) string {
	if total <= 0 {
		return Bytes(used)
	}
	var buf [32]byte
	v, i := scale(total)
	u := float64(used) / float64(int64(1)<<(10*i))
	var b []byte
	if used != 0 && i > 0 && u < 0.05 && u > -0.05 {
		b = append(append(buf[:0], Bytes(used)...), '/')
	} else {
		b = append(appendFigure(buf[:0], u, i), '/')
	}
	b = append(append(appendFigure(b, v, i), ' '), binary[i]...)
	return string(b)
}

// InGiB is n bytes in GiB, for a table whose column head names the unit:
// fmt.Sprintf("%.2f", InGiB(3<<29)) is "1.50".
func InGiB(n int64) float64 { return float64(n) / (1 << 30) }

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
