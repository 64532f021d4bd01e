package cuda

import (
	"fmt"
	"runtime"
)

// ncclResult_t values (nccl.h).
const (
	ncclSuccess = 0 // ncclSuccess = 0
)

// ncclResultNames names ncclResult_t values (nccl.h, NCCL 2.x;
// ncclTimeout only in recent releases).
var ncclResultNames = map[int]string{
	0: "ncclSuccess",
	1: "ncclUnhandledCudaError",
	2: "ncclSystemError",
	3: "ncclInternalError",
	4: "ncclInvalidArgument",
	5: "ncclInvalidUsage",
	6: "ncclRemoteError",
	7: "ncclInProgress",
	8: "ncclTimeout",
}

// ncclDataType_t values (nccl.h: ncclInt8 = 0, ncclUint8 = 1,
// ncclInt32 = 2, ncclUint32 = 3, ncclInt64 = 4, ncclUint64 = 5,
// ncclFloat16 = 6, ncclFloat32 = 7, ncclFloat64 = 8, ncclBfloat16 = 9).
const (
	ncclInt32    = 2
	ncclFloat16  = 6
	ncclFloat32  = 7
	ncclFloat64  = 8
	ncclBfloat16 = 9
)

// ncclType maps a DataType to NCCL's ncclDataType_t.
func ncclType(t DataType) (int32, error) {
	switch t {
	case F32:
		return ncclFloat32, nil
	case F16:
		return ncclFloat16, nil
	case BF16:
		return ncclBfloat16, nil
	case F64:
		return ncclFloat64, nil
	case I32:
		return ncclInt32, nil
	}
	return 0, fmt.Errorf("cuda: NCCL has no %s", t)
}

// ReduceOp is a reduction; its values are NCCL's ncclRedOp_t.
type ReduceOp int

// The reductions (nccl.h: ncclSum = 0, ncclProd = 1, ncclMax = 2,
// ncclMin = 3, ncclAvg = 4).
const (
	Sum  ReduceOp = 0
	Prod ReduceOp = 1
	Max  ReduceOp = 2
	Min  ReduceOp = 3
	Avg  ReduceOp = 4
)

// SplitNoColor as Split's color leaves the rank out of every new
// communicator (NCCL_SPLIT_NOCOLOR = -1).
const SplitNoColor = -1

// UniqueID is ncclUniqueId: rank 0 makes it, the others get it through
// the bootstrap, and all pass it to InitRank.
type UniqueID [128]byte

// ncclUniqueID is ncclUniqueId as C has it, typedef struct { char
// internal[NCCL_UNIQUE_ID_BYTES]; } ncclUniqueId; (128 bytes), for
// passing by value.
type ncclUniqueID struct{ Internal [128]byte }

// ncclAPI is libnccl's functions; each binding's declaration (nccl.h,
// NCCL 2.18+) is beside it. ncclComm_t and cudaStream_t are pointers.
type ncclAPI struct {
	// ncclResult_t ncclGetVersion(int *version);
	getVersion func(v *int32) int32
	// ncclResult_t ncclGetUniqueId(ncclUniqueId *uniqueId);
	getUniqueID func(id *ncclUniqueID) int32
	// ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank);
	commInitRank func(comm *uintptr, nranks int32, id ncclUniqueID, rank int32) int32
	// ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm, ncclConfig_t *config); (NCCL >= 2.18)
	commSplit func(comm uintptr, color, key int32, newcomm *uintptr, config uintptr) int32
	// ncclResult_t ncclCommDestroy(ncclComm_t comm);
	commDestroy func(comm uintptr) int32
	// ncclResult_t ncclCommAbort(ncclComm_t comm);
	commAbort func(comm uintptr) int32
	// ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError);
	commGetAsyncError func(comm uintptr, r *int32) int32
	// ncclResult_t ncclCommCount(const ncclComm_t comm, int *count);
	commCount func(comm uintptr, n *int32) int32
	// ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank);
	commUserRank func(comm uintptr, rank *int32) int32
	// const char *ncclGetErrorString(ncclResult_t result);
	getErrorString func(r int32) string
	// const char *ncclGetLastError(ncclComm_t comm); (NCCL >= 2.13, optional)
	getLastError func(comm uintptr) string
	// ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
	//   ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream);
	allReduce func(send, recv uintptr, count uint64, t, op int32, comm, s uintptr) int32
	// ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount, ncclDataType_t datatype,
	//   ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream);
	reduceScatter func(send, recv uintptr, count uint64, t, op int32, comm, s uintptr) int32
	// ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount, ncclDataType_t datatype,
	//   ncclComm_t comm, cudaStream_t stream);
	allGather func(send, recv uintptr, count uint64, t int32, comm, s uintptr) int32
	// ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, int root,
	//   ncclComm_t comm, cudaStream_t stream);
	broadcast func(send, recv uintptr, count uint64, t, root int32, comm, s uintptr) int32
	// ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm, cudaStream_t stream);
	send func(buf uintptr, count uint64, t, peer int32, comm, s uintptr) int32
	// ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm, cudaStream_t stream);
	recv func(buf uintptr, count uint64, t, peer int32, comm, s uintptr) int32
	// ncclResult_t ncclGroupStart(void);
	groupStart func() int32
	// ncclResult_t ncclGroupEnd(void);
	groupEnd func() int32
}

