package cuda_test

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/gptui/gptui/kernels"
	"github.com/gptui/gptui/kernels/cuda"
	"github.com/gptui/gptui/kernels/cuda/emu"
)

// Flash attention (kernels/flashattention.cu) rounds q, k, v, dout, P and
// dS to bf16 (8 significant bits) and accumulates in fp32, so it is held
// to bf16 tolerances against the float64 reference, not attention.cu's
// 1e-5: the relative L2 error of each tensor and its largest absolute
// error relative to its largest magnitude (attErr). Measured on the
// emulator over every case of TestFlashAttention at every limit (hs 64 and
// 128 alike), L2 and max: out 2.8e-3, 4.1e-3; lse 2.2e-4, 1.0e-3; dq
// 4.2e-3, 6.4e-3; dk 4.2e-3, 5.5e-3; dv 3.1e-3, 3.3e-3; the whole dqkv
// 3.7e-3, 3.5e-3 — bf16's unit roundoff is 2⁻⁹ ≈ 2e-3. The tolerances
// leave room for a GPU's other order of summation; a causal mask dropped
// on the diagonal gives errors of order 1.
const (
	flashTolL2  = 1e-2
	flashTolMax = 2e-2
)

func flashCheckClose(t *testing.T, name string, got, want []float32) {
	t.Helper()
	l2, mx := attErr(got, want)
	t.Logf("%s: L2 relative %.3g, max abs / max |ref| %.3g", name, l2, mx)
	if !(l2 <= flashTolL2 && mx <= flashTolMax) {
		t.Errorf("%s: L2 relative error %.3g, max abs error %.3g of the largest value (tolerance %g, %g)", name, l2, mx, flashTolL2, flashTolMax)
	}
}

// flashCheckDQKV checks dq, dk, dv and the whole of dqkv (B·T rows of
// (NH+2·NKV)·hs) against the reference.
func flashCheckDQKV(t *testing.T, name string, got, want []float32, B, T, NH, NKV, hs int) {
	t.Helper()
	ld, C := (NH+2*NKV)*hs, NH*hs
	for _, part := range []struct {
		name   string
		lo, hi int
	}{{"dq", 0, C}, {"dk", C, C + NKV*hs}, {"dv", C + NKV*hs, ld}} {
		var g, w []float32
		for n := 0; n < B*T; n++ {
			g = append(g, got[n*ld+part.lo:n*ld+part.hi]...)
			w = append(w, want[n*ld+part.lo:n*ld+part.hi]...)
		}
		flashCheckClose(t, name+" "+part.name, g, w)
	}
	flashCheckClose(t, name+" dqkv", got, want)
}

// TestFlashVariants checks the flash kernels' shared memory (the figures
// flashattention.go's comment gives) and the tiles chosen at each limit:
// the largest that fits, and every one fitting its limit.
func TestFlashVariants(t *testing.T) {
	sizes := map[string]int{
		"fwd hs64 128×64": 55296, "fwd hs128 128×64": 69632,
		"bwd hs64 64×64": 65536, "bwd hs128 64×64": 79360,
	}
	for k, want := range sizes {
		var hs, q, kk int
		var dir string
		fmt.Sscanf(strings.NewReplacer("×", " ", "hs", "").Replace(k), "%s %d %d %d", &dir, &hs, &q, &kk)
		got := cuda.FlashForwardShared(hs, cuda.AttTile{Q: q, K: kk})
		if dir == "bwd" {
			got = cuda.FlashBackwardShared(hs, cuda.AttTile{Q: q, K: kk})
		}
		if got != want {
			t.Errorf("%s: %d bytes, want %d", k, got, want)
		}
	}
	want := map[string][2]string{ // by limit: hs 64's forward and backward functions, then hs 128's
		"96KiB_V100":  {"q128k64 q64k64", "q128k64 q64k64"},
		"99KiB_L40S":  {"q128k64 q64k64", "q128k64 q64k64"},
		"163KiB_A100": {"q128k64 q64k64", "q128k64 q64k64"},
		"227KiB_H100": {"q128k64 q64k64", "q128k64 q64k64"},
	}
	for _, lim := range sharedLimits {
		v, err := cuda.SelectVariants(lim.attrs)
		if err != nil {
			t.Fatal(err)
		}
		for i, hs := range []int{64, 128} {
			c, ok := v.Flash(hs)
			if !ok {
				t.Errorf("%s: no flash kernels for hs %d", lim.name, hs)
				continue
			}
			got := strings.TrimPrefix(c.Forward.Function, fmt.Sprintf("flash_attn_forward_hs%d_", hs)) + " " +
				strings.TrimPrefix(c.Backward.Function, fmt.Sprintf("flash_attn_backward_hs%d_", hs))
			if got != want[lim.name][i] {
				t.Errorf("%s hs %d: %s, want %s", lim.name, hs, got, want[lim.name][i])
			}
			if c.Forward.Shared > v.SharedLimit() || c.Backward.Shared > v.SharedLimit() {
				t.Errorf("%s hs %d: %d and %d bytes do not fit %d", lim.name, hs, c.Forward.Shared, c.Backward.Shared, v.SharedLimit())
			}
		}
		if _, ok := v.Flash(80); ok {
			t.Errorf("%s: flash kernels for hs 80", lim.name)
		}
	}
	names := map[string]bool{}
	for _, n := range cuda.FlashKernelNames() {
		names[n] = true
	}
	prog := emuProgram(t)
	for n := range names {
		if !strings.Contains(" "+strings.Join(prog.Names(), " ")+" ", " "+n+" ") {
			t.Errorf("kernel %s of FlashKernelNames is not in Source", n)
		}
	}
	for _, n := range prog.Names() {
		if strings.HasPrefix(n, "flash_") && !names[n] {
			t.Errorf("kernel %s of Source is not in FlashKernelNames", n)
		}
	}
}

