package cuda

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/gptui/gptui/internal/standin"
)

// sbChildEnv marks the process TestBLASStandin runs its checks in.
const sbChildEnv = "GPTUI_TEST_BLAS_STANDIN_CHILD"

// TestBLASStandin runs BLAS (cuBLAS's Gemm and GemmStridedBatched,
// cuBLASLt's Matmul with each epilogue) over the stand-in libcuda.so.1,
// libcublas.so.12 and libcublasLt.so.12 (internal/standin) on device
// buffers, against a float64 reference, and checks where the stand-ins
// fail with cuBLAS's statuses. The libraries are loaded once per process
// and kept (package cuda's loaded), so the checks run in a child process
// of this test binary with GPTUI_CUDA_LIBDIR naming the stand-ins: a GPU
// machine's real libraries, loaded by other tests, stay apart, and the
// stand-in driver does not stay behind for the tests that look for a GPU.
func TestBLASStandin(t *testing.T) {
	if os.Getenv(sbChildEnv) != "" {
		sbChild(t)
		return
	}
	dir := standin.Build(t)
	t.Setenv(LibDirEnv, dir)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestBLASStandin$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), sbChildEnv+"=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the checks over the stand-ins: %v\n%s", err, out)
	}
	if !bytes.Contains(out, []byte("--- PASS: TestBLASStandin ")) {
		t.Fatalf("the checks over the stand-ins did not pass:\n%s", out)
	}
	t.Logf("%s", out)
}

func sbChild(t *testing.T) {
	d, err := Open(0)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	s, err := d.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	defer d.DestroyStream(s)
	b, err := d.NewBLAS(s)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	dir := os.Getenv(LibDirEnv)
	if cb, lt := b.Paths(); filepath.Dir(cb) != dir || filepath.Dir(lt) != dir || d.LibraryPath() != filepath.Join(dir, "libcuda.so.1") {
		t.Fatalf("loaded %s, %s and %s, not the stand-ins of %s", d.LibraryPath(), cb, lt, dir)
	}
	if v, err := b.Version(); err != nil || v != 120800 {
		t.Fatalf("Version = %d, %v; want the stand-in's 120800", v, err)
	}
	h := &sbDev{t: t, d: d}
	t.Run("Gemm", func(t *testing.T) { sbGemm(t, h.on(t), b) })
	t.Run("GemmStridedBatched", func(t *testing.T) { sbStrided(t, h.on(t), b) })
	t.Run("Matmul", func(t *testing.T) { sbMatmul(t, h.on(t), b) })
	t.Run("Rounding", func(t *testing.T) { sbRounding(t, h.on(t), b) })
	t.Run("StreamOrder", func(t *testing.T) { sbStreamOrder(t, h.on(t), b) })
	t.Run("CopiedAtTheCall", func(t *testing.T) { sbCopied(t, h.on(t), b) })
	t.Run("Statuses", func(t *testing.T) { sbStatuses(t, h.on(t), b) })
}

// ---- device buffers ----

// sbDev allocates and copies device memory, failing its test on errors.
type sbDev struct {
	t *testing.T
	d *Device
}

func (h *sbDev) on(t *testing.T) *sbDev { return &sbDev{t: t, d: h.d} }

func (h *sbDev) alloc(bytes int) Ptr {
	h.t.Helper()
	p, err := h.d.Alloc(bytes)
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(func() { h.d.Free(p) })
	return p
}

// put copies b to a new allocation.
func (h *sbDev) put(b []byte) Ptr {
	h.t.Helper()
	p := h.alloc(max(len(b), 1))
	if len(b) > 0 {
		if err := h.d.CopyHtoD(p, unsafe.Pointer(&b[0]), len(b)); err != nil {
			h.t.Fatal(err)
		}
	}
	return p
}

func (h *sbDev) get(p Ptr, bytes int) []byte {
	h.t.Helper()
	b := make([]byte, bytes)
	if err := h.d.CopyDtoH(unsafe.Pointer(&b[0]), p, bytes); err != nil {
		h.t.Fatal(err)
	}
	return b
}

// ---- numbers ----

// sbBF16 rounds x to bfloat16 to nearest even (NaN stays NaN).
func sbBF16(x float32) uint16 {
	u := math.Float32bits(x)
	if u&0x7fffffff > 0x7f800000 {
		return uint16(u>>16) | 0x40
	}
	u += 0x7fff + (u>>16)&1
	return uint16(u >> 16)
}

// sbF16 rounds x to IEEE half to nearest even, by float64 arithmetic (a
// way other than the stand-in's bit operations).
func sbF16(x float32) uint16 {
	f := float64(x)
	var sign uint16
	if math.Signbit(f) {
		sign, f = 0x8000, -f
	}
	switch {
	case math.IsNaN(f):
		return sign | 0x7e00
	case f >= 65520:
		return sign | 0x7c00
	case f < 0x1p-14:
		return sign | uint16(math.RoundToEven(f*0x1p24))
	}
	frac, exp := math.Frexp(f) // f = frac·2^exp, frac in [0.5, 1)
	q := math.RoundToEven(frac * 2048)
	e := exp - 1 + 15
	if q == 2048 {
		q, e = 1024, e+1
	}
	if e >= 31 {
		return sign | 0x7c00
	}
	return sign | uint16(e)<<10 | uint16(q-1024)
}

func sbF16Value(h uint16) float64 {
	sign := 1.0
	if h&0x8000 != 0 {
		sign = -1
	}
	e, m := int(h>>10&0x1f), float64(h&0x3ff)
	switch e {
	case 0x1f:
		if m != 0 {
			return math.NaN()
		}
		return math.Inf(int(sign))
	case 0:
		return sign * m * 0x1p-24
	}
	return sign * (1 + m/1024) * math.Ldexp(1, e-15)
}

// sbEncode stores vals as t, rounding to nearest even.
func sbEncode(vals []float32, t DataType) []byte {
	b := make([]byte, len(vals)*t.Size())
	for i, v := range vals {
		switch t {
		case F32:
			binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(v))
		case BF16:
			binary.LittleEndian.PutUint16(b[2*i:], sbBF16(v))
		case F16:
			binary.LittleEndian.PutUint16(b[2*i:], sbF16(v))
		}
	}
	return b
}

func sbDecode(b []byte, t DataType) []float64 {
	out := make([]float64, len(b)/t.Size())
	for i := range out {
		switch t {
		case F32:
			out[i] = float64(math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:])))
		case BF16:
			out[i] = float64(math.Float32frombits(uint32(binary.LittleEndian.Uint16(b[2*i:])) << 16))
		case F16:
			out[i] = sbF16Value(binary.LittleEndian.Uint16(b[2*i:]))
		}
	}
	return out
}