// NCCL is the NCCL library, loaded.
type NCCL struct {
	api     ncclAPI
	path    string
	version int
}

// LoadNCCL finds libnccl.so.2 (see Find) and loads it.
func LoadNCCL() (*NCCL, error) {
	h, err := load(LibNCCL)
	if err != nil {
		return nil, fmt.Errorf("cuda: %w", err)
	}
	n := &NCCL{path: h.path}
	a := &n.api
	for _, b := range []struct {
		fn   any
		name string
	}{
		{&a.getVersion, "ncclGetVersion"},
		{&a.getUniqueID, "ncclGetUniqueId"},
		{&a.commInitRank, "ncclCommInitRank"},
		{&a.commSplit, "ncclCommSplit"},
		{&a.commDestroy, "ncclCommDestroy"},
		{&a.commAbort, "ncclCommAbort"},
		{&a.commGetAsyncError, "ncclCommGetAsyncError"},
		{&a.commCount, "ncclCommCount"},
		{&a.commUserRank, "ncclCommUserRank"},
		{&a.getErrorString, "ncclGetErrorString"},
		{&a.allReduce, "ncclAllReduce"},
		{&a.reduceScatter, "ncclReduceScatter"},
		{&a.allGather, "ncclAllGather"},
		{&a.broadcast, "ncclBroadcast"},
		{&a.send, "ncclSend"},
		{&a.recv, "ncclRecv"},
		{&a.groupStart, "ncclGroupStart"},
		{&a.groupEnd, "ncclGroupEnd"},
	} {
		if err := h.sym(b.fn, b.name); err != nil {
			return nil, fmt.Errorf("cuda: %w (NCCL 2.18 or later is needed)", err)
		}
	}
	if !h.optSym(&a.getLastError, "ncclGetLastError") {
		a.getLastError = nil
	}
	var v int32
	if err := n.check("ncclGetVersion", 0, a.getVersion(&v)); err != nil {
		return nil, fmt.Errorf("cuda: %s: %w", h.path, err)
	}
	n.version = int(v)
	return n, nil
}

// check turns an ncclResult_t into nil or an *Error; comm, when not 0,
// adds NCCL's last error message for it.
func (n *NCCL) check(op string, comm uintptr, r int32) error {
	if r == ncclSuccess {
		return nil
	}
	e := &Error{Op: op, Code: int(r), Name: ncclResultNames[int(r)], Msg: n.api.getErrorString(r)}
	if n.api.getLastError != nil {
		if last := n.api.getLastError(comm); last != "" {
			e.Msg += ": " + last
		}
	}
	return e
}

// Version returns NCCL's version code, 10000*major + 100*minor + patch
// (22703 for 2.27.3).
func (n *NCCL) Version() int { return n.version }

// Path returns where NCCL was loaded from.
func (n *NCCL) Path() string { return n.path }