// TestFlashAttention runs the flash forward and backward kernels under
// each device's shared-memory limit (the emulator refusing a launch above
// it, as the GPU would), on the tiles chosen there, against gqaRef64 in
// float64: head sizes 64 and 128, multi-head (GPT-2: NKV = NH) and grouped
// (NH 8, NKV 2) attention, T 80 (not a multiple of any tile) and 128 (a
// multiple of every tile), B 2. Every limit runs each head size with
// multi-head and grouped attention and T 80 and 128, in a Latin square
// that alternates from one limit to the next, so the limits with the same
// tiles (96 and 99 KiB, 163 and 227 KiB) run all eight combinations
// between them (all eight take twice as long). The backward pass reads the
// flash forward pass's out and lse. Checked: out, lse, and dq, dk, dv and
// the whole dqkv, which is overwritten (it starts as garbage).
func TestFlashAttention(t *testing.T) {
	type tc struct{ B, T, NH, NKV, hs int }
	for i, lim := range sharedLimits {
		// (hs 64: MHA at one T, GQA at the other; hs 128 the other way)
		T1, T2 := 80, 128
		if i%2 == 1 {
			T1, T2 = T2, T1
		}
		cases := []tc{
			{B: 2, T: T1, NH: 2, NKV: 2, hs: 64}, {B: 2, T: T2, NH: 8, NKV: 2, hs: 64},
			{B: 2, T: T2, NH: 2, NKV: 2, hs: 128}, {B: 2, T: T1, NH: 8, NKV: 2, hs: 128},
		}
		t.Run(lim.name, func(t *testing.T) {
			m, k, v := variantMachine(t, lim.attrs)
			for _, hs := range []int{64, 128} {
				c, _ := v.Flash(hs)
				t.Logf("hs %d: %s (%d B), %s (%d B)", hs, c.Forward.Function, c.Forward.Shared, c.Backward.Function, c.Backward.Shared)
			}
			var checks []func()
			for _, c := range cases {
				name := fmt.Sprintf("B%d_T%d_NH%d_NKV%d_hs%d", c.B, c.T, c.NH, c.NKV, c.hs)
				B, T, NH, NKV, hs := c.B, c.T, c.NH, c.NKV, c.hs
				ld, C := (NH+2*NKV)*hs, NH*hs
				r := rand.New(rand.NewPCG(uint64(B*T), uint64(NH*NKV*hs)))
				qkv, dout := attRandom(r, B*T*ld), attRandom(r, B*T*C)
				gqkv, gdout := m.Float32s(qkv), m.Float32s(dout)
				gout, glse := m.Alloc(4*B*T*C), m.Alloc(4*B*NH*T)
				gdelta := m.Alloc(4 * cuda.FlashDeltaFloats(B, NH, T))
				gdqkv := m.Float32s(attRandom(r, B*T*ld)) // overwritten, not added to
				must(t, k.FlashGQAForward(0, gout, glse, gqkv, B, T, NH, NKV, hs))
				must(t, k.FlashGQABackward(0, gdqkv, gdout, gout, gqkv, glse, gdelta, 0, B, T, NH, NKV, hs))
				checks = append(checks, func() {
					out, lse, dqkv := gqaRef64(qkv, dout, B, T, NH, NKV, hs, kernels.Dropout{}, 0)
					flashCheckClose(t, name+" out", m.ReadFloat32s(gout, B*T*C), out)
					flashCheckClose(t, name+" lse", m.ReadFloat32s(glse, B*NH*T), lse)
					flashCheckDQKV(t, name, m.ReadFloat32s(gdqkv, B*T*ld), dqkv, B, T, NH, NKV, hs)
				})
			}
			run(t, m)
			for _, c := range checks {
				c()
			}
		})
	}
}

