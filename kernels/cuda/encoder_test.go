package cuda_test

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

func TestEncoder(t *testing.T) {
	for _, tc := range []struct {
		B, T, C, V int
		vlo, rows  int // the shard: rows vlo … vlo+rows−1; rows 0: the whole table
		noWPE      bool
		off        int // float offset of every buffer (≠ 0 mod 4: scalar path)
	}{
		{B: 2, T: 5, C: 8, V: 11},
		{B: 3, T: 7, C: 13, V: 9},
		{B: 2, T: 4, C: 12, V: 10, off: 1},
		{B: 4, T: 6, C: 16, V: 20, vlo: 5, rows: 8},
		{B: 2, T: 3, C: 5, V: 20, vlo: 10, rows: 10, noWPE: true},
	} {
		t.Run(fmt.Sprintf("B%dT%dC%dV%d_%d+%d_off%d", tc.B, tc.T, tc.C, tc.V, tc.vlo, tc.rows, tc.off), func(t *testing.T) {
			r := rand.New(rand.NewPCG(1, uint64(tc.C)))
			m, k := machine(t)
			B, T, C := tc.B, tc.T, tc.C
			rows := tc.rows
			if rows == 0 {
				rows = tc.V
			}
			inp := make([]int32, B*T)
			for i := range inp {
				inp[i] = int32(r.IntN(tc.V + 2)) // a few out of range
			}
			inp[0] = inp[B*T-1] // a repeated token
			wte, wpe := randn(r, rows*C, 1), randn(r, T*C, 1)
			dout := randn(r, B*T*C, 1)
			dwte0, dwpe0 := randn(r, rows*C, 1), randn(r, T*C, 1)
			if tc.noWPE {
				wpe, dwpe0 = nil, nil
			}

			want := make([]float32, B*T*C)
			dwte, dwpe := append([]float32(nil), dwte0...), append([]float32(nil), dwpe0...)
			cpuBackend.EncoderShardForward(want, inp, wte, tc.vlo, wpe, B, T, C)
			cpuBackend.EncoderShardBackward(dwte, tc.vlo, dwpe, dout, inp, B, T, C)

			o := tc.off
			out, ip := place(m, make([]float32, B*T*C), o), m.Int32s(inp)
			wp, pp := place(m, wte, o), place(m, wpe, o)
			gp, gwte, gwpe := place(m, dout, o), place(m, dwte0, o), place(m, dwpe0, o)
			if tc.noWPE {
				pp, gwpe = 0, 0
			}
			if tc.rows == 0 {
				must(t, k.EncoderForward(0, out, ip, wp, pp, B, T, C, tc.V))
				must(t, k.EncoderBackward(0, gwte, gwpe, gp, ip, B, T, C, tc.V))
			} else {
				must(t, k.EncoderShardForward(0, out, ip, wp, tc.vlo, rows, pp, B, T, C))
				must(t, k.EncoderShardBackward(0, gwte, tc.vlo, rows, gwpe, gp, ip, B, T, C))
			}
			run(t, m)
			checkExact(t, "out", m.ReadFloat32s(out, B*T*C), want)
			checkClose(t, "dwte", m.ReadFloat32s(gwte, rows*C), dwte, 1e-5)
			if !tc.noWPE {
				checkExact(t, "dwpe", m.ReadFloat32s(gwpe, T*C), dwpe)
			}
		})
	}
}