// UniqueID makes the id of a new communicator (ncclGetUniqueId). Rank 0
// calls it and sends the id to the other ranks.
func (n *NCCL) UniqueID() (UniqueID, error) {
	var id ncclUniqueID
	if err := n.check("ncclGetUniqueId", 0, n.api.getUniqueID(&id)); err != nil {
		return UniqueID{}, fmt.Errorf("cuda: %w", err)
	}
	return UniqueID(id.Internal), nil
}

// Comm is an NCCL communicator on one device.
type Comm struct {
	n            *NCCL
	d            *Device
	c            uintptr
	rank, nranks int
}

// InitRank joins rank of the nranks-rank communicator id on device d
// (ncclCommInitRank; the id passes by value). It returns when all ranks
// have joined.
func (n *NCCL) InitRank(d *Device, nranks int, id UniqueID, rank int) (*Comm, error) {
	if nranks < 1 || rank < 0 || rank >= nranks {
		return nil, fmt.Errorf("cuda: NCCL rank %d of %d", rank, nranks)
	}
	defer runtime.UnlockOSThread()
	if err := d.enter(); err != nil {
		return nil, err
	}
	c := &Comm{n: n, d: d, rank: rank, nranks: nranks}
	if err := n.check("ncclCommInitRank", 0, n.api.commInitRank(&c.c, int32(nranks), ncclUniqueID{id}, int32(rank))); err != nil {
		return nil, fmt.Errorf("cuda: NCCL rank %d of %d on device %d: %w", rank, nranks, d.ordinal, err)
	}
	return c, nil
}

// Rank returns this rank's number in the communicator.
func (c *Comm) Rank() int { return c.rank }

// Size returns the number of ranks in the communicator.
func (c *Comm) Size() int { return c.nranks }

// GroupStart opens a group of NCCL calls that NCCL issues together at
// GroupEnd (ncclGroupStart), as Send and Recv pairs need. NCCL's groups
// are per OS thread, so GroupStart locks the calling goroutine to its
// thread until GroupEnd: call both, and the calls between, from one
// goroutine.
func (n *NCCL) GroupStart() error {
	runtime.LockOSThread()
	if err := n.check("ncclGroupStart", 0, n.api.groupStart()); err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("cuda: %w", err)
	}
	return nil
}

// GroupEnd closes the group GroupStart opened (ncclGroupEnd) and unlocks
// the goroutine from its thread.
func (n *NCCL) GroupEnd() error {
	defer runtime.UnlockOSThread()
	if err := n.check("ncclGroupEnd", 0, n.api.groupEnd()); err != nil {
		return fmt.Errorf("cuda: %w", err)
	}
	return nil
}

// call runs one NCCL call with the device's context current.
func (c *Comm) call(what string, f func() int32) error {
	if c.c == 0 {
		return fmt.Errorf("cuda: NCCL %s on a destroyed communicator", what)
	}
	defer runtime.UnlockOSThread()
	if err := c.d.enter(); err != nil {
		return err
	}
	if err := c.n.check(what, c.c, f()); err != nil {
		return fmt.Errorf("cuda: NCCL rank %d of %d: %w", c.rank, c.nranks, err)
	}
	return nil
}

// AllReduce reduces count elements of send across the ranks into recv on
// every rank (ncclAllReduce); send may equal recv.
func (c *Comm) AllReduce(send, recv Ptr, count int, t DataType, op ReduceOp, s Stream) error {
	nt, err := ncclType(t)
	if err != nil {
		return err
	}
	return c.call("ncclAllReduce", func() int32 {
		return c.n.api.allReduce(uintptr(send), uintptr(recv), uint64(count), nt, int32(op), c.c, uintptr(s))
	})
}

// ReduceScatter reduces Size()·recvCount elements of send across the
// ranks and leaves rank r's block of recvCount in recv (ncclReduceScatter).
func (c *Comm) ReduceScatter(send, recv Ptr, recvCount int, t DataType, op ReduceOp, s Stream) error {
	nt, err := ncclType(t)
	if err != nil {
		return err
	}
	return c.call("ncclReduceScatter", func() int32 {
		return c.n.api.reduceScatter(uintptr(send), uintptr(recv), uint64(recvCount), nt, int32(op), c.c, uintptr(s))
	})
}

