package cluster

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gptui/gptui/event"
	"github.com/gptui/gptui/internal/sshtest"
	"github.com/gptui/gptui/sshexec"
)

// starCluster is n sshd nodes in a StarNet, the head's link shaped to
// headRate (tc; "" leaves it), and an inventory of them.
func starCluster(t *testing.T, n int, headRate string) (*sshtest.StarNet, *testCluster) {
	t.Helper()
	net := sshtest.NewStarNet(t, n)
	if headRate != "" {
		net.ShapeHead(t, headRate)
	}
	dir := t.TempDir()
	nodes := net.StartNodes(t, dir, "cpu:1")
	tc := &testCluster{servers: nodes.Servers, workdirs: nodes.Workdirs, hosts: nodes.Hosts, knownHosts: filepath.Join(dir, "known_hosts")}
	if err := os.WriteFile(tc.knownHosts, []byte(sshtest.KnownHosts(tc.servers...)), 0o600); err != nil {
		t.Fatal(err)
	}
	return net, tc
}

// fileSHA256 returns the hex SHA-256 of the file.
func fileSHA256(t *testing.T, file string) string {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// checkCopies fails the test unless every workdir holds gptui with the
// SHA-256 want.
func checkCopies(t *testing.T, workdirs []string, want string) {
	t.Helper()
	for _, wd := range workdirs {
		if got := fileSHA256(t, filepath.Join(wd, "gptui")); got != want {
			t.Errorf("%s/gptui: SHA-256 %s, want %s", wd, got, want)
		}
	}
}

// TestRelayStar: six nodes, the head's link shaped to 100 Mbit/s, and a
// data folder (three files of 3 MiB) that no node has. The plan pushes the
// binary and stages each data file to one node, and the nodes relay them
// to each other: the head's link carries them at most twice (once, plus
// SSH), and every node's copies have the SHA-256 of this machine's.
func TestRelayStar(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: six sshd nodes in a network namespace, a 35 MB binary over a 100 Mbit/s link")
	}
	exe := buildGPTUI(t)
	fi, err := os.Stat(exe)
	if err != nil {
		t.Fatal(err)
	}
	// The data: relative, so here (the test's current directory) and
	// in each workdir there.
	data := fmt.Sprintf("relaydata-%d", os.Getpid())
	t.Cleanup(func() { os.RemoveAll(data) })
	if err := os.MkdirAll(data, 0o755); err != nil {
		t.Fatal(err)
	}
	var dataBytes int64
	for k := range 3 {
		b := make([]byte, 3<<20)
		rand.Read(b)
		if err := os.WriteFile(filepath.Join(data, fmt.Sprintf("shard%d.bin", k)), b, 0o644); err != nil {
			t.Fatal(err)
		}
		dataBytes += int64(len(b))
	}
	net, tc := starCluster(t, 6, "100mbit")
	j := New(tc.options(t, "Data.Train.dataset.input_dir="+data, "Data.Eval.dataset.input_dir="+data))
	events := collect(j)
	tx0 := net.HeadTxBytes(t)
	start := time.Now()
	p, err := j.Plan(context.Background())
	took := time.Since(start)
	tx := net.HeadTxBytes(t) - tx0
	j.Close()
	es := <-events
	if err != nil {
		t.Fatal(err)
	}
	direct := 0
	for _, n := range p.Nodes {
		ps := n.Pushes[0]
		t.Logf("%s: %s", n.Name, ps)
		if ps.Skipped {
			t.Errorf("%s: binary push skipped on a new node", n.Name)
		}
		if ps.Via == "" {
			direct++
		}
	}
	t.Logf("plan of 6 nodes in %v; the head's link carried %.1f MB, the binary being %.1f MB and the data %.1f MB", took, float64(tx)/1e6, float64(fi.Size())/1e6, float64(dataBytes)/1e6)
	if direct != 1 {
		t.Errorf("%d nodes got the binary from this machine, want 1", direct)
	}
	if tx > 2*(fi.Size()+dataBytes) {
		t.Errorf("the head's link carried %d bytes, more than twice the binary and the data (%d)", tx, fi.Size()+dataBytes)
	}
	checkCopies(t, tc.workdirs, fileSHA256(t, exe))
	relayed := map[string]int{} // staged data files relayed, by file
	for _, e := range es {
		if e.Kind != event.KindNode {
			continue
		}
		if strings.Contains(e.Message, "relay") && strings.Contains(e.Message, "failed") {
			t.Errorf("%s: %s", e.Node, e.Message)
		}
		if strings.HasPrefix(e.Message, "staging "+data+" ") && strings.Contains(e.Message, ", relayed from ") {
			relayed[e.Message[strings.LastIndex(e.Message, "/shard"):strings.Index(e.Message, ".bin ")]]++
		}
	}
	for k := range 3 {
		f := fmt.Sprintf("shard%d.bin", k)
		want := fileSHA256(t, filepath.Join(data, f))
		for _, wd := range tc.workdirs {
			if got := fileSHA256(t, filepath.Join(wd, data, f)); got != want {
				t.Errorf("%s: SHA-256 %s, want %s", filepath.Join(wd, data, f), got, want)
			}
		}
		if got := relayed["/shard"+fmt.Sprint(k)]; got != 5 {
			t.Errorf("%s staged by relay to %d nodes, want 5", f, got)
		}
	}
}

