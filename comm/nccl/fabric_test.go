package nccl

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/gptui/gptui/comm"
	"github.com/gptui/gptui/half"
	"github.com/gptui/gptui/kernels/cuda"
)

// connect connects a TCP World of size ranks in this process, one
// goroutine per rank, and closes them when the test ends.
func connect(t testing.TB, size int, timeout time.Duration) []*comm.World {
	t.Helper()
	for attempt := 0; ; attempt++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		l.Close()
		worlds := make([]*comm.World, size)
		errs := make([]error, size)
		var wg sync.WaitGroup
		for r := range size {
			wg.Go(func() {
				worlds[r], errs[r] = comm.Connect(context.Background(), comm.Config{Rank: r, WorldSize: size, MasterAddr: "127.0.0.1", MasterPort: port, Timeout: timeout, Secret: []byte("test")})
			})
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			closeAll(worlds)
			if errors.Is(errs[0], syscall.EADDRINUSE) && attempt < 3 {
				continue
			}
			t.Fatalf("connecting %d ranks: %v", size, err)
		}
		t.Cleanup(func() { closeAll(worlds) })
		return worlds
	}
}

func closeAll(worlds []*comm.World) {
	var wg sync.WaitGroup
	for _, w := range worlds {
		if w != nil {
			wg.Go(func() { w.Close() })
		}
	}
	wg.Wait()
}

// onAll runs f for every rank concurrently and returns the errors by rank.
func onAll(n int, f func(r int) error) []error {
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Go(func() { errs[r] = f(r) })
	}
	wg.Wait()
	return errs
}

func mustAll(t testing.TB, n int, f func(r int) error) {
	t.Helper()
	for r, err := range onAll(n, f) {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
}

// rank is one rank of a test job: its World, its view of the fake, its
// compute stream and its fabric.
type rank struct {
	w      *comm.World
	lib    *Lib
	stream cuda.Stream
	f      *Fabric
	fake   *fake
}

// Float32s, Float64s and Sync make a rank the Memory of Check: device
// memory of the fake, and the compute stream's work done.
func (r *rank) Float32s(n int) []float32 { return r.fake.float32s(n) }
func (r *rank) Float64s(n int) []float64 { return r.fake.float64s(n) }
func (r *rank) Sync() error              { return r.fake.syncStream(r.lib, r.stream) }

// Upload and Download copy between host memory and the fake's device
// memory once the stream's work is done, as kernels.Memory orders them.
func (r *rank) Upload(dst, src any) {
	if err := r.Sync(); err != nil {
		panic(err)
	}
	copyAny(dst, src)
}

func (r *rank) Download(dst, src any) error {
	if err := r.Sync(); err != nil {
		return err
	}
	copyAny(dst, src)
	return nil
}

// copyAny copies src into dst, slices of one element type.
func copyAny(dst, src any) {
	switch d := dst.(type) {
	case []float32:
		copy(d, src.([]float32))
	case []float64:
		copy(d, src.([]float64))
	default:
		panic(fmt.Sprintf("copy into a %T", dst))
	}
}

// worldTimeout is the least timeout of the TCP World under a test's
// fabrics (fabricsWith).
const worldTimeout = 5 * time.Second

// fabrics connects size ranks and makes each one's fabric on fk.
func fabrics(t testing.TB, fk *fake, size int, timeout time.Duration) []*rank {
	t.Helper()
	return fabricsWith(t, fk, size, Options{Timeout: timeout})
}

// fabricsWith is fabrics with the options o (its Lib and Stream set per
// rank). The TCP World under the fabrics gets o.Timeout but at least
// worldTimeout: the tests time the fabric's watchdog, and a World with
// their sub-second timeouts declares a member gone when a loaded machine
// leaves its heartbeats unscheduled for half of that.
func fabricsWith(t testing.TB, fk *fake, size int, o Options) []*rank {
	t.Helper()
	worlds := connect(t, size, max(o.Timeout, worldTimeout))
	rs := make([]*rank, size)
	mustAll(t, size, func(r int) error {
		lib := fk.lib(r)
		s, err := lib.NewStream()
		if err != nil {
			return err
		}
		o := o
		o.Lib, o.Stream = lib, s
		f, err := New(context.Background(), worlds[r], o)
		if err != nil {
			return err
		}
		rs[r] = &rank{w: worlds[r], lib: lib, stream: s, f: f, fake: fk}
		return nil
	})
	t.Cleanup(func() {
		for _, r := range rs {
			r.f.Close()
		}
	})
	return rs
}

// TestBootstrap: rank 0 makes the unique id and the others get it over
// the TCP World: every rank joins the same world communicator, in its
// place; a rank that never joins fails the others within the timeout.
func TestBootstrap(t *testing.T) {
	fk := newFake(t)
	rs := fabrics(t, fk, 3, 10*time.Second)
	if fk.ids != 1 {
		t.Errorf("%d unique ids made, want 1 (rank 0's)", fk.ids)
	}
	for i, r := range rs {
		h := r.f.root.(*fhandle)
		if h.rank != i || h.Size() != 3 || h.c != rs[0].f.root.(*fhandle).c {
			t.Errorf("rank %d joined as %d of %d, world communicator %p (rank 0's %p)", i, h.rank, h.Size(), h.c, rs[0].f.root.(*fhandle).c)
		}
	}

	// Rank 2 is connected but never makes its fabric.
	worlds := connect(t, 3, 500*time.Millisecond)
	t0 := time.Now()
	errs := onAll(2, func(r int) error {
		lib := fk.lib(r)
		s, _ := lib.NewStream()
		f, err := New(context.Background(), worlds[r], Options{Lib: lib, Stream: s, Timeout: 500 * time.Millisecond})
		if err == nil {
			f.Close()
		}
		return err
	})
	for r, err := range errs {
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("rank %d without rank 2: %v, want a timeout", r, err)
		}
	}
	if d := time.Since(t0); d > 5*time.Second {
		t.Errorf("the ranks gave up after %v", d)
	}
}

