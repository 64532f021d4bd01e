package jobdir

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// The test binary is also a stand-in supervisor (fakeSupervisor), started
// by Launch as the real one is, so that the claim's passing through exec
// is what is tested.
func TestMain(m *testing.M) {
	if os.Getenv("GPTUI_FAKE_SUPERVISOR") != "" {
		os.Exit(fakeSupervisor(os.Args[len(os.Args)-1]))
	}
	os.Exit(m.Run())
}

// fakeSupervisor does what a supervisor does with its claim: it takes the
// claim Launch handed it, writes its record, notes that it ran (a line in
// DIR/ran), starts a long child if GPTUI_FAKE_CHILD is set, and exits
// after a moment.
func fakeSupervisor(dir string) int {
	c, err := SuperviseClaim(dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 3
	}
	defer c.Release()
	if err := WriteSupervisor(dir, Self(filepath.Join(dir, SocketFile))); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	f, err := os.OpenFile(filepath.Join(dir, "ran"), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err == nil {
		fmt.Fprintf(f, "%d\n", os.Getpid())
		f.Close()
	}
	if os.Getenv("GPTUI_FAKE_CHILD") != "" {
		child := exec.Command("sleep", "5")
		if err := child.Start(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
	time.Sleep(100 * time.Millisecond)
	return 0
}

// waitEnded waits until the job in dir has no live supervisor.
func waitEnded(t *testing.T, dir string) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if j, err := Read(dir); err == nil && !j.Alive {
			return
		}
	}
	t.Fatalf("%s: the supervisor is still alive after 5 s", dir)
}

// TestRestartRace launches the supervisor of one job twice at the same
// instant, 20 times, as two `gptui restart` of an ended job do: each time
// exactly one supervisor runs, and the other launch is refused naming the
// job.
func TestRestartRace(t *testing.T) {
	t.Setenv("GPTUI_FAKE_SUPERVISOR", "1")
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	for trial := range 20 {
		_, dir := newJob(t)
		var errs [2]error
		var wg sync.WaitGroup
		for k := range errs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, errs[k] = Launch(dir, exe)
			}()
		}
		wg.Wait()
		refused := 0
		for _, err := range errs {
			var busy *BusyError
			switch {
			case err == nil:
			case errors.As(err, &busy) && busy.ID == testID:
				refused++
			default:
				t.Fatalf("trial %d: launch: %v, want success or a *BusyError for job %s", trial, err, testID)
			}
		}
		if refused != 1 {
			t.Fatalf("trial %d: %d of 2 simultaneous launches refused (%v), want 1", trial, refused, errs)
		}
		waitEnded(t, dir)
		b, _ := os.ReadFile(filepath.Join(dir, "ran"))
		if n := strings.Count(string(b), "\n"); n != 1 {
			t.Fatalf("trial %d: %d supervisors ran (%q), want 1", trial, n, b)
		}
	}
}

// TestClaimEndsWithSupervisor: a claim handed to a supervisor is held
// while it runs (a third launch is refused), not inherited by the
// programs it starts, and free once it exits.
func TestClaimEndsWithSupervisor(t *testing.T) {
	t.Setenv("GPTUI_FAKE_SUPERVISOR", "1")
	t.Setenv("GPTUI_FAKE_CHILD", "1")
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	_, dir := newJob(t)
	sup, err := Launch(dir, exe)
	if err != nil {
		t.Fatal(err)
	}
	var busy *BusyError
	if _, err := TakeClaim(dir); !errors.As(err, &busy) || busy.Supervisor.PID != sup.PID {
		t.Fatalf("claim while the supervisor runs: %v, want a *BusyError naming pid %d", err, sup.PID)
	}
	if !strings.Contains(busy.Error(), fmt.Sprint(sup.PID)) {
		t.Errorf("the refusal %q does not name the supervisor's pid %d", busy, sup.PID)
	}
	waitEnded(t, dir)
	c, err := TakeClaim(dir) // its child, sleep 5, still runs
	if err != nil {
		t.Fatalf("claim after the supervisor exited, its child running: %v", err)
	}
	c.Release()
}