// sbOperand is a device matrix and the values it holds.
type sbOperand struct {
	p    Ptr
	t    DataType
	vals []float64
}

// sbRandom puts n random values (rounded to t) on the device.
func (h *sbDev) random(r *rand.Rand, n int, t DataType) sbOperand {
	h.t.Helper()
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(r.NormFloat64())
	}
	b := sbEncode(v, t)
	return sbOperand{h.put(b), t, sbDecode(b, t)}
}

// sbOutRel is the relative error of one rounding into t, and sbOutAbs
// its absolute error where t's numbers are subnormal.
func sbOutRel(t DataType) float64 {
	switch t {
	case BF16:
		return 0x1p-8
	case F16:
		return 0x1p-11
	}
	return 0x1p-24
}

func sbOutAbs(t DataType) float64 {
	if t == F16 {
		return 0x1p-25
	}
	return 0
}

// sbAccRel bounds the error of a float sum of k products of the inputs,
// relative to the sum of their magnitudes; with TF32 the inputs are
// first rounded to 10 bits of mantissa (each by at most 2^-11).
func sbAccRel(k int, tf32 bool) float64 {
	e := float64(k+8) * 0x1p-24
	if tf32 {
		e += 0x1p-10
	}
	return e
}

// sbOp is op(X)[i,p] of a column-major matrix with leading dimension ld.
func sbOp(x []float64, trans bool, i, p, ld int) float64 {
	if trans {
		return x[p+i*ld]
	}
	return x[i+p*ld]
}

// sbRef computes alpha·op(A)·op(B) + beta·C (C is not read for beta 0)
// in float64, with the sum of the magnitudes of each element's terms.
func sbRef(ta, tb bool, m, n, k int, alpha float64, a []float64, lda int, b []float64, ldb int, beta float64, c []float64, ldc int) (want, scale []float64) {
	want, scale = make([]float64, m*n), make([]float64, m*n)
	for j := range n {
		for i := range m {
			var s, mag float64
			for p := range k {
				x := sbOp(a, ta, i, p, lda) * sbOp(b, tb, p, j, ldb)
				s += x
				mag += math.Abs(x)
			}
			s, mag = alpha*s, math.Abs(alpha)*mag
			if beta != 0 {
				s += beta * c[i+j*ldc]
				mag += math.Abs(beta * c[i+j*ldc])
			}
			want[i+j*m], scale[i+j*m] = s, mag
		}
	}
	return want, scale
}

func sbGeluTanh(x float64) float64 {
	return 0.5 * x * (1 + math.Tanh(math.Sqrt(2/math.Pi)*(x+0.044715*x*x*x)))
}

// sbDGeluTanh is sbGeluTanh's derivative.
func sbDGeluTanh(x float64) float64 {
	k := math.Sqrt(2 / math.Pi)
	th := math.Tanh(k * (x + 0.044715*x*x*x))
	return 0.5*(1+th) + 0.5*x*(1-th*th)*k*(1+3*0.044715*x*x)
}

// sbCompare checks got (an m×n matrix with leading dimension ld) against
// want (m×n, packed): |got−want| ≤ acc·scale + rounding into t.
func sbCompare(t *testing.T, what string, got []float64, ld int, want, scale []float64, m, n int, acc float64, ot DataType) {
	t.Helper()
	bad := 0
	for j := range n {
		for i := range m {
			g, w := got[i+j*ld], want[i+j*m]
			tol := acc*scale[i+j*m] + sbOutRel(ot)*math.Abs(w) + sbOutAbs(ot) + 1e-30
			d := math.Abs(g - w)
			if !(d <= tol) {
				if bad < 5 {
					t.Errorf("%s[%d,%d] = %g, want %g (±%.3g)", what, i, j, g, w, tol)
				}
				bad++
			}
		}
	}
	if bad > 0 {
		t.Errorf("%s: %d of %d elements out of tolerance", what, bad, m*n)
	}
}

// sbGemmCase is one GEMM: op shapes, types and leading dimensions padded
// by pad elements.
type sbGemmCase struct {
	name     string
	ta, tb   bool
	m, n, k  int
	in, out  DataType
	exact    bool // Gemm's exact: IEEE fp32, not TF32, for fp32 inputs
	tf32     bool // the reference allows TF32
	pad      int
	nanC     bool // C holds NaNs and beta is 0: C must not be read
	ep       Epilogue
	batch    int
	strideAt int // extra elements between the matrices of a batch
}

func (c sbGemmCase) dims() (rowsA, colsA, rowsB, colsB, lda, ldb, ldc int) {
	rowsA, colsA = c.m, c.k
	if c.ta {
		rowsA, colsA = c.k, c.m
	}
	rowsB, colsB = c.k, c.n
	if c.tb {
		rowsB, colsB = c.n, c.k
	}
	return rowsA, colsA, rowsB, colsB, rowsA + c.pad, rowsB + c.pad, c.m + c.pad
}

func sbTrans(ta, tb bool) string {
	s := []byte("NN")
	if ta {
		s[0] = 'T'
	}
	if tb {
		s[1] = 'T'
	}
	return string(s)
}

// sbGemm: cublasGemmEx through BLAS.Gemm, every combination of types the
// backend and cudacheck use, each transpose, padded leading dimensions.
func sbGemm(t *testing.T, h *sbDev, b *BLAS) {
	var cases []sbGemmCase
	for _, ty := range []struct {
		in, out     DataType
		exact, tf32 bool
		name        string
	}{
		{F32, F32, true, false, "f32 exact"},
		{F32, F32, false, true, "f32 tf32"},
		{BF16, F32, false, false, "bf16→f32"},
		{F16, F32, false, false, "f16→f32"},
		{BF16, BF16, false, false, "bf16→bf16"},
		{F16, F16, false, false, "f16→f16"},
	} {
		for _, tr := range [][2]bool{{false, false}, {true, false}, {false, true}, {true, true}} {
			cases = append(cases, sbGemmCase{name: ty.name + " " + sbTrans(tr[0], tr[1]), ta: tr[0], tb: tr[1], m: 37, n: 29, k: 53,
				in: ty.in, out: ty.out, exact: ty.exact, tf32: ty.tf32, pad: 3})
		}
	}
	cases = append(cases, sbGemmCase{name: "f32 beta 0 over NaN C", ta: true, m: 16, n: 8, k: 24, in: F32, out: F32, exact: true, nanC: true})
	r := rand.New(rand.NewPCG(1, 2))
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) { sbRunGemm(t, h.on(t), b, r, c) })
	}
}