// TestOperations: every operation, on device and host buffers, gives
// what the members' inputs make it on 1, 2 and 3 ranks; the same check
// passes on the TCP ring's communicators, so it checks what the
// interface promises.
func TestOperations(t *testing.T) {
	for _, size := range []int{1, 2, 3} {
		t.Run(fmt.Sprintf("nccl %d", size), func(t *testing.T) {
			fk := newFake(t)
			rs := fabrics(t, fk, size, 10*time.Second)
			cs := make([]comm.Communicator, size)
			mustAll(t, size, func(r int) error {
				c, err := rs[r].f.Communicator("dp", allRanks(size))
				if err != nil {
					return err
				}
				if err := c.AllReduce(context.Background(), make([]float32, 1)); err == nil {
					return errors.New("an AllReduce before Ready worked")
				}
				cs[r] = c
				return rs[r].f.Ready(context.Background())
			})
			mustAll(t, size, func(r int) error { return Check(context.Background(), cs[r], rs[r]) })
			for r, rk := range rs {
				p := rk.f.Progress()
				if len(p.InFlight) != 0 || p.Done < 10 || p.Last.Group != "dp" {
					t.Errorf("rank %d after the check: %+v", r, p)
				}
				tr := cs[r].Traffic()
				if size > 1 && (tr.SentBytes == 0 || tr.RecvBytes == 0) {
					t.Errorf("rank %d traffic %+v", r, tr)
				}
			}
		})
	}
	t.Run("tcp 3", func(t *testing.T) {
		worlds := connect(t, 3, 10*time.Second)
		mustAll(t, 3, func(r int) error {
			c, err := worlds[r].Fabric(nil).Communicator("dp", allRanks(3))
			if err != nil {
				return err
			}
			return Check(context.Background(), c, hostMemory{})
		})
	})
}

// hostMemory is Memory on the Go heap, for the TCP ring.
type hostMemory struct{}

func (hostMemory) Float32s(n int) []float32 { return make([]float32, n) }
func (hostMemory) Float64s(n int) []float64 { return make([]float64, n) }
func (hostMemory) Sync() error              { return nil }
func (hostMemory) Upload(dst, src any)      { copyAny(dst, src) }
func (hostMemory) Download(dst, src any) error {
	copyAny(dst, src)
	return nil
}

func allRanks(n int) []int {
	r := make([]int, n)
	for i := range r {
		r[i] = i
	}
	return r
}

// halvesIn is an Options.Halves that takes the buffers of bufs (read
// under mu) for the backend's bfloat16 activations, at their own address:
// the fake reads and writes a BF16 buffer's first half as bfloat16s.
func halvesIn(mu *sync.Mutex, bufs [][]float32) func(unsafe.Pointer, int) (cuda.Ptr, bool) {
	return func(p unsafe.Pointer, n int) (cuda.Ptr, bool) {
		mu.Lock()
		defer mu.Unlock()
		for _, h := range bufs {
			lo := uintptr(unsafe.Pointer(unsafe.SliceData(h)))
			if h != nil && uintptr(p) >= lo && uintptr(p)+uintptr(n) <= lo+uintptr(4*len(h)) {
				return cuda.Ptr(uintptr(p)), true
			}
		}
		return 0, false
	}
}

