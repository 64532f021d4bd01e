//go:build unix

package comm

import (
	"encoding/json"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"
)

// TestPeerDeath runs 4 ranks as processes in an all-reduce loop and takes
// one away in the middle: killed (the kernel closes its sockets), or
// stopped (its sockets stay open but nothing comes). Every other rank must
// return a *PeerError naming it within the timeout; the test logs how long
// each took.
func TestPeerDeath(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	for _, tc := range []struct {
		name    string
		sig     syscall.Signal
		victim  int
		timeout time.Duration
	}{
		{"SIGKILL", syscall.SIGKILL, 2, 30 * time.Second},
		{"SIGSTOP", syscall.SIGSTOP, 1, 3 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const n = 4
			procs := startRanks(t, n, tc.timeout)
			for r, p := range procs {
				select {
				case ok := <-p.ready:
					if !ok {
						t.Fatalf("rank %d did not start: %s", r, p.stderr.String())
					}
				case <-time.After(30 * time.Second):
					t.Fatalf("rank %d did not start in 30 s", r)
				}
			}
			time.Sleep(100 * time.Millisecond) // well inside the loop
			killed := time.Now()
			if err := procs[tc.victim].cmd.Process.Signal(tc.sig); err != nil {
				t.Fatal(err)
			}
			var wg sync.WaitGroup
			latency := make([]time.Duration, n)
			for r, p := range procs {
				if r == tc.victim {
					continue
				}
				wg.Go(func() {
					select {
					case err := <-p.exited:
						if err != nil {
							t.Errorf("rank %d: %v: %s", r, err, p.stderr.String())
							return
						}
					case <-time.After(tc.timeout + 10*time.Second):
						t.Errorf("rank %d still running %v after the signal", r, tc.timeout+10*time.Second)
						return
					}
					b, err := os.ReadFile(p.result)
					if err != nil {
						t.Errorf("rank %d: %v", r, err)
						return
					}
					var res helperResult
					if err := json.Unmarshal(b, &res); err != nil {
						t.Errorf("rank %d: %v", r, err)
						return
					}
					latency[r] = time.Duration(res.At - killed.UnixNano())
					if !res.PeerError || res.PeerRank != tc.victim || res.PeerAddr == "" {
						t.Errorf("rank %d returned %q, want a *PeerError naming rank %d", r, res.Err, tc.victim)
					}
					if latency[r] > tc.timeout {
						t.Errorf("rank %d noticed after %v, more than the timeout %v", r, latency[r], tc.timeout)
					}
					t.Logf("rank %d: after %d all-reduces, %v after the signal: %s", r, res.Iterations, latency[r].Round(time.Millisecond), res.Err)
				})
			}
			wg.Wait()
			procs[tc.victim].cmd.Process.Kill()
			<-procs[tc.victim].exited
		})
	}
}
