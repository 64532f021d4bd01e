package agent

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gptui/gptui/event"
	"github.com/gptui/gptui/launch"
)

// preflightRun is RunPreflight in a goroutine, driven as the launcher
// drives it, through pipes.
type preflightRun struct {
	in   *io.PipeWriter
	out  *bufio.Reader
	done chan error
}

func startPreflight(t *testing.T, spec PreflightSpec) (*preflightRun, PreflightListening) {
	t.Helper()
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	r := &preflightRun{in: inW, out: bufio.NewReader(outR), done: make(chan error, 1)}
	go func() {
		err := RunPreflight(context.Background(), inR, outW)
		outW.CloseWithError(io.EOF)
		r.done <- err
	}()
	t.Cleanup(func() { inW.Close() })
	b, _ := json.Marshal(spec)
	if _, err := inW.Write(append(b, '\n')); err != nil {
		t.Fatal(err)
	}
	var l PreflightListening
	if err := readLine(r.out, &l); err != nil {
		t.Fatalf("%s: the listening line: %v", spec.Node, err)
	}
	return r, l
}

// report sends the targets and reads the report.
func (r *preflightRun) report(t *testing.T, ts []PreflightTarget) *event.Preflight {
	t.Helper()
	b, _ := json.Marshal(PreflightTargets{Targets: ts})
	if _, err := r.in.Write(append(b, '\n')); err != nil {
		t.Fatal(err)
	}
	e, err := event.NewReader(r.out).Next()
	if err != nil || e.Kind != event.KindPreflight || e.Preflight == nil {
		t.Fatalf("the report: %+v, %v", e, err)
	}
	return e.Preflight
}

// TestRunPreflight: two nodes on this machine meet: the master listens
// on MASTER_PORT, each on a port of its ephemeral range, each reaches
// the master and the other; a port where nothing listens is refused, and
// a port answered by another node's pre-flight is not taken for the
// node's. The listeners stay open until standard input ends.
func TestRunPreflight(t *testing.T) {
	port, err := launch.FreePort("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	a, la := startPreflight(t, PreflightSpec{Node: "a", MasterAddr: "127.0.0.1", MasterPort: port, Master: true, World: 2, CkptDir: dir, DiskNeed: 1})
	b, lb := startPreflight(t, PreflightSpec{Node: "b", MasterAddr: "127.0.0.1", MasterPort: port, World: 2, CkptDir: dir, DiskNeed: 1 << 62, DiskWhy: "all of them"})
	for _, l := range []PreflightListening{la, lb} {
		if l.Iface == "" || l.Addr != "127.0.0.1" || l.Port < l.Range[0] || l.Port > l.Range[1] || l.MasterErr != "" {
			t.Fatalf("listening %+v, want a port of the ephemeral range on loopback", l)
		}
	}
	master := PreflightTarget{Node: "a", Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), Master: true, Range: la.Range}
	closed, err := launch.FreePort("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	pa := a.report(t, []PreflightTarget{master, {Node: "b", Addr: fmt.Sprintf("127.0.0.1:%d", lb.Port), Range: lb.Range}})
	pb := b.report(t, []PreflightTarget{master,
		{Node: "a", Addr: fmt.Sprintf("127.0.0.1:%d", la.Port), Range: la.Range},
		{Node: "c", Addr: fmt.Sprintf("127.0.0.1:%d", closed), Range: [2]int{1000, 2000}},
		{Node: "d", Addr: fmt.Sprintf("127.0.0.1:%d", la.Port), Range: la.Range}, // a's port, not d's
	})
	if pa.Status() != event.PreflightOK {
		t.Errorf("a: %+v, want ok", pa.Checks)
	}
	var text []string
	for _, c := range pb.Checks {
		text = append(text, c.Name+" "+c.Status+" "+c.Value+" "+c.Problem())
	}
	got := strings.Join(text, "\n")
	for _, want := range []string{
		"master ok 127.0.0.1:" + strconv.Itoa(port) + " reached in ",
		fmt.Sprintf("peer failed  b cannot reach c at 127.0.0.1:%d, a port of the range its workers listen in: connection refused; fix: open TCP ports 1000-2000 on c", closed),
		`peer failed  b cannot reach d at 127.0.0.1:` + strconv.Itoa(la.Port) + `, a port of the range its workers listen in: reached "gptui-preflight a" there instead of d's pre-flight`,
		"peer ok 1 peer reached in their ephemeral ranges",
		"disk failed ",
		"(4611686018427387904 bytes): all of them; fix: free ",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("b's checks lack %q:\n%s", want, got)
		}
	}
	// a still listens for late dialers until its input ends.
	c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", la.Port), time.Second)
	if err != nil {
		t.Errorf("a's listener is closed before its input ends: %v", err)
	} else {
		c.Close()
	}
	a.in.Close()
	b.in.Close()
	for _, r := range []*preflightRun{a, b} {
		select {
		case err := <-r.done:
			if err != nil {
				t.Errorf("RunPreflight: %v", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("RunPreflight did not return at the end of its input")
		}
	}
}

// TestPreflightAlone: without MASTER_ADDR (a job on the launcher's
// machine alone) no network is checked: no listener, no interface.
func TestPreflightAlone(t *testing.T) {
	r, l := startPreflight(t, PreflightSpec{Node: "local", World: 4})
	if l.Port != 0 || l.Iface != "" || l.IfaceErr != "" {
		t.Errorf("listening %+v, want nothing", l)
	}
	p := r.report(t, nil)
	for _, c := range p.Checks {
		if c.Name == event.CheckIface || c.Name == event.CheckMaster || c.Name == event.CheckPeer {
			t.Errorf("a network check alone: %+v", c)
		}
	}
	if p.Iface != "" {
		t.Errorf("interface %q alone", p.Iface)
	}
}
