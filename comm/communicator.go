package comm

import (
	"context"
	"unsafe"
)

// Communicator is a group of ranks and the data-path operations the
// engine's parallel dimensions run on it: the gradients of data
// parallelism and sharding, the activations of tensor and pipeline
// parallelism. The TCP ring ([Group]) implements it, and so does the NCCL
// communicator of package comm/nccl; the engine sees only this interface.
//
// Members are numbered 0..Size()-1 in ascending world-rank order; peers are
// given as these numbers. Every member must issue the same operations
// (kind and lengths) in the same order; for Send, Recv and Exchange, the
// members involved, in the same order relative to the communicator's
// other operations.
//
// # Ordering
//
// A communicator is tied to the rank's stream: the queue of kernels of the
// rank's compute backend. An operation sees every kernel queued on the
// stream before it was issued, and kernels queued after a blocking
// operation returns (after an asynchronous one's Wait returns) see its
// result. The host must not touch a buffer given to an operation until the
// operation is done, and reads the result only through the stream (after
// the backend's Sync): an implementation may run the operation on the
// device, after the kernels before it, and return to the host at once.
//
// Point-to-point transfers rendezvous: a Send may wait until the matching
// Recv has been issued (NCCL's does). A schedule whose two neighbours each
// send before they receive deadlocks; they issue the two together with
// Exchange.
//
// # Failure and cancellation
//
// Failures are those of [Group]: a member that is gone or stuck fails the
// operation within the timeout with a [*PeerError], the failure ends the
// whole job's communicators, and canceling the context of an issued
// blocking operation aborts them (the other members could not be told to
// skip it).
type Communicator interface {
	// Rank is this process's member number; Size the number of members.
	Rank() int
	Size() int

	// AllReduce replaces buf, on every member, with the element-wise sum
	// of all members' buf.
	AllReduce(ctx context.Context, buf []float32) error
	// AllReduceAsync starts AllReduce and returns at once.
	AllReduceAsync(buf []float32) Request
	// AllReduceBF16Async starts an all-reduce of buf, the backend's
	// bfloat16 activations (kernels.Activations under bf16), in
	// bfloat16, and returns at once: each partial sum is rounded to the
	// nearest bfloat16 as it is made, as NCCL's ncclBfloat16 all-reduce
	// does. NCCL moves half AllReduce's bytes; the TCP ring, whose CPU
	// backend keeps bfloat16 activations in float32s, the same.
	AllReduceBF16Async(buf []float32) Request
	// AllReduce64 sums a few float64s (loss sums, softmax statistics)
	// over the members, in rank order.
	AllReduce64(ctx context.Context, buf []float64) error
	// ReduceScatter leaves in out this member's part of the element-wise
	// sum of the members' in: len(in) = Size()·len(out).
	ReduceScatter(ctx context.Context, in, out []float32) error
	// AllGather concatenates the members' in, in member order, into out
	// on every member: len(out) = Size()·len(in).
	AllGather(ctx context.Context, in, out []float32) error

	// Send sends buf to member to; Recv receives into buf (of the same
	// length) what member from sends.
	Send(ctx context.Context, buf []float32, to int) error
	Recv(ctx context.Context, buf []float32, from int) error
	// Exchange issues sends and receives together and returns when all
	// are done, so that none waits for another: a pipeline stage's
	// outputs to its neighbours and its next inputs from them. Transfers
	// between two members are matched in the order each side lists them.
	Exchange(ctx context.Context, sends, recvs []Transfer) error

	// Traffic counts the payload bytes sent and received so far.
	Traffic() Traffic
}

// Transfer is one side of a point-to-point transfer in an Exchange: the
// member it goes to or comes from, and the buffer.
type Transfer struct {
	Peer int
	Buf  []float32
}

// Request is an operation issued asynchronously.
type Request interface {
	// Wait blocks until the operation is done (or, on a device, ordered
	// before the kernels queued after Wait returns) and returns its
	// error, or until ctx ends. A Wait that returns ctx's error leaves the
	// operation running: its buffers still belong to the communicator.
	Wait(ctx context.Context) error
}

// Stream is the queue of device work a rank's operations are ordered
// after. Sync returns once everything queued on it has finished, with the
// device's first failure, if any. The GPU backend is one; a backend that
// computes synchronously needs none.
type Stream interface {
	Sync() error
}

// DeviceStream is a Stream whose memory the host cannot address
// (kernels/deferred's sealed test double, which models device memory):
// the TCP ring reads and writes an operation's buffers — by the group's
// worker and its connections' readers and writers — at the addresses
// Alias gives, as a GPU's copy engine or NCCL's kernels address memory
// the host cannot.
type DeviceStream interface {
	Stream
	// Alias returns where the ring may read and write the memory at p:
	// the device's address of it when p is the stream's memory, else p.
	Alias(p unsafe.Pointer) unsafe.Pointer
}

