package cuda

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"time"
	"unsafe"

	"github.com/gptui/gptui/half"
)

// MeasureGemm times an n×n×n GEMM with inputs of type t (output of the
// same type; f32 in IEEE fp32, never TF32, as the fp32 training GEMMs
// run) on b's stream:
// three warm-up runs, then the median of ten runs timed with events. It
// returns the rate in FLOP/s (2n³ per run), the device's measured peak
// for MFU figures (n=8192 for bf16).
func MeasureGemm(ctx context.Context, d *Device, b *BLAS, t DataType, n int) (flops float64, err error) {
	if t.Size() == 0 || n <= 0 {
		return 0, fmt.Errorf("cuda: measuring a %s GEMM of %d", t, n)
	}
	bytes := n * n * t.Size()
	var ptrs []Ptr
	defer func() {
		for _, p := range ptrs {
			d.Free(p)
		}
	}()
	// Inputs hold small random values (a GEMM of zeros draws less
	// power and can clock higher): one random megabyte, repeated.
	chunk := make([]byte, 1<<20)
	r := rand.New(rand.NewPCG(uint64(n), 3))
	for i := 0; i < len(chunk); i += t.Size() {
		x := r.Float32() - 0.5
		switch t {
		case BF16:
			v := half.F32ToBF16(x)
			chunk[i], chunk[i+1] = byte(v), byte(v>>8)
		case F16:
			v := half.F32ToF16(x)
			chunk[i], chunk[i+1] = byte(v), byte(v>>8)
		case F32:
			v := math.Float32bits(x)
			chunk[i], chunk[i+1], chunk[i+2], chunk[i+3] = byte(v), byte(v>>8), byte(v>>16), byte(v>>24)
		default:
			return 0, fmt.Errorf("cuda: measuring a %s GEMM: use f32, f16 or bf16", t)
		}
	}
	for range 3 {
		p, err := d.Alloc(bytes)
		if err != nil {
			return 0, err
		}
		ptrs = append(ptrs, p)
		for off := 0; off < bytes; off += len(chunk) {
			if err := d.CopyHtoD(p+Ptr(off), unsafe.Pointer(&chunk[0]), min(len(chunk), bytes-off)); err != nil {
				return 0, err
			}
		}
	}
	A, B, C := ptrs[0], ptrs[1], ptrs[2]
	gemm := func() error {
		return b.Gemm(false, false, n, n, n, 1, A, t, n, B, t, n, 0, C, t, n, t == F32)
	}
	for range 3 {
		if err := gemm(); err != nil {
			return 0, err
		}
	}
	start, err := d.NewEvent()
	if err != nil {
		return 0, err
	}
	defer d.DestroyEvent(start)
	end, err := d.NewEvent()
	if err != nil {
		return 0, err
	}
	defer d.DestroyEvent(end)
	var times []time.Duration
	for range 10 {
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		if err := d.Record(start, b.s); err != nil {
			return 0, err
		}
		if err := gemm(); err != nil {
			return 0, err
		}
		if err := d.Record(end, b.s); err != nil {
			return 0, err
		}
		el, err := d.Elapsed(start, end)
		if err != nil {
			return 0, err
		}
		times = append(times, el)
	}
	slices.Sort(times)
	med := (times[4] + times[5]) / 2
	if med <= 0 {
		return 0, fmt.Errorf("cuda: a %d³ GEMM timed at %v", n, med)
	}
	return 2 * float64(n) * float64(n) * float64(n) / med.Seconds(), nil
}