// TestAllReduceBF16: AllReduceBF16Async hands NCCL the backend's
// bfloat16 activations at their bfloat16s' address as ncclBfloat16 — the
// fake adds in float32 and stores each sum in bfloat16, as NCCL does —
// counts half AllReduce's bytes, and refuses a buffer of float32s.
func TestAllReduceBF16(t *testing.T) {
	fk := newFake(t)
	const n = 8
	// Each rank's "activations": a float32 buffer whose first 2n bytes
	// hold n bfloat16s, Halves giving that same address.
	halves := make([][]float32, 2)
	var mu sync.Mutex
	rs := fabricsWith(t, fk, 2, Options{Timeout: 10 * time.Second, Halves: halvesIn(&mu, halves)})
	value := func(r, i int) float32 { return half.BF16ToF32(half.F32ToBF16(1 + float32(i)/3 + float32(r)/7)) }
	bf16s := func(h []float32) []uint16 { return unsafe.Slice((*uint16)(unsafe.Pointer(unsafe.SliceData(h))), n) }
	cs := ready(t, rs, "dp")
	errs := onAll(2, func(r int) error {
		h := rs[r].Float32s(n)
		for i := range n {
			bf16s(h)[i] = half.F32ToBF16(value(r, i))
		}
		mu.Lock()
		halves[r] = h
		mu.Unlock()
		if err := cs[r].AllReduceBF16Async(h).Wait(context.Background()); err != nil {
			return err
		}
		return rs[r].Sync()
	})
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	for r := range 2 {
		for i, b := range bf16s(halves[r]) {
			want := half.BF16ToF32(half.F32ToBF16(value(0, i) + value(1, i)))
			if got := half.BF16ToF32(b); got != want {
				t.Errorf("rank %d, element %d: %v, want %v", r, i, got, want)
			}
		}
	}
	if got, want := cs[0].Traffic().SentBytes, int64(2*n); got != want {
		t.Errorf("%d bytes counted sent, want %d (half of a float32 all-reduce's)", got, want)
	}
	refused := onAll(2, func(r int) error { return cs[r].AllReduceBF16Async(rs[r].Float32s(n)).Wait(context.Background()) })
	for r, err := range refused {
		if err == nil || !strings.Contains(err.Error(), "not the backend's bfloat16 activations") {
			t.Errorf("rank %d: AllReduceBF16Async of float32s: %v, want a refusal", r, err)
		}
	}
}

// TestHalves: a buffer the backend says holds bfloat16 activations
// (Options.Halves) goes to NCCL at the address Halves gives, as BF16 —
// the fake, which moves float32s only, refuses it by that type — and sums
// of such buffers, and gathers between one and a float32 buffer, are
// refused before NCCL is called, naming the operation.
func TestHalves(t *testing.T) {
	for _, tc := range []struct {
		name string
		op   func(c comm.Communicator, half, f32 []float32, r int) error
		want string
	}{
		{"send", func(c comm.Communicator, half, _ []float32, r int) error {
			if r == 0 {
				return c.Send(context.Background(), half, 1)
			}
			return c.Recv(context.Background(), half, 0)
		}, "fake ncclSend of bf16"},
		{"all-reduce", func(c comm.Communicator, half, _ []float32, _ int) error {
			return c.AllReduce(context.Background(), half)
		}, "AllReduce of bfloat16 activations"},
		{"all-gather into float32s", func(c comm.Communicator, half, f32 []float32, _ int) error {
			return c.AllGather(context.Background(), half[:4], f32)
		}, "AllGather from bf16 into f32"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fk := newFake(t)
			halves := make([][]float32, 2)
			var mu sync.Mutex
			rs := fabricsWith(t, fk, 2, Options{Timeout: 10 * time.Second, Halves: halvesIn(&mu, halves)})
			errs := onAll(2, func(r int) error {
				c, err := rs[r].f.Communicator("mp", allRanks(2))
				if err == nil {
					err = rs[r].f.Ready(context.Background())
				}
				if err != nil {
					return err
				}
				mu.Lock()
				halves[r] = rs[r].Float32s(8)
				h := halves[r]
				mu.Unlock()
				return tc.op(c, h, rs[r].Float32s(8), r)
			})
			for r, err := range errs {
				if r == 1 && tc.name == "send" {
					continue // the receiver fails with the fabric, or by the same check
				}
				if err == nil || !strings.Contains(err.Error(), tc.want) {
					t.Errorf("rank %d: %v, want an error saying %q", r, err, tc.want)
				}
			}
		})
	}
}