// Fabric makes the communicators of one rank of a job.
type Fabric interface {
	// Rank and Size are this process's world rank and the job's size.
	Rank() int
	Size() int
	// Communicator returns a communicator for the given world ranks
	// (ascending, this rank among them), named for diagnostics. Every
	// member must create the same communicators in the same order.
	Communicator(name string, ranks []int) (Communicator, error)
}

// CollectiveFabric is a Fabric whose communicators are made by all the
// job's ranks together, members or not: NCCL's, split from one world
// communicator. Communicator only declares a communicator (its operations
// fail until then); Ready, called by every rank once it has declared all
// of its communicators, makes them all. The ranks' declarations together
// must be consistent: every member of a communicator declares it, with
// the same name and ranks, and the communicators of one name (and order
// of declaration among that name's) do not overlap.
type CollectiveFabric interface {
	Fabric
	Ready(ctx context.Context) error
}

// Fabric returns w's communicators as a [Fabric]: [Group]s of the TCP
// ring. With s not nil, every operation first waits for s (the host can
// only hand the ring memory the device has finished writing); with s nil
// the kernels are assumed to have finished when they return. A
// [DeviceStream]'s memory is touched at its Alias.
func (w *World) Fabric(s Stream) Fabric { return tcpFabric{w, s} }

type tcpFabric struct {
	w *World
	s Stream
}

func (f tcpFabric) Rank() int { return f.w.Rank() }
func (f tcpFabric) Size() int { return f.w.Size() }

func (f tcpFabric) Communicator(name string, ranks []int) (Communicator, error) {
	g, err := f.w.NamedGroup(name, ranks)
	if err != nil || f.s == nil {
		return g, err
	}
	d, _ := f.s.(DeviceStream)
	return &streamGroup{g, f.s, d}, nil
}

// streamGroup is a Group whose operations wait for the stream before the
// ring touches their buffers, and touch a device's at its Alias.
type streamGroup struct {
	g *Group
	s Stream
	d DeviceStream // s, when its memory is a device's; else nil
}

// alias returns buf at the address where the ring may touch it.
func alias[T any](d DeviceStream, buf []T) []T {
	if d == nil || len(buf) == 0 {
		return buf
	}
	return unsafe.Slice((*T)(d.Alias(unsafe.Pointer(unsafe.SliceData(buf)))), len(buf))
}

// aliases returns ts with their buffers at their Alias.
func aliases(d DeviceStream, ts []Transfer) []Transfer {
	if d == nil {
		return ts
	}
	out := make([]Transfer, len(ts))
	for i, t := range ts {
		out[i] = Transfer{Peer: t.Peer, Buf: alias(d, t.Buf)}
	}
	return out
}

func (c *streamGroup) Rank() int        { return c.g.Rank() }
func (c *streamGroup) Size() int        { return c.g.Size() }
func (c *streamGroup) Traffic() Traffic { return c.g.Traffic() }

func (c *streamGroup) AllReduce(ctx context.Context, buf []float32) error {
	if err := c.s.Sync(); err != nil {
		return err
	}
	return c.g.AllReduce(ctx, alias(c.d, buf))
}

func (c *streamGroup) AllReduceAsync(buf []float32) Request {
	if err := c.s.Sync(); err != nil {
		return failed("AllReduce", err)
	}
	return c.g.AllReduceAsync(alias(c.d, buf))
}

func (c *streamGroup) AllReduceBF16Async(buf []float32) Request {
	if err := c.s.Sync(); err != nil {
		return failed("AllReduceBF16", err)
	}
	return c.g.AllReduceBF16Async(alias(c.d, buf))
}

func (c *streamGroup) AllReduce64(ctx context.Context, buf []float64) error {
	if err := c.s.Sync(); err != nil {
		return err
	}
	return c.g.AllReduce64(ctx, alias(c.d, buf))
}

func (c *streamGroup) ReduceScatter(ctx context.Context, in, out []float32) error {
	if err := c.s.Sync(); err != nil {
		return err
	}
	return c.g.ReduceScatter(ctx, alias(c.d, in), alias(c.d, out))
}

func (c *streamGroup) AllGather(ctx context.Context, in, out []float32) error {
	if err := c.s.Sync(); err != nil {
		return err
	}
	return c.g.AllGather(ctx, alias(c.d, in), alias(c.d, out))
}

func (c *streamGroup) Send(ctx context.Context, buf []float32, to int) error {
	if err := c.s.Sync(); err != nil {
		return err
	}
	return c.g.Send(ctx, alias(c.d, buf), to)
}

func (c *streamGroup) Recv(ctx context.Context, buf []float32, from int) error {
	if err := c.s.Sync(); err != nil {
		return err
	}
	return c.g.Recv(ctx, alias(c.d, buf), from)
}

func (c *streamGroup) Exchange(ctx context.Context, sends, recvs []Transfer) error {
	if err := c.s.Sync(); err != nil {
		return err
	}
	return c.g.Exchange(ctx, aliases(c.d, sends), aliases(c.d, recvs))
}

// Both implementations satisfy the interface.
var (
	_ Communicator = (*Group)(nil)
	_ Communicator = (*streamGroup)(nil)
)
