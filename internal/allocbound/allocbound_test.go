package allocbound

import "testing"

var sink []byte

func TestMeasure(t *testing.T) {
	for _, n := range []int{0, 1 << 20, 16 << 20} {
		got := Measure(func() { sink = make([]byte, n) })
		if got < uint64(n) || got > uint64(n)+1<<16 {
			t.Errorf("allocating %d bytes measured %d", n, got)
		}
	}
	if Limit(1000) != 64<<20+16000 {
		t.Errorf("Limit(1000) = %d", Limit(1000))
	}
}
