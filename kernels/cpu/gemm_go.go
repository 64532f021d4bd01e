package cpu

// The pure-Go GEMM follows the GotoBLAS blocking scheme in miniature. For
// each block of gemmKC steps of the inner dimension, op(A) is packed into
// strips of gemmMR rows and op(B) into strips of gemmNR columns, each strip
// laid out step by step ([p][r] and [p][c]) with zero padding past the
// matrix edge, so every transpose combination is served by one micro-kernel
// that streams two contiguous arrays. C is then updated in tiles of
// gemmTileM×gemmTileN elements spread over the Backend's threads.
//
// The micro-kernel's shape was chosen by measurement: the Go compiler keeps
// a 2×4 block of accumulators in registers, whereas larger blocks spill to
// the stack and run slower.
const (
	gemmMR    = 2       // rows of the micro-kernel's C block
	gemmNR    = 4       // columns of the micro-kernel's C block
	gemmKC    = 256     // inner-dimension block: an A strip plus a B strip stay in L1
	gemmTileM = 64      // rows of C per parallel task (a multiple of gemmMR)
	gemmTileN = 256     // columns of C per parallel task (a multiple of gemmNR)
	packGrain = 1 << 13 // elements worth a goroutine when packing
)

// sgemmGo is the pure-Go Sgemm. The arguments have been checked, and m, n, k
// are positive and alpha non-zero.
func (b *Backend) sgemmGo(transA, transB bool, m, n, k int, alpha float32, a []float32, lda int, bm []float32, ldb int, beta float32, c []float32, ldc int) {
	b.scaleC(m, n, beta, c, ldc)

	mStrips := (m + gemmMR - 1) / gemmMR
	nStrips := (n + gemmNR - 1) / gemmNR
	kb := min(k, gemmKC)
	buf := b.getPack(kb*mStrips, kb*nStrips)
	defer b.packs.Put(buf)

	rowTiles := (m + gemmTileM - 1) / gemmTileM
	colTiles := (n + gemmTileN - 1) / gemmTileN
	for p0 := 0; p0 < k; p0 += gemmKC {
		kk := min(gemmKC, k-p0)
		ap, bp := buf.a[:kk*mStrips], buf.b[:kk*nStrips]
		b.ParallelFor(mStrips, max(1, packGrain/(kk*gemmMR)), func(lo, hi int) {
			for s := lo; s < hi; s++ {
				packA(transA, a, lda, m, s*gemmMR, p0, ap[s*kk:(s+1)*kk])
			}
		})
		b.ParallelFor(nStrips, max(1, packGrain/(kk*gemmNR)), func(lo, hi int) {
			for s := lo; s < hi; s++ {
				packB(transB, bm, ldb, n, s*gemmNR, p0, bp[s*kk:(s+1)*kk])
			}
		})
		// Consecutive tasks share a row of tiles, so a thread's A strips
		// stay in cache while it walks along the columns.
		b.ParallelFor(rowTiles*colTiles, 1, func(lo, hi int) {
			for t := lo; t < hi; t++ {
				i0 := t / colTiles * gemmTileM
				j0 := t % colTiles * gemmTileN
				i1, j1 := min(i0+gemmTileM, m), min(j0+gemmTileN, n)
				for j := j0; j < j1; j += gemmNR {
					bs := bp[j/gemmNR*kk:][:kk]
					for i := i0; i < i1; i += gemmMR {
						acc := kernel2x4(ap[i/gemmMR*kk:][:kk], bs)
						storeTile(&acc, alpha, c, ldc, i, j, min(gemmMR, m-i), min(gemmNR, n-j))
					}
				}
			}
		})
	}
}

// packBufs holds the packed strips of one k block: A as gemmMR-row steps,
// B as gemmNR-column steps.
type packBufs struct {
	a [][gemmMR]float32
	b [][gemmNR]float32
}