// TestFlashAttentionInterop checks that each family's backward pass takes
// the other's forward output (the same out and lse): attention.cu's
// backward after the flash forward, and the flash backward after
// attention.cu's forward, on grouped heads at hs 64.
func TestFlashAttentionInterop(t *testing.T) {
	const B, T, NH, NKV, hs = 1, 80, 4, 2, 64
	ld, C := (NH+2*NKV)*hs, NH*hs
	r := rand.New(rand.NewPCG(3, 7))
	qkv, dout := attRandom(r, B*T*ld), attRandom(r, B*T*C)
	out, lse, dqkv := gqaRef64(qkv, dout, B, T, NH, NKV, hs, kernels.Dropout{}, 0)
	m, k, _ := variantMachine(t, attrsA100)
	gqkv, gdout := m.Float32s(qkv), m.Float32s(dout)
	fout, flse, aout, alse := m.Alloc(4*B*T*C), m.Alloc(4*B*NH*T), m.Alloc(4*B*T*C), m.Alloc(4*B*NH*T)
	d1, d2 := m.Alloc(4*B*T*ld), m.Alloc(4*B*T*ld)
	must(t, k.FlashGQAForward(0, fout, flse, gqkv, B, T, NH, NKV, hs))
	must(t, k.GQABackward(0, d1, gdout, fout, gqkv, flse, 0, B, T, NH, NKV, hs, 0, 0, 0, 0, 0))
	must(t, k.GQAForward(0, aout, alse, gqkv, B, T, NH, NKV, hs, 0, 0, 0, 0, 0))
	must(t, k.FlashGQABackward(0, d2, gdout, aout, gqkv, alse, m.Alloc(4*cuda.FlashDeltaFloats(B, NH, T)), 0, B, T, NH, NKV, hs))
	run(t, m)
	flashCheckClose(t, "flash out", m.ReadFloat32s(fout, B*T*C), out)
	flashCheckClose(t, "flash lse", m.ReadFloat32s(flse, B*NH*T), lse)
	attCheckClose(t, "fp32 out", m.ReadFloat32s(aout, B*T*C), out)
	flashCheckDQKV(t, "fp32 backward of the flash forward", m.ReadFloat32s(d1, B*T*ld), dqkv, B, T, NH, NKV, hs)
	flashCheckDQKV(t, "flash backward of the fp32 forward", m.ReadFloat32s(d2, B*T*ld), dqkv, B, T, NH, NKV, hs)
}

