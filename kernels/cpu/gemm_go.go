package cpu

import "unsafe"

// kernGo is the micro-kernel in plain Go, for CPUs without an assembly one.
// Its 2×4 tile was chosen by measurement: the Go compiler keeps a 2×4 block
// of accumulators in registers, whereas larger blocks spill to the stack.
var kernGo = &gemmKernel{name: "go", mr: 2, nr: 4, lanes: 4, kc: 256, mc: 64, nc: 1024, vsBLAS: blasFaster, fn: sgemmGoKernel}

// sgemmGoKernel is gemmKernel.fn for the 2×4 tile.
func sgemmGoKernel(k int, ap, bp, cp *float32, ldc int, alpha, beta float32) {
	a := unsafe.Slice((*[2]float32)(unsafe.Pointer(ap)), k)
	b := unsafe.Slice((*[4]float32)(unsafe.Pointer(bp)), k)
	var c00, c01, c02, c03, c10, c11, c12, c13 float32
	for p := range b {
		// Pointers to the steps, rather than copies, let the compiler use
		// memory operands and keep all eight sums in registers.
		x, y := &a[p], &b[p]
		c00 += x[0] * y[0]
		c01 += x[0] * y[1]
		c02 += x[0] * y[2]
		c03 += x[0] * y[3]
		c10 += x[1] * y[0]
		c11 += x[1] * y[1]
		c12 += x[1] * y[2]
		c13 += x[1] * y[3]
	}
	r0 := (*[4]float32)(unsafe.Pointer(cp))
	r1 := (*[4]float32)(unsafe.Add(unsafe.Pointer(cp), 4*ldc))
	acc := [2][4]float32{{c00, c01, c02, c03}, {c10, c11, c12, c13}}
	for r, row := range [2]*[4]float32{r0, r1} {
		for j, v := range acc[r] {
			if beta == 0 {
				row[j] = alpha * v
			} else {
				row[j] = float32(alpha*v) + float32(beta*row[j])
			}
		}
	}
}
