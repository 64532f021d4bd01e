package cuda

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestNoManagedMemory: the backend's buffers are device memory: no source
// of the package but the driver's binding (driver.go) calls AllocManaged or
// Prefetch, so that a layout that does not fit fails its allocation
// instead of paging to the host (issue 34). The driver self-test
// (cudacheck) still checks managed memory; it is not the training path.
func TestNoManagedMemory(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if f == "driver.go" || strings.HasSuffix(f, "_test.go") {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for i, line := range strings.Split(string(b), "\n") {
			for _, call := range []string{".AllocManaged(", ".Prefetch("} {
				if strings.Contains(line, call) {
					t.Errorf("%s:%d calls %s: the training path allocates device memory only", f, i+1, strings.Trim(call, ".("))
				}
			}
		}
	}
}
