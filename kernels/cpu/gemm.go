package cpu

//go:generate go run gemm_gen.go

import (
	"unsafe"
)

// The built-in GEMM follows the GotoBLAS scheme. C = alpha·op(A)·op(B) +
// beta·C is cut into panels of gemmKernel.nc columns; for each block of kc
// steps of the inner dimension, the panel of op(B) is packed into strips
// of nr columns laid out step by step ([p][c]), then blocks of mc rows of
// op(A) are packed into strips of mr rows ([p][r]), and the micro-kernel
// multiplies one A strip by one B strip into an mr×nr tile of C held in
// registers. Packing pads the strips with zeros past the matrix edge, so
// one micro-kernel serves every transpose combination, stride and edge:
// tiles that overhang C are computed whole into a scratch tile and only
// their inside is added to C.
//
// The block sizes keep the working set in cache: a B strip (kc×nr) in L1,
// the A block (mc×kc) in L2, the B panel (kc×nc) in L2 or L3.
//
// Threads split the larger of C's two dimensions into contiguous ranges of
// strips, and each packs its own A blocks and B panels: no thread waits on
// another between the start and the end of the product. The operand along
// the other dimension is packed by every thread: one packed element per
// 2·n/T FLOP of a thread's work (n the split dimension, T threads), little
// at the shapes where threads pay.
//
// Each element of C is one dot product summed in k order, block by block,
// whatever the threads, the tile it falls in or the kernel width: results
// do not depend on the thread count.
//
// In bf16 (the bgemm kernels) a "step" of the inner dimension is a pair:
// packing rounds op(A) and op(B) to bfloat16 (bf16Bits) and stores each
// pair of consecutive k values as one 32-bit word, the low half the even
// value, which is what VDPBF16PS multiplies and adds in fp32.

// gemmKernel is a micro-kernel and the blocking that feeds it.
type gemmKernel struct {
	name   string // named in Backend.Name: "avx512", "avx2", "sse2", "go", "avx512-bf16"
	mr, nr int    // the register tile: rows and columns of C
	kc     int    // inner-dimension steps per block (bf16: pairs of k)
	mc     int    // rows of op(A) per packed block, a multiple of mr
	nc     int    // columns of op(B) per packed panel, a multiple of nr
	bf16   bool   // operands are packed as bf16 pairs
	// vsBLAS is how the kernel compares with OpenBLAS on the CPUs that run
	// it (measured: docs/training.md, BENCHMARKS.md), which decides the
	// default GEMM: the built-in one where the best kernel is blasSlower,
	// otherwise OpenBLAS when it is installed.
	vsBLAS blasRank

	// fn computes the mr×nr tile C = alpha·Σ_p a[p·mr:]ᵀ·b[p·nr:] +
	// beta·C from k ≥ 1 packed steps (see gemm_gen.go); C is not read
	// when beta is ±0. ldc is in elements.
	fn gemmFunc
	// lanes is the width of the kernel's vectors, nr a multiple of it;
	// narrow[i] is fn for a tile of (i+1)·lanes columns, which the last
	// strip of a panel uses when it is that narrow (a 64-column product
	// then wastes 16 columns of 64, not 32 of 96).
	lanes  int
	narrow []gemmFunc
}

// blasRank places a kernel against OpenBLAS on the same CPU.
type blasRank int

const (
	blasSlower blasRank = iota // OpenBLAS is slower: the built-in GEMM is the default
	blasNear                   // OpenBLAS is a little faster: used when installed, silently missed
	blasFaster                 // OpenBLAS is much faster: used when installed, and suggested when not
)

// gemmFunc is a micro-kernel: see gemmKernel.fn.
type gemmFunc func(k int, a, b, c *float32, ldc int, alpha, beta float32)

