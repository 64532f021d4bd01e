package cluster

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gptui/gptui/agent"
	"github.com/gptui/gptui/sshexec"
)

// treeRun is a simulated distribution to n nodes through a distributor's
// acquire, release and add (no network): copy(src, dst) stands for a
// transfer, src nil for this machine's.
type treeRun struct {
	d       *distributor
	sp      *spread
	mu      sync.Mutex
	head    int // copies this machine made
	relays  int // relays tried
	failed  int // relays failed
	maxBusy int // the most transfers one holder served at once
}

func runTree(t *testing.T, n int, copy func(src, dst *node) error) *treeRun {
	t.Helper()
	r := &treeRun{d: newDistributor(context.Background(), true), sp: &spread{local: "f", changed: make(chan struct{})}}
	defer r.d.close()
	errs := sshexec.ForEach(context.Background(), n, 0, func(ctx context.Context, i int) error {
		dst := &node{name: fmt.Sprint("n", i)}
		tried := map[*holder]bool{}
		cannot := false
		for {
			h, err := r.d.acquire(ctx, r.sp, tried, cannot)
			if err != nil {
				return err
			}
			if h == nil {
				r.mu.Lock()
				r.head++
				r.mu.Unlock()
				err := copy(nil, dst)
				r.d.release(r.sp, nil, err)
				if err == nil {
					r.d.add(r.sp, dst, "f")
				}
				return err
			}
			r.d.mu.Lock()
			busy := h.active
			r.d.mu.Unlock()
			err = copy(h.n, dst)
			r.mu.Lock()
			r.relays++
			r.maxBusy = max(r.maxBusy, busy)
			if err != nil {
				r.failed++
			}
			r.mu.Unlock()
			r.d.release(r.sp, h, err)
			if err == nil {
				r.d.add(r.sp, dst, "f")
				return nil
			}
			tried[h] = true
			var re *relayError
			cannot = errors.As(err, &re) && re.destination
		}
	})
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	if got := len(r.sp.holders); got != n {
		t.Errorf("%d nodes hold the file, want %d", got, n)
	}
	return r
}

// TestRelayTree: this machine makes one copy, the nodes the other 31,
// each serving at most relayPeers at once, in a few rounds: the number of
// copies triples each round.
func TestRelayTree(t *testing.T) {
	const headTime, relayTime = 200 * time.Millisecond, 100 * time.Millisecond
	start := time.Now()
	r := runTree(t, 32, func(src, dst *node) error {
		if src == nil {
			time.Sleep(headTime)
		} else {
			time.Sleep(relayTime)
		}
		return nil
	})
	took := time.Since(start)
	t.Logf("32 nodes: %d copies from this machine, %d relayed, at most %d at once from one node, in %v", r.head, r.relays, r.maxBusy, took)
	if r.head != 1 || r.relays != 31 {
		t.Errorf("%d copies from this machine and %d relayed, want 1 and 31", r.head, r.relays)
	}
	if r.maxBusy > relayPeers {
		t.Errorf("a node served %d at once, more than %d", r.maxBusy, relayPeers)
	}
	// 1, 3, 9, 27, 81 copies: 4 rounds after the first (direct: 32 × 200 ms).
	if bound := headTime + 4*relayTime + time.Second; took > bound {
		t.Errorf("took %v, want about %v (under %v)", took, headTime+4*relayTime, bound)
	}
}

// TestRelayTreeFaults: a source that fails every transfer serves no more
// after relaySourceFailures, its destinations get the file from another
// node or this machine; a destination that cannot fetch gets it from this
// machine at once; when every relay fails, the job stops relaying.
func TestRelayTreeFaults(t *testing.T) {
	t.Run("bad source", func(t *testing.T) {
		var mu sync.Mutex
		var bad *node
		badServed := 0
		r := runTree(t, 12, func(src, dst *node) error {
			time.Sleep(20 * time.Millisecond)
			mu.Lock()
			defer mu.Unlock()
			if src == nil && bad == nil {
				bad = dst // the first copy's holder fails whatever it serves
			}
			if src != nil && src == bad {
				badServed++
				return &relayError{source: true, err: errors.New("died")}
			}
			return nil
		})
		t.Logf("%d copies from this machine, %d relays, %d failed", r.head, r.relays, r.failed)
		// Its failures count as they end: relayPeers-1 more may have
		// started meanwhile.
		if most := relaySourceFailures + relayPeers - 1; badServed > most {
			t.Errorf("the failing source was tried %d times, more than %d", badServed, most)
		}
		// The first copy, and one for each destination it failed.
		if most := 1 + relaySourceFailures + relayPeers - 1; r.head > most {
			t.Errorf("%d copies from this machine, want at most %d", r.head, most)
		}
	})
	t.Run("destination cannot fetch", func(t *testing.T) {
		r := runTree(t, 6, func(src, dst *node) error {
			time.Sleep(20 * time.Millisecond)
			if src != nil && dst.name == "n3" {
				return &relayError{destination: true, err: errors.New("no /dev/tcp")}
			}
			return nil
		})
		if r.failed > 1 || r.head > 2 {
			t.Errorf("%d failed relays and %d copies from this machine, want at most 1 and 2", r.failed, r.head)
		}
	})
	t.Run("every relay fails", func(t *testing.T) {
		r := runTree(t, 16, func(src, dst *node) error {
			time.Sleep(10 * time.Millisecond)
			if src != nil {
				return errors.New("network down")
			}
			return nil
		})
		t.Logf("%d copies from this machine, %d relays failed", r.head, r.failed)
		// Those in flight when the count is reached finish theirs.
		if r.failed > relayGiveUp+relayPeers*relayGiveUp {
			t.Errorf("%d relays failed after relaying should have stopped at %d", r.failed, relayGiveUp)
		}
		if r.head != 16 {
			t.Errorf("%d copies from this machine, want all 16", r.head)
		}
	})
}