// tcSource exercises the emulator's tensor-core and copy instructions
// (emu/src/cuda_emu.h): mma.m16n8k16 and ldmatrix.x4 in PTX's fragment
// layouts, cp.async, the conversions to bf16 and fp16, and the misuses the
// emulator must refuse.
const tcSource = `
// mma16816: d (16×8, row-major) = a (16×16, row-major) · b (16×8,
// row-major) + c (16×8) through emu_mma_m16n8k16_bf16, each lane placing
// its elements by the PTX ISA's fragment table, element by element
// (the emulator finds them lane by lane): a's element i of 8 at row
// g + 8·((i / 2) % 2), column 2t + i % 2 + 8·(i / 4); b's element i of 4
// at row 2t + i % 2 + 8·(i / 2), column g; d's element i at row
// g + 8·(i / 2), column 2t + i % 2. d is written back the same way.
extern "C" __global__ void mma16816(float* d, const float* a, const float* b, const float* c) {
	const int g = threadIdx.x >> 2, t = threadIdx.x & 3;
	unsigned af[4] = {0, 0, 0, 0}, bf[2] = {0, 0};
	for (int i = 0; i < 8; i++) {
		const int r = g + 8 * ((i / 2) % 2), k = 2 * t + i % 2 + 8 * (i / 4);
		af[i / 2] |= (unsigned)__float2bfloat16(a[r * 16 + k]).__x << (16 * (i % 2));
	}
	for (int i = 0; i < 4; i++) {
		const int k = 2 * t + i % 2 + 8 * (i / 2);
		bf[i / 2] |= (unsigned)__float2bfloat16(b[k * 8 + g]).__x << (16 * (i % 2));
	}
	float acc[4];
	for (int i = 0; i < 4; i++) acc[i] = c[(g + 8 * (i / 2)) * 8 + 2 * t + i % 2];
	emu_mma_m16n8k16_bf16(acc, af, bf[0], bf[1]);
	for (int i = 0; i < 4; i++) d[(g + 8 * (i / 2)) * 8 + 2 * t + i % 2] = acc[i];
}

// ldsm: emu_ldmatrix_x4 of a 16×16 bf16 matrix holding 16·row + column
// at row stride 24, matrix m at rows 8·(m % 2), columns 8·(m / 2) (lane
// 8m + i gives its row i); out[4·lane + m] is the lane's register m.
extern "C" __global__ void ldsm(unsigned* out, int trans) {
	__align__(16) __shared__ __nv_bfloat16 M[16 * 24];
	for (int i = threadIdx.x; i < 16 * 24; i += 32) M[i] = __float2bfloat16((float)(16 * (i / 24) + i % 24));
	__syncwarp();
	const int m = threadIdx.x >> 3, i = threadIdx.x & 7;
	unsigned r[4];
	emu_ldmatrix_x4(r, &M[(8 * (m % 2) + i) * 24 + 8 * (m / 2)], trans != 0);
	for (int k = 0; k < 4; k++) out[4 * threadIdx.x + k] = r[k];
}

// cpasync: each thread copies in[thread] into fresh dynamic shared memory
// with cp.async and reads it back, after waiting for it or not.
extern "C" __global__ void cpasync(float* out, const float* in, int wait) {
	extern __shared__ __align__(128) float sh[];
	emu_cp_async(&sh[threadIdx.x], &in[threadIdx.x], 4);
	emu_cp_async_commit();
	if (wait) emu_cp_async_wait(0);
	out[blockIdx.x * blockDim.x + threadIdx.x] = sh[threadIdx.x];
}

// ldsm_misaligned: emu_ldmatrix_x4 from a row 8 bytes off 16-byte alignment.
extern "C" __global__ void ldsm_misaligned(float* out) {
	__align__(16) __shared__ __nv_bfloat16 M[16 * 24];
	unsigned r[4];
	emu_ldmatrix_x4(r, &M[(threadIdx.x & 7) * 24 + 4], false);
	out[threadIdx.x] = (float)r[0];
}

// mma_partial: emu_mma_m16n8k16_bf16 by half a warp.
extern "C" __global__ void mma_partial(float* out) {
	float acc[4] = {0, 0, 0, 0};
	const unsigned a[4] = {0, 0, 0, 0};
	emu_mma_m16n8k16_bf16(acc, a, 0u, 0u);
	out[threadIdx.x] = acc[0];
}

// cvt: float → bf16 and fp16 → float, round to nearest even.
extern "C" __global__ void cvt(float* bf, float* hf, const float* x, int n) {
	for (int i = threadIdx.x; i < n; i += blockDim.x) {
		bf[i] = __bfloat162float(__float2bfloat16(x[i]));
		hf[i] = __half2float(__float2half(x[i]));
	}
}
`

// roundBF16 and roundF16 round to nearest even (finite inputs).
func roundBF16(x float32) float32 {
	u := math.Float32bits(x)
	u += 0x7fff + (u>>16)&1
	return math.Float32frombits(u &^ 0xffff)
}

func roundF16(x float32) float32 {
	if x == 0 {
		return x
	}
	_, e := math.Frexp(float64(x))
	ulp := math.Ldexp(1, max(e-11, -24)) // 11 significant bits; denormals below 2⁻¹⁴
	return float32(math.RoundToEven(float64(x)/ulp) * ulp)
}

