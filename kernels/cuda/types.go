package cuda

// Ptr is a device address (CUdeviceptr). Zero is the null pointer.
type Ptr uintptr

// Dim3 is a grid or block shape.
type Dim3 struct{ X, Y, Z uint32 }

// Stream is a CUDA stream (CUstream); zero is the legacy default stream.
type Stream uintptr

// Function is a kernel of a loaded module (CUfunction).
type Function uintptr

// Launcher starts kernels. Each argument is a Ptr, int32, uint32, int64,
// uint64, float32 or float64, passed to the kernel by value in order.
// *Device implements it; the kernel tests implement it with an emulator.
type Launcher interface {
	Launch(f Function, grid, block Dim3, shared int, s Stream, args ...any) error
}