func sbRunGemm(t *testing.T, h *sbDev, b *BLAS, r *rand.Rand, c sbGemmCase) {
	_, colsA, _, colsB, lda, ldb, ldc := c.dims()
	batch := max(c.batch, 1)
	sa, sb, sc := lda*colsA+c.strideAt, ldb*colsB+c.strideAt, ldc*c.n+c.strideAt
	A := h.random(r, sa*batch, c.in)
	B := h.random(r, sb*batch, c.in)
	C := h.random(r, sc*batch, c.out)
	alpha, beta := float32(1.25), float32(0.5)
	if c.nanC {
		beta = 0
		nan := make([]float32, sc*batch)
		for i := range nan {
			nan[i] = float32(math.NaN())
		}
		C = sbOperand{h.put(sbEncode(nan, c.out)), c.out, nil}
	}
	var err error
	if c.batch > 0 {
		err = b.GemmStridedBatched(c.ta, c.tb, c.m, c.n, c.k, alpha, A.p, c.in, lda, int64(sa), B.p, c.in, ldb, int64(sb), beta, C.p, c.out, ldc, int64(sc), batch, c.exact)
	} else {
		err = b.Gemm(c.ta, c.tb, c.m, c.n, c.k, alpha, A.p, c.in, lda, B.p, c.in, ldb, beta, C.p, c.out, ldc, c.exact)
	}
	if err != nil {
		t.Fatal(err)
	}
	if err := h.d.Sync(b.Stream()); err != nil {
		t.Fatal(err)
	}
	got := sbDecode(h.get(C.p, sc*batch*c.out.Size()), c.out)
	for i := range batch {
		var cv []float64
		if !c.nanC {
			cv = C.vals[i*sc:]
		}
		want, scale := sbRef(c.ta, c.tb, c.m, c.n, c.k, float64(alpha), A.vals[i*sa:], lda, B.vals[i*sb:], ldb, float64(beta), cv, ldc)
		sbCompare(t, fmt.Sprintf("C%d", i), got[i*sc:], ldc, want, scale, c.m, c.n, sbAccRel(c.k, c.tf32), c.out)
		// The padding between columns and between matrices is not written.
		if !c.nanC {
			for j := range c.n {
				for p := c.m; p < ldc; p++ {
					if g, w := got[i*sc+p+j*ldc], C.vals[i*sc+p+j*ldc]; g != w {
						t.Fatalf("C%d padding [%d,%d] = %g, was %g", i, p, j, g, w)
					}
				}
			}
			for p := ldc * c.n; p < sc; p++ {
				if g, w := got[i*sc+p], C.vals[i*sc+p]; g != w {
					t.Fatalf("the gap after C%d [%d] = %g, was %g", i, p, g, w)
				}
			}
		}
	}
}

// sbStrided: cublasGemmStridedBatchedEx, with gaps between the matrices.
func sbStrided(t *testing.T, h *sbDev, b *BLAS) {
	r := rand.New(rand.NewPCG(3, 4))
	for _, ty := range []struct {
		in, out     DataType
		exact, tf32 bool
		name        string
	}{
		{F32, F32, true, false, "f32 exact"},
		{BF16, F32, false, false, "bf16→f32"},
		{F16, F16, false, false, "f16→f16"},
	} {
		for _, tr := range [][2]bool{{false, false}, {true, false}, {false, true}, {true, true}} {
			c := sbGemmCase{name: ty.name + " " + sbTrans(tr[0], tr[1]), ta: tr[0], tb: tr[1], m: 19, n: 17, k: 23,
				in: ty.in, out: ty.out, exact: ty.exact, tf32: ty.tf32, pad: 2, batch: 3, strideAt: 5}
			t.Run(c.name, func(t *testing.T) { sbRunGemm(t, h.on(t), b, r, c) })
		}
	}
}

// sbMatmul: cuBLASLt through BLAS.Matmul, each epilogue, each combination
// of types, each transpose. The bias has D's type (cuBLASLt's default
// CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE), m elements for BIAS and for
// BGRADA's sums over k of op(A), n for BGRADB's of op(B). The auxiliary
// matrix of GELU_AUX_BIAS (the sum GELU reads, stored) and DGELU (the
// point of GELU's derivative) has D's type and layout, its leading
// dimension a multiple of 8 (AuxAlign; Matmul refuses another).
func sbMatmul(t *testing.T, h *sbDev, b *BLAS) {
	r := rand.New(rand.NewPCG(5, 6))
	for _, ep := range []Epilogue{EpilogueNone, EpilogueBias, EpilogueGelu, EpilogueGeluBias, EpilogueBiasGrad, EpilogueBiasGradA, EpilogueGeluAuxBias, EpilogueDGelu} {
		pad := 4
		if ep.usesAux() {
			pad = 8
		}
		for _, ty := range []struct{ in, out DataType }{{F32, F32}, {BF16, BF16}, {BF16, F32}, {F16, F16}, {F16, F32}} {
			for _, tr := range [][2]bool{{false, false}, {true, false}, {false, true}, {true, true}} {
				c := sbGemmCase{name: fmt.Sprintf("%s %s→%s %s", ep, ty.in, ty.out, sbTrans(tr[0], tr[1])), ta: tr[0], tb: tr[1],
					m: 24, n: 20, k: 40, in: ty.in, out: ty.out, pad: pad, ep: ep}
				t.Run(c.name, func(t *testing.T) { sbRunMatmul(t, h.on(t), b, r, c) })
			}
		}
	}
	t.Run("an auxiliary matrix's leading dimension not a multiple of 8", func(t *testing.T) {
		h := h.on(t)
		A, B, C := h.alloc(4*24*40), h.alloc(4*40*20), h.alloc(4*28*20)
		err := b.Matmul(false, false, 24, 20, 40, 1, A, F32, 24, B, F32, 40, 0, C, F32, 28, EpilogueDGelu, 0, h.alloc(4*28*20))
		if !matmulRefused(err) {
			t.Fatalf("DGELU with ldc 28: %v, want a refusal the backend does without", err)
		}
	})
	t.Run("gelu+bias f32 tf32 TN", func(t *testing.T) {
		b.AllowTF32(true)
		defer b.AllowTF32(false)
		sbRunMatmul(t, h.on(t), b, r, sbGemmCase{ta: true, m: 24, n: 20, k: 40, in: F32, out: F32, pad: 4, ep: EpilogueGeluBias, tf32: true})
	})
}

