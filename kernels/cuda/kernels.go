package cuda

import (
	"fmt"
	"math"
	"sync"
)

// Kernels launches the engine's kernels (the sources of [Source]) with
// their launch geometry. Each method takes the stream first, then device
// pointers and sizes, checks the sizes, and queues one or more launches on
// the stream; like every CUDA launch, it returns before the kernel runs,
// and an error reports a bad argument or a failed launch, never a result.
//
// Launch geometry is computed by pure functions of the sizes (the *Geometry
// functions), so the emulator tests run exactly the grids a GPU gets.
// Kernels is safe for concurrent use if its Launcher is.
type Kernels struct {
	l      Launcher
	lookup func(name string) (Function, error)
	v      *Variants // read only

	mu sync.Mutex
	fn map[string]Function
}

// NewKernels looks up every kernel of [KernelNames] with lookup (a loaded
// module's cuModuleGetFunction, or the emulator's table) and returns the
// Kernels launching them through l, with [DefaultVariants] (the 64×64
// attention tiles an H100 fits).
func NewKernels(l Launcher, lookup func(name string) (Function, error)) (*Kernels, error) {
	return NewKernelsFor(l, lookup, DefaultVariants())
}

// NewKernelsFor is NewKernels launching the kernel variants v chose
// ([SelectVariants]); it looks up none of the variants v did not choose.
func NewKernelsFor(l Launcher, lookup func(name string) (Function, error), v *Variants) (*Kernels, error) {
	if v == nil {
		return nil, fmt.Errorf("cuda: NewKernelsFor without variants")
	}
	k := &Kernels{l: l, lookup: lookup, v: v, fn: map[string]Function{}}
	for _, name := range KernelNames() {
		if !v.needs(name) {
			continue // a variant v did not choose, maybe not compiled
		}
		f, err := lookup(name)
		if err != nil {
			return nil, fmt.Errorf("cuda: kernel %s: %w", name, err)
		}
		k.fn[name] = f
	}
	return k, nil
}

// launch starts kernel name. A name missing from KernelNames is looked up
// on first use and remembered.
func (k *Kernels) launch(name string, grid, block Dim3, shared int, s Stream, args ...any) error {
	k.mu.Lock()
	f, ok := k.fn[name]
	if !ok {
		var err error
		if f, err = k.lookup(name); err != nil {
			k.mu.Unlock()
			return fmt.Errorf("cuda: kernel %s: %w", name, err)
		}
		k.fn[name] = f
	}
	k.mu.Unlock()
	if err := k.l.Launch(f, grid, block, shared, s, args...); err != nil {
		return fmt.Errorf("cuda: launching %s: %w", name, err)
	}
	return nil
}

// kernelNames are the kernels of this file's methods, in source order.
var kernelNames = []string{
	"encoder_forward", "encoder_backward",
	"layernorm_forward", "layernorm_backward",
	"bias_add", "bias_store", "bias_backward", "cast_f32_bf16", "cast_f32_f16", "cast_bf16_f32", "cast_f16_f32",
	"gelu_forward", "gelu_backward", "bias_gelu_store",
	"residual_forward", "scale",
	"dropout_forward",
	"cross_entropy", "classifier_max", "classifier_global_max", "classifier_exp", "classifier_finish",
	"adamw",
	"sum_partial", "sum_finish", "non_finite",
}

// KernelNames returns the name of every kernel the Kernels methods launch
// (the `extern "C" __global__` functions of [Source]).
func KernelNames() []string {
	names := append(append([]string(nil), kernelNames...), attentionKernelNames()...)
	for _, more := range [][]string{llamaKernelNames, ringKernelNames, fusedKernelNames, flashKernelNames} {
		names = append(names, more...)
	}
	return names
}

// Launch geometry.

const (
	ewThreads   = 256   // threads per block of elementwise kernels
	ewMaxBlocks = 16384 // grid-stride loops cover the rest
	rowThreads  = 256   // layernorm_forward: 8 warps, a row each
	lnbThreads  = 512   // layernorm_backward: 16 warps
	lnbRows     = 32    // rows per block of layernorm_backward, at least
	lnbMaxGrid  = 1024  // layernorm_backward's most blocks
	clsThreads  = 512   // classifier kernels: one block per row
	bbRows      = 256   // bias_backward's rows per block (matmul.cu BB_ROWS)
	normThreads = 512   // sum_partial
	normBlocks  = 1024  // sum_partial's most blocks
	normPerThr  = 8     // elements per thread before another block is added
)