// TestEmuTensorCore checks the emulator's tensor-core and copy
// instructions: mma.m16n8k16 with its fragments placed by PTX's table
// against float64 (the products exact, the sums in fp32: within 1e-6 of
// the sum's magnitude), ldmatrix.x4 with and without .trans, cp.async read
// before and after its wait, the round-to-nearest-even conversions, and
// that it refuses a partial warp and a misaligned row.
func TestEmuTensorCore(t *testing.T) {
	if _, err := exec.LookPath("g++"); err != nil {
		t.Skip("g++ is not installed")
	}
	prog, err := emu.Build(context.Background(), t.TempDir(), tcSource, emu.Options{Sanitize: os.Getenv("GPTUI_EMU_SANITIZE") != "", CacheDir: emu.DefaultCacheDir()})
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(1, 2))
	A, B, C := attRandom(r, 256), attRandom(r, 128), attRandom(r, 128)

	// mma.m16n8k16 (bf16) in the PTX fragment layout: 16×8 of d against
	// float64, the products exact, the sums in fp32.
	{
		m := prog.NewMachine()
		f, err := m.Lookup("mma16816")
		if err != nil {
			t.Fatal(err)
		}
		b8, c8 := B, C
		d := m.Alloc(4 * 128)
		must(t, m.Launch(f, cuda.Dim3{X: 1, Y: 1, Z: 1}, cuda.Dim3{X: 32, Y: 1, Z: 1}, 0, 0, d, m.Float32s(A), m.Float32s(b8), m.Float32s(c8)))
		run(t, m)
		got := m.ReadFloat32s(d, 128)
		var worst float64
		for i := 0; i < 16; i++ {
			for j := 0; j < 8; j++ {
				want, mag := float64(c8[i*8+j]), math.Abs(float64(c8[i*8+j]))
				for k := 0; k < 16; k++ {
					p := float64(roundBF16(A[i*16+k])) * float64(roundBF16(b8[k*8+j]))
					want += p
					mag += math.Abs(p)
				}
				worst = max(worst, math.Abs(float64(got[i*8+j])-want)/mag)
			}
		}
		t.Logf("mma.m16n8k16 bf16: largest error %.3g of the terms' magnitude", worst)
		if !(worst <= 1e-6) {
			t.Errorf("mma.m16n8k16 bf16: error %.3g of the terms' magnitude, want ≤ 1e-6", worst)
		}
	}

	// ldmatrix.x4: lane 4g+t gets row g, columns 2t, 2t+1 of each matrix
	// (.trans: rows 2t, 2t+1 of column g), the first in the lower half.
	for _, trans := range []int32{0, 1} {
		m := prog.NewMachine()
		f, err := m.Lookup("ldsm")
		if err != nil {
			t.Fatal(err)
		}
		out := m.Alloc(4 * 128)
		must(t, m.Launch(f, cuda.Dim3{X: 1, Y: 1, Z: 1}, cuda.Dim3{X: 32, Y: 1, Z: 1}, 0, 0, out, trans))
		run(t, m)
		raw := m.ReadUint16s(out, 256)
		got := make([]uint32, 128)
		for i := range got {
			got[i] = uint32(raw[2*i]) | uint32(raw[2*i+1])<<16
		}
		for l := 0; l < 32; l++ {
			g, tg := l/4, l%4
			for mat := 0; mat < 4; mat++ {
				r0, c0 := 8*(mat%2), 8*(mat/2)
				at := func(r, c int) uint32 { return uint32(math.Float32bits(float32(16*(r0+r)+c0+c)) >> 16) }
				want := at(g, 2*tg) | at(g, 2*tg+1)<<16
				if trans == 1 {
					want = at(2*tg, g) | at(2*tg+1, g)<<16
				}
				if got[4*l+mat] != want {
					t.Errorf("ldmatrix trans=%d: lane %d register %d = %#x, want %#x", trans, l, mat, got[4*l+mat], want)
				}
			}
		}
	}

	// cp.async: waited for, every block reads the copies; not waited for,
	// block 0 (even: copies land at the wait) reads the NaN that was
	// there, block 1 (odd: they land at once) the copies.
	for _, wait := range []int32{1, 0} {
		m := prog.NewMachine()
		f, err := m.Lookup("cpasync")
		if err != nil {
			t.Fatal(err)
		}
		in := make([]float32, 32)
		for i := range in {
			in[i] = float32(i + 1)
		}
		out := m.Alloc(4 * 64)
		must(t, m.Launch(f, cuda.Dim3{X: 2, Y: 1, Z: 1}, cuda.Dim3{X: 32, Y: 1, Z: 1}, 128, 0, out, m.Float32s(in), wait))
		run(t, m)
		got := m.ReadFloat32s(out, 64)
		for i, v := range got {
			stale := wait == 0 && i < 32
			if stale != math.IsNaN(float64(v)) || !stale && v != in[i%32] {
				t.Errorf("cp.async wait=%d: block %d thread %d read %v", wait, i/32, i%32, v)
			}
		}
	}

	// Conversions: ties to even, and past the last bits.
	x := []float32{1, 1 + 1.0/256, 1 + 3.0/256, 1 + 1.0/256 + 1.0/65536, -2.5e-3, 65504, 1e-7, 3.14159265}
	m := prog.NewMachine()
	bf, hf := m.Alloc(4*len(x)), m.Alloc(4*len(x))
	f, _ := m.Lookup("cvt")
	must(t, m.Launch(f, cuda.Dim3{X: 1, Y: 1, Z: 1}, cuda.Dim3{X: 32, Y: 1, Z: 1}, 0, 0, bf, hf, m.Float32s(x), int32(len(x))))
	run(t, m)
	gb, gh := m.ReadFloat32s(bf, len(x)), m.ReadFloat32s(hf, len(x))
	for i, v := range x {
		if gb[i] != roundBF16(v) || gh[i] != roundF16(v) {
			t.Errorf("convert %v: bf16 %v, fp16 %v; want %v, %v", v, gb[i], gh[i], roundBF16(v), roundF16(v))
		}
	}

	// Misuses end the run with a message.
	for _, tc := range []struct {
		kernel  string
		threads uint32
		want    string
	}{
		{"mma_partial", 16, "16 of the warp's 32 lanes"},
		{"ldsm_misaligned", 32, "not 16-byte aligned"},
	} {
		m := prog.NewMachine()
		f, _ := m.Lookup(tc.kernel)
		must(t, m.Launch(f, cuda.Dim3{X: 1, Y: 1, Z: 1}, cuda.Dim3{X: tc.threads, Y: 1, Z: 1}, 0, 0, m.Alloc(4*32)))
		err := m.Run(context.Background())
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s on %d threads: %v; want an error saying %q", tc.kernel, tc.threads, err, tc.want)
		}
	}
}

