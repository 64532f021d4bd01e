package units

import (
	"regexp"
	"testing"
)

func TestUnits(t *testing.T) {
	for _, tc := range []struct{ got, want string }{
		{Metric(0), "0"},
		{Metric(999), "999"},
		{Metric(2_500_000), "2.50M"},
		{Metric(7e9), "7.00G"},
		{Metric(42), "42"},
		{Metric(7800), "7.8k"},
		{Metric(4_560_000), "4.56M"},
		{Metric(1_230_000_000), "1.23G"},
		{Params(124_475_904), "124M"},
		{Params(1.3e9), "1.3B"},
		{Params(96_000), "96K"},
	} {
		if tc.got != tc.want {
			t.Errorf("got %q, want %q", tc.got, tc.want)
		}
	}
}

// TestMemoryConvention: a memory size is in binary units, labelled, in the
// largest unit it reaches, with one decimal below 100 and none from 100
// on; a used/total pair is in the total's unit, labelled once.
func TestMemoryConvention(t *testing.T) {
	const (
		KiB = int64(1) << (10 * (iota + 1))
		MiB
		GiB
		TiB
	)
	for _, tc := range []struct {
		n    int64
		want string
	}{
		{0, "0 B"},
		{1, "1 B"},
		{900, "900 B"},
		{1023, "1023 B"},
		{1024, "1.0 KiB"},
		{1536, "1.5 KiB"},
		{9011, "8.8 KiB"},
		{64 * KiB, "64.0 KiB"},
		{5 * MiB, "5.0 MiB"},
		{57*MiB + 300*KiB, "57.3 MiB"},
		{99*MiB + 973*KiB, "100 MiB"}, // 99.95 MiB rounds to whole
		{312 * MiB, "312 MiB"},
		{1023 * MiB, "1023 MiB"},
		{1023*MiB + 600*KiB, "1.0 GiB"}, // never "1024 MiB"
		{3 * GiB / 2, "1.5 GiB"},
		{4000000 * KiB, "3.8 GiB"},
		{25_300_000_000, "23.6 GiB"}, // the "25.3 GB" of the issue
		{80 * GiB, "80.0 GiB"},
		{141e9, "131 GiB"}, // an H200's 141 GB
		{2 * TiB, "2.0 TiB"},
		{-5, "-5 B"},
	} {
		if got := Bytes(tc.n); got != tc.want {
			t.Errorf("Bytes(%d) = %q, want %q", tc.n, got, tc.want)
		}
	}
	for _, tc := range []struct {
		used, total int64
		want        string
	}{
		{860 * MiB, 47 * GiB / 2, "0.8/23.5 GiB"},
		{12 * GiB, 64 * GiB, "12.0/64.0 GiB"},
		{300 * MiB, 64 * GiB, "0.3/64.0 GiB"},
		{0, 64 * GiB, "0/64.0 GiB"},
		{3 * MiB, 64 * GiB, "3.0 MiB/64.0 GiB"}, // not "0.0/64.0 GiB"
		{57 * MiB, 512 * MiB, "57.0/512 MiB"},
		{123 * GiB, 141e9, "123/131 GiB"},
		{100 * GiB, 2 * TiB, "0.1/2.0 TiB"},
		{500, 900, "500/900 B"},
		{300 * MiB, 0, "300 MiB"},
	} {
		if got := BytesOf(tc.used, tc.total); got != tc.want {
			t.Errorf("BytesOf(%d, %d) = %q, want %q", tc.used, tc.total, got, tc.want)
		}
	}
	if got := InGiB(3 << 29); got != 1.5 {
		t.Errorf("InGiB(3<<29) = %v, want 1.5", got)
	}

	// Every size, from a byte to a TiB and past it, is one figure and a
	// binary unit, at most 8 characters wide.
	size := regexp.MustCompile(`^(0|[0-9]{1,4}) B$|^([0-9]{1,2}\.[0-9]|[1-9][0-9]{2,3}) [KMGTPE]iB$`)
	for n := int64(0); n < 1<<50; n = n*5/4 + 1 {
		if s := Bytes(n); !size.MatchString(s) || len(s) > 8 {
			t.Fatalf("Bytes(%d) = %q: not a labelled binary size of at most 8 characters", n, s)
		}
	}
}

// TestBytesAllocs: a size is written with one allocation, its string, so
// that a screen can keep its text current as each report arrives.
func TestBytesAllocs(t *testing.T) {
	n := int64(0)
	if a := testing.AllocsPerRun(100, func() { n += 12345678; _ = Bytes(n) }); a > 1 {
		t.Errorf("Bytes: %.0f allocations, want 1", a)
	}
	if a := testing.AllocsPerRun(100, func() { n += 12345678; _ = BytesOf(n, 64<<30) }); a > 1 {
		t.Errorf("BytesOf: %.0f allocations, want 1", a)
	}
}
