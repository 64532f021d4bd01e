package cuda

import (
	"fmt"
	"slices"
	"strings"
)

// Kernel variants sized per device.
//
// Most kernels use at most the 48 KiB of dynamic shared memory every GPU
// gives a block; the attention kernels ask for more (up to 172 KiB for the
// 64×64 tiles of the head-size-128 backward pass), which a block may use
// only up to the device's opt-in limit (CU_DEVICE_ATTRIBUTE_MAX_SHARED_
// MEMORY_PER_BLOCK_OPTIN): 227 KiB on an H100 or H200, 163 KiB on an A100,
// 99 KiB on an L40S, L4, A10 or RTX 4090, 96 KiB on a V100. The attention
// kernels therefore come in tile variants (kernels/attention.cu), and
// SelectVariants picks, for each kernel, the first of its variants, largest
// tiles first, that fits the device. The normalisation backward kernels
// (layernorm_backward, rmsnorm_backward) have one variant whose shared
// memory grows with the channels C; the limit bounds C instead.

// DeviceAttrs are the attributes of a device that the kernels' variants
// are chosen by (cuDeviceGetAttribute).
type DeviceAttrs struct {
	Major, Minor int // compute capability
	// SharedOptin is the most dynamic shared memory, in bytes, a block
	// may use after opting in (..._MAX_SHARED_MEMORY_PER_BLOCK_OPTIN); 0
	// means unknown, and the figure of the compute capability's data
	// centre part is assumed (see [SharedOptinFor]).
	SharedOptin  int
	SharedPerSM  int // shared memory per multiprocessor, bytes (..._MAX_SHARED_MEMORY_PER_MULTIPROCESSOR)
	RegsPerBlock int // 32-bit registers a block may use (..._MAX_REGISTERS_PER_BLOCK)
	SMs          int // multiprocessors
}

// defaultShared is the dynamic shared memory every kernel may use without
// opting in.
const defaultShared = 48 << 10

// SharedOptinFor is the opt-in shared memory per block, in bytes, of
// compute capability major.minor as the CUDA programming guide tables it,
// or 0 for one it does not know (before 7.0).
func SharedOptinFor(major, minor int) int {
	switch {
	case major == 7 && minor == 5:
		return 64 << 10 // Turing
	case major == 7:
		return 96 << 10 // Volta
	case major == 8 && (minor == 0 || minor == 7):
		return 163 << 10 // A100, Orin
	case major == 8:
		return 99 << 10 // GA10x, Ada
	case major == 9 || major == 10:
		return 227 << 10 // Hopper, Blackwell data centre
	case major >= 11:
		return 99 << 10 // consumer Blackwell and later: the smaller figure
	}
	return 0
}

// sharedLimit is the most dynamic shared memory a block may use on a.
func (a DeviceAttrs) sharedLimit() int {
	n := a.SharedOptin
	if n == 0 {
		n = SharedOptinFor(a.Major, a.Minor)
	}
	return max(n, defaultShared)
}

// AttTile is a tile shape of the attention kernels: Q query rows against K
// keys per block (each 32 or 64).
type AttTile struct{ Q, K int }

// attDefaultTile is the tile of the kernels without a suffix, an H100's.
var attDefaultTile = AttTile{attTile, attTile}

func (t AttTile) String() string { return fmt.Sprintf("%d×%d", t.Q, t.K) }

// suffix is the kernel-name suffix of the tile: none for 64×64, else
// _q<Q>k<K>.
func (t AttTile) suffix() string {
	if t == attDefaultTile {
		return ""
	}
	return fmt.Sprintf("_q%dk%d", t.Q, t.K)
}

// pld is the row stride, in floats, of the tile's probability tiles.
func (t AttTile) pld() int { return t.K + 16 }

// ForwardShared is the dynamic shared memory, in bytes, of the forward
// kernel on tile t for head size hs: a q tile, k and v tiles and a tile of
// probabilities.
func (t AttTile) ForwardShared(hs int) int {
	return ((t.Q+2*t.K)*attLD(hs) + t.Q*t.pld()) * 4
}

// BackwardShared is the dynamic shared memory, in bytes, of the backward
// kernel on tile t for head size hs: k and v tiles, q and dout tiles, and
// tiles of probabilities and of their gradients.
func (t AttTile) BackwardShared(hs int) int {
	return (2*(t.K+t.Q)*attLD(hs) + 2*t.Q*t.pld()) * 4
}

// attKernel is one attention kernel and its tile variants, largest first.
type attKernel struct {
	name     string // attention_forward_hs128, attention_backward_any, …
	hs       int    // head size; 0 for the generic kernel
	backward bool
	tiles    []AttTile
}