// TestFlashAttentionBF16: the flash kernels with bfloat16 activations —
// qkv, out, dout and dqkv stored as bfloat16, dq accumulated in a float32
// buffer and stored into dqkv once — against gqaRef64 on the same
// (rounded) inputs, within the flash kernels' bf16 tolerance, at head
// sizes 64 and 128 on an H100's tiles and an A100's; dqkv is overwritten.
func TestFlashAttentionBF16(t *testing.T) {
	const B, T, NH, NKV = 2, 80, 8, 2
	for _, lim := range []struct {
		name  string
		attrs cuda.DeviceAttrs
	}{{"H100", attrsH100}, {"A100", attrsA100}} {
		for _, hs := range []int{64, 128} {
			t.Run(fmt.Sprintf("%s/hs%d", lim.name, hs), func(t *testing.T) {
				m, k, _ := variantMachine(t, lim.attrs)
				ld, C := (NH+2*NKV)*hs, NH*hs
				r := rand.New(rand.NewPCG(uint64(hs), 5))
				qkv, dout := attRandom(r, B*T*ld), attRandom(r, B*T*C)
				kernels.RoundBF16(qkv)
				kernels.RoundBF16(dout)
				bf := func(x []float32) cuda.BF16Ptr { return cuda.BF16Ptr(m.Uint16s(toBF16(x))) }
				gqkv, gdout := bf(qkv), bf(dout)
				gout, gdqkv := bf(make([]float32, B*T*C)), bf(attRandom(r, B*T*ld)) // dqkv overwritten
				glse, gdelta, gdq := m.Alloc(4*B*NH*T), m.Alloc(4*cuda.FlashDeltaFloats(B, NH, T)), m.Alloc(4*B*T*C)
				must(t, k.FlashGQAForward(0, gout, glse, gqkv, B, T, NH, NKV, hs))
				must(t, k.FlashGQABackward(0, gdqkv, gdout, gout, gqkv, glse, gdelta, gdq, B, T, NH, NKV, hs))
				run(t, m)
				out, lse, dqkv := gqaRef64(qkv, dout, B, T, NH, NKV, hs, kernels.Dropout{}, 0)
				flashCheckClose(t, "out", fromBF16(m.ReadUint16s(cuda.Ptr(gout), B*T*C)), out)
				flashCheckClose(t, "lse", m.ReadFloat32s(glse, B*NH*T), lse)
				flashCheckDQKV(t, "dqkv", fromBF16(m.ReadUint16s(cuda.Ptr(gdqkv), B*T*ld)), dqkv, B, T, NH, NKV, hs)
			})
		}
	}
}
