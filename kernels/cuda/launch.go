package cuda

import (
	"fmt"
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

	mu sync.Mutex
	fn map[string]Function
}

// NewKernels looks up every kernel of [KernelNames] with lookup (a loaded
// module's cuModuleGetFunction, or the emulator's table) and returns the
// Kernels launching them through l.
func NewKernels(l Launcher, lookup func(name string) (Function, error)) (*Kernels, error) {
	k := &Kernels{l: l, lookup: lookup, fn: map[string]Function{}}
	for _, name := range KernelNames() {
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
var kernelNames = []string{}

// KernelNames returns the name of every kernel the Kernels methods launch
// (the `extern "C" __global__` functions of [Source]).
func KernelNames() []string {
	return append([]string(nil), kernelNames...)
}