// TestRelaySourceDies: four nodes whose links to each other are shaped
// (200 Mbit/s, so a relay takes seconds); the first relay's source is
// killed a second into sending. Its destinations get the binary from the
// head or from another node, every copy is right, and the job runs.
func TestRelaySourceDies(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: four sshd nodes in a network namespace, a relay source killed, a job")
	}
	exe := buildGPTUI(t)
	net, tc := starCluster(t, 4, "")
	net.ShapeNodes(t, "200mbit")
	var mu sync.Mutex
	var killed string
	testRelayHook = func(stage, src, dst string, kill func()) {
		mu.Lock()
		defer mu.Unlock()
		if stage == "progress" && killed == "" {
			killed = src
			t.Logf("killing the relay server on %s while it sends to %s", src, dst)
			go kill()
		}
	}
	t.Cleanup(func() { testRelayHook = nil })
	j := New(tc.options(t, append([]string{"Engine.max_steps=2"}, dp4...)...))
	events := collect(j)
	start := time.Now()
	p, err := j.Plan(context.Background())
	if err != nil {
		j.Close()
		t.Fatal(err)
	}
	planned := time.Since(start)
	testRelayHook = nil
	mu.Lock()
	if killed == "" {
		t.Error("no relay was killed: no progress reported by a source")
	}
	mu.Unlock()
	checkCopies(t, tc.workdirs, fileSHA256(t, exe))
	for _, wd := range tc.workdirs {
		if left, _ := filepath.Glob(filepath.Join(wd, "gptui.relay-*")); len(left) > 0 {
			t.Errorf("temporary files left: %q", left)
		}
	}
	if err := j.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	err = j.Wait()
	es := <-events
	var failedRelays []string
	for _, e := range es {
		if e.Kind == event.KindNode && e.State == event.NodePushing && strings.Contains(e.Message, "/gptui ") {
			t.Logf("%s: %s", e.Node, e.Message)
			if strings.Contains(e.Message, "the relay from "+killed+" failed") {
				failedRelays = append(failedRelays, e.Node)
			}
		}
	}
	if err != nil {
		t.Fatalf("job: %v", err)
	}
	if last := es[len(es)-1]; last.Kind != event.KindJob || last.State != event.JobDone {
		t.Errorf("last event %+v, want job done", last)
	}
	if len(failedRelays) == 0 {
		t.Errorf("no push says the relay from %s failed", killed)
	}
	for _, n := range p.Nodes {
		if slices.Contains(failedRelays, n.Name) && n.Pushes[0].Via == killed {
			t.Errorf("%s: relayed from %s, which was killed", n.Name, killed)
		}
	}
	t.Logf("plan %v (relays to %v failed and were made good), whole job %v", planned, failedRelays, time.Since(start))
}

