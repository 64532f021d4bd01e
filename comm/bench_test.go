package comm

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"testing"
	"time"
)

// benchSizes are the all-reduce buffer sizes in MiB.
var benchSizes = []int{1, 16, 64, 256}

// busBandwidth is the bus bandwidth in GB/s of n all-reduces of bytes each
// on s ranks in d: 2(s−1)/s · bytes / time, what each link carries.
func busBandwidth(s, bytes, n int, d time.Duration) float64 {
	return 2 * float64(s-1) / float64(s) * float64(bytes) * float64(n) / d.Seconds() / 1e9
}

// BenchmarkAllReduce measures the all-reduce with each rank in its own
// process: the benchmark is rank 0 and starts the others by re-executing
// the test binary (TestHelperRank, mode "bench"), which then follow rank
// 0's commands, broadcast before each timed loop.
func BenchmarkAllReduce(b *testing.B) {
	for _, s := range []int{2, 4} {
		b.Run(fmt.Sprintf("ranks=%d", s), func(b *testing.B) {
			w, stop := startBenchRanks(b, s)
			defer stop()
			g, err := w.Group(allRanks(s))
			if err != nil {
				b.Fatal(err)
			}
			for _, mb := range benchSizes {
				b.Run(fmt.Sprintf("MB=%d", mb), func(b *testing.B) {
					buf := make([]float32, mb<<18)
					ctx := context.Background()
					cmd := []float32{float32(b.N), float32(mb)}
					if err := g.Broadcast(ctx, cmd, 0); err != nil {
						b.Fatal(err)
					}
					if err := g.AllReduce(ctx, buf); err != nil { // warm-up
						b.Fatal(err)
					}
					b.SetBytes(int64(4 * len(buf)))
					b.ResetTimer()
					start := time.Now()
					for range b.N {
						if err := g.AllReduce(ctx, buf); err != nil {
							b.Fatal(err)
						}
					}
					d := time.Since(start)
					b.ReportMetric(busBandwidth(s, 4*len(buf), b.N, d), "busGB/s")
				})
			}
			if err := g.Broadcast(context.Background(), []float32{-1, 0}, 0); err != nil {
				b.Fatal(err)
			}
		})
	}
}

// startBenchRanks connects this process as rank 0 of s ranks, the others
// being child processes, and returns the World and a function that waits
// for the children after they were told to exit.
func startBenchRanks(b *testing.B, s int) (*World, func()) {
	port := freePort(b)
	var cmds []*exec.Cmd
	for r := 1; r < s; r++ {
		cmd := exec.Command(os.Args[0], "-test.run=^TestHelperRank$")
		cmd.Env = append(os.Environ(), "GPTUI_COMM_HELPER=bench",
			"RANK="+strconv.Itoa(r), "WORLD_SIZE="+strconv.Itoa(s),
			"MASTER_ADDR=127.0.0.1", "MASTER_PORT="+strconv.Itoa(port), "GPTUI_JOB_SECRET=test",
			"GPTUI_COMM_TIMEOUT=60s")
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
		cmds = append(cmds, cmd)
	}
	w, err := Connect(context.Background(), Config{Rank: 0, WorldSize: s, MasterAddr: "127.0.0.1", MasterPort: port, Timeout: 60 * time.Second, Secret: []byte("test")})
	if err != nil {
		for _, c := range cmds {
			c.Process.Kill()
			c.Wait()
		}
		b.Fatal(err)
	}
	return w, func() {
		w.Close()
		for _, c := range cmds {
			if err := c.Wait(); err != nil {
				b.Errorf("bench rank: %v", err)
			}
		}
	}
}

// benchRank is the body of a child rank of BenchmarkAllReduce.
func benchRank() error {
	cfg, err := ConfigFromEnv()
	if err != nil {
		return err
	}
	w, err := Connect(context.Background(), cfg)
	if err != nil {
		return err
	}
	defer w.Close()
	g, err := w.Group(allRanks(w.Size()))
	if err != nil {
		return err
	}
	ctx := context.Background()
	var buf []float32
	for {
		cmd := make([]float32, 2)
		if err := g.Broadcast(ctx, cmd, 0); err != nil {
			return err
		}
		if cmd[0] < 0 {
			return nil
		}
		if n := int(cmd[1]) << 18; len(buf) != n {
			buf = make([]float32, n)
		}
		for range int(cmd[0]) + 1 {
			if err := g.AllReduce(ctx, buf); err != nil {
				return err
			}
		}
	}
}

// BenchmarkAllReduceInProcess measures the all-reduce with every rank a
// goroutine of this process (each with its own World over loopback TCP).
func BenchmarkAllReduceInProcess(b *testing.B) {
	for _, s := range []int{2, 4} {
		b.Run(fmt.Sprintf("ranks=%d", s), func(b *testing.B) {
			ws := connectWorlds(b, s, func(c *Config) { c.Timeout = 60 * time.Second })
			gs := groups(b, ws, allRanks(s))
			for _, mb := range benchSizes {
				b.Run(fmt.Sprintf("MB=%d", mb), func(b *testing.B) {
					bufs := make([][]float32, s)
					for r := range bufs {
						bufs[r] = make([]float32, mb<<18)
					}
					ctx := context.Background()
					mustAll(b, s, func(r int) error { return gs[r].AllReduce(ctx, bufs[r]) })
					b.SetBytes(int64(mb << 20))
					b.ResetTimer()
					start := time.Now()
					mustAll(b, s, func(r int) error {
						for range b.N {
							if err := gs[r].AllReduce(ctx, bufs[r]); err != nil {
								return err
							}
						}
						return nil
					})
					b.ReportMetric(busBandwidth(s, mb<<20, b.N, time.Since(start)), "busGB/s")
				})
			}
		})
	}
}

