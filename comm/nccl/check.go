package nccl

import (
	"context"
	"fmt"

	"github.com/gptui/gptui/comm"
)

// Memory is what [Check] needs of a rank's compute backend: buffers the
// device reaches, which the host fills and reads only through Upload and
// Download (a GPU's device memory is not the host's to touch), and Sync
// (kernels.Memory has them all; cuda.Backend is one).
type Memory interface {
	Float32s(n int) []float32
	Float64s(n int) []float64
	Upload(dst, src any)
	Download(dst, src any) error
	Sync() error
}

// Check runs every operation of comm.Communicator on c, which every
// member runs at once, and compares each result with what the members'
// inputs make it: once on buffers from m (device memory: filled by
// m.Upload, read by m.Download) and once on Go slices (host memory). The inputs are small
// integers, so every sum is exact in any order and a result must match
// bit for bit: the TCP ring and NCCL give the same. On one rank it is the
// device check of NCCL's path (gptui gpu nccl); on several, with a fake
// library, its test.
func Check(ctx context.Context, c comm.Communicator, m Memory) error {
	for _, dev := range []bool{true, false} {
		where := "host memory"
		if dev {
			where = "device memory"
		}
		if err := check(ctx, c, m, dev); err != nil {
			return fmt.Errorf("%s: %w", where, err)
		}
	}
	return nil
}

// checkN is the length of the buffers: odd, and past one chunk of the TCP
// ring when the float32s of a whole group are counted.
const checkN = 40961

// value is member r's input at i.
func value(r, i int) float32 { return float32(r*1000 + i%97) }

func check(ctx context.Context, c comm.Communicator, m Memory, dev bool) error {
	S, me := c.Size(), c.Rank()
	f32 := func(n int) []float32 {
		if dev {
			return m.Float32s(n)
		}
		return make([]float32, n)
	}
	// read waits for the device before the host reads a result.
	read := func() error {
		if dev {
			return m.Sync()
		}
		return nil
	}
	compare := func(op string, got []float32, want func(i int) float32) error {
		if err := read(); err != nil {
			return fmt.Errorf("%s: %w", op, err)
		}
		if dev {
			h := make([]float32, len(got))
			if err := m.Download(h, got); err != nil {
				return fmt.Errorf("%s: %w", op, err)
			}
			got = h
		}
		for i, g := range got {
			if w := want(i); g != w {
				return fmt.Errorf("%s on %d members: rank %d's element %d is %g, want %g", op, S, me, i, g, w)
			}
		}
		return nil
	}
	fill := func(b []float32, r, off int) []float32 {
		h := b
		if dev {
			h = make([]float32, len(b))
		}
		for i := range h {
			h[i] = value(r, off+i)
		}
		if dev {
			m.Upload(b, h)
		}
		return b
	}
	sum := func(i int) float32 { // Σ_r value(r, i)
		return float32(1000*S*(S-1)/2 + S*(i%97))
	}

	// AllReduce, and its asynchronous form.
	b := fill(f32(checkN), me, 0)
	if err := c.AllReduce(ctx, b); err != nil {
		return fmt.Errorf("AllReduce: %w", err)
	}
	if err := compare("AllReduce", b, sum); err != nil {
		return err
	}
	a1, a2 := fill(f32(checkN), me, 0), fill(f32(7), me, 3)
	r1, r2 := c.AllReduceAsync(a1), c.AllReduceAsync(a2)
	for _, r := range []comm.Request{r2, r1} {
		if err := r.Wait(ctx); err != nil {
			return fmt.Errorf("AllReduceAsync: %w", err)
		}
	}
	if err := compare("AllReduceAsync", a1, sum); err != nil {
		return err
	}
	if err := compare("AllReduceAsync", a2, func(i int) float32 { return sum(i + 3) }); err != nil {
		return err
	}

	// AllReduce64.
	h64 := make([]float64, 3)
	for i := range h64 {
		h64[i] = float64(me) + 0.5*float64(i)
	}
	s64 := h64
	if dev {
		s64 = m.Float64s(3)
		m.Upload(s64, h64)
	}
	if err := c.AllReduce64(ctx, s64); err != nil {
		return fmt.Errorf("AllReduce64: %w", err)
	}
	if err := read(); err != nil {
		return err
	}
	if dev {
		if err := m.Download(h64, s64); err != nil {
			return fmt.Errorf("AllReduce64: %w", err)
		}
	}
	for i, g := range h64 {
		if w := float64(S*(S-1)/2) + 0.5*float64(i*S); g != w {
			return fmt.Errorf("AllReduce64 on %d members: rank %d's element %d is %g, want %g", S, me, i, g, w)
		}
	}

	// ReduceScatter: out is this member's part of the sum of the ins.
	n := checkN/S + 1
	in := fill(f32(S*n), me, 0)
	out := f32(n)
	if err := c.ReduceScatter(ctx, in, out); err != nil {
		return fmt.Errorf("ReduceScatter: %w", err)
	}
	if err := compare("ReduceScatter", out, func(i int) float32 { return sum(me*n + i) }); err != nil {
		return err
	}

	// AllGather: the members' ins in member order.
	in = fill(f32(n), me, 0)
	out = f32(S * n)
	if err := c.AllGather(ctx, in, out); err != nil {
		return fmt.Errorf("AllGather: %w", err)
	}
	if err := compare("AllGather", out, func(i int) float32 { return value(i/n, i%n) }); err != nil {
		return err
	}

	// An Exchange around the ring (with oneself on one member).
	next, prev := (me+1)%S, (me+S-1)%S
	send, recv := fill(f32(checkN), me, 0), f32(checkN)
	if err := c.Exchange(ctx, []comm.Transfer{{Peer: next, Buf: send}}, []comm.Transfer{{Peer: prev, Buf: recv}}); err != nil {
		return fmt.Errorf("Exchange: %w", err)
	}
	if err := compare("Exchange", recv, func(i int) float32 { return value(prev, i) }); err != nil {
		return err
	}

	// Send and Recv in pairs, an even member first sending to the odd one
	// after it, then the other way round: a send needs its receive posted.
	if S == 1 {
		return nil
	}
	for _, dir := range []int{0, 1} {
		buf := fill(f32(checkN), me, 0)
		sends := me%2 == dir
		peer := me + 1
		if me%2 == 1 {
			peer = me - 1
		}
		if peer >= S {
			continue
		}
		var err error
		if sends {
			err = c.Send(ctx, buf, peer)
		} else {
			err = c.Recv(ctx, buf, peer)
		}
		if err != nil {
			return fmt.Errorf("Send/Recv: %w", err)
		}
		if !sends {
			if err := compare("Send/Recv", buf, func(i int) float32 { return value(peer, i) }); err != nil {
				return err
			}
		}
	}
	return read()
}