func sbRunMatmul(t *testing.T, h *sbDev, b *BLAS, r *rand.Rand, c sbGemmCase) {
	_, colsA, _, colsB, lda, ldb, ldc := c.dims()
	A := h.random(r, lda*colsA, c.in)
	B := h.random(r, ldb*colsB, c.in)
	C := h.random(r, ldc*c.n, c.out)
	alpha, beta := float32(1.25), float32(0.5)
	var bias, aux sbOperand
	nbias := c.m
	if c.ep.usesAux() {
		aux = h.random(r, ldc*c.n, c.out)
	}
	switch c.ep {
	case EpilogueBias, EpilogueGeluBias, EpilogueGeluAuxBias:
		bias = h.random(r, c.m, c.out)
	case EpilogueBiasGrad, EpilogueBiasGradA:
		// cuBLASLt documents the bias gradient as the sums alone; the
		// stand-in does not scale them by alpha, which cudacheck keeps
		// at 1 for these.
		alpha = 1
		if c.ep == EpilogueBiasGrad {
			nbias = c.n
		}
		nan := make([]float32, nbias)
		for i := range nan {
			nan[i] = float32(math.NaN()) // overwritten, not accumulated into
		}
		bias = sbOperand{h.put(sbEncode(nan, c.out)), c.out, nil}
	}
	want, scale := sbRef(c.ta, c.tb, c.m, c.n, c.k, float64(alpha), A.vals, lda, B.vals, ldb, float64(beta), C.vals, ldc)
	acc := sbAccRel(c.k, c.tf32)
	if bias.vals != nil {
		for j := range c.n {
			for i := range c.m {
				want[i+j*c.m] += bias.vals[i]
				scale[i+j*c.m] += math.Abs(bias.vals[i])
			}
		}
	}
	sum, sumScale := slices.Clone(want), slices.Clone(scale)
	if c.ep == EpilogueDGelu {
		for j := range c.n {
			for i := range c.m {
				// The derivative's error, of float's tanh and products,
				// on top of the product's (a slope of at most 1.13).
				dg := sbDGeluTanh(aux.vals[i+j*ldc])
				want[i+j*c.m] *= dg
				scale[i+j*c.m] = 1.2*scale[i+j*c.m] + 1e-6*(math.Abs(want[i+j*c.m])+1)/acc
			}
		}
	}
	if c.ep == EpilogueGelu || c.ep == EpilogueGeluBias || c.ep == EpilogueGeluAuxBias {
		for i, x := range want {
			// GELU's slope is at most 1.13: the error of x carries over
			// at most 1.2 times, plus float's tanh and products.
			want[i] = sbGeluTanh(x)
			scale[i] = 1.2*scale[i] + 1e-6*(math.Abs(x)+1)/acc
		}
	}
	if err := b.Matmul(c.ta, c.tb, c.m, c.n, c.k, alpha, A.p, c.in, lda, B.p, c.in, ldb, beta, C.p, c.out, ldc, c.ep, bias.p, aux.p); err != nil {
		t.Fatal(err)
	}
	if err := h.d.Sync(b.Stream()); err != nil {
		t.Fatal(err)
	}
	got := sbDecode(h.get(C.p, ldc*c.n*c.out.Size()), c.out)
	sbCompare(t, "D", got, ldc, want, scale, c.m, c.n, acc, c.out)
	if c.ep == EpilogueGeluAuxBias {
		sbCompare(t, "the auxiliary matrix (GELU's input)", sbDecode(h.get(aux.p, ldc*c.n*c.out.Size()), c.out), ldc, sum, sumScale, c.m, c.n, acc, c.out)
	}
	if c.ep == EpilogueBiasGrad || c.ep == EpilogueBiasGradA {
		gotBias := sbDecode(h.get(bias.p, nbias*c.out.Size()), c.out)
		wantBias, biasScale := make([]float64, nbias), make([]float64, nbias)
		for x := range nbias {
			for p := range c.k {
				var v float64
				if c.ep == EpilogueBiasGradA {
					v = sbOp(A.vals, c.ta, x, p, lda) // op(A)[x,p]
				} else {
					v = sbOp(B.vals, c.tb, p, x, ldb) // op(B)[p,x]
				}
				wantBias[x] += v
				biasScale[x] += math.Abs(v)
			}
		}
		sbCompare(t, "bias gradient", gotBias, nbias, wantBias, biasScale, nbias, 1, sbAccRel(c.k, false), c.out)
	}
}

