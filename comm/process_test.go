package comm

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"
)

// TestHelperRank is not a test: it is the body of the child processes that
// the multi-process tests and benchmarks start by re-executing the test
// binary with GPTUI_COMM_HELPER set to the mode, and torchrun's variables.
func TestHelperRank(t *testing.T) {
	mode := os.Getenv("GPTUI_COMM_HELPER")
	if mode == "" {
		t.Skip("helper process of the multi-process tests")
	}
	var err error
	switch mode {
	case "bench":
		err = benchRank()
	case "loop":
		err = loopRank()
	default:
		err = fmt.Errorf("unknown helper mode %q", mode)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "helper rank %s: %v\n", os.Getenv("RANK"), err)
		os.Exit(1)
	}
	os.Exit(0)
}

// helperResult is what a "loop" rank reports when its all-reduce loop
// ends, in the file named by GPTUI_COMM_RESULT.
type helperResult struct {
	Rank       int    `json:"rank"`
	Iterations int    `json:"iterations"`
	Err        string `json:"err"`
	PeerError  bool   `json:"peer_error"`
	PeerRank   int    `json:"peer_rank"`
	PeerAddr   string `json:"peer_addr"`
	At         int64  `json:"at_unix_nano"` // when the error was returned
}

// loopRank all-reduces 4 MiB over and over, printing "ready" after the
// first, until an all-reduce fails, and reports how.
func loopRank() error {
	cfg, err := ConfigFromEnv()
	if err != nil {
		return err
	}
	ctx := context.Background()
	w, err := Connect(ctx, cfg)
	if err != nil {
		return err
	}
	defer w.Close()
	g, err := w.Group(allRanks(w.Size()))
	if err != nil {
		return err
	}
	buf := exactInput(w.Rank(), 1<<20)
	for i := 0; ; i++ {
		if err := g.AllReduce(ctx, buf); err != nil {
			res := helperResult{Rank: w.Rank(), Iterations: i, Err: err.Error(), At: time.Now().UnixNano()}
			var pe *PeerError
			if errors.As(err, &pe) {
				res.PeerError, res.PeerRank, res.PeerAddr = true, pe.Rank, pe.Addr
			}
			b, err := json.Marshal(res)
			if err != nil {
				return err
			}
			return os.WriteFile(os.Getenv("GPTUI_COMM_RESULT"), b, 0o644)
		}
		clear(buf)
		if i == 0 {
			fmt.Println("ready")
		}
	}
}

// rankProcess is a child process running one rank.
type rankProcess struct {
	cmd    *exec.Cmd
	result string       // its GPTUI_COMM_RESULT file
	stderr bytes.Buffer // what it wrote there
	ready  chan bool    // receives whether it printed "ready"
	exited chan error   // receives cmd.Wait's result
}

// startRanks starts n "loop" ranks as child processes.
func startRanks(t *testing.T, n int, timeout time.Duration) []*rankProcess {
	t.Helper()
	port := freePort(t)
	dir := t.TempDir()
	procs := make([]*rankProcess, n)
	for r := range n {
		p := &rankProcess{result: fmt.Sprintf("%s/result.%d", dir, r), ready: make(chan bool, 1), exited: make(chan error, 1)}
		p.cmd = exec.Command(os.Args[0], "-test.run=^TestHelperRank$")
		p.cmd.Env = append(os.Environ(), "GPTUI_COMM_HELPER=loop", "GPTUI_COMM_RESULT="+p.result,
			"RANK="+strconv.Itoa(r), "WORLD_SIZE="+strconv.Itoa(n),
			"MASTER_ADDR=127.0.0.1", "MASTER_PORT="+strconv.Itoa(port), "GPTUI_JOB_SECRET=test",
			"GPTUI_COMM_TIMEOUT="+timeout.String())
		p.cmd.Stderr = &p.stderr
		out, err := p.cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := p.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		go func() {
			sc := bufio.NewScanner(out)
			ok := sc.Scan() && sc.Text() == "ready"
			p.ready <- ok
			for sc.Scan() {
			}
			p.exited <- p.cmd.Wait()
		}()
		procs[r] = p
	}
	t.Cleanup(func() {
		for _, p := range procs {
			p.cmd.Process.Kill()
		}
	})
	return procs
}