// TestRelayFetchScript runs relayFetchScript here against ServeFiles: the
// file lands whole with its mode; a wrong hash, a token not granted and a
// source not listening fail with their exit statuses and leave nothing.
func TestRelayFetchScript(t *testing.T) {
	if _, err := exec.LookPath("bash"); err != nil {
		t.Skipf("no bash: %v", err)
	}
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	content := bytes.Repeat([]byte{0, 1, 2, 255, '\n', 'x'}, 500_000)
	if err := os.WriteFile(src, content, 0o644); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(content)
	want := hex.EncodeToString(sum[:])

	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	done := make(chan error, 1)
	go func() {
		done <- agent.ServeFiles(context.Background(), inR, outW)
		outW.Close()
	}()
	defer func() {
		inW.Close()
		if err := <-done; err != nil {
			t.Errorf("ServeFiles: %v", err)
		}
	}()
	port := 0
	var first [64]byte
	n, _ := outR.Read(first[:])
	if _, err := fmt.Sscanf(string(first[:n]), "listening %d", &port); err != nil {
		t.Fatalf("%q: %v", first[:n], err)
	}
	go io.Copy(io.Discard, outR)

	fetch := func(target, sum string, port int, token string) (int, string) {
		cmd := exec.Command("bash", "-c", relayFetchScript, "gptui-fetch", target, target+".relay-test", "127.0.0.1", fmt.Sprint(port), sum, "0755")
		cmd.Stdin = strings.NewReader(token + "\n")
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		err := cmd.Run()
		var ee *exec.ExitError
		if err != nil && !errors.As(err, &ee) {
			t.Fatal(err)
		}
		return cmd.ProcessState.ExitCode(), stderr.String()
	}
	target := filepath.Join(dir, "sub", "dir", "dst")
	for _, tt := range []struct {
		name   string
		grant  bool
		sum    string
		port   int
		status int
	}{
		{"wrong hash", true, strings.Repeat("0", 64), port, 75},
		{"token not granted", false, want, port, 75},
		{"nothing listening", true, want, 1, 73},
		{"whole", true, want, port, 0},
	} {
		tok := newToken()
		if tt.grant {
			fmt.Fprintf(inW, "grant 1 %s %s\n", tok, src)
		}
		code, stderr := fetch(target, tt.sum, tt.port, tok)
		if code != tt.status {
			t.Errorf("%s: exit status %d, want %d: %s", tt.name, code, tt.status, stderr)
		}
		entries, _ := os.ReadDir(filepath.Dir(target))
		for _, e := range entries {
			if e.Name() != "dst" {
				t.Errorf("%s: %s left behind", tt.name, e.Name())
			}
		}
	}
	got, err := os.ReadFile(target)
	if err != nil || !bytes.Equal(got, content) {
		t.Fatalf("the fetched file: %d bytes, %v; want the %d bytes sent", len(got), err, len(content))
	}
	if fi, _ := os.Stat(target); fi.Mode().Perm() != 0o755 {
		t.Errorf("mode %v, want 0755", fi.Mode().Perm())
	}
}

// TestAwaitGrant: the destination gets its token only once the source's
// server says the grant is in force ("granted ID"); a server that ends,
// or takes no grant in time, is the source's failure (a relayError the
// distributor retries from another holder), and a cancelled push ends
// the wait with its cause.
func TestAwaitGrant(t *testing.T) {
	cancelled := errors.New("the push was cancelled")
	for _, tc := range []struct {
		name   string
		lines  []string // what the server reports before the wait
		down   bool     // the server has ended
		cancel bool     // the push's context is cancelled
		want   string   // "" for nil, else in the error
		source bool     // a relayError of the source
	}{
		{"granted", []string{"granted 7"}, false, false, "", false},
		{"another transfer's grant first", []string{"granted 70", "progress 7 100", "granted 7"}, false, false, "", false},
		{"the server ended", []string{"granted 6"}, true, false, "the server on src ended: killed", true},
		{"no grant in time", nil, false, false, "src did not take the grant within 20ms", true},
		{"cancelled", nil, false, true, cancelled.Error(), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := &relayServer{n: &node{name: "src"}, down: make(chan struct{})}
			lines := make(chan string, len(tc.lines))
			for _, l := range tc.lines {
				lines <- l
			}
			if tc.down {
				srv.endErr = errors.New("killed")
				close(srv.down)
			}
			ctx, cancel := context.WithCancelCause(context.Background())
			defer cancel(nil)
			if tc.cancel {
				cancel(cancelled)
			}
			err := awaitGrant(ctx, srv, lines, "7", 20*time.Millisecond)
			var re *relayError
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("awaitGrant: %v, want nil", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("awaitGrant: %v, want an error with %q", err, tc.want)
			case tc.source != (errors.As(err, &re) && re.source):
				t.Fatalf("awaitGrant: %v (%T): the source's failure %v, want %v", err, err, !tc.source, tc.source)
			}
		})
	}
}
