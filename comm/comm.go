// Package comm is gptui's communicator for multi-process training on CPUs:
// collective operations (all-reduce, reduce-scatter, all-gather, broadcast,
// barrier) and point-to-point transfers between the processes of a job,
// over TCP.
//
// # Setting up
//
// Every process (rank) of a job calls [Connect] with the same world size
// and master address and its own rank; [ConfigFromEnv] reads them from the
// variables torchrun sets. Rank 0 listens on the master address, the other
// ranks register with it, and the ranks then connect into a full mesh: one
// TCP connection per pair of ranks, shared by every group.
//
// Every connection is authenticated with the job's secret ([Config.Secret],
// [SecretEnv]) before anything of the job crosses it; a peer that does not
// hold it is dropped and takes no rank's place. The traffic after that is
// not encrypted.
//
// A [World] hands out communicators for subsets of the ranks with
// [World.Group]. Groups are matched across processes by their member list
// and by the order in which they are created: every member of a group must
// create the same groups (the same member lists) in the same order. Creating
// a group needs no network round trip.
//
// # The engine's view
//
// The engine's parallel dimensions talk only to the [Communicator]
// interface, made by a [Fabric]: [World.Fabric] gives the TCP ring's
// groups, ordered after a device [Stream] where the backend computes
// asynchronously; package comm/nccl gives NCCL communicators on the GPU.
// The control plane (the stop and resume agreements, checkpoint parts,
// scalars) stays on the World's TCP groups.
//
// # Operations
//
// Buffers are []float32 (plus a small []float64 all-reduce for scalars such
// as loss sums, and an all-reduce of bfloat16 values held in float32s whose
// every sum is rounded to bfloat16, as NCCL's bfloat16 all-reduce makes
// them), and every operation exists in a form that blocks until it
// is done; all-reduce, reduce-scatter and all-gather also have asynchronous
// forms that return a [Request] to Wait on, for overlapping communication
// with computation. The operations of one group run one after another in
// the order they were issued, and every member must issue the same
// operations (with the same lengths) in the same order; members whose
// operations differ get an error rather than wrong data wherever the
// mismatch shows in the frames they exchange. Operations of different groups
// run concurrently.
//
// Sums are deterministic: AllReduce and ReduceScatter add each element along
// a fixed ring order, so every member gets bit-identical results and a
// repeated call with the same inputs gives the same bits. The order depends
// on the group size, so the result is not bit-identical to a sum computed in
// rank order (AllReduce64 does sum in rank order).
//
// # Failures
//
// Each blocking step is bounded by [Config.Timeout]: no wait inside an
// operation lasts longer than that without data arriving. Idle connections
// carry heartbeats, so a process that stops (killed, or hung) is noticed by
// every other rank within the timeout even when nobody was waiting for it.
// The first failure of any connection ends the whole World: every pending
// and later operation of every group fails with a [*PeerError] naming the
// rank that failed, and the ranks tell one another, so that all of them
// name the same culprit. A World is not usable after a failure; the job
// must be restarted (from a checkpoint).
//
// Canceling the context of a blocking operation that has been issued also
// ends the World (the other members could not be told to skip it); the
// context given to [Request.Wait] only stops the waiting.
//
// # Wire format and host requirements
//
// Data travels in the host's byte order with no conversion: the []float32
// buffers are sent and received in place, viewed as bytes. Every rank must
// therefore be little-endian (amd64, arm64, riscv64 and most others);
// Connect refuses to run on a big-endian host.
package comm

import (
	"encoding/binary"
	"errors"
	"fmt"
	"unsafe"

	"github.com/gptui/gptui/half"
)

// ErrClosed is the error of operations issued on (or pending in) a World
// after [World.Close].
var ErrClosed = errors.New("comm: world closed")

// ErrPeerClosed is the Err of the [*PeerError] for a member that closed its
// World while an operation still needed it.
var ErrPeerClosed = errors.New("peer closed its communicator")

// ErrMismatch is wrapped by the error reported when members issued
// different operations (kind, order or length) on a group.
var ErrMismatch = errors.New("members issued different operations")

// PeerError reports that a member of the World is gone or unusable, and
// which one. Err says what was observed, and wraps:
//
//   - io.EOF or a network error: the connection was closed or reset (the
//     process exited or was killed);
//   - context.DeadlineExceeded: the member sent nothing at all (not even
//     heartbeats) for half the timeout (the process is hung), or an
//     operation waited longer than the timeout for its data (the member
//     never issued the operation, or is stuck in something else);
//   - [ErrPeerClosed]: the member closed its World;
//   - [ErrMismatch]: the member's frames do not match the operation.
//
// A failure seen by one rank is passed on to the others, whose PeerError
// names the same rank, with Err starting "reported by rank N".
type PeerError struct {
	Rank int    // world rank of the member
	Addr string // the member's host:port in the mesh
	Err  error  // what was observed
}

// Error implements error.
func (e *PeerError) Error() string {
	return fmt.Sprintf("comm: rank %d (%s): %v", e.Rank, e.Addr, e.Err)
}

// Unwrap returns e.Err.
func (e *PeerError) Unwrap() error { return e.Err }

// Traffic counts the payload bytes (frame headers excluded) that this
// process sent and received through a group.
type Traffic struct {
	SentBytes, RecvBytes int64
}

// littleEndian reports whether the host stores numbers little-endian, as
// the wire format assumes.
func littleEndian() bool {
	var b [2]byte
	binary.NativeEndian.PutUint16(b[:], 1)
	return b[0] == 1
}

// f32Bytes views s as bytes, without copying.
func f32Bytes(s []float32) []byte {
	if len(s) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&s[0])), 4*len(s))
}

// f64Bytes views s as bytes, without copying.
func f64Bytes(s []float64) []byte {
	if len(s) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&s[0])), 8*len(s))
}

// bytesF32 views b, which must come from f32Bytes (aligned, a multiple of 4
// long), as float32s.
func bytesF32(b []byte) []float32 {
	if len(b) < 4 {
		return nil
	}
	return unsafe.Slice((*float32)(unsafe.Pointer(&b[0])), len(b)/4)
}

// addF32Go adds src into dst element by element; len(src) must be at least
// len(dst). It is addF32 where there is no assembly version.
func addF32Go(dst, src []float32) {
	src = src[:len(dst)]
	i := 0
	for ; i+8 <= len(dst); i += 8 {
		d := dst[i : i+8 : i+8]
		s := src[i : i+8 : i+8]
		d[0] += s[0]
		d[1] += s[1]
		d[2] += s[2]
		d[3] += s[3]
		d[4] += s[4]
		d[5] += s[5]
		d[6] += s[6]
		d[7] += s[7]
	}
	for ; i < len(dst); i++ {
		dst[i] += src[i]
	}
}

// roundBF16 rounds every element of x to the nearest bfloat16, ties to
// even (half's rule, as the kernels store bfloat16 activations).
func roundBF16(x []float32) {
	for i, v := range x {
		x[i] = half.BF16ToF32(half.F32ToBF16(v))
	}
}

// overlaps reports whether a and b share memory.
func overlaps(a, b []float32) bool {
	if len(a) == 0 || len(b) == 0 {
		return false
	}
	a0 := uintptr(unsafe.Pointer(&a[0]))
	b0 := uintptr(unsafe.Pointer(&b[0]))
	return a0 < b0+4*uintptr(len(b)) && b0 < a0+4*uintptr(len(a))
}