// SumScratch is the size in bytes of the scratch Sum needs: one double
// per block of its first kernel.
const SumScratch = normBlocks * 8

// ElementwiseGeometry is the launch shape of a grid-stride kernel over work
// items (elements, or float4s plus the scalar tail).
func ElementwiseGeometry(work int64) (grid, block Dim3) {
	b := (work + ewThreads - 1) / ewThreads
	b = min(max(b, 1), ewMaxBlocks)
	return Dim3{uint32(b), 1, 1}, Dim3{ewThreads, 1, 1}
}

// vecWork is the number of work items of a kernel over n elements: n/4
// float4s and n%4 scalars when vec, else n.
func vecWork(n int64, vec bool) int64 {
	if vec {
		return n/4 + n%4
	}
	return n
}

// LayerNormForwardGeometry is one warp per row, 8 rows per block.
func LayerNormForwardGeometry(N int) (grid, block Dim3) {
	w := rowThreads / 32
	return Dim3{uint32((N + w - 1) / w), 1, 1}, Dim3{rowThreads, 1, 1}
}

// LayerNormBackwardGeometry is 16 warps per block, each block at least
// lnbRows rows, at most lnbMaxGrid blocks (they walk the rows grid-stride),
// and LayerNormBackwardShared(C) bytes of dynamic shared memory.
func LayerNormBackwardGeometry(N, C int) (grid, block Dim3, shared int) {
	g := min(max((N+lnbRows-1)/lnbRows, 1), lnbMaxGrid)
	return Dim3{uint32(g), 1, 1}, Dim3{lnbThreads, 1, 1}, LayerNormBackwardShared(C)
}

// LayerNormBackwardShared is layernorm_backward's dynamic shared memory for
// C channels: the block's dw and dbias partial sums. Above 48 KiB (C >
// 6144) the backend must raise the function's limit before launching it.
func LayerNormBackwardShared(C int) int { return 2 * C * 4 }

// BiasBackwardGeometry is blocks of 32 columns × 16 threads, bbRows rows
// per block.
func BiasBackwardGeometry(N, OC int) (grid, block Dim3) {
	return Dim3{uint32((OC + 31) / 32), uint32((N + bbRows - 1) / bbRows), 1}, Dim3{32, 16, 1}
}

// ClassifierGeometry is one block of clsThreads per row.
func ClassifierGeometry(N int) (grid, block Dim3) {
	return Dim3{uint32(N), 1, 1}, Dim3{clsThreads, 1, 1}
}

// SumGeometry is the first kernel's grid: a fixed function of n, so the
// order of the sum is too.
func SumGeometry(n int64) (grid, block Dim3) {
	b := (n + normThreads*normPerThr - 1) / (normThreads * normPerThr)
	b = min(max(b, 1), normBlocks)
	return Dim3{uint32(b), 1, 1}, Dim3{normThreads, 1, 1}
}

// aligned reports whether every pointer is a multiple of a bytes (a null
// pointer is).
func aligned(a uintptr, ps ...Ptr) bool {
	for _, p := range ps {
		if uintptr(p)%a != 0 {
			return false
		}
	}
	return true
}

func flag(b bool) int32 {
	if b {
		return 1
	}
	return 0
}

// checkSizes returns an error unless every size is at least 0 and their
// product fits the kernels' indices.
func checkSizes(op string, sizes ...int) error {
	p := int64(1)
	for _, n := range sizes {
		if n < 0 || n > math.MaxInt32 {
			return fmt.Errorf("cuda: %s: size %d out of range (0 to %d)", op, n, math.MaxInt32)
		}
		p *= int64(n)
		if p > 1<<46 {
			return fmt.Errorf("cuda: %s: sizes %v too large", op, sizes)
		}
	}
	return nil
}

// elementwise launches a grid-stride kernel over n elements; args follow
// the pointers and n as the kernel takes them, the vec flag last.
func (k *Kernels) elementwise(name string, s Stream, n int, vec bool, args ...any) error {
	if n < 0 {
		return fmt.Errorf("cuda: %s of %d elements", name, n)
	}
	if n == 0 {
		return nil
	}
	grid, block := ElementwiseGeometry(vecWork(int64(n), vec))
	return k.launch(name, grid, block, 0, s, append(args, flag(vec))...)
}

// EncoderForward writes out (B,T,C) = wte[inp[b,t]] + wpe[t], as
// kernels/cpu: wte (V,C), wpe (maxT,C), inp (B,T) int32; a token ≥ V
// contributes zeros.
func (k *Kernels) EncoderForward(s Stream, out Buf, inp, wte, wpe Ptr, B, T, C, V int) error {
	return k.EncoderShardForward(s, out, inp, wte, 0, V, wpe, B, T, C)
}

