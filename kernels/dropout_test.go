package kernels

import "testing"

func TestDropoutMask(t *testing.T) {
	tests := []struct {
		p        float32
		min, max float64 // the kept fraction of 200000 elements
	}{
		{0, 1, 1},
		{0.1, 0.89, 0.91},
		{0.25, 0.74, 0.76},
		{0.9, 0.09, 0.11},
	}
	const n = 200000
	for _, tt := range tests {
		d := Dropout{P: tt.p, Key: SiteKey(1, 2, 3)}
		in := make([]float32, n)
		for i := range in {
			in[i] = 1
		}
		out := make([]float32, n)
		d.Apply(out, in, 0)
		kept := 0
		for i, v := range out {
			if (v != 0) != d.Keep(uint64(i)) || (v != 0 && v != d.Scale()) {
				t.Fatalf("P %v element %d: %v, Keep %v, scale %v", tt.p, i, v, d.Keep(uint64(i)), d.Scale())
			}
			if v != 0 {
				kept++
			}
		}
		if frac := float64(kept) / n; frac < tt.min || frac > tt.max {
			t.Errorf("P %v: kept fraction %.4f, want [%v, %v]", tt.p, frac, tt.min, tt.max)
		}
		// A slice starting at 1000 draws what elements 1000… of the whole drew.
		part := make([]float32, 500)
		d.Apply(part, in[:500], 1000)
		for i := range part {
			if part[i] != out[1000+i] {
				t.Fatalf("P %v: the stream at offset 1000 differs at %d", tt.p, i)
			}
		}
	}
}

func TestSiteKey(t *testing.T) {
	keys := map[uint64][]uint64{}
	for _, parts := range [][]uint64{{1, 2, 3}, {1, 2, 4}, {1, 2}, {2, 1}, {}, {0}, {0, 0}} {
		k := SiteKey(parts...)
		if prev, ok := keys[k]; ok {
			t.Errorf("SiteKey(%v) = SiteKey(%v)", parts, prev)
		}
		keys[k] = parts
	}
}

func TestAttIndex(t *testing.T) {
	// Heads 2…3 of 4 (tensor parallel, nh 2 here) address the rows a single
	// process holding all 4 heads would.
	whole := Dropout{}
	part := Dropout{Heads: 4, Head0: 2}
	const T, off = 5, 7
	for bb := range 2 {
		for r := range 2 * T {
			if got, want := part.AttIndex(off, bb, 2, r, T), whole.AttIndex(off, bb, 4, 2*T+r, T); got != want {
				t.Errorf("batch %d row %d: %d, want %d", bb, r, got, want)
			}
		}
	}
}
