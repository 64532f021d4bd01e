//go:build unix

package checkpoint

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// helperEnv carries "<output dir>|<step>|<phase>" to TestHelperSave in a
// child process.
const helperEnv = "GPTUI_CHECKPOINT_CRASH_HELPER"

// TestHelperSave is not a test: run as a child process by
// TestCrashSafety, it saves a checkpoint (keeping one) and SIGKILLs itself
// when the save reaches the phase named in its environment.
func TestHelperSave(t *testing.T) {
	spec := os.Getenv(helperEnv)
	if spec == "" {
		t.Skip("helper process for TestCrashSafety")
	}
	f := strings.Split(spec, "|")
	step, err := strconv.Atoi(f[1])
	if err != nil {
		t.Fatal(err)
	}
	opt := saveOptions{keepLast: 1, at: func(phase string) {
		if phase == f[2] {
			syscall.Kill(os.Getpid(), syscall.SIGKILL)
			time.Sleep(time.Minute) // the signal is on its way
		}
	}}
	if _, err := save(f[0], testManifest(step), wholeParts(step), opt); err != nil {
		t.Fatal(err)
	}
}

// saveInChild saves step in a child process that kills itself at phase
// ("" for none) and reports whether it was killed.
func saveInChild(t *testing.T, out string, step int, phase string) (killed bool) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperSave$", "-test.count=1")
	cmd.Env = append(os.Environ(), helperEnv+"="+out+"|"+strconv.Itoa(step)+"|"+phase)
	outb, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL {
			return true
		}
	}
	if err != nil {
		t.Fatalf("child saving step %d: %v\n%s", step, err, outb)
	}
	return false
}

func TestCrashSafety(t *testing.T) {
	const (
		tmp2 = ".tmp-step_00000002-*"
		s1   = "step_00000001"
		s2   = "step_00000002"
	)
	tests := []struct {
		phase    string   // where the save of step 2 dies; "" for nowhere
		wantStep int      // what Latest must return afterwards
		entries  []string // what the output directory holds afterwards
		inTmp    []string // what the temporary directory holds, if there is one
	}{
		{"tensors", 1, []string{tmp2, "latest", s1}, []string{"rank_00000.safetensors"}},
		{"manifest", 1, []string{tmp2, "latest", s1}, []string{"rank_00000.safetensors"}},
		{"rename", 1, []string{tmp2, "latest", s1}, []string{ManifestFile, "rank_00000.safetensors"}},
		{"latest", 1, []string{"latest", s1, s2}, nil},
		{"rotate", 2, []string{"latest", s1, s2}, nil},
		{"", 2, []string{"latest", s2}, nil},
	}
	for _, tt := range tests {
		t.Run("kill at "+tt.phase, func(t *testing.T) {
			out := t.TempDir()
			if saveInChild(t, out, 1, "") {
				t.Fatal("the first save was killed")
			}
			if killed := saveInChild(t, out, 2, tt.phase); killed != (tt.phase != "") {
				t.Fatalf("child killed = %v", killed)
			}
			if got := dirEntries(t, out); !slices.Equal(got, tt.entries) {
				t.Errorf("after the crash the output dir holds %v, want %v", got, tt.entries)
			}
			if tt.inTmp != nil {
				tmps, _ := filepath.Glob(filepath.Join(out, tmp2))
				if len(tmps) != 1 {
					t.Fatalf("temporary directories %v", tmps)
				}
				if got := dirEntries(t, tmps[0]); !slices.Equal(got, tt.inTmp) {
					t.Errorf("the temporary directory holds %v, want %v", got, tt.inTmp)
				}
				if tt.phase == "tensors" {
					// Step 1 still exists, and its data file has the same size
					// as a complete one of step 2.
					part, err1 := os.Stat(filepath.Join(tmps[0], "rank_00000.safetensors"))
					full, err2 := os.Stat(filepath.Join(out, s1, "rank_00000.safetensors"))
					if err := errors.Join(err1, err2); err != nil {
						t.Fatal(err)
					}
					if part.Size() <= full.Size()/3 || part.Size() >= full.Size() {
						t.Errorf("the interrupted data file has %d bytes, a complete one %d", part.Size(), full.Size())
					}
				}
			}

			c, warnings, err := Latest(out)
			if err != nil {
				t.Fatalf("Latest after a crash at %q: %v", tt.phase, err)
			}
			if len(warnings) != 0 {
				t.Errorf("warnings %q", warnings)
			}
			if c.Manifest.Step != tt.wantStep {
				t.Fatalf("Latest is step %d, want %d", c.Manifest.Step, tt.wantStep)
			}
			checkParts(t, c, wholeParts(tt.wantStep))

			// The next save clears the debris.
			mustSave(t, out, 3, 1)
			if got := dirEntries(t, out); !slices.Equal(got, []string{"latest", "step_00000003"}) {
				t.Errorf("after the next save the output dir holds %v", got)
			}
		})
	}
}