// EncoderShardForward is the vocabulary-parallel embedding: wte holds rows
// vlo … vlo+rows−1 of the token embedding, a token outside them contributes
// zeros; wpe may be 0 (no position embedding on this rank).
func (k *Kernels) EncoderShardForward(s Stream, out Buf, inp, wte Ptr, vlo, rows int, wpe Ptr, B, T, C int) error {
	if err := checkSizes("EncoderShardForward", B, T, C); err != nil {
		return err
	}
	if err := checkSizes("EncoderShardForward", vlo, rows); err != nil {
		return err
	}
	if B*T*C == 0 {
		return nil
	}
	p, bf := bufs(out)
	vec := bf == 0 && C%4 == 0 && aligned(16, p[0], wte, wpe)
	n := int64(B) * int64(T) * int64(C)
	if vec {
		n /= 4
	}
	grid, block := ElementwiseGeometry(n)
	return k.launch("encoder_forward", grid, block, 0, s, p[0], inp, wte, int32(vlo), int32(rows), wpe, int32(B*T), int32(T), int32(C), bf, flag(vec))
}

// EncoderBackward accumulates dwte[inp[b,t]] += dout[b,t] (tokens < V) and
// dwpe[t] += dout[b,t]. dwte's sums take atomics: their last bits may
// differ from run to run.
func (k *Kernels) EncoderBackward(s Stream, dwte, dwpe Ptr, dout Buf, inp Ptr, B, T, C, V int) error {
	return k.EncoderShardBackward(s, dwte, 0, V, dwpe, dout, inp, B, T, C)
}

// EncoderShardBackward accumulates the gradients of EncoderShardForward:
// dwte for the tokens in this rank's rows, and dwpe unless it is 0.
func (k *Kernels) EncoderShardBackward(s Stream, dwte Ptr, vlo, rows int, dwpe Ptr, dout Buf, inp Ptr, B, T, C int) error {
	if err := checkSizes("EncoderShardBackward", B, T, C); err != nil {
		return err
	}
	if err := checkSizes("EncoderShardBackward", vlo, rows); err != nil {
		return err
	}
	if B*T*C == 0 {
		return nil
	}
	grid, block := ElementwiseGeometry(int64(T) * int64(C))
	p, bf := bufs(dout)
	return k.launch("encoder_backward", grid, block, 0, s, dwte, int32(vlo), int32(rows), dwpe, p[0], inp, int32(B), int32(T), int32(C), bf)
}

// LayerNormForward normalises N rows of C: out = (inp − mean)·rstd·w +
// bias, keeping mean and rstd (N) unless they are 0.
func (k *Kernels) LayerNormForward(s Stream, out Buf, mean, rstd Ptr, inp Buf, w, bias Ptr, N, C int) error {
	if err := checkSizes("LayerNormForward", N, C); err != nil {
		return err
	}
	if N == 0 || C == 0 {
		return nil
	}
	p, bf := bufs(out, inp)
	vec := bf == 0 && C%4 == 0 && aligned(16, p[0], p[1], w, bias)
	grid, block := LayerNormForwardGeometry(N)
	return k.launch("layernorm_forward", grid, block, 0, s, p[0], mean, rstd, p[1], w, bias, int32(N), int32(C), bf, flag(vec))
}

// LayerNormBackward accumulates dinp (N,C), dw and dbias (C) as
// kernels/cpu. The dw and dbias sums take atomics: their last bits may
// differ from run to run. It needs LayerNormBackwardShared(C) bytes of
// dynamic shared memory, whose limit the backend raises above 48 KiB.
func (k *Kernels) LayerNormBackward(s Stream, dinp Buf, dw, dbias Ptr, dout, inp Buf, w, mean, rstd Ptr, N, C int) error {
	if err := checkSizes("LayerNormBackward", N, C); err != nil {
		return err
	}
	if N == 0 || C == 0 {
		return nil
	}
	grid, block, shared := LayerNormBackwardGeometry(N, C)
	p, bf := bufs(dinp, dout, inp)
	return k.launch("layernorm_backward", grid, block, shared, s, p[0], dw, dbias, p[1], p[2], w, mean, rstd, int32(N), int32(C), bf)
}