// AllGather gathers sendCount elements from every rank into recv, rank
// r's at r·sendCount (ncclAllGather).
func (c *Comm) AllGather(send, recv Ptr, sendCount int, t DataType, s Stream) error {
	nt, err := ncclType(t)
	if err != nil {
		return err
	}
	return c.call("ncclAllGather", func() int32 {
		return c.n.api.allGather(uintptr(send), uintptr(recv), uint64(sendCount), nt, c.c, uintptr(s))
	})
}

// Broadcast copies count elements of root's send into every rank's recv
// (ncclBroadcast).
func (c *Comm) Broadcast(send, recv Ptr, count int, t DataType, root int, s Stream) error {
	nt, err := ncclType(t)
	if err != nil {
		return err
	}
	return c.call("ncclBroadcast", func() int32 {
		return c.n.api.broadcast(uintptr(send), uintptr(recv), uint64(count), nt, int32(root), c.c, uintptr(s))
	})
}

// Send sends count elements at p to peer (ncclSend); pair it with the
// peer's Recv, inside GroupStart/GroupEnd when ranks exchange.
func (c *Comm) Send(p Ptr, count int, t DataType, peer int, s Stream) error {
	nt, err := ncclType(t)
	if err != nil {
		return err
	}
	return c.call("ncclSend", func() int32 {
		return c.n.api.send(uintptr(p), uint64(count), nt, int32(peer), c.c, uintptr(s))
	})
}

// Recv receives count elements from peer into p (ncclRecv).
func (c *Comm) Recv(p Ptr, count int, t DataType, peer int, s Stream) error {
	nt, err := ncclType(t)
	if err != nil {
		return err
	}
	return c.call("ncclRecv", func() int32 {
		return c.n.api.recv(uintptr(p), uint64(count), nt, int32(peer), c.c, uintptr(s))
	})
}

// Split makes communicators of the ranks with the same color, ordered by
// key (ncclCommSplit, NCCL 2.18+, the parent's configuration). Every rank
// of c must call it; a rank with color SplitNoColor gets nil.
func (c *Comm) Split(color, key int) (*Comm, error) {
	var nc uintptr
	if err := c.call("ncclCommSplit", func() int32 {
		return c.n.api.commSplit(c.c, int32(color), int32(key), &nc, 0)
	}); err != nil {
		return nil, err
	}
	if nc == 0 {
		return nil, nil
	}
	out := &Comm{n: c.n, d: c.d, c: nc}
	var rank, count int32
	if err := c.call("ncclCommUserRank", func() int32 { return c.n.api.commUserRank(nc, &rank) }); err != nil {
		return nil, err
	}
	if err := c.call("ncclCommCount", func() int32 { return c.n.api.commCount(nc, &count) }); err != nil {
		return nil, err
	}
	out.rank, out.nranks = int(rank), int(count)
	return out, nil
}

// AsyncError returns the communicator's asynchronous error, if any
// (ncclCommGetAsyncError): a peer that died, a network failure.
func (c *Comm) AsyncError() error {
	var r int32
	if err := c.call("ncclCommGetAsyncError", func() int32 { return c.n.api.commGetAsyncError(c.c, &r) }); err != nil {
		return err
	}
	if err := c.n.check("ncclCommGetAsyncError", c.c, r); err != nil {
		return fmt.Errorf("cuda: NCCL rank %d of %d: %w", c.rank, c.nranks, err)
	}
	return nil
}

// Destroy frees the communicator after its queued work is done
// (ncclCommDestroy).
func (c *Comm) Destroy() error {
	if c.c == 0 {
		return nil
	}
	err := c.call("ncclCommDestroy", func() int32 { return c.n.api.commDestroy(c.c) })
	c.c = 0
	return err
}

// Abort frees the communicator at once, ending the operations queued or
// running on it (ncclCommAbort): the way out of an operation that waits
// for a peer that is gone, which Destroy would wait for. It may be called
// from another goroutine while an operation blocks in NCCL; the
// communicator must not be used after it.
func (c *Comm) Abort() error {
	if c.c == 0 {
		return nil
	}
	err := c.call("ncclCommAbort", func() int32 { return c.n.api.commAbort(c.c) })
	c.c = 0
	return err
}
