package main

import (
	"bytes"
	"strings"
	"sync"
	"testing"
	"time"
)

// lockedBuffer is a bytes.Buffer safe for the watchdog's goroutine.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestWatchdog: output that keeps coming keeps the watchdog quiet; when
// it stops for longer than the wait, the watchdog prints the goroutines'
// stacks and one last line naming the last line printed and what to do,
// and exits with status 1.
func TestWatchdog(t *testing.T) {
	var out, errs lockedBuffer
	exited := make(chan int, 1)
	const wait = 400 * time.Millisecond
	dog := newWatchdog(&out, &errs, wait, "gpu check", func(code int) { exited <- code })
	defer dog.stop()
	for i := range 6 { // 480 ms of output, none of it a wait apart
		dog.Write([]byte("PASS  check " + string(rune('a'+i)) + "\n"))
		time.Sleep(wait / 5)
	}
	dog.Write([]byte("PASS  NVRTC load\nPASS  kernel la"))
	select {
	case code := <-exited:
		t.Fatalf("the watchdog fired (exit %d) while output came; stderr:\n%s", code, errs.String())
	default:
	}
	select {
	case code := <-exited:
		if code != 1 {
			t.Errorf("exit status %d, want 1", code)
		}
	case <-time.After(10 * wait):
		t.Fatal("the watchdog did not fire after the output stopped")
	}
	if !strings.Contains(out.String(), "PASS  check f\n") {
		t.Errorf("output not passed through: %q", out.String())
	}
	e := strings.TrimSpace(errs.String())
	last := e[strings.LastIndexByte(e, '\n')+1:]
	if !strings.Contains(e, "goroutine ") || !strings.Contains(e, "TestWatchdog") {
		t.Errorf("no goroutine stacks before the message:\n%s", e)
	}
	for _, want := range []string{"gptui: gpu check: watchdog: nothing printed for 400ms after \"PASS  kernel la\"", "a GPU call hangs", "CUDA_LAUNCH_BLOCKING=1", "--watchdog"} {
		if !strings.Contains(last, want) {
			t.Errorf("last line %q does not say %q", last, want)
		}
	}
}

// TestGPUArgs: the gpu subcommands' arguments are checked before any GPU
// is looked for: an unknown part of 'gpu check --only' is a one-line
// usage error naming the parts.
func TestGPUArgs(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"gpu", "check", "--only", "selftest,kernels"}, []string{`no part "kernels"`, "selftest, kernels-fp32, kernels-bf16, tiny-fp32, 124m-bf16, nccl"}},
		{[]string{"gpu", "libs", "--watchdog", "1s"}, []string{"flag provided but not defined: -watchdog"}},
		{[]string{"gpu", "sing"}, []string{"gptui gpu libs", "gptui gpu check", "gptui gpu bench"}},
	} {
		code, _, e := runCLI(t, tc.args...)
		checkUserError(t, code, e, tc.want)
	}
}