// sbRounding: the one rounding into D's type (to nearest even, half's
// subnormals and overflow, NaN kept), the reading of half and bfloat16
// inputs (subnormals), and TF32's rounding of fp32 inputs (to nearest,
// ties away) under CUBLAS_COMPUTE_32F_FAST_TF32, through 1×1×1 GEMMs:
// D = alpha·1·1 stores alpha; D = x·1 (fp32) reads x.
func sbRounding(t *testing.T, h *sbDev, b *BLAS) {
	one := func(ty DataType) Ptr { return h.put(sbEncode([]float32{1}, ty)) }
	gemm := func(alpha float32, a, bm Ptr, in DataType, out DataType, exact bool) []byte {
		t.Helper()
		c := h.alloc(4)
		if err := b.Gemm(false, false, 1, 1, 1, alpha, a, in, 1, bm, in, 1, 0, c, out, 1, exact); err != nil {
			t.Fatal(err)
		}
		if err := h.d.Sync(b.Stream()); err != nil {
			t.Fatal(err)
		}
		return h.get(c, out.Size())
	}
	nan := float32(math.NaN())
	for _, c := range []struct {
		t     DataType
		x     float32
		want  uint16
		isNaN bool
	}{
		{F16, 1, 0x3c00, false},
		{F16, 1 + 0x1p-11, 0x3c00, false},           // a tie: to the even 1
		{F16, 1 + 3*0x1p-11, 0x3c02, false},         // a tie: to the even 1+2^-9
		{F16, 1 + 0x1p-11 + 0x1p-20, 0x3c01, false}, // past the tie: up
		{F16, 65504, 0x7bff, false},
		{F16, 65519, 0x7bff, false},
		{F16, 65520, 0x7c00, false}, // the tie past the largest: to infinity
		{F16, -1e6, 0xfc00, false},
		{F16, 0x1p-14, 0x0400, false},              // the least normal
		{F16, 0x1p-14 - 0x1p-25, 0x0400, false},    // a tie between 1023 and 1024 ulps: to 1024
		{F16, 0x1p-24, 0x0001, false},              // the least subnormal
		{F16, 0x1p-25, 0x0000, false},              // a tie: to the even 0
		{F16, 3 * 0x1p-26, 0x0001, false},          // past the tie: up
		{F16, 2.5 * 0x1p-24, 0x0002, false},        // a tie: to the even 2
		{F16, 3.5 * 0x1p-24, 0x0004, false},        // a tie: to the even 4
		{F16, -0x1p-30, 0x8000, false},             // to -0
		{F16, float32(math.Inf(1)), 0x7c00, false}, //
		{F16, nan, 0, true},
		{BF16, 1, 0x3f80, false},
		{BF16, 1 + 0x1p-8, 0x3f80, false},           // a tie: to the even 1
		{BF16, 1 + 3*0x1p-8, 0x3f82, false},         // a tie: to the even
		{BF16, 1 + 0x1p-8 + 0x1p-20, 0x3f81, false}, // past the tie: up
		{BF16, math.MaxFloat32, 0x7f80, false},      // past the largest bfloat16: infinity
		{BF16, math.Float32frombits(0x7f7f0000), 0x7f7f, false},
		{BF16, math.Float32frombits(0x00018000), 0x0002, false}, // a subnormal tie: to even
		{BF16, -0x1p-140, 0x8000, false},
		{BF16, nan, 0, true},
	} {
		got := binary.LittleEndian.Uint16(gemm(c.x, one(c.t), one(c.t), c.t, c.t, false))
		if c.isNaN {
			exp := uint16(0x7c00)
			if c.t == BF16 {
				exp = 0x7f80
			}
			if got&exp != exp || got&^(exp|0x8000) == 0 {
				t.Errorf("%s of NaN = %#04x, not a NaN", c.t, got)
			}
		} else if got != c.want {
			t.Errorf("%s of %g (%#08x) = %#04x, want %#04x", c.t, c.x, math.Float32bits(c.x), got, c.want)
		}
	}
	for _, c := range []struct {
		t    DataType
		bits uint16
		want float32
	}{
		{F16, 0x0001, 0x1p-24},
		{F16, 0x03ff, 1023 * 0x1p-24},
		{F16, 0x7bff, 65504},
		{F16, 0xc000, -2},
		{F16, 0x7c00, float32(math.Inf(1))},
		{BF16, 0x0001, math.Float32frombits(1 << 16)},
		{BF16, 0x7f7f, math.Float32frombits(0x7f7f0000)},
		{BF16, 0xbfc0, -1.5},
	} {
		x := make([]byte, 2)
		binary.LittleEndian.PutUint16(x, c.bits)
		got := math.Float32frombits(binary.LittleEndian.Uint32(gemm(1, h.put(x), one(c.t), c.t, F32, false)))
		if got != c.want {
			t.Errorf("%s %#04x reads as %g, want %g", c.t, c.bits, got, c.want)
		}
	}
	for _, c := range []struct {
		x           float32
		exact, tf32 float32
	}{
		{1 + 0x1p-12, 1 + 0x1p-12, 1},           // below TF32's half ulp: down
		{1 + 0x1p-11, 1 + 0x1p-11, 1 + 0x1p-10}, // a tie: away from zero
		{-(1 + 0x1p-11), -(1 + 0x1p-11), -(1 + 0x1p-10)},
		{1 + 0x1p-10 + 0x1p-23, 1 + 0x1p-10 + 0x1p-23, 1 + 0x1p-10},
	} {
		x := h.put(sbEncode([]float32{c.x}, F32))
		for _, exact := range []bool{true, false} {
			want := c.tf32
			if exact {
				want = c.exact
			}
			if got := math.Float32frombits(binary.LittleEndian.Uint32(gemm(1, x, one(F32), F32, F32, exact))); got != want {
				t.Errorf("%g·1 with exact=%v = %g (%#08x), want %g", c.x, exact, got, math.Float32bits(got), want)
			}
		}
	}
}

// sbBusy queues memsets of 256 MiB on s, which keep its thread busy for
// a while (tens of milliseconds): work queued after them that ran on the
// caller's thread, or out of order, would run before they end.
func sbBusy(t *testing.T, h *sbDev, s Stream) {
	t.Helper()
	big := h.alloc(64 << 20)
	for range 4 {
		if err := h.d.Memset(big, 64<<20, s); err != nil {
			t.Fatal(err)
		}
	}
}

// sbStreamOrder: the GEMMs run on the BLAS's stream after the work queued
// there before them (a memset of A behind a busy stream: with beta 1, C
// stays as it was), and the host call returns before the stream has run
// that work (a marker recorded before the call is not yet done when it
// returns; of three tries, for a machine too loaded to see it once).
func sbStreamOrder(t *testing.T, h *sbDev, b *BLAS) {
	r := rand.New(rand.NewPCG(7, 8))
	const m, n, k = 32, 16, 24
	marker, err := h.d.NewMarker()
	if err != nil {
		t.Fatal(err)
	}
	defer h.d.DestroyEvent(marker)
	for _, op := range []string{"Gemm", "GemmStridedBatched", "Matmul"} {
		t.Run(op, func(t *testing.T) {
			async := false
			for try := 0; try < 3 && !async; try++ {
				h := h.on(t)
				A := h.random(r, m*k, F32)
				B := h.random(r, k*n, F32)
				C := h.random(r, m*n, F32)
				sbBusy(t, h, b.Stream())
				if err := h.d.Memset(A.p, 4*m*k, b.Stream()); err != nil {
					t.Fatal(err)
				}
				if err := h.d.Record(marker, b.Stream()); err != nil {
					t.Fatal(err)
				}
				var err error
				switch op {
				case "Gemm":
					err = b.Gemm(false, false, m, n, k, 1, A.p, F32, m, B.p, F32, k, 1, C.p, F32, m, true)
				case "GemmStridedBatched":
					err = b.GemmStridedBatched(false, false, m, n, k, 1, A.p, F32, m, 0, B.p, F32, k, 0, 1, C.p, F32, m, 0, 1, true)
				default:
					err = b.Matmul(false, false, m, n, k, 1, A.p, F32, m, B.p, F32, k, 1, C.p, F32, m, EpilogueNone, 0, 0)
				}
				if err != nil {
					t.Fatal(err)
				}
				done, err := h.d.Done(marker)
				if err != nil {
					t.Fatal(err)
				}
				async = !done
				if err := h.d.Sync(b.Stream()); err != nil {
					t.Fatal(err)
				}
				got := sbDecode(h.get(C.p, 4*m*n), F32)
				for i := range got {
					if got[i] != C.vals[i] {
						t.Fatalf("C[%d] = %g, want %g: the GEMM read A before the memset queued before it", i, got[i], C.vals[i])
					}
				}
			}
			if !async {
				t.Errorf("three times, the stream had run the work queued before the %s when the call returned: it ran on the calling thread", op)
			}
		})
	}
}