// loopbackPair returns the two ends of a loopback TCP connection, tuned as
// the mesh connections are.
func loopbackPair(b *testing.B) (*net.TCPConn, *net.TCPConn) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	acc := make(chan net.Conn, 1)
	go func() {
		c, err := l.Accept()
		if err != nil {
			acc <- nil
			return
		}
		acc <- c
	}()
	c1, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	c2 := <-acc
	if c2 == nil {
		b.Fatal("accept failed")
	}
	a, z := c1.(*net.TCPConn), c2.(*net.TCPConn)
	tune(a)
	tune(z)
	return a, z
}

// coldBytes is the size of the buffers the "cold" loopback benchmarks walk
// through, larger than the caches, as the all-reduce's buffers are.
const coldBytes = 64 << 20

// BenchmarkLoopbackTCP measures raw loopback TCP throughput: one stream,
// 4 MiB writes, the reader in another goroutine; the ceiling for one link
// of the mesh. "hot" writes the same 4 MiB again and again (it stays in
// the caches); "cold" walks through 64 MiB on both ends.
func BenchmarkLoopbackTCP(b *testing.B) {
	const chunk = 4 << 20
	for _, span := range []struct {
		name  string
		bytes int
	}{{"hot", chunk}, {"cold", coldBytes}} {
		b.Run(span.name, func(b *testing.B) {
			a, z := loopbackPair(b)
			defer a.Close()
			defer z.Close()
			done := make(chan error, 1)
			go func() {
				buf := make([]byte, span.bytes)
				var err error
				for i := 0; err == nil; i++ {
					o := i * chunk % span.bytes
					_, err = io.ReadFull(z, buf[o:o+chunk])
				}
				if err == io.EOF {
					err = nil
				}
				done <- err
			}()
			buf := make([]byte, span.bytes)
			b.SetBytes(chunk)
			b.ResetTimer()
			start := time.Now()
			for i := range b.N {
				o := i * chunk % span.bytes
				if _, err := a.Write(buf[o : o+chunk]); err != nil {
					b.Fatal(err)
				}
			}
			a.CloseWrite()
			if err := <-done; err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(chunk)*float64(b.N)/time.Since(start).Seconds()/1e9, "GB/s")
		})
	}
}

// BenchmarkLoopbackRing measures raw loopback TCP with s streams at once in
// a ring, every endpoint sending and receiving 1 MiB pieces of 64 MiB
// buffers: the traffic of a ring all-reduce without the arithmetic, so the
// per-link throughput the machine allows when s links share its cores.
func BenchmarkLoopbackRing(b *testing.B) {
	const chunk = 1 << 20
	for _, s := range []int{2, 4} {
		b.Run(fmt.Sprintf("ranks=%d", s), func(b *testing.B) {
			out := make([]*net.TCPConn, s) // rank r → r+1
			in := make([]*net.TCPConn, s)  // rank r−1 → r
			for r := range s {
				a, z := loopbackPair(b)
				defer a.Close()
				defer z.Close()
				out[r], in[(r+1)%s] = a, z
			}
			b.SetBytes(chunk)
			b.ResetTimer()
			start := time.Now()
			var wg sync.WaitGroup
			for r := range s {
				wg.Go(func() {
					buf := make([]byte, coldBytes)
					for i := range b.N {
						o := i * chunk % coldBytes
						if _, err := out[r].Write(buf[o : o+chunk]); err != nil {
							b.Error(err)
							return
						}
					}
				})
				wg.Go(func() {
					buf := make([]byte, coldBytes)
					for i := range b.N {
						o := i * chunk % coldBytes
						if _, err := io.ReadFull(in[r], buf[o:o+chunk]); err != nil {
							b.Error(err)
							return
						}
					}
				})
			}
			wg.Wait()
			b.ReportMetric(float64(chunk)*float64(b.N)/time.Since(start).Seconds()/1e9, "linkGB/s")
		})
	}
}

// BenchmarkAllReduceSmall measures the latency of small all-reduces (a
// bias vector, a layer's worth of LayerNorm parameters), ranks as
// goroutines.
func BenchmarkAllReduceSmall(b *testing.B) {
	for _, s := range []int{2, 4} {
		b.Run(fmt.Sprintf("ranks=%d", s), func(b *testing.B) {
			ws := connectWorlds(b, s, nil)
			gs := groups(b, ws, allRanks(s))
			for _, n := range []int{1, 768, 65536} {
				b.Run(fmt.Sprintf("floats=%d", n), func(b *testing.B) {
					ctx := context.Background()
					mustAll(b, s, func(r int) error {
						buf := make([]float32, n)
						for range b.N {
							if err := gs[r].AllReduce(ctx, buf); err != nil {
								return err
							}
						}
						return nil
					})
				})
			}
		})
	}
}