// getPack returns pooled packing buffers with room for na A steps and nb B
// steps.
func (b *Backend) getPack(na, nb int) *packBufs {
	buf, ok := b.packs.Get().(*packBufs)
	if !ok {
		buf = new(packBufs)
	}
	if cap(buf.a) < na {
		buf.a = make([][gemmMR]float32, na)
	}
	if cap(buf.b) < nb {
		buf.b = make([][gemmNR]float32, nb)
	}
	buf.a, buf.b = buf.a[:na], buf.b[:nb]
	return buf
}

// packA copies rows i0…i0+gemmMR-1 of op(A) (m rows in all), columns
// p0…p0+len(dst)-1, into dst: dst[p][r] = op(A)[i0+r][p0+p]. Rows past m are
// zero.
func packA(trans bool, a []float32, lda, m, i0, p0 int, dst [][gemmMR]float32) {
	rows := min(gemmMR, m-i0)
	if trans { // op(A)[i][p] = a[p·lda+i]: each step's rows are contiguous
		for p := range dst {
			n := copy(dst[p][:], a[(p0+p)*lda+i0:][:rows])
			clear(dst[p][n:])
		}
		return
	}
	for r := range gemmMR {
		if r >= rows {
			for p := range dst {
				dst[p][r] = 0
			}
			continue
		}
		src := a[(i0+r)*lda+p0:][:len(dst)]
		for p, v := range src {
			dst[p][r] = v
		}
	}
}

// packB copies columns j0…j0+gemmNR-1 of op(B) (n columns in all), rows
// p0…p0+len(dst)-1, into dst: dst[p][c] = op(B)[p0+p][j0+c]. Columns past n
// are zero.
func packB(trans bool, bm []float32, ldb, n, j0, p0 int, dst [][gemmNR]float32) {
	cols := min(gemmNR, n-j0)
	if !trans { // op(B)[p][j] = b[p·ldb+j]: each step's columns are contiguous
		if cols == gemmNR {
			for p := range dst {
				dst[p] = [gemmNR]float32(bm[(p0+p)*ldb+j0:])
			}
			return
		}
		for p := range dst {
			n := copy(dst[p][:], bm[(p0+p)*ldb+j0:][:cols])
			clear(dst[p][n:])
		}
		return
	}
	for col := range gemmNR {
		if col >= cols {
			for p := range dst {
				dst[p][col] = 0
			}
			continue
		}
		src := bm[(j0+col)*ldb+p0:][:len(dst)]
		for p, v := range src {
			dst[p][col] = v
		}
	}
}

// kernel2x4 returns the 2×4 block Σ_p a[p]ᵀ·b[p] of a packed A strip and a
// packed B strip of the same length, row-major.
func kernel2x4(a [][gemmMR]float32, b [][gemmNR]float32) [gemmMR * gemmNR]float32 {
	var c00, c01, c02, c03, c10, c11, c12, c13 float32
	a = a[:len(b)] // one bounds check here instead of one per step
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
	return [gemmMR * gemmNR]float32{c00, c01, c02, c03, c10, c11, c12, c13}
}

// storeTile adds alpha·acc to the rows×cols corner of the C block whose
// top-left element is C[i][j].
func storeTile(acc *[gemmMR * gemmNR]float32, alpha float32, c []float32, ldc, i, j, rows, cols int) {
	if rows == gemmMR && cols == gemmNR {
		r0 := (*[gemmNR]float32)(c[i*ldc+j:])
		r1 := (*[gemmNR]float32)(c[(i+1)*ldc+j:])
		r0[0] += alpha * acc[0]
		r0[1] += alpha * acc[1]
		r0[2] += alpha * acc[2]
		r0[3] += alpha * acc[3]
		r1[0] += alpha * acc[4]
		r1[1] += alpha * acc[5]
		r1[2] += alpha * acc[6]
		r1[3] += alpha * acc[7]
		return
	}
	for r := range rows {
		row := c[(i+r)*ldc+j:][:cols]
		for col := range row {
			row[col] += alpha * acc[r*gemmNR+col]
		}
	}
}