// BiasAdd adds bias (OC) to every row of out (N,OC), the bias of a GEMM
// whose epilogue did not.
func (k *Kernels) BiasAdd(s Stream, out, bias Ptr, N, OC int) error {
	if err := checkSizes("BiasAdd", N, OC); err != nil {
		return err
	}
	if N == 0 || OC == 0 {
		return nil
	}
	vec := OC%4 == 0 && aligned(16, out, bias)
	n := int64(N) * int64(OC)
	if vec {
		n /= 4
	}
	grid, block := ElementwiseGeometry(n)
	return k.launch("bias_add", grid, block, 0, s, out, bias, int32(N), int32(OC), flag(vec))
}

// BiasStore writes out (N,OC) = in (N,OC) + bias (OC): a GEMM's float32
// product and its bias, rounded once into out when out is bfloat16
// activations.
func (k *Kernels) BiasStore(s Stream, out Buf, in, bias Ptr, N, OC int) error {
	if err := checkSizes("BiasStore", N, OC); err != nil {
		return err
	}
	if N == 0 || OC == 0 {
		return nil
	}
	grid, block := ElementwiseGeometry(int64(N) * int64(OC))
	p, bf := bufs(out)
	return k.launch("bias_store", grid, block, 0, s, p[0], in, bias, int32(N), int32(OC), bf)
}

// BiasBackward accumulates dbias (OC) += Σ_rows dout (N,OC), with one
// atomic per column and 256 rows (the last bits may differ between runs).
func (k *Kernels) BiasBackward(s Stream, dbias Ptr, dout Buf, N, OC int) error {
	if err := checkSizes("BiasBackward", N, OC); err != nil {
		return err
	}
	if N == 0 || OC == 0 {
		return nil
	}
	grid, block := BiasBackwardGeometry(N, OC)
	b, bf := bufs(dout)
	return k.launch("bias_backward", grid, block, 0, s, dbias, b[0], int32(N), int32(OC), bf)
}

// GeluForward writes out = GELU(inp) (tanh approximation), n elements; out
// may alias inp.
func (k *Kernels) GeluForward(s Stream, out, inp Buf, n int) error {
	p, bf := bufs(out, inp)
	return k.elementwise("gelu_forward", s, n, bf == 0 && aligned(16, p...), p[0], p[1], int64(n), bf)
}

// GeluBackward writes dinp = GELU'(inp)·dout (overwritten) from the forward
// pass's inp and out, n elements; dinp may alias dout. With out nil, the
// derivative is computed from inp alone (MatmulBackwardGelu's, as
// cuBLASLt's DGELU epilogue computes it), not recovered from out.
func (k *Kernels) GeluBackward(s Stream, dinp, inp, out, dout Buf, n int) error {
	p, bf := bufs(dinp, inp, out, dout)
	return k.elementwise("gelu_backward", s, n, bf == 0 && aligned(16, p...), p[0], p[1], p[2], p[3], int64(n), bf)
}

// BiasGeluStore writes pre (N,OC) = v = in (N,OC) + bias (OC) and out
// (N,OC) = GELU(v): a GEMM's float32 product, its bias (none when 0) and
// GELU, as cuBLASLt's GELU_AUX_BIAS epilogue does (GELU of the float32
// sum; pre and out rounded once each when bfloat16 activations, the bias
// then read as a bfloat16).
func (k *Kernels) BiasGeluStore(s Stream, out, pre Buf, in, bias Ptr, N, OC int) error {
	if err := checkSizes("BiasGeluStore", N, OC); err != nil {
		return err
	}
	if N == 0 || OC == 0 {
		return nil
	}
	grid, block := ElementwiseGeometry(int64(N) * int64(OC))
	p, bf := bufs(out, pre)
	return k.launch("bias_gelu_store", grid, block, 0, s, p[0], p[1], in, bias, int32(N), int32(OC), bf)
}

// ResidualForward writes out = a + b, n elements; out may alias a or b.
func (k *Kernels) ResidualForward(s Stream, out, a, b Buf, n int) error {
	p, bf := bufs(out, a, b)
	return k.elementwise("residual_forward", s, n, bf == 0 && aligned(16, p...), p[0], p[1], p[2], int64(n), bf)
}

// Scale multiplies n elements of x by f.
func (k *Kernels) Scale(s Stream, x Buf, n int, f float32) error {
	p, bf := bufs(x)
	return k.elementwise("scale", s, n, bf == 0 && aligned(16, p...), p[0], int64(n), f, bf)
}

