package nccl

import (
	"unsafe"

	"github.com/gptui/gptui/kernels/cuda"
)

// Handle is a communicator of the library: a *cuda.Comm on a GPU.
type Handle interface {
	Rank() int
	Size() int
}

// Lib is every call the fabric makes into NCCL and the CUDA driver, as
// function fields: [Real] fills them with package cuda's bindings; the
// tests fill them with a fake that behaves like NCCL where the fabric
// depends on it (collective creation, rendezvous, abort, asynchronous
// errors). Buffers are device addresses of elements of type cuda.F32
// (AllReduce: F32 or F64; AllGather, Send and Recv: F32 or BF16, the
// backend's bfloat16 activations); reductions are sums. Calls on one communicator
// come from one goroutine at a time, except Abort and AsyncError, which
// the fabric's watchdog calls while an operation may block in NCCL.
type Lib struct {
	// NCCL (nccl.h).
	UniqueID   func() (cuda.UniqueID, error)                                // ncclGetUniqueId
	InitRank   func(nranks int, id cuda.UniqueID, rank int) (Handle, error) // ncclCommInitRank
	Split      func(c Handle, color, key int) (Handle, error)               // ncclCommSplit; nil for cuda.SplitNoColor
	AsyncError func(c Handle) error                                         // ncclCommGetAsyncError
	Abort      func(c Handle) error                                         // ncclCommAbort
	GroupStart func() error                                                 // ncclGroupStart: the calls up to GroupEnd run together
	GroupEnd   func() error                                                 // ncclGroupEnd

	AllReduce     func(c Handle, send, recv cuda.Ptr, count int, t cuda.DataType, s cuda.Stream) error
	ReduceScatter func(c Handle, send, recv cuda.Ptr, recvCount int, s cuda.Stream) error
	AllGather     func(c Handle, send, recv cuda.Ptr, sendCount int, t cuda.DataType, s cuda.Stream) error
	Send          func(c Handle, buf cuda.Ptr, count int, t cuda.DataType, peer int, s cuda.Stream) error
	Recv          func(c Handle, buf cuda.Ptr, count int, t cuda.DataType, peer int, s cuda.Stream) error

	// The CUDA driver (cuda.h).
	NewStream     func() (cuda.Stream, error)                             // cuStreamCreate
	DestroyStream func(s cuda.Stream) error                               // cuStreamDestroy
	NewEvent      func() (cuda.Event, error)                              // cuEventCreate, without timing
	DestroyEvent  func(e cuda.Event) error                                // cuEventDestroy
	Record        func(e cuda.Event, s cuda.Stream) error                 // cuEventRecord
	Done          func(e cuda.Event) (bool, error)                        // cuEventQuery
	WaitEvent     func(s cuda.Stream, e cuda.Event) error                 // cuStreamWaitEvent
	Reachable     func(p unsafe.Pointer) bool                             // cuPointerGetAttribute: device or managed memory
	Alloc         func(bytes int) (cuda.Ptr, error)                       // cuMemAlloc
	Free          func(p cuda.Ptr) error                                  // cuMemFree
	CopyHtoD      func(dst cuda.Ptr, src unsafe.Pointer, bytes int) error // cuMemcpyHtoD: after the work queued before it
	CopyDtoH      func(dst unsafe.Pointer, src cuda.Ptr, bytes int) error // cuMemcpyDtoH: after the work queued before it
}

// Real is the library of device d: NCCL as n loaded it, the driver's
// calls on d.
func Real(d *cuda.Device, n *cuda.NCCL) *Lib {
	comm := func(h Handle) *cuda.Comm { return h.(*cuda.Comm) }
	return &Lib{
		UniqueID: n.UniqueID,
		InitRank: func(nranks int, id cuda.UniqueID, rank int) (Handle, error) {
			c, err := n.InitRank(d, nranks, id, rank)
			if c == nil {
				return nil, err // not a typed nil in the interface
			}
			return c, err
		},
		Split: func(c Handle, color, key int) (Handle, error) {
			s, err := comm(c).Split(color, key)
			if s == nil {
				return nil, err
			}
			return s, err
		},
		AsyncError: func(c Handle) error { return comm(c).AsyncError() },
		Abort:      func(c Handle) error { return comm(c).Abort() },
		GroupStart: n.GroupStart,
		GroupEnd:   n.GroupEnd,
		AllReduce: func(c Handle, send, recv cuda.Ptr, count int, t cuda.DataType, s cuda.Stream) error {
			return comm(c).AllReduce(send, recv, count, t, cuda.Sum, s)
		},
		ReduceScatter: func(c Handle, send, recv cuda.Ptr, n int, s cuda.Stream) error {
			return comm(c).ReduceScatter(send, recv, n, cuda.F32, cuda.Sum, s)
		},
		AllGather: func(c Handle, send, recv cuda.Ptr, n int, t cuda.DataType, s cuda.Stream) error {
			return comm(c).AllGather(send, recv, n, t, s)
		},
		Send: func(c Handle, p cuda.Ptr, n int, t cuda.DataType, peer int, s cuda.Stream) error {
			return comm(c).Send(p, n, t, peer, s)
		},
		Recv: func(c Handle, p cuda.Ptr, n int, t cuda.DataType, peer int, s cuda.Stream) error {
			return comm(c).Recv(p, n, t, peer, s)
		},
		NewStream:     d.NewStream,
		DestroyStream: d.DestroyStream,
		NewEvent:      d.NewMarker,
		DestroyEvent:  d.DestroyEvent,
		Record:        d.Record,
		Done:          d.Done,
		WaitEvent:     d.WaitEvent,
		Reachable:     d.Reachable,
		Alloc:         d.Alloc,
		Free:          d.Free,
		CopyHtoD:      d.CopyHtoD,
		CopyDtoH:      d.CopyDtoH,
	}
}