// stripWidth returns the width a strip of cols ≤ nr columns is packed and
// computed at, and the kernel for it.
func (k *gemmKernel) stripWidth(cols int) (int, gemmFunc) {
	if cols < k.nr {
		if v := (cols + k.lanes - 1) / k.lanes; v <= len(k.narrow) {
			return v * k.lanes, k.narrow[v-1]
		}
	}
	return k.nr, k.fn
}

// gemmMinFlops is the least work, in FLOP, worth a thread of its own: a
// goroutine's start and join cost a few µs, the time of about 10⁶ FLOP.
const gemmMinFlops = 1 << 21

// gemmArgs are one product's operands, checked by checkSgemm.
type gemmArgs struct {
	transA, transB bool
	m, n, k        int
	alpha, beta    float32
	a              []float32
	lda            int
	b              []float32
	ldb            int
	c              []float32
	ldc            int
}

// gemmBufs are one thread's packing buffers.
type gemmBufs struct {
	a, b []float32 // the A block and the B panel
	tile []float32 // an mr×nr scratch tile for the edges
}

// gemm runs the product on kern. m, n and k are positive and alpha is not
// zero (Sgemm has handled the rest).
func (b *Backend) gemm(kern *gemmKernel, g *gemmArgs) {
	parts := b.Threads()
	if f := 2 * float64(g.m) * float64(g.n) * float64(g.k) / gemmMinFlops; f < float64(parts) {
		parts = max(1, int(f))
	}
	if g.n >= g.m {
		strips := (g.n + kern.nr - 1) / kern.nr
		b.ParallelFor(strips, max(1, strips/parts), func(lo, hi int) {
			b.gemmBlock(kern, g, 0, g.m, lo*kern.nr, min(hi*kern.nr, g.n))
		})
		return
	}
	strips := (g.m + kern.mr - 1) / kern.mr
	b.ParallelFor(strips, max(1, strips/parts), func(lo, hi int) {
		b.gemmBlock(kern, g, lo*kern.mr, min(hi*kern.mr, g.m), 0, g.n)
	})
}

// gemmBlock computes rows i0…i1-1, columns j0…j1-1 of C on one thread.
func (b *Backend) gemmBlock(kern *gemmKernel, g *gemmArgs, i0, i1, j0, j1 int) {
	mr, nr := kern.mr, kern.nr
	steps := g.k
	if kern.bf16 {
		steps = (g.k + 1) / 2
	}
	buf := b.getGemmBufs(kern)
	defer b.gemmPool.Put(buf)
	for jc := j0; jc < j1; jc += kern.nc {
		nc := min(kern.nc, j1-jc)
		for pc := 0; pc < steps; pc += kern.kc {
			kc := min(kern.kc, steps-pc)
			beta := g.beta
			if pc > 0 {
				beta = 1
			}
			packPanelB(kern, g, buf.b, pc, kc, jc, nc)
			for ic := i0; ic < i1; ic += kern.mc {
				mc := min(kern.mc, i1-ic)
				packBlockA(kern, g, buf.a, pc, kc, ic, mc)
				for jr := 0; jr < nc; jr += nr {
					bs := &buf.b[jr/nr*kc*nr]
					cols := min(nr, nc-jr)
					w, fn := kern.stripWidth(cols)
					for ir := 0; ir < mc; ir += mr {
						as := &buf.a[ir/mr*kc*mr]
						rows := min(mr, mc-ir)
						ci := (ic+ir)*g.ldc + jc + jr
						if rows == mr && cols == w {
							fn(kc, as, bs, &g.c[ci], g.ldc, g.alpha, beta)
							continue
						}
						fn(kc, as, bs, &buf.tile[0], w, g.alpha, 0)
						addTile(buf.tile, w, g.c[ci:], g.ldc, rows, cols, beta)
					}
				}
			}
		}
	}
}