// DropoutForward writes out[i] = in[i]·mask/(1−p) for n elements whose
// stream indices start at off, the mask kernels/cpu's Dropout{P: p, Key:
// key} draws, bit for bit; p = 0 copies (nothing when out == in). out may
// alias in.
func (k *Kernels) DropoutForward(s Stream, out, in Buf, n int, p float32, key, off uint64) error {
	if !(p >= 0 && p < 1) {
		return fmt.Errorf("cuda: dropout probability %v: want 0 ≤ p < 1", p)
	}
	ps, bf := bufs(out, in)
	if p == 0 && ps[0] == ps[1] {
		return nil
	}
	return k.elementwise("dropout_forward", s, n, bf == 0 && aligned(16, ps...), ps[0], ps[1], int64(n), p, 1/(1-p), key, off, bf)
}

// DropoutBackward is DropoutForward on the gradient: dinp = dout·mask/(1−p)
// with the forward pass's p, key and off. dinp may alias dout.
func (k *Kernels) DropoutBackward(s Stream, dinp, dout Buf, n int, p float32, key, off uint64) error {
	return k.DropoutForward(s, dinp, dout, n, p, key, off)
}

// checkLogits checks the sizes of logits (N,ld) whose first V columns are
// real: 0 ≤ V ≤ ld, N·ld within the kernels' range, and each of more (a
// column offset) in int32's.
func checkLogits(op string, N, V, ld int, more ...int) error {
	if err := checkSizes(op, N, ld); err != nil {
		return err
	}
	for _, n := range append(more, V) {
		if err := checkSizes(op, n); err != nil {
			return err
		}
	}
	if ld < V {
		return fmt.Errorf("cuda: %s: row stride %d below the %d real columns", op, ld, V)
	}
	return nil
}

// CrossEntropy is the fused classifier over logits (N,ld), row stride ld,
// the first V columns the real vocabulary and the rest padding, and targets
// (N) int32: losses (N) = −log softmax(logits[:, :V])[target], and when
// grad the real columns overwritten by dscale·(softmax − onehot(target)),
// the padding by 0. The padding enters neither the maximum nor the sum.
func (k *Kernels) CrossEntropy(s Stream, losses Ptr, logits Buf, targets Ptr, N, V, ld int, dscale float32, grad bool) error {
	if err := checkLogits("CrossEntropy", N, V, ld); err != nil {
		return err
	}
	if N == 0 {
		return nil
	}
	if V == 0 {
		return fmt.Errorf("cuda: CrossEntropy over 0 columns")
	}
	grid, block := ClassifierGeometry(N)
	p, bf := bufs(logits)
	return k.launch("cross_entropy", grid, block, 0, s, losses, p[0], targets, int32(N), int32(V), int32(ld), dscale, flag(grad), bf)
}

// ClassifierMax writes maxes (N) = each row's maximum of the V real
// columns of logits (N,ld), −∞ for V = 0 (the vocabulary-parallel
// classifier, see kernels/cpu).
func (k *Kernels) ClassifierMax(s Stream, maxes Ptr, logits Buf, N, V, ld int) error {
	if err := checkLogits("ClassifierMax", N, V, ld); err != nil {
		return err
	}
	if N == 0 {
		return nil
	}
	grid, block := ClassifierGeometry(N)
	p, bf := bufs(logits)
	return k.launch("classifier_max", grid, block, 0, s, maxes, p[0], int32(N), int32(V), int32(ld), bf)
}

// ClassifierExp writes stats (N,2) float64 from the V real columns of
// logits (N,ld) and maxes (N): each row's Σ e^(x−max) and its target
// logit when this rank's columns vlo … vlo+V−1 hold the target, else 0.
// The logits are only read.
func (k *Kernels) ClassifierExp(s Stream, stats Ptr, logits Buf, targets, maxes Ptr, N, V, ld, vlo int) error {
	if err := checkLogits("ClassifierExp", N, V, ld, vlo); err != nil {
		return err
	}
	if N == 0 {
		return nil
	}
	grid, block := ClassifierGeometry(N)
	p, bf := bufs(logits)
	return k.launch("classifier_exp", grid, block, 0, s, stats, p[0], targets, maxes, int32(N), int32(V), int32(ld), int32(vlo), bf)
}

// ClassifierGlobalMax writes maxes (N) = the largest over the MP ranks of
// their row maxima gmax (MP,N).
func (k *Kernels) ClassifierGlobalMax(s Stream, maxes, gmax Ptr, N, MP int) error {
	if err := checkSizes("ClassifierGlobalMax", N, MP); err != nil {
		return err
	}
	if MP == 0 {
		return nil
	}
	return k.elementwise("classifier_global_max", s, N, false, maxes, gmax, int64(N), int32(MP))
}

