package cuda

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// fakeCompiler counts compiles and makes an image that depends on every
// input, as a real compiler's would.
type fakeCompiler struct {
	calls atomic.Int32
	delay time.Duration
	fail  bool
}

func (f *fakeCompiler) compile(src, name string, opts []string) ([]byte, string, error) {
	n := f.calls.Add(1)
	time.Sleep(f.delay)
	if f.fail {
		return nil, name + "(3): error: expected a \";\"\n1 error detected", errors.New("nvrtcCompileProgram: NVRTC_ERROR_COMPILATION (6)")
	}
	return []byte(fmt.Sprintf("\x7fELF|%s|%s|%s|compile %d", src, name, strings.Join(opts, ","), n)), "", nil
}

func TestCacheMissThenHit(t *testing.T) {
	dir := t.TempDir()
	fc := &fakeCompiler{}
	c := &Cache{Dir: dir, Compile: fc.compile, Version: "nvrtc 13.0"}
	opts := []string{"--gpu-architecture=sm_90", "-default-device"}

	img, hit, err := c.Get("__global__ void k(){}", "k.cu", opts)
	if err != nil || hit {
		t.Fatalf("first Get: hit=%v err=%v, want a miss", hit, err)
	}
	img2, hit, err := c.Get("__global__ void k(){}", "k.cu", opts)
	if err != nil || !hit || !bytes.Equal(img, img2) {
		t.Fatalf("second Get: hit=%v err=%v same=%v, want a hit of the same image", hit, err, bytes.Equal(img, img2))
	}
	// A new Cache on the same folder (another process) hits on disk.
	c2 := &Cache{Dir: dir, Compile: fc.compile, Version: "nvrtc 13.0"}
	img3, hit, err := c2.Get("__global__ void k(){}", "k.cu", opts)
	if err != nil || !hit || !bytes.Equal(img, img3) {
		t.Fatalf("Get from a new Cache: hit=%v err=%v, want a hit", hit, err)
	}
	if n := fc.calls.Load(); n != 1 {
		t.Errorf("compiled %d times, want 1", n)
	}
	// The entry is where Path says, and no temporary files are left.
	if _, err := os.Stat(c.Path("__global__ void k(){}", "k.cu", opts)); err != nil {
		t.Errorf("entry: %v", err)
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 1 {
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		t.Errorf("cache folder holds %q, want one entry", names)
	}
}

func TestCacheKeyParts(t *testing.T) {
	dir := t.TempDir()
	fc := &fakeCompiler{}
	base := func() *Cache { return &Cache{Dir: dir, Compile: fc.compile, Version: "nvrtc 12.8"} }
	src, name, opts := "src", "a.cu", []string{"--gpu-architecture=sm_90"}
	if _, _, err := base().Get(src, name, opts); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		what      string
		c         *Cache
		src, name string
		opts      []string
	}{
		{"source", base(), "src2", name, opts},
		{"name", base(), src, "b.cu", opts},
		{"options", base(), src, name, []string{"--gpu-architecture=sm_80"}},
		{"extra option", base(), src, name, []string{"--gpu-architecture=sm_90", "-lineinfo"}},
		{"option split differently", base(), src, name, []string{"--gpu-architecture=", "sm_90"}},
		{"version", &Cache{Dir: dir, Compile: fc.compile, Version: "nvrtc 13.0"}, src, name, opts},
	} {
		before := fc.calls.Load()
		img, hit, err := tc.c.Get(tc.src, tc.name, tc.opts)
		if err != nil || hit {
			t.Errorf("a different %s: hit=%v err=%v, want a miss", tc.what, hit, err)
		}
		if fc.calls.Load() != before+1 {
			t.Errorf("a different %s did not compile", tc.what)
		}
		if !bytes.Contains(img, []byte(tc.src+"|"+tc.name)) {
			t.Errorf("a different %s got image %q", tc.what, img)
		}
	}
}

func TestCacheCorruptEntries(t *testing.T) {
	src, name, opts := "s", "k.cu", []string{"-O3"}
	for _, tc := range []struct {
		name    string
		corrupt func(path string) error
	}{
		{"truncated", func(p string) error {
			b, _ := os.ReadFile(p)
			return os.WriteFile(p, b[:len(b)-3], 0o644)
		}},
		{"bit flipped", func(p string) error {
			b, _ := os.ReadFile(p)
			b[len(b)-1] ^= 1
			return os.WriteFile(p, b, 0o644)
		}},
		{"empty", func(p string) error { return os.WriteFile(p, nil, 0o644) }},
		{"garbage", func(p string) error {
			return os.WriteFile(p, []byte("not an entry at all, longer than the header is........"), 0o644)
		}},
		{"unreadable", func(p string) error { return os.Chmod(p, 0) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			fc := &fakeCompiler{}
			c := &Cache{Dir: dir, Compile: fc.compile, Version: "v"}
			want, _, err := c.Get(src, name, opts)
			if err != nil {
				t.Fatal(err)
			}
			if err := tc.corrupt(c.Path(src, name, opts)); err != nil {
				t.Fatal(err)
			}
			if tc.name == "unreadable" && os.Geteuid() == 0 {
				// root reads files whatever their mode: make the entry a
				// folder instead, which no one can read as a file.
				p := c.Path(src, name, opts)
				os.Remove(p)
				os.Mkdir(p, 0o755)
			}
			img, hit, err := c.Get(src, name, opts)
			if err != nil {
				t.Fatalf("Get after corruption: %v", err)
			}
			if hit || fc.calls.Load() != 2 {
				t.Errorf("hit=%v after %d compiles, want a recompile", hit, fc.calls.Load())
			}
			if !bytes.HasPrefix(img, want[:len(want)-1]) {
				t.Errorf("image %q, want a fresh compile like %q", img, want)
			}
			if tc.name == "unreadable" {
				return // the entry may not be writable either; still not fatal
			}
			// The entry was repaired.
			if _, hit, _ := c.Get(src, name, opts); !hit {
				t.Error("the recompiled entry was not stored")
			}
		})
	}
}