// sbCopied: cublasLtMatmul takes alpha, beta and the descriptors at the
// call: changing them, then destroying them, while the stream has not
// yet run the matmul, changes nothing. Likewise cublasGemmEx's alpha.
func sbCopied(t *testing.T, h *sbDev, b *BLAS) {
	a := b.api
	r := rand.New(rand.NewPCG(9, 10))
	const m, n, k = 8, 6, 5
	A := h.random(r, m*k, F32)
	B := h.random(r, k*n, F32)
	C := h.random(r, m*n, F32)
	D := h.alloc(4 * m * n)
	var desc, aL, bL, cL, pref uintptr
	st := func(what string, s int32) {
		t.Helper()
		if s != 0 {
			t.Fatalf("%s: status %d", what, s)
		}
	}
	st("desc", a.ltDescCreate(&desc, cublasCompute32F, int32(F32)))
	st("A layout", a.ltLayoutCreate(&aL, int32(F32), m, k, m))
	st("B layout", a.ltLayoutCreate(&bL, int32(F32), k, n, k))
	st("C layout", a.ltLayoutCreate(&cL, int32(F32), m, n, m))
	st("pref", a.ltPrefCreate(&pref))
	ws := uint64(WorkspaceBytes)
	st("workspace pref", a.ltPrefSetAttr(pref, ltPrefMaxWorkspace, unsafe.Pointer(&ws), 8))
	var res ltHeuristic
	var got int32
	st("heuristic", a.ltHeuristic(b.lt, desc, aL, bL, cL, cL, pref, 1, &res, &got))
	if got != 1 || res.State != 0 || res.WorkspaceSize != WorkspaceBytes {
		t.Fatalf("heuristic: %d results, state %d, workspace %d; want 1, 0, %d", got, res.State, res.WorkspaceSize, WorkspaceBytes)
	}
	alpha, beta := float32(2), float32(0.5)
	sbBusy(t, h, b.Stream())
	st("cublasLtMatmul", a.ltMatmul(b.lt, desc, unsafe.Pointer(&alpha), uintptr(A.p), aL, uintptr(B.p), bL, unsafe.Pointer(&beta), uintptr(C.p), cL, uintptr(D), cL,
		&res.Algo, uintptr(b.ws), WorkspaceBytes, uintptr(b.Stream())))
	alpha, beta = 100, 100
	gelu, trans := uint32(ltEpilogueGelu), int32(cublasOpT)
	st("epilogue", a.ltDescSetAttr(desc, ltDescEpilogue, unsafe.Pointer(&gelu), 4))
	st("transa", a.ltDescSetAttr(desc, ltDescTransA, unsafe.Pointer(&trans), 4))
	for _, l := range []uintptr{aL, bL, cL} {
		st("layout destroy", a.ltLayoutDestroy(l))
	}
	st("desc destroy", a.ltDescDestroy(desc))
	st("pref destroy", a.ltPrefDestroy(pref))
	// cublasGemmEx on the same busy stream, into C, its alpha changed after.
	alpha2, beta2 := float32(-1), float32(1)
	ret := a.gemmEx(b.h, cublasOpN, cublasOpN, m, n, k, unsafe.Pointer(&alpha2), uintptr(A.p), int32(F32), m, uintptr(B.p), int32(F32), k,
		unsafe.Pointer(&beta2), uintptr(C.p), int32(F32), m, cublasCompute32FPedantic, cublasGemmDefault)
	st("cublasGemmEx", ret)
	alpha2, beta2 = 7, 7
	if err := h.d.Sync(b.Stream()); err != nil {
		t.Fatal(err)
	}
	want, scale := sbRef(false, false, m, n, k, 2, A.vals, m, B.vals, k, 0.5, C.vals, m)
	sbCompare(t, "D", sbDecode(h.get(D, 4*m*n), F32), m, want, scale, m, n, sbAccRel(k, false), F32)
	want, scale = sbRef(false, false, m, n, k, -1, A.vals, m, B.vals, k, 1, C.vals, m)
	sbCompare(t, "C", sbDecode(h.get(C.p, 4*m*n), F32), m, want, scale, m, n, sbAccRel(k, false), F32)
}