// ClassifierFinish writes losses (N) from the summed stats and, when grad,
// turns the real columns of logits (N,ld) into the loss gradient,
// e^(x−max) divided by the row's sum, and writes 0 over the padding.
func (k *Kernels) ClassifierFinish(s Stream, losses Ptr, logits Buf, targets, maxes, stats Ptr, N, V, ld, vlo int, dscale float32, grad bool) error {
	if err := checkLogits("ClassifierFinish", N, V, ld, vlo); err != nil {
		return err
	}
	if N == 0 {
		return nil
	}
	grid, block := ClassifierGeometry(N)
	p, bf := bufs(logits)
	return k.launch("classifier_finish", grid, block, 0, s, losses, p[0], targets, maxes, stats, int32(N), int32(V), int32(ld), int32(vlo), dscale, flag(grad), bf)
}

// AdamW updates n parameters in place as kernels/cpu's AdamW (step is
// 1-based; every gradient is first multiplied by gscale), in its exact
// operation order.
func (k *Kernels) AdamW(s Stream, params, grads, m, v Ptr, n int, lr, beta1, beta2, eps, wd, gscale float32, step int) error {
	if step < 1 {
		return fmt.Errorf("cuda: AdamW step %d: steps count from 1", step)
	}
	rc1 := float32(1 / (1 - math.Pow(float64(beta1), float64(step))))
	rc2 := float32(1 / (1 - math.Pow(float64(beta2), float64(step))))
	return k.elementwise("adamw", s, n, aligned(16, params, grads, m, v),
		params, grads, m, v, int64(n), lr, beta1, beta2, eps, wd, gscale, rc1, rc2)
}

// Sum adds w·Σ x (w·Σ x² when square is set) over n elements,
// accumulated in float64, to the double at out; scratch is SumScratch
// bytes. Several sums add into one double before one read (the gradient
// norm over every tensor). The order of the sum is fixed by n, so the
// result is the same on every run. The host reads the double after the
// stream has finished.
func (k *Kernels) Sum(s Stream, out, x Ptr, n int, scratch Ptr, w float64, square bool) error {
	if n < 0 {
		return fmt.Errorf("cuda: Sum of %d elements", n)
	}
	grid, block := SumGeometry(int64(n))
	if err := k.launch("sum_partial", grid, block, 0, s, scratch, x, int64(n), flag(square)); err != nil {
		return err
	}
	return k.launch("sum_finish", Dim3{1, 1, 1}, Dim3{256, 1, 1}, 0, s, out, scratch, int32(grid.X), w)
}

// NonFinite sets the int32 at flag to 1 when any of n elements of x is an
// infinity or NaN (fp16 loss scaling's overflow check); it never clears it.
func (k *Kernels) NonFinite(s Stream, flag, x Ptr, n int) error {
	if n < 0 {
		return fmt.Errorf("cuda: NonFinite of %d elements", n)
	}
	if n == 0 {
		return nil
	}
	grid, block := ElementwiseGeometry(int64(n))
	return k.launch("non_finite", grid, block, 0, s, flag, x, int64(n))
}

// CastF32ToBF16 rounds n floats to bfloat16 (to nearest even; NaN stays a
// NaN).
func (k *Kernels) CastF32ToBF16(s Stream, out, in Ptr, n int) error {
	return k.elementwise("cast_f32_bf16", s, n, aligned(8, out) && aligned(16, in), out, in, int64(n))
}

// CastF32ToF16 rounds n floats to IEEE half (to nearest even, denormals
// kept, beyond ±65520 infinity, NaN a quiet NaN).
func (k *Kernels) CastF32ToF16(s Stream, out, in Ptr, n int) error {
	return k.elementwise("cast_f32_f16", s, n, aligned(8, out) && aligned(16, in), out, in, int64(n))
}

// CastBF16ToF32 widens n bfloat16 values to float (exact).
func (k *Kernels) CastBF16ToF32(s Stream, out, in Ptr, n int) error {
	return k.elementwise("cast_bf16_f32", s, n, aligned(16, out) && aligned(8, in), out, in, int64(n))
}

// CastF16ToF32 widens n IEEE half values to float (exact).
func (k *Kernels) CastF16ToF32(s Stream, out, in Ptr, n int) error {
	return k.elementwise("cast_f16_f32", s, n, aligned(16, out) && aligned(8, in), out, in, int64(n))
}
