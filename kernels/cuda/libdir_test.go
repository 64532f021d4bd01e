package cuda

import (
	"path/filepath"
	"slices"
	"testing"
)

// TestDriverFromLibDir: a libcuda.so.1 in a folder of GPTUI_CUDA_LIBDIR is
// taken before the one the system loader finds (a forward-compatibility
// driver library, or the tests' stand-in, named there on purpose); one in
// LD_LIBRARY_PATH still comes after the loader's own, and the driver
// folders last.
func TestDriverFromLibDir(t *testing.T) {
	root := t.TempDir()
	tree(t, root, "over/libcuda.so.1", "ld/libcuda.so.1", "usr/lib64/libcuda.so.1")
	env := fakeEnv(root, map[string]string{LibDirEnv: filepath.Join(root, "over"), "LD_LIBRARY_PATH": filepath.Join(root, "ld")}, "libcuda.so.1")
	got, _, err := Find(LibCUDA, env)
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(root, "over/libcuda.so.1"); got != want {
		t.Errorf("Find = %s, want %s", got, want)
	}
	want := []string{filepath.Join(root, "over/libcuda.so.1"), "libcuda.so.1", filepath.Join(root, "ld/libcuda.so.1"), filepath.Join(root, "usr/lib64/libcuda.so.1")}
	if c := Candidates(LibCUDA, env); !slices.Equal(c, want) {
		t.Errorf("Candidates = %q, want %q", c, want)
	}
}