// shared is the most dynamic shared memory kernel k asks for on tile t:
// for the generic kernel, the most over the head sizes it takes.
func (k attKernel) shared(t AttTile) int {
	need := func(hs int) int {
		if k.backward {
			return t.BackwardShared(hs)
		}
		return t.ForwardShared(hs)
	}
	if k.hs > 0 {
		return need(k.hs)
	}
	n := 0
	for hs := 1; hs <= attMaxHS; hs++ {
		if attSuffix(hs) == "any" {
			n = max(n, need(hs))
		}
	}
	return n
}

// attKernels lists the forward and backward attention kernels with their
// variants, as kernels/attention.cu stamps them out. The smaller tiles
// exist where the 64×64 kernel does not fit 96 KiB (V100) or 163 KiB
// (A100); their bytes:
//
//	forward  hs128, any  64×32: 79,872, 77,312 (64×64: 121,856, 118,016)
//	backward hs64, hs80  32×64: 72,704, 84,992 (64×64: 110,592, 126,976)
//	backward hs128, any  32×64: 121,856, 118,016; 32×32: 79,872, 77,312
//	                            (64×64: 176,128, 171,008)
//
// The forward kernels of hs 32, 64 and 80 (48,128 to 84,992 bytes) and the
// backward kernel of hs 32 (77,824) fit every supported device as they are.
func attKernels() []attKernel {
	d := attDefaultTile
	fwd := map[int][]AttTile{128: {d, {64, 32}}, 0: {d, {64, 32}}}
	bwd := map[int][]AttTile{
		64: {d, {32, 64}}, 80: {d, {32, 64}},
		128: {d, {32, 64}, {32, 32}}, 0: {d, {32, 64}, {32, 32}},
	}
	var ks []attKernel
	for _, hs := range append(slices.Clone(attHeadSizes), 0) {
		s := "any"
		if hs > 0 {
			s = attSuffix(hs)
		}
		tiles := func(m map[int][]AttTile) []AttTile {
			if t, ok := m[hs]; ok {
				return t
			}
			return []AttTile{d}
		}
		ks = append(ks,
			attKernel{"attention_forward_" + s, hs, false, tiles(fwd)},
			attKernel{"attention_backward_" + s, hs, true, tiles(bwd)})
	}
	return ks
}

// attVariantNames are the function names of every attention kernel's
// variants other than the 64×64 ones.
func attVariantNames() []string {
	var names []string
	for _, k := range attKernels() {
		for _, t := range k.tiles {
			if t != attDefaultTile {
				names = append(names, k.name+t.suffix())
			}
		}
	}
	return names
}

// KernelVariant is the variant of one kernel chosen for a device.
type KernelVariant struct {
	Kernel   string  // the kernel: attention_backward_hs128
	Function string  // the function launched: attention_backward_hs128_q32k32
	Tile     AttTile // the attention tile
	Shared   int     // the most dynamic shared memory a launch asks for, bytes
}

// Variants is the variant of every kernel with a choice, for one device.
// Its methods only read it: a Variants may be shared.
type Variants struct {
	attrs  DeviceAttrs
	limit  int                      // dynamic shared memory per block, bytes
	byName map[string]KernelVariant // by KernelVariant.Kernel
}

// SelectVariants chooses each attention kernel's variant for a device with
// attributes a: the first of its tiles, largest first, whose shared memory
// fits the device's opt-in limit per block, so a device that fits today's
// 64×64 tiles (an H100) keeps them. Where no variant of some kernel fits,
// the error names the kernel, the bytes its smallest variant needs and the
// device's limit.
func SelectVariants(a DeviceAttrs) (*Variants, error) {
	v := &Variants{attrs: a, limit: a.sharedLimit(), byName: map[string]KernelVariant{}}
	var errs []string
	for _, k := range attKernels() {
		var chosen *KernelVariant
		for _, t := range k.tiles {
			if n := k.shared(t); n <= v.limit {
				chosen = &KernelVariant{Kernel: k.name, Function: k.name + t.suffix(), Tile: t, Shared: n}
				break
			}
		}
		if chosen == nil {
			small := k.tiles[len(k.tiles)-1]
			errs = append(errs, fmt.Sprintf("%s needs %d bytes of shared memory per block (%s tiles, its smallest); the device (sm_%d%d) allows %d",
				k.name, k.shared(small), small, a.Major, a.Minor, v.limit))
			continue
		}
		v.byName[k.name] = *chosen
	}
	switch len(errs) {
	case 0:
	case 1:
		return nil, fmt.Errorf("cuda: %s", errs[0])
	default:
		return nil, fmt.Errorf("cuda: %s (and %d more kernels do not fit)", errs[0], len(errs)-1)
	}
	return v, nil
}