// TestRelayBenchmark32 measures the time to push the binary to 32 nodes
// in a StarNet whose head link is shaped to 100 Mbit/s, directly (the head
// pushes to each) and relayed, three times each, alternately, and the
// bytes the head's link carried. It runs only with GPTUI_RELAY_BENCH=1
// (about 6 minutes); BENCHMARKS.md has its figures.
//
//	GPTUI_RELAY_BENCH=1 go test -count=1 -timeout 30m -run TestRelayBenchmark32 -v ./cluster
func TestRelayBenchmark32(t *testing.T) {
	if os.Getenv("GPTUI_RELAY_BENCH") == "" {
		t.Skip("set GPTUI_RELAY_BENCH=1 to run the 32-node push benchmark (about 6 minutes)")
	}
	const n, rounds = 32, 3
	exe := buildGPTUI(t)
	fi, err := os.Stat(exe)
	if err != nil {
		t.Fatal(err)
	}
	want := fileSHA256(t, exe)
	net, tc := starCluster(t, n, "100mbit")
	invNodes, err := sshexec.LoadInventory(tc.hosts)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	nodes := make([]*node, n)
	for i, inv := range invNodes {
		c, err := sshexec.Dial(ctx, inv.Host, inv.Port, sshexec.ClientConfig{User: inv.User, IdentityFiles: []string{inv.Identity}, KnownHostsFile: tc.knownHosts, NoAgent: true})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		nodes[i] = &node{inv: inv, name: inv.Host, client: c, dir: inv.Workdir, exe: "./gptui"}
	}
	type result struct {
		took time.Duration
		tx   int64
	}
	results := map[bool][]result{}
	for r := range rounds {
		for _, relay := range []bool{false, true} {
			for _, wd := range tc.workdirs {
				os.RemoveAll(wd)
			}
			d := newDistributor(ctx, relay)
			tx0 := net.HeadTxBytes(t)
			start := time.Now()
			var viaMu sync.Mutex
			direct := 0
			errs := sshexec.ForEach(ctx, n, DefaultParallel, func(ctx context.Context, i int) error {
				ps, notes, err := d.push(ctx, nodes[i], exe, path.Join(nodes[i].dir, "gptui"), 0o755, "")
				if len(notes) > 0 {
					t.Logf("%s: %s", nodes[i].name, relayNotes(notes))
				}
				viaMu.Lock()
				if ps.Via == "" {
					direct++
				}
				viaMu.Unlock()
				return err
			})
			took := time.Since(start)
			d.close()
			tx := net.HeadTxBytes(t) - tx0
			for _, err := range errs {
				if err != nil {
					t.Fatal(err)
				}
			}
			checkCopies(t, tc.workdirs, want)
			results[relay] = append(results[relay], result{took, tx})
			t.Logf("round %d, relay %v: %v, %d pushes from the head, the head's link carried %.1f MB", r+1, relay, took.Round(10*time.Millisecond), direct, float64(tx)/1e6)
		}
	}
	median := func(rs []result) result {
		s := slices.Clone(rs)
		slices.SortFunc(s, func(a, b result) int { return int(a.took - b.took) })
		return s[len(s)/2]
	}
	dm, rm := median(results[false]), median(results[true])
	var b strings.Builder
	for _, relay := range []bool{false, true} {
		fmt.Fprintf(&b, "relay %v:", relay)
		for _, r := range results[relay] {
			fmt.Fprintf(&b, " %.1f s (%.0f MB)", r.took.Seconds(), float64(r.tx)/1e6)
		}
		b.WriteString("\n")
	}
	t.Logf("%d nodes, binary %.1f MB, head link 100 Mbit/s\n%sdirect median %.1f s, relayed median %.1f s, ratio %.3f",
		n, float64(fi.Size())/1e6, b.String(), dm.took.Seconds(), rm.took.Seconds(), rm.took.Seconds()/dm.took.Seconds())
	if rm.took > dm.took/4 {
		t.Errorf("relayed %v is more than a quarter of direct %v", rm.took, dm.took)
	}
}