// addTile stores the rows×cols corner of tile (alpha·acc, stride nr) into
// C as the micro-kernels do: C = tile + beta·C, or tile when beta is 0.
func addTile(tile []float32, nr int, c []float32, ldc, rows, cols int, beta float32) {
	for r := range rows {
		t := tile[r*nr : r*nr+cols]
		row := c[r*ldc : r*ldc+cols]
		if beta == 0 {
			copy(row, t)
			continue
		}
		for j, v := range t {
			row[j] = v + float32(beta*row[j]) // two roundings, never fused
		}
	}
}

// getGemmBufs returns pooled packing buffers big enough for kern.
func (b *Backend) getGemmBufs(kern *gemmKernel) *gemmBufs {
	buf, ok := b.gemmPool.Get().(*gemmBufs)
	if !ok {
		buf = new(gemmBufs)
	}
	grow := func(s []float32, n int) []float32 {
		if cap(s) < n {
			return make([]float32, n)
		}
		return s[:n]
	}
	buf.a = grow(buf.a, kern.mc*kern.kc)
	buf.b = grow(buf.b, kern.nc*kern.kc)
	buf.tile = grow(buf.tile, kern.mr*kern.nr)
	return buf
}

// packBlockA packs rows i0…i0+rows-1 of op(A), steps p0…p0+kc-1, into
// strips of kern.mr rows: dst[s·kc·mr + p·mr + r] = op(A)[i0+s·mr+r][p0+p],
// zero past the last row.
func packBlockA(kern *gemmKernel, g *gemmArgs, dst []float32, p0, kc, i0, rows int) {
	mr := kern.mr
	for s := 0; s*mr < rows; s++ {
		d := dst[s*kc*mr : (s+1)*kc*mr]
		r0, n := i0+s*mr, min(mr, rows-s*mr)
		switch {
		case kern.bf16 && g.transA:
			packPairsCols(asU32(d), mr, g.a, g.lda, p0, kc, g.k, r0, n)
		case kern.bf16:
			packPairsRows(asU32(d), mr, g.a, g.lda, p0, kc, g.k, r0, n)
		case g.transA:
			packCols(d, mr, g.a, g.lda, p0, kc, r0, n)
		default:
			packRows(d, mr, g.a, g.lda, p0, kc, r0, n)
		}
	}
}

// packPanelB packs columns j0…j0+cols-1 of op(B), steps p0…p0+kc-1, into
// strips of kern.nr columns: dst[s·kc·nr + p·w + c] = op(B)[p0+p][j0+s·nr+c]
// with w = nr, except for a last strip narrow enough for a narrower kernel
// (stripWidth); zero past the last column.
func packPanelB(kern *gemmKernel, g *gemmArgs, dst []float32, p0, kc, j0, cols int) {
	nr := kern.nr
	for s := 0; s*nr < cols; s++ {
		c0, n := j0+s*nr, min(nr, cols-s*nr)
		w, _ := kern.stripWidth(n)
		d := dst[s*kc*nr:][:kc*w]
		switch {
		case kern.bf16 && g.transB:
			packPairsRows(asU32(d), w, g.b, g.ldb, p0, kc, g.k, c0, n)
		case kern.bf16:
			packPairsCols(asU32(d), w, g.b, g.ldb, p0, kc, g.k, c0, n)
		case g.transB:
			packRows(d, w, g.b, g.ldb, p0, kc, c0, n)
		default:
			packCols(d, w, g.b, g.ldb, p0, kc, c0, n)
		}
	}
}

// packCols packs a strip whose steps are rows of the stored matrix:
// d[p·w + j] = x[(p0+p)·ld + c0 + j] for j < n, 0 for n ≤ j < w. Groups of
// 8 columns go to packColsVec where the CPU has one.
func packCols(d []float32, w int, x []float32, ld, p0, kc, c0, n int) {
	from := packColsVec(d, w, x, ld, p0, kc, c0, n)
	if from == w {
		return
	}
	for p := range kc {
		dd := d[p*w : p*w+w]
		copy(dd[from:], x[(p0+p)*ld+c0+from:][:n-from])
		clear(dd[n:])
	}
}