// DefaultVariants is the choice for a device with room for every kernel's
// largest variant (an H100): the 64×64 attention tiles.
func DefaultVariants() *Variants {
	v, err := SelectVariants(DeviceAttrs{Major: 9, Minor: 0, SharedOptin: 227 << 10})
	if err != nil {
		panic(err) // the 64×64 tiles fit 227 KiB: TestSelectVariants
	}
	return v
}

// Attrs are the device attributes v was chosen for.
func (v *Variants) Attrs() DeviceAttrs { return v.attrs }

// SharedLimit is the most dynamic shared memory, in bytes, a block may use
// on the device.
func (v *Variants) SharedLimit() int { return v.limit }

// Kernel returns the variant chosen for kernel name (attention_forward_hs64,
// …) and whether name has variants.
func (v *Variants) Kernel(name string) (KernelVariant, bool) {
	kv, ok := v.byName[name]
	return kv, ok
}

// All returns the chosen variants in kernel-name order.
func (v *Variants) All() []KernelVariant {
	all := make([]KernelVariant, 0, len(v.byName))
	for _, kv := range v.byName {
		all = append(all, kv)
	}
	slices.SortFunc(all, func(a, b KernelVariant) int { return strings.Compare(a.Kernel, b.Kernel) })
	return all
}

// defaultOnly reports whether every chosen variant is a 64×64 kernel, so
// the module needs none of the others (New then compiles it with
// -DGPTUI_ATT_DEFAULT_ONLY, as fast as before the variants existed).
func (v *Variants) defaultOnly() bool {
	for _, kv := range v.byName {
		if kv.Tile != attDefaultTile {
			return false
		}
	}
	return true
}

// compileOptions are NVRTC's options for the kernels of v on the
// architecture of arch (ArchFlag's).
func compileOptions(arch string, v *Variants) []string {
	opts := []string{arch, "--std=c++17"}
	if v.defaultOnly() {
		opts = append(opts, "-DGPTUI_ATT_DEFAULT_ONLY")
	}
	return opts
}

// needs reports whether Kernels launching v looks up function name: every
// kernel but the variants v did not choose.
func (v *Variants) needs(name string) bool {
	if !slices.Contains(attVariantNames(), name) {
		return true
	}
	for _, kv := range v.byName {
		if kv.Function == name {
			return true
		}
	}
	return false
}

// SharedNeeds maps the function of each chosen variant that needs more than
// the default 48 KiB of dynamic shared memory to its bytes, so the backend
// raises each function's limit once after loading the module, to that
// variant's size only.
func (v *Variants) SharedNeeds() map[string]int {
	need := map[string]int{}
	for _, kv := range v.byName {
		if kv.Shared > defaultShared {
			need[kv.Function] = kv.Shared
		}
	}
	return need
}

// checkShared returns an error naming kernel unless n bytes of dynamic
// shared memory fit a block of the device.
func (v *Variants) checkShared(kernel string, n int) error {
	if n <= v.limit {
		return nil
	}
	return fmt.Errorf("cuda: %s needs %d bytes of shared memory per block; the device (sm_%d%d) allows %d",
		kernel, n, v.attrs.Major, v.attrs.Minor, v.limit)
}

// NormMaxChannels is the most channels C the normalisation backward
// kernels take on the device: layernorm_backward keeps 2·C floats in
// shared memory, rmsnorm_backward C.
func (v *Variants) NormMaxChannels() (layernorm, rmsnorm int) {
	return v.limit / LayerNormBackwardShared(1), v.limit / RMSNormBackwardShared(1)
}

// String describes the choice in one line: the device's limit and every
// attention kernel not on the 64×64 tiles, with its tile and bytes.
func (v *Variants) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "kernel variants for sm_%d%d, %d KiB shared memory per block", v.attrs.Major, v.attrs.Minor, v.limit>>10)
	if v.attrs.SharedPerSM > 0 {
		fmt.Fprintf(&b, " (%d KiB per SM", v.attrs.SharedPerSM>>10)
		if v.attrs.SMs > 0 {
			fmt.Fprintf(&b, ", %d SMs", v.attrs.SMs)
		}
		b.WriteString(")")
	}
	var small []string
	for _, kv := range v.All() {
		if kv.Tile != attDefaultTile {
			small = append(small, fmt.Sprintf("%s %s (%d B)", strings.TrimPrefix(kv.Kernel, "attention_"), kv.Tile, kv.Shared))
		}
	}
	if len(small) == 0 {
		b.WriteString(": attention on 64×64 tiles")
	} else {
		fmt.Fprintf(&b, ": attention on 64×64 tiles but %s", strings.Join(small, ", "))
	}
	ln, rms := v.NormMaxChannels()
	fmt.Fprintf(&b, "; layernorm backward up to C=%d, rmsnorm backward up to C=%d", ln, rms)
	return b.String()
}
