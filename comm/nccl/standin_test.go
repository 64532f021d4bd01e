package nccl

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/gptui/gptui/comm"
	"github.com/gptui/gptui/half"
	"github.com/gptui/gptui/internal/standin"
	"github.com/gptui/gptui/kernels/cuda"
)

// The fabric over the real binding (cuda.LoadNCCL, cuda.Open: purego) and
// the stand-in libnccl.so.2 and libcuda.so.1 of internal/standin, its
// ranks in processes of their own: this test binary, run again as one
// rank (standinRankEnv set), which runs standinRank.

// standinRankEnv, set, makes TestStandin a rank of its parent's job.
const standinRankEnv = "GPTUI_TEST_STANDIN_RANK"

// TestStandin: three processes make the fabric over the stand-ins (the
// unique id over TCP, ncclCommInitRank, the splits of a communicator of
// all and of one of two plus one of one); every operation gives what the
// members' inputs make it (Check: device memory, queued on the streams,
// AllReduceAsync on the communication stream; host memory, staged); then
// ranks 0 and 1 each send to the other before receiving, which the
// stand-in's rendezvous hangs as NCCL's does: the host goes on (device
// buffers), the watchdog gives up after the timeout and aborts, which
// ends the stand-in's waiting operations (the stream drains). No shared
// memory is left behind.
func TestStandin(t *testing.T) {
	if os.Getenv(standinRankEnv) != "" {
		standinRank(t)
		return
	}
	libs := standin.Build(t)
	tag := standin.Tag(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	const size = 3
	outs := make([]strings.Builder, size)
	errs := make([]error, size)
	var wg sync.WaitGroup
	for r := range size {
		cmd := exec.Command(os.Args[0], "-test.run=^TestStandin$", "-test.v")
		cmd.Env = append(os.Environ(), append(standin.Env(libs, tag),
			standinRankEnv+"=1", "RANK="+strconv.Itoa(r), "WORLD_SIZE="+strconv.Itoa(size),
			"MASTER_ADDR=127.0.0.1", "MASTER_PORT="+strconv.Itoa(port), comm.SecretEnv+"=test")...)
		cmd.Stdout, cmd.Stderr = &outs[r], &outs[r]
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		wg.Go(func() {
			done := make(chan error, 1)
			go func() { done <- cmd.Wait() }()
			select {
			case errs[r] = <-done:
			case <-time.After(time.Minute):
				cmd.Process.Kill()
				errs[r] = fmt.Errorf("still running after a minute: %w", <-done)
			}
		})
	}
	wg.Wait()
	for r := range size {
		if errs[r] != nil {
			t.Errorf("rank %d: %v\n%s", r, errs[r], outs[r].String())
		} else {
			t.Logf("rank %d:\n%s", r, outs[r].String())
		}
	}
	if left := standin.Segments(tag); len(left) > 0 {
		t.Errorf("shared-memory segments left: %v", left)
	}
}

// deviceMemory is Check's Memory on a device of the stand-in driver,
// whose device memory is the process's own: a slice over it reads it.
type deviceMemory struct {
	d *cuda.Device
	s cuda.Stream
}

func (m deviceMemory) alloc(bytes int) unsafe.Pointer {
	p, err := m.d.Alloc(bytes)
	if err != nil {
		panic(err)
	}
	return *(*unsafe.Pointer)(unsafe.Pointer(&p))
}

func (m deviceMemory) Float32s(n int) []float32 { return unsafe.Slice((*float32)(m.alloc(4*n)), n) }
func (m deviceMemory) Float64s(n int) []float64 { return unsafe.Slice((*float64)(m.alloc(8*n)), n) }
func (m deviceMemory) Sync() error              { return m.d.Sync(m.s) }

// Upload and Download copy after the stream's work, as kernels.Memory
// orders them (the stand-in's device memory is the host's).
func (m deviceMemory) Upload(dst, src any) {
	if err := m.Sync(); err != nil {
		panic(err)
	}
	copyAny(dst, src)
}

func (m deviceMemory) Download(dst, src any) error {
	if err := m.Sync(); err != nil {
		return err
	}
	copyAny(dst, src)
	return nil
}

// standinRank is one rank of TestStandin's job.
func standinRank(t *testing.T) {
	cfg, err := comm.ConfigFromEnv()
	if err != nil {
		t.Fatal(err)
	}
	cfg.Timeout, cfg.InitTimeout = 20*time.Second, 20*time.Second
	ctx := context.Background()
	w, err := comm.Connect(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	d, err := cuda.Open(cfg.Rank)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	n, err := cuda.LoadNCCL()
	if err != nil {
		t.Fatal(err)
	}
	s, err := d.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	defer d.DestroyStream(s)
	const timeout = time.Second
	// halves is the one buffer of "bfloat16 activations" the bfloat16
	// all-reduce below uses: n float32s of device memory whose first 2n
	// bytes hold n bfloat16s, Halves giving that same address.
	var halves []float32
	isHalves := func(p unsafe.Pointer, bytes int) (cuda.Ptr, bool) {
		if halves != nil && p == unsafe.Pointer(unsafe.SliceData(halves)) && bytes == 4*len(halves) {
			return cuda.Ptr(uintptr(p)), true
		}
		return 0, false
	}
	f, err := New(ctx, w, Options{Lib: Real(d, n), Stream: s, Timeout: timeout, Halves: isHalves})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	t.Logf("rank %d: NCCL %d from %s, device %d (%s) of %s", cfg.Rank, n.Version(), n.Path(), d.Ordinal(), d.Name(), d.LibraryPath())
	all, err := f.Communicator("all", []int{0, 1, 2})
	if err != nil {
		t.Fatal(err)
	}
	part := []int{0, 1}
	if cfg.Rank == 2 {
		part = []int{2}
	}
	sub, err := f.Communicator("part", part)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Ready(ctx); err != nil {
		t.Fatal(err)
	}
	// The ranks leave together, over TCP, once the others are done.
	end, err := w.WorldGroup("end")
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := end.AllReduce64(ctx, []float64{1}); err != nil {
			t.Errorf("the last barrier: %v", err)
		}
	}()
	mem := deviceMemory{d, s}
	for _, c := range []comm.Communicator{all, sub} {
		if err := Check(ctx, c, mem); err != nil {
			t.Fatalf("%d members: %v", c.Size(), err)
		}
	}
	if p := f.Progress(); p.Done < 20 || len(p.InFlight) != 0 {
		t.Errorf("after the checks: %+v", p)
	}
	// A bfloat16 all-reduce over the three: each chunk added along the
	// ring from member c+1, each sum rounded, as the TCP ring's.
	const nb = 1001
	value := func(r, i int) float32 { return half.BF16ToF32(half.F32ToBF16(float32(i%37)/7 - 2 + float32(r)/3)) }
	halves = mem.Float32s(nb)
	bits := unsafe.Slice((*uint16)(unsafe.Pointer(unsafe.SliceData(halves))), nb)
	for i := range nb {
		bits[i] = half.F32ToBF16(value(cfg.Rank, i))
	}
	if err := all.AllReduceBF16Async(halves).Wait(ctx); err != nil {
		t.Fatalf("AllReduceBF16Async: %v", err)
	}
	if err := mem.Sync(); err != nil {
		t.Fatal(err)
	}
	for c := range 3 {
		for i := c * nb / 3; i < (c+1)*nb/3; i++ {
			want := value((c+1)%3, i)
			for k := 2; k <= 3; k++ {
				want = half.BF16ToF32(half.F32ToBF16(want + value((c+k)%3, i)))
			}
			if got := half.BF16ToF32(bits[i]); got != want {
				t.Fatalf("AllReduceBF16Async: element %d is %v, want %v", i, got, want)
			}
		}
	}

	// Two members that each send first: both wait on their streams.
	if cfg.Rank == 2 {
		return
	}
	t0 := time.Now()
	if err := sub.Send(ctx, mem.Float32s(5), 1-sub.Rank()); err != nil {
		t.Fatalf("a Send of device memory: %v", err)
	}
	if d := time.Since(t0); d > timeout/2 {
		t.Errorf("a Send of device memory took %v on the host", d)
	}
	for f.Err() == nil && time.Since(t0) < 10*timeout {
		time.Sleep(10 * time.Millisecond)
	}
	err = f.Err()
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "Send #") || !strings.Contains(err.Error(), "(part)") {
		t.Fatalf("after %v: %v, want the Send timed out", time.Since(t0), err)
	}
	t.Logf("after %v: %v", time.Since(t0).Round(time.Millisecond), err)
	// The abort ended the stand-in's send: the stream drains.
	if err := d.Sync(s); err != nil {
		t.Errorf("the stream after the abort: %v", err)
	}
	if d := time.Since(t0); d > 3*timeout {
		t.Errorf("the stream drained %v after the Send", d)
	}
	if err := all.AllReduce(ctx, make([]float32, 3)); err == nil {
		t.Errorf("an operation after the abort worked")
	}
}