// packRows packs a strip whose steps are columns of the stored matrix (a
// transpose): d[p·w + j] = x[(c0+j)·ld + p0 + p] for j < n, 0 for n ≤ j < w.
// Blocks of 8×8 go to packRowsVec where the CPU has one.
func packRows(d []float32, w int, x []float32, ld, p0, kc, c0, n int) {
	rows, steps := packRowsVec(d, w, x, ld, p0, kc, c0, n)
	for j := range n {
		from := 0
		if j < rows {
			from = steps
		}
		if from == kc {
			continue
		}
		src := x[(c0+j)*ld+p0+from:][:kc-from]
		dd := d[from*w+j:]
		for p, v := range src {
			dd[p*w] = v
		}
	}
	for j := n; j < w; j++ {
		for p := range kc {
			d[p*w+j] = 0
		}
	}
}

// packPairsCols is packCols for bf16 pairs: step q of the strip holds
// values 2q and 2q+1 of the inner dimension, which are rows of x:
// d[q·w + j] = bf16(x[2(p0+q)·ld + c0+j]) | bf16(x[(2(p0+q)+1)·ld + c0+j])<<16,
// the high half 0 past row k-1. Groups of 8 columns go to packPairsColsVec
// where the CPU has one.
func packPairsCols(d []uint32, w int, x []float32, ld, p0, kc, k, c0, n int) {
	cols, steps := packPairsColsVec(d, w, x, ld, p0, kc, k, c0, n)
	q0 := 0
	if cols == w {
		q0 = steps // those steps are done
	}
	for q := q0; q < kc; q++ {
		from := 0
		if q < steps {
			from = cols
		}
		dd := d[q*w : q*w+w]
		p := 2 * (p0 + q)
		lo := x[p*ld+c0:][from:n]
		if p+1 < k {
			hi := x[(p+1)*ld+c0:][from:n]
			for j, v := range lo {
				dd[from+j] = bf16Bits(v) | bf16Bits(hi[j])<<16
			}
		} else {
			for j, v := range lo {
				dd[from+j] = bf16Bits(v)
			}
		}
		clear(dd[n:])
	}
}

// packPairsRows is packRows for bf16 pairs: the two values of a pair are
// neighbours in a row of x:
// d[q·w + j] = bf16(x[(c0+j)·ld + 2(p0+q)]) | bf16(x[(c0+j)·ld + 2(p0+q)+1])<<16,
// the high half 0 past column k-1. Blocks of 8×8 pairs go to
// packPairsRowsVec where the CPU has one.
func packPairsRows(d []uint32, w int, x []float32, ld, p0, kc, k, c0, n int) {
	rows, steps := packPairsRowsVec(d, w, x, ld, p0, kc, k, c0, n)
	p := 2 * p0
	m := min(2*kc, k-p) // values of the row in this block
	for j := range n {
		src := x[(c0+j)*ld+p:][:m]
		dd := d[j:]
		q := 0
		if j < rows {
			q = steps
		}
		for ; 2*q+1 < m; q++ {
			dd[q*w] = bf16Bits(src[2*q]) | bf16Bits(src[2*q+1])<<16
		}
		if 2*q < m {
			dd[q*w] = bf16Bits(src[2*q])
		}
	}
	for j := n; j < w; j++ {
		for q := range kc {
			d[q*w+j] = 0
		}
	}
}

// asU32 views a float32 buffer as the uint32 words of bf16 pairs.
func asU32(s []float32) []uint32 {
	return unsafe.Slice((*uint32)(unsafe.Pointer(unsafe.SliceData(s))), len(s))
}

// asF32 views bf16 pair words as the float32 buffer they live in.
func asF32(s []uint32) []float32 {
	return unsafe.Slice((*float32)(unsafe.Pointer(unsafe.SliceData(s))), len(s))
}