// sbStatuses: the stand-ins fail where cuBLAS does, with its statuses:
// through the bindings (BLAS checks the shapes before cuBLAS sees them),
// and through BLAS's errors.
func sbStatuses(t *testing.T, h *sbDev, b *BLAS) {
	a := b.api
	const m, n, k = 8, 6, 4
	A, B, C := h.alloc(4*m*k), h.alloc(4*k*n), h.alloc(4*m*n)
	roomyA := h.alloc(4*m*k + 256) // A at +16 still lies in it
	small := h.alloc(4 * (m*k - 1))
	host := make([]float32, m*k)
	hostP := uintptr(unsafe.Pointer(&host[0]))
	var dead uintptr
	if s := a.create(&dead); s != 0 {
		t.Fatal(s)
	}
	if s := a.destroy(dead); s != 0 {
		t.Fatal(s)
	}
	alpha, beta := float32(1), float32(0)
	type gemmArgs struct {
		h             uintptr
		ta, tb        int32
		m, n, k       int32
		a             uintptr
		at            DataType
		lda           int32
		b             uintptr
		bt            DataType
		ldb           int32
		c             uintptr
		ct            DataType
		ldc           int32
		compute, algo int32
		sa, sb, sc    int64
		batch         int32
	}
	base := gemmArgs{h: b.h, m: m, n: n, k: k, a: uintptr(A), at: F32, lda: m, b: uintptr(B), bt: F32, ldb: k, c: uintptr(C), ct: F32, ldc: m,
		compute: cublasCompute32F, algo: cublasGemmDefault}
	for _, c := range []struct {
		name    string
		edit    func(g *gemmArgs)
		batched bool
		want    int32
	}{
		{"valid", func(g *gemmArgs) {}, false, 0},
		{"valid bf16→f32", func(g *gemmArgs) { g.at, g.bt = BF16, BF16 }, false, 0},
		{"a handle never created", func(g *gemmArgs) { g.h = uintptr(unsafe.Pointer(&host[1])) }, false, 1},
		{"a destroyed handle", func(g *gemmArgs) { g.h = dead }, false, 1},
		{"no handle", func(g *gemmArgs) { g.h = 0 }, false, 1},
		{"m < 0", func(g *gemmArgs) { g.m = -1 }, false, 7},
		{"k < 0", func(g *gemmArgs) { g.k = -1 }, false, 7},
		{"transa 7", func(g *gemmArgs) { g.ta = 7 }, false, 7},
		{"lda < m", func(g *gemmArgs) { g.lda = m - 1 }, false, 7},
		{"lda < k, A transposed", func(g *gemmArgs) { g.ta, g.lda = cublasOpT, k-1 }, false, 7},
		{"ldb < k", func(g *gemmArgs) { g.ldb = k - 1 }, false, 7},
		{"ldb < n, B transposed", func(g *gemmArgs) { g.tb, g.ldb = cublasOpT, n-1 }, false, 7},
		{"ldc < m", func(g *gemmArgs) { g.ldc = m - 1 }, false, 7},
		{"A in host memory", func(g *gemmArgs) { g.a = hostP }, false, 7},
		{"A past its allocation", func(g *gemmArgs) { g.a = uintptr(small) }, false, 7},
		{"A misaligned", func(g *gemmArgs) { g.a = uintptr(A) + 2; g.m, g.lda = m-1, m-1 }, false, 7},
		{"C in host memory", func(g *gemmArgs) { g.c = hostP }, false, 7},
		{"C past its allocation", func(g *gemmArgs) { g.ldc = m + 1 }, false, 7},
		{"A f16, B bf16", func(g *gemmArgs) { g.at, g.bt = F16, BF16 }, false, 15},
		{"bf16 into f16", func(g *gemmArgs) { g.at, g.bt, g.ct = BF16, BF16, F16 }, false, 15},
		{"f32 into bf16", func(g *gemmArgs) { g.ct = BF16 }, false, 15},
		{"f64", func(g *gemmArgs) { g.at, g.bt, g.ct = F64, F64, F64 }, false, 15},
		{"type 99", func(g *gemmArgs) { g.at, g.bt = 99, 99 }, false, 15},
		{"TF32 compute on bf16", func(g *gemmArgs) { g.at, g.bt, g.compute = BF16, BF16, cublasCompute32FFastTF32 }, false, 15},
		{"compute type 12345", func(g *gemmArgs) { g.compute = 12345 }, false, 7},
		{"algo 50", func(g *gemmArgs) { g.algo = 50 }, false, 15},
		{"batched valid", func(g *gemmArgs) { g.batch = 1 }, true, 0},
		{"batched, batch < 0", func(g *gemmArgs) { g.batch = -1 }, true, 7},
		{"batched, the second A past the allocation", func(g *gemmArgs) { g.batch, g.sa = 2, m*k }, true, 7},
		{"batched, the second C past the allocation", func(g *gemmArgs) { g.batch, g.sc = 2, m*n }, true, 7},
	} {
		g := base
		c.edit(&g)
		var s int32
		if c.batched {
			s = a.gemmStridedBatchedEx(g.h, g.ta, g.tb, g.m, g.n, g.k, unsafe.Pointer(&alpha), g.a, int32(g.at), g.lda, g.sa, g.b, int32(g.bt), g.ldb, g.sb,
				unsafe.Pointer(&beta), g.c, int32(g.ct), g.ldc, g.sc, g.batch, g.compute, g.algo)
		} else {
			s = a.gemmEx(g.h, g.ta, g.tb, g.m, g.n, g.k, unsafe.Pointer(&alpha), g.a, int32(g.at), g.lda, g.b, int32(g.bt), g.ldb,
				unsafe.Pointer(&beta), g.c, int32(g.ct), g.ldc, g.compute, g.algo)
		}
		if s != c.want {
			t.Errorf("cublasGemmEx, %s: status %d (%s), want %d (%s)", c.name, s, a.name(s), c.want, a.name(c.want))
		}
	}
	if err := h.d.Sync(b.Stream()); err != nil {
		t.Fatal(err)
	}

	// cuBLASLt.
	var desc, aL, bL, cL, bfL, pref, tightPref uintptr
	st := func(what string, s int32) {
		t.Helper()
		if s != 0 {
			t.Fatalf("%s: status %d", what, s)
		}
	}
	st("desc", a.ltDescCreate(&desc, cublasCompute32F, int32(F32)))
	st("A layout", a.ltLayoutCreate(&aL, int32(F32), m, k, m))
	st("B layout", a.ltLayoutCreate(&bL, int32(F32), k, n, k))
	st("C layout", a.ltLayoutCreate(&cL, int32(F32), m, n, m))
	st("bf16 B layout", a.ltLayoutCreate(&bfL, int32(BF16), k, n, k))
	st("pref", a.ltPrefCreate(&pref))
	st("tight pref", a.ltPrefCreate(&tightPref))
	defer func() {
		for _, l := range []uintptr{aL, bL, cL, bfL} {
			a.ltLayoutDestroy(l)
		}
		a.ltDescDestroy(desc)
		a.ltPrefDestroy(pref)
		a.ltPrefDestroy(tightPref)
	}()
	ws := uint64(1 << 20)
	st("workspace pref", a.ltPrefSetAttr(pref, ltPrefMaxWorkspace, unsafe.Pointer(&ws), 8))
	var res ltHeuristic
	var got int32
	st("heuristic", a.ltHeuristic(b.lt, desc, aL, bL, cL, cL, pref, 1, &res, &got))
	if got != 1 || res.WorkspaceSize != ws {
		t.Fatalf("heuristic: %d results needing %d bytes of workspace, want 1 needing %d", got, res.WorkspaceSize, ws)
	}
	if s := a.ltHeuristic(b.lt, desc, aL, bL, cL, cL, pref, 0, &res, &got); s != 7 {
		t.Errorf("cublasLtMatmulAlgoGetHeuristic for 0 results: status %d, want 7", s)
	}
	if s := a.ltHeuristic(b.lt, desc, aL, bfL, cL, cL, pref, 1, &res, &got); s != 15 {
		t.Errorf("cublasLtMatmulAlgoGetHeuristic, A f32 and B bf16: status %d, want 15", s)
	}
	if s := a.ltHeuristic(b.lt, desc, aL, aL, cL, cL, pref, 1, &res, &got); s != 7 {
		t.Errorf("cublasLtMatmulAlgoGetHeuristic, B's rows not A's columns: status %d, want 7", s)
	}
	two := uint32(2)
	st("alignment 2", a.ltPrefSetAttr(tightPref, ltPrefMinAlignA, unsafe.Pointer(&two), 4))
	var res2 ltHeuristic
	if s := a.ltHeuristic(b.lt, desc, aL, bL, cL, cL, tightPref, 1, &res2, &got); s != 0 || got != 0 {
		t.Errorf("cublasLtMatmulAlgoGetHeuristic, f32 A aligned to 2 bytes: status %d, %d results; want 0, none", s, got)
	}
	if s := a.ltDescSetAttr(desc, ltDescTransA, unsafe.Pointer(&two), 8); s != 7 {
		t.Errorf("cublasLtMatmulDescSetAttribute of TRANSA with 8 bytes: status %d, want 7", s)
	}
	if s := a.ltPrefSetAttr(pref, ltPrefMaxWorkspace, unsafe.Pointer(&two), 4); s != 7 {
		t.Errorf("cublasLtMatmulPreferenceSetAttribute of MAX_WORKSPACE_BYTES with 4 bytes: status %d, want 7", s)
	}
	matmul := func(lt, a_, b_, c_, d_ uintptr, aLay, bLay uintptr, wsp uintptr, wsBytes uint64) int32 {
		return a.ltMatmul(lt, desc, unsafe.Pointer(&alpha), a_, aLay, b_, bLay, unsafe.Pointer(&beta), c_, cL, d_, cL,
			&res.Algo, wsp, wsBytes, uintptr(b.Stream()))
	}
	wsp := uintptr(b.ws)
	for _, c := range []struct {
		name string
		s    int32
		want int32
	}{
		{"valid", matmul(b.lt, uintptr(A), uintptr(B), uintptr(C), uintptr(C), aL, bL, wsp, ws), 0},
		{"a handle never created", matmul(uintptr(unsafe.Pointer(&host[1])), uintptr(A), uintptr(B), uintptr(C), uintptr(C), aL, bL, wsp, ws), 1},
		{"workspace below the preference's", matmul(b.lt, uintptr(A), uintptr(B), uintptr(C), uintptr(C), aL, bL, wsp, ws-1), 7},
		{"workspace in host memory", matmul(b.lt, uintptr(A), uintptr(B), uintptr(C), uintptr(C), aL, bL, hostP, ws), 7},
		{"A in host memory", matmul(b.lt, hostP, uintptr(B), uintptr(C), uintptr(C), aL, bL, wsp, ws), 7},
		{"D past its allocation", matmul(b.lt, uintptr(A), uintptr(B), uintptr(C), uintptr(small), aL, bL, wsp, ws), 7},
		{"A less aligned than the preference said", matmul(b.lt, uintptr(roomyA)+16, uintptr(B), uintptr(C), uintptr(C), aL, bL, wsp, ws), 7},
		{"B's rows not A's columns", matmul(b.lt, uintptr(A), uintptr(B), uintptr(C), uintptr(C), aL, aL, wsp, ws), 7},
		{"A f32, B bf16", matmul(b.lt, uintptr(A), uintptr(B), uintptr(C), uintptr(C), aL, bfL, wsp, ws), 15},
	} {
		if c.s != c.want {
			t.Errorf("cublasLtMatmul, %s: status %d (%s), want %d (%s)", c.name, c.s, a.name(c.s), c.want, a.name(c.want))
		}
	}
	// The bias: device memory of D's type.
	ep := uint32(ltEpilogueBias)
	st("bias epilogue", a.ltDescSetAttr(desc, ltDescEpilogue, unsafe.Pointer(&ep), 4))
	hostBias := uint64(hostP)
	st("bias pointer", a.ltDescSetAttr(desc, ltDescBiasPointer, unsafe.Pointer(&hostBias), 8))
	if s := matmul(b.lt, uintptr(A), uintptr(B), uintptr(C), uintptr(C), aL, bL, wsp, ws); s != 7 {
		t.Errorf("cublasLtMatmul, a bias in host memory: status %d, want 7", s)
	}
	devBias := uint64(A)
	st("bias pointer", a.ltDescSetAttr(desc, ltDescBiasPointer, unsafe.Pointer(&devBias), 8))
	if s := matmul(b.lt, uintptr(A), uintptr(B), uintptr(C), uintptr(C), aL, bL, wsp, ws); s != 0 {
		t.Errorf("cublasLtMatmul, a bias in device memory: status %d, want 0", s)
	}
	f16 := int32(F16)
	st("bias type", a.ltDescSetAttr(desc, 26, unsafe.Pointer(&f16), 4)) // CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE
	if s := matmul(b.lt, uintptr(A), uintptr(B), uintptr(C), uintptr(C), aL, bL, wsp, ws); s != 15 {
		t.Errorf("cublasLtMatmul, an f16 bias for an f32 D: status %d, want 15 (the stand-in takes D's type only)", s)
	}
	if err := h.d.Sync(b.Stream()); err != nil {
		t.Fatal(err)
	}

	// BLAS's errors carry cuBLAS's status, its name and its description.
	for _, c := range []struct {
		name string
		err  error
	}{
		{"Gemm, A in host memory", b.Gemm(false, false, m, n, k, 1, Ptr(hostP), F32, m, B, F32, k, 0, C, F32, m, true)},
		{"GemmStridedBatched, C past its allocation", b.GemmStridedBatched(false, false, m, n, k, 1, A, F32, m, 0, B, F32, k, 0, 0, small, F32, m, 0, 1, true)},
		{"Matmul, a bias in host memory", b.Matmul(false, false, m, n, k, 1, A, F32, m, B, F32, k, 0, C, F32, m, EpilogueBias, Ptr(hostP), 0)},
	} {
		var e *Error
		if !errors.As(c.err, &e) || e.Code != 7 || e.Name != "CUBLAS_STATUS_INVALID_VALUE" || e.Msg == "" {
			t.Errorf("%s: %v; want an *Error with CUBLAS_STATUS_INVALID_VALUE (7) and its description", c.name, c.err)
		} else if !strings.Contains(c.err.Error(), "CUBLAS_STATUS_INVALID_VALUE (7)") {
			t.Errorf("%s: %q does not name the status", c.name, c.err)
		}
	}
	if err := h.d.Sync(b.Stream()); err != nil {
		t.Fatal(err)
	}
}
