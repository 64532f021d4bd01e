package cuda

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"
)

// TestSourceCompilesWithNVRTC compiles the kernels, as the backend does on
// a GPU node, with the NVRTC this machine has (CI installs Debian's
// libnvrtc11.2, NVRTC 11.8: no GPU needed): through the purego bindings
// and the on-disk cache, for Hopper (sm_90, the H100/H200) and Ampere
// (sm_80). The image must be a CUBIN (ELF), and the second Get a hit.
func TestSourceCompilesWithNVRTC(t *testing.T) {
	nv, err := LoadNVRTC()
	if err != nil {
		// .ci/run installs libnvrtc11.2, so CI never skips.
		t.Skipf("no NVRTC on this machine: %v", err)
	}
	major, minor := nv.Version()
	t.Logf("NVRTC %d.%d from %s", major, minor, nv.Path())
	cache := nv.NewCache(t.TempDir())
	archs := [][2]int{{9, 0}, {8, 0}}
	if testing.Short() {
		archs = archs[:1] // -short: Hopper only (each compile takes ~20 s here)
	}
	for _, arch := range archs {
		opts := []string{ArchFlag(arch[0], arch[1]), "--std=c++17"}
		start := time.Now()
		img, hit, err := cache.Get(Source(), "gptui.cu", opts)
		if err != nil {
			var ce *CompileError
			if errors.As(err, &ce) {
				t.Fatalf("sm_%d%d: %v\n%s", arch[0], arch[1], err, ce.Log)
			}
			t.Fatalf("sm_%d%d: %v", arch[0], arch[1], err)
		}
		if hit || !bytes.HasPrefix(img, []byte("\x7fELF")) {
			t.Fatalf("sm_%d%d: hit %v, image starts %q; want a fresh CUBIN", arch[0], arch[1], hit, img[:min(4, len(img))])
		}
		t.Logf("sm_%d%d: %d-byte CUBIN in %.1f s", arch[0], arch[1], len(img), time.Since(start).Seconds())
		for _, name := range KernelNames() {
			if !bytes.Contains(img, []byte(name)) {
				t.Errorf("sm_%d%d: kernel %s is not in the image", arch[0], arch[1], name)
			}
		}
		again, hit, err := cache.Get(Source(), "gptui.cu", opts)
		if err != nil || !hit || !bytes.Equal(again, img) {
			t.Fatalf("sm_%d%d: second Get: hit %v, err %v, same image %v", arch[0], arch[1], hit, err, bytes.Equal(again, img))
		}
	}
	// A source error comes back with NVRTC's log naming the line.
	_, _, err = cache.Get(Source()+"\nextern \"C\" __global__ void broken() { undefined_thing(); }\n", "gptui.cu", []string{ArchFlag(9, 0)})
	if err == nil || !strings.Contains(err.Error(), "NVRTC") {
		t.Fatalf("broken source: %v; want an NVRTC compile error", err)
	}
}