func TestCacheUnwritable(t *testing.T) {
	// Dir is a file: nothing can be stored, the image still comes back.
	f := filepath.Join(t.TempDir(), "file")
	os.WriteFile(f, []byte("x"), 0o644)
	fc := &fakeCompiler{}
	c := &Cache{Dir: filepath.Join(f, "sub"), Compile: fc.compile}
	img, hit, err := c.Get("s", "n", nil)
	if err != nil || hit || len(img) == 0 {
		t.Errorf("Get in an unwritable folder: %d bytes, hit=%v, err=%v; want the compiled image", len(img), hit, err)
	}
}

func TestCacheConcurrent(t *testing.T) {
	dir := t.TempDir()
	fc := &fakeCompiler{delay: 50 * time.Millisecond}
	c := &Cache{Dir: dir, Compile: fc.compile, Version: "v"}
	const n = 16
	imgs := make([][]byte, n)
	hits := make([]bool, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			img, hit, err := c.Get("same", "k.cu", []string{"x"})
			if err != nil {
				t.Error(err)
			}
			imgs[i], hits[i] = img, hit
		}()
	}
	wg.Wait()
	if got := fc.calls.Load(); got != 1 {
		t.Errorf("%d concurrent Gets compiled %d times, want 1", n, got)
	}
	misses := 0
	for i := range n {
		if !bytes.Equal(imgs[i], imgs[0]) {
			t.Errorf("Get %d returned %q, Get 0 %q", i, imgs[i], imgs[0])
		}
		if !hits[i] {
			misses++
		}
	}
	if misses != 1 {
		t.Errorf("%d Gets reported a miss, want 1 (the one that compiled)", misses)
	}

	// Two Caches on one folder (two processes): both may compile, but the
	// entry is always whole.
	fc2 := &fakeCompiler{delay: 10 * time.Millisecond}
	var wg2 sync.WaitGroup
	for range 8 {
		wg2.Add(1)
		go func() {
			defer wg2.Done()
			c := &Cache{Dir: dir, Compile: fc2.compile, Version: "w"}
			img, _, err := c.Get("other", "k.cu", nil)
			if err != nil || !bytes.HasPrefix(img, []byte("\x7fELF|other|k.cu||compile ")) {
				t.Errorf("Get = %q, %v", img, err)
			}
		}()
	}
	wg2.Wait()
	if img, ok := readEntry((&Cache{Dir: dir, Version: "w"}).Path("other", "k.cu", nil)); !ok || len(img) == 0 {
		t.Error("the entry written by racing caches is not sound")
	}
}

func TestCacheCompileError(t *testing.T) {
	fc := &fakeCompiler{fail: true}
	c := &Cache{Dir: t.TempDir(), Compile: fc.compile}
	_, _, err := c.Get("bad", "bad.cu", nil)
	var ce *CompileError
	if !errors.As(err, &ce) {
		t.Fatalf("Get of a bad source: %v, want a *CompileError", err)
	}
	if ce.Name != "bad.cu" || !strings.Contains(err.Error(), `bad.cu(3): error: expected a ";"`) || !strings.Contains(err.Error(), "NVRTC_ERROR_COMPILATION") {
		t.Errorf("error %q does not carry the cause and log", err)
	}
	// Nothing is cached: the next Get compiles again.
	c.Get("bad", "bad.cu", nil)
	if fc.calls.Load() != 2 {
		t.Errorf("a failed compile was cached")
	}
	if _, _, err := (&Cache{}).Get("s", "n", nil); err == nil {
		t.Error("a Cache without Compile should fail")
	}
}

func TestDefaultCacheDir(t *testing.T) {
	for _, tc := range []struct {
		env  map[string]string
		want string
	}{
		{map[string]string{"GPTUI_CACHE_DIR": "/c", "XDG_CACHE_HOME": "/x", "HOME": "/h"}, "/c"},
		{map[string]string{"XDG_CACHE_HOME": "/x", "HOME": "/h"}, "/x/gptui/cuda"},
		{map[string]string{"HOME": "/h"}, "/h/.cache/gptui/cuda"},
		{map[string]string{}, "/tmp/t/gptui-cuda"},
	} {
		if got := cacheDirFrom(func(k string) string { return tc.env[k] }, "/tmp/t"); got != tc.want {
			t.Errorf("cacheDirFrom(%v) = %s, want %s", tc.env, got, tc.want)
		}
	}
	t.Setenv("GPTUI_CACHE_DIR", "/somewhere")
	if got := DefaultCacheDir(); got != "/somewhere" {
		t.Errorf("DefaultCacheDir = %s with GPTUI_CACHE_DIR=/somewhere", got)
	}
}

func TestArchFlag(t *testing.T) {
	if got := ArchFlag(9, 0); got != "--gpu-architecture=sm_90" {
		t.Errorf("ArchFlag(9, 0) = %s", got)
	}
	if got := ArchFlag(8, 6); got != "--gpu-architecture=sm_86" {
		t.Errorf("ArchFlag(8, 6) = %s", got)
	}
}
