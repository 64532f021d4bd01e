package arch

import "testing"

func TestHeadRows(t *testing.T) {
	for _, tc := range []struct {
		name                 string
		N                    int
		blockBytes, rowBytes int64
		want                 int
	}{
		{"no rows", 0, 1 << 20, 4, 0},
		{"one chunk: the block keeps more", 1000, 1 << 30, 4 * 50304, 1000},
		{"even chunks", 8192, 4 * 2048 * 8192, 4 * 8192, 2048},
		// 8192·2048·4 bytes of a block over rows of 12,000·4: 1398 rows,
		// 6 chunks, the last shorter.
		{"uneven", 8192, 4 * 2048 * 8192, 4 * 12000, 1366},
		{"floor", 4096, 1 << 10, 4 * 50304, MinHeadRows},
		{"fewer rows than the floor", 100, 1, 4 * 50304, 100},
		{"no width", 100, 0, 0, 100},
	} {
		got := HeadRows(tc.N, tc.blockBytes, tc.rowBytes)
		if got != tc.want {
			t.Errorf("%s: HeadRows(%d, %d, %d) = %d, want %d", tc.name, tc.N, tc.blockBytes, tc.rowBytes, got, tc.want)
		}
		if tc.N > 0 && (got < 1 || got > tc.N) {
			t.Errorf("%s: %d rows out of 1 … %d", tc.name, got, tc.N)
		}
	}
}
