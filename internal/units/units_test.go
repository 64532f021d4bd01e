package units

import "testing"

func TestUnits(t *testing.T) {
	for _, tc := range []struct{ got, want string }{
		{GB(1234567890, 3), "1.235 GB"},
		{GB(51_400_000_000, 2), "51.40 GB"},
		{GiB(4000000 << 10), "3.8 GiB"},
		{Bytes(0), "0 B"},
		{Bytes(1023), "1023 B"},
		{Bytes(1024), "1.0 KiB"},
		{Bytes(5 << 20), "5.0 MiB"},
		{Bytes(512), "512 B"},
		{Bytes(1536), "1.5 KiB"},
		{Bytes(3 << 30), "3.0 GiB"},
		{BytesShort(900), "900B"},
		{BytesShort(64 << 10), "64K"},
		{BytesShort(312 << 20), "312M"},
		{BytesShort(3 << 29), "1.5G"},
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
