package cuda

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// tree makes empty files (and their folders) under root.
func tree(t *testing.T, root string, files ...string) {
	t.Helper()
	for _, f := range files {
		p := filepath.Join(root, f)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// fakeEnv is an environment of vars, with system folders under root.
func fakeEnv(root string, vars map[string]string, system ...string) Env {
	return Env{
		Getenv: func(k string) string { return vars[k] },
		Root:   root,
		System: func(soname string) bool {
			for _, s := range system {
				if s == soname {
					return true
				}
			}
			return false
		},
	}
}

func TestFind(t *testing.T) {
	for _, tc := range []struct {
		name   string
		lib    Library
		files  []string          // under the test's root
		vars   map[string]string // values with $R replaced by the root
		system []string          // sonames the fake loader finds
		want   string            // relative to the root, or a bare soname
	}{
		{
			name:  "override before LD_LIBRARY_PATH",
			lib:   LibNVRTC,
			files: []string{"over/libnvrtc.so.12", "ld/libnvrtc.so.13"},
			vars:  map[string]string{"GPTUI_CUDA_LIBDIR": "$R/over", "LD_LIBRARY_PATH": "$R/ld"},
			want:  "over/libnvrtc.so.12",
		},
		{
			name:  "override is a path list",
			lib:   LibNVRTC,
			files: []string{"b/libnvrtc.so.12"},
			vars:  map[string]string{"GPTUI_CUDA_LIBDIR": "$R/a:$R/b"},
			want:  "b/libnvrtc.so.12",
		},
		{
			name:  "newest soname first in a folder",
			lib:   LibNVRTC,
			files: []string{"ld/libnvrtc.so.11.2", "ld/libnvrtc.so.12", "ld/libnvrtc.so.13", "ld/libnvrtc.so"},
			vars:  map[string]string{"LD_LIBRARY_PATH": "$R/ld"},
			want:  "ld/libnvrtc.so.13",
		},
		{
			name:  "release-numbered files are not sonames",
			lib:   LibCUBLAS,
			files: []string{"ld/libcublas.so.13.0.0.19", "ld/libcublas.so.12", "ld/libcublasLt.so.12"},
			vars:  map[string]string{"LD_LIBRARY_PATH": "$R/ld"},
			want:  "ld/libcublas.so.12",
		},
		{
			name:  "unversioned name last",
			lib:   LibNVRTC,
			files: []string{"ld/libnvrtc.so", "ld/libnvrtc.so.11.2"},
			vars:  map[string]string{"LD_LIBRARY_PATH": "$R/ld"},
			want:  "ld/libnvrtc.so.11.2",
		},
		{
			name:  "LD_LIBRARY_PATH in order",
			lib:   LibNCCL,
			files: []string{"two/libnccl.so.2", "three/libnccl.so.2"},
			vars:  map[string]string{"LD_LIBRARY_PATH": "$R/one:$R/two:$R/three"},
			want:  "two/libnccl.so.2",
		},
		{
			name:  "LD_LIBRARY_PATH before CUDA_HOME",
			lib:   LibNVRTC,
			files: []string{"ld/libnvrtc.so.12", "cuda/lib64/libnvrtc.so.13"},
			vars:  map[string]string{"LD_LIBRARY_PATH": "$R/ld", "CUDA_HOME": "$R/cuda"},
			want:  "ld/libnvrtc.so.12",
		},
		{
			name:  "CUDA_HOME lib64 before lib",
			lib:   LibNVRTC,
			files: []string{"cuda/lib/libnvrtc.so.13", "cuda/lib64/libnvrtc.so.12"},
			vars:  map[string]string{"CUDA_HOME": "$R/cuda"},
			want:  "cuda/lib64/libnvrtc.so.12",
		},
		{
			name:  "CUDA_HOME before /usr/local/cuda",
			lib:   LibCUBLAS,
			files: []string{"usr/local/cuda/lib64/libcublas.so.13", "home/cuda/lib64/libcublas.so.12"},
			vars:  map[string]string{"CUDA_HOME": "$R/home/cuda"},
			want:  "home/cuda/lib64/libcublas.so.12",
		},
		{
			name:  "/usr/local/cuda before the wheels",
			lib:   LibNVRTC,
			files: []string{"usr/local/cuda/lib64/libnvrtc.so.12", "usr/local/lib/python3.12/dist-packages/nvidia/cu13/lib/libnvrtc.so.13"},
			want:  "usr/local/cuda/lib64/libnvrtc.so.12",
		},
		{
			name:  "virtualenv's CUDA 13 wheel",
			lib:   LibNVRTC,
			files: []string{"venv/lib/python3.11/site-packages/nvidia/cu13/lib/libnvrtc.so.13"},
			vars:  map[string]string{"VIRTUAL_ENV": "$R/venv"},
			want:  "venv/lib/python3.11/site-packages/nvidia/cu13/lib/libnvrtc.so.13",
		},
		{
			name: "cu13 folder before the CUDA 12 component folder",
			lib:  LibNVRTC,
			files: []string{
				"venv/lib/python3.11/site-packages/nvidia/cuda_nvrtc/lib/libnvrtc.so.12",
				"venv/lib/python3.11/site-packages/nvidia/cu13/lib/libnvrtc.so.13",
			},
			vars: map[string]string{"VIRTUAL_ENV": "$R/venv"},
			want: "venv/lib/python3.11/site-packages/nvidia/cu13/lib/libnvrtc.so.13",
		},
		{
			name:  "CUDA 12 cuBLAS wheel",
			lib:   LibCUBLAS,
			files: []string{"home/u/.local/lib/python3.10/site-packages/nvidia/cublas/lib/libcublas.so.12"},
			vars:  map[string]string{"HOME": "$R/home/u"},
			want:  "home/u/.local/lib/python3.10/site-packages/nvidia/cublas/lib/libcublas.so.12",
		},
		{
			name:  "NCCL wheel",
			lib:   LibNCCL,
			files: []string{"usr/local/lib/python3.12/dist-packages/nvidia/nccl/lib/libnccl.so.2"},
			want:  "usr/local/lib/python3.12/dist-packages/nvidia/nccl/lib/libnccl.so.2",
		},
		{
			name: "newest Python first",
			lib:  LibNCCL,
			files: []string{
				"usr/lib/python3.9/dist-packages/nvidia/nccl/lib/libnccl.so.2",
				"usr/lib/python3.12/dist-packages/nvidia/nccl/lib/libnccl.so.2",
			},
			want: "usr/lib/python3.12/dist-packages/nvidia/nccl/lib/libnccl.so.2",
		},
		{
			name:  "pyenv's Python",
			lib:   LibNVRTC,
			files: []string{"home/u/.pyenv/versions/3.11.9/lib/python3.11/site-packages/nvidia/cu13/lib/libnvrtc.so.13"},
			vars:  map[string]string{"HOME": "$R/home/u"},
			want:  "home/u/.pyenv/versions/3.11.9/lib/python3.11/site-packages/nvidia/cu13/lib/libnvrtc.so.13",
		},
		{
			name:  "user site before the system's",
			lib:   LibNVRTC,
			files: []string{"home/u/.local/lib/python3.10/site-packages/nvidia/cuda_nvrtc/lib/libnvrtc.so.12", "usr/lib/python3/dist-packages/nvidia/cu13/lib/libnvrtc.so.13"},
			vars:  map[string]string{"HOME": "$R/home/u"},
			want:  "home/u/.local/lib/python3.10/site-packages/nvidia/cuda_nvrtc/lib/libnvrtc.so.12",
		},
		{
			name:  "NCCL wheel of a virtualenv on PATH, not activated",
			lib:   LibNCCL,
			files: []string{"opt/torch/.venv/bin/python3", "opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib/libnccl.so.2"},
			vars:  map[string]string{"PATH": "$R/usr/bin:$R/opt/torch/.venv/bin:$R/bin"},
			want:  "opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib/libnccl.so.2",
		},
		{
			name: "a folder on PATH without a Python is no prefix",
			lib:  LibNVRTC,
			files: []string{
				"opt/tools/bin/nvcc", "opt/tools/lib/python3.12/site-packages/nvidia/cu13/lib/libnvrtc.so.13",
				"usr/lib/python3/dist-packages/nvidia/cuda_nvrtc/lib/libnvrtc.so.12",
			},
			vars: map[string]string{"PATH": "$R/opt/tools/bin"},
			want: "usr/lib/python3/dist-packages/nvidia/cuda_nvrtc/lib/libnvrtc.so.12",
		},
		{
			name: "user site before a PATH Python's, and the system's Python keeps its place",
			lib:  LibNVRTC,
			files: []string{
				"usr/bin/python3", "usr/local/lib/python3.12/dist-packages/nvidia/cu13/lib/libnvrtc.so.13",
				"opt/py/bin/python", "opt/py/lib/python3.11/site-packages/nvidia/cu13/lib/libnvrtc.so.13",
				"home/u/.local/lib/python3.12/site-packages/nvidia/cuda_nvrtc/lib/libnvrtc.so.12",
			},
			vars: map[string]string{"PATH": "$R/usr/bin:$R/opt/py/bin", "HOME": "$R/home/u"},
			want: "home/u/.local/lib/python3.12/site-packages/nvidia/cuda_nvrtc/lib/libnvrtc.so.12",
		},
		{
			name: "a PATH Python's wheels before the system's",
			lib:  LibNVRTC,
			files: []string{
				"usr/bin/python3", "usr/lib/python3/dist-packages/nvidia/cu13/lib/libnvrtc.so.13",
				"opt/py/bin/python", "opt/py/lib/python3.11/site-packages/nvidia/cuda_nvrtc/lib/libnvrtc.so.12",
			},
			vars: map[string]string{"PATH": "$R/usr/bin:$R/opt/py/bin"},
			want: "opt/py/lib/python3.11/site-packages/nvidia/cuda_nvrtc/lib/libnvrtc.so.12",
		},
		{
			name:  "conda prefix lib",
			lib:   LibNCCL,
			files: []string{"conda/lib/libnccl.so.2"},
			vars:  map[string]string{"CONDA_PREFIX": "$R/conda"},
			want:  "conda/lib/libnccl.so.2",
		},
		{
			name:   "files before the loader's own search",
			lib:    LibNVRTC,
			files:  []string{"usr/local/cuda/lib64/libnvrtc.so.12"},
			system: []string{"libnvrtc.so.13"},
			want:   "usr/local/cuda/lib64/libnvrtc.so.12",
		},
		{
			name:   "loader's search, newest soname",
			lib:    LibCUBLAS,
			system: []string{"libcublas.so.12", "libcublas.so.13"},
			want:   "libcublas.so.13",
		},
		{
			name:   "driver from the loader first",
			lib:    LibCUDA,
			files:  []string{"ld/libcuda.so.1"},
			vars:   map[string]string{"LD_LIBRARY_PATH": "$R/ld"},
			system: []string{"libcuda.so.1"},
			want:   "libcuda.so.1",
		},
		{
			name:  "driver from its folders",
			lib:   LibCUDA,
			files: []string{"usr/lib/x86_64-linux-gnu/libcuda.so.1"},
			want:  "usr/lib/x86_64-linux-gnu/libcuda.so.1",
		},
		{
			name:  "never the toolkit's stub libcuda",
			lib:   LibCUDA,
			files: []string{"cuda/lib64/stubs/libcuda.so", "cuda/lib64/libcuda.so", "usr/lib64/libcuda.so.1"},
			vars:  map[string]string{"CUDA_HOME": "$R/cuda", "LD_LIBRARY_PATH": "$R/cuda/lib64"},
			want:  "usr/lib64/libcuda.so.1",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			tree(t, root, tc.files...)
			vars := map[string]string{}
			for k, v := range tc.vars {
				vars[k] = strings.ReplaceAll(v, "$R", root)
			}
			got, where, err := Find(tc.lib, fakeEnv(root, vars, tc.system...))
			if err != nil {
				t.Fatalf("Find: %v", err)
			}
			want := tc.want
			if strings.Contains(want, "/") {
				want = filepath.Join(root, want)
			}
			if got != want {
				t.Errorf("Find = %s, want %s", got, want)
			}
			if len(where) == 0 || where[len(where)-1] != loaderPath {
				t.Errorf("where = %q, want the loader's path last", where)
			}
		})
	}
}

func TestFindNotFound(t *testing.T) {
	root := t.TempDir()
	// A site-packages without the wheel, and a wheel folder of another library.
	tree(t, root, "usr/lib/python3.11/dist-packages/numpy/x.py", "usr/lib/python3.11/dist-packages/nvidia/nccl/lib/libnccl.so.2")
	env := fakeEnv(root, map[string]string{"LD_LIBRARY_PATH": "/nowhere/a", "CUDA_HOME": "/opt/cuda-x"})
	_, where, err := Find(LibNVRTC, env)
	if err == nil {
		t.Fatal("Find found libnvrtc in an empty tree")
	}
	if !errors.Is(err, ErrNotFound) {
		t.Errorf("errors.Is(%v, ErrNotFound) = false", err)
	}
	var nf *NotFoundError
	if !errors.As(err, &nf) || nf.Lib != LibNVRTC || !reflect.DeepEqual(nf.Tried, where) {
		t.Errorf("error %#v does not carry the library and where it looked (%q)", err, where)
	}
	msg := err.Error()
	for _, want := range []string{
		"libnvrtc.so not found (looked in /nowhere/a, /opt/cuda-x/lib64, /opt/cuda-x/lib, " + filepath.Join(root, "usr/local/cuda/lib64"),
		"no nvidia/cu13/lib or nvidia/cuda_nvrtc/lib in any Python site-packages",
		"the dynamic loader's path)",
		"install the CUDA toolkit or the nvidia-cuda-nvrtc wheel, or set GPTUI_CUDA_LIBDIR",
	} {
		if !strings.Contains(msg, want) {
			t.Errorf("error %q lacks %q", msg, want)
		}
	}
	if strings.Contains(msg, "\n") {
		t.Errorf("error is not one line: %q", msg)
	}
	if strings.Contains(msg, "*") {
		t.Errorf("error shows unexpanded patterns: %q", msg)
	}

	// An existing wheel folder is listed.
	tree(t, root, "usr/lib/python3.11/dist-packages/nvidia/cu13/lib/README")
	_, _, err = Find(LibNVRTC, env)
	if want := filepath.Join(root, "usr/lib/python3.11/dist-packages/nvidia/cu13/lib"); err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("error %v does not name the wheel folder %s", err, want)
	}
}

func TestCandidatesOrder(t *testing.T) {
	root := t.TempDir()
	tree(t, root, "a/libcublas.so.12", "a/libcublas.so.13", "a/libcublas.so", "a/libcublasLt.so.13", "b/libcublas.so.13")
	env := fakeEnv(root, map[string]string{"LD_LIBRARY_PATH": filepath.Join(root, "a") + ":" + filepath.Join(root, "b")})
	got := Candidates(LibCUBLAS, env)
	want := []string{
		filepath.Join(root, "a/libcublas.so.13"),
		filepath.Join(root, "a/libcublas.so.12"),
		filepath.Join(root, "a/libcublas.so"),
		filepath.Join(root, "b/libcublas.so.13"),
		"libcublas.so.13", "libcublas.so.12", "libcublas.so.11",
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Candidates =\n%q\nwant\n%q", got, want)
	}
}

func TestCompanions(t *testing.T) {
	for _, tc := range []struct {
		found string
		lib   Library
		want  string
	}{
		{"/w/nvidia/cublas/lib/libcublas.so.12", LibCUBLASLt, "/w/nvidia/cublas/lib/libcublasLt.so.12"},
		{"/w/nvidia/cu13/lib/libcublas.so.13", LibCUBLASLt, "/w/nvidia/cu13/lib/libcublasLt.so.13"},
		{"libcublas.so.13", LibCUBLASLt, "libcublasLt.so.13"},
		{"/usr/local/cuda/lib64/libcublas.so", LibCUBLASLt, "/usr/local/cuda/lib64/libcublasLt.so"},
	} {
		if got := companion(tc.found, tc.lib); got != tc.want {
			t.Errorf("companion(%s) = %s, want %s", tc.found, got, tc.want)
		}
	}

	root := t.TempDir()
	tree(t, root, "libnvrtc.so.13", "libnvrtc-builtins.so.13.0", "libnvrtc-builtins.so.13.1",
		"libnvrtc-builtins.so.12.8", "libnvrtc-builtins.so", "libnvrtc-builtins.so.13.1.80")
	got := nvrtcBuiltins(filepath.Join(root, "libnvrtc.so.13"))
	want := []string{filepath.Join(root, "libnvrtc-builtins.so.13.1"), filepath.Join(root, "libnvrtc-builtins.so.13.0")}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("nvrtcBuiltins = %q, want %q", got, want)
	}
	if got := nvrtcBuiltins("libnvrtc.so.13"); got != nil {
		t.Errorf("nvrtcBuiltins of a bare soname = %q, want none", got)
	}
}

// TestLoadHere loads the libraries on this machine: where they are
// missing (no GPU, no toolkit) the errors must name the library and where
// it was looked for, never panic.
func TestLoadHere(t *testing.T) {
	check := func(what string, err error, lib Library) {
		t.Helper()
		if err == nil {
			t.Logf("%s: loaded", what)
			return
		}
		msg := err.Error()
		if !strings.Contains(msg, lib.String()) {
			t.Errorf("%s: error %q does not name %s", what, msg, lib)
		}
		if errors.Is(err, ErrNotFound) && !strings.Contains(msg, "looked in") {
			t.Errorf("%s: error %q does not say where it looked", what, msg)
		}
		if !errors.Is(err, ErrNotFound) && !strings.Contains(msg, "/") && !strings.Contains(msg, "cuInit") {
			t.Errorf("%s: error %q names no path", what, msg)
		}
		t.Logf("%s: %v", what, err)
	}
	d, err := Open(0)
	if err == nil {
		d.Close()
	}
	check("Open(0)", err, LibCUDA)
	c, err := LoadNVRTC()
	if err == nil {
		t.Logf("NVRTC %d.%d at %s", c.major, c.minor, c.Path())
	}
	check("LoadNVRTC", err, LibNVRTC)
	n, err := LoadNCCL()
	if err == nil {
		t.Logf("NCCL %d at %s", n.Version(), n.Path())
	}
	check("LoadNCCL", err, LibNCCL)
	if _, err := loadBLAS(); err != nil {
		check("cuBLAS", err, LibCUBLAS)
	}
}

// TestLoadBroken gives the loader a file that is not a library: the error
// names the file and why it did not load.
func TestLoadBroken(t *testing.T) {
	dir := t.TempDir()
	tree(t, dir, "libnccl.so.2")
	t.Setenv(LibDirEnv, dir)
	n, err := LoadNCCL()
	if err == nil {
		t.Logf("a real NCCL loaded past the broken one: %s", n.Path())
		return
	}
	want := filepath.Join(dir, "libnccl.so.2") + ": "
	if !strings.Contains(err.Error(), "found but not loadable") || !strings.Contains(err.Error(), want) {
		t.Errorf("LoadNCCL: %v; want it to name %s as not loadable", err, want)
	}
}

func TestMappedFile(t *testing.T) {
	maps := `55d0c0000000-55d0c0001000 r--p 00000000 08:01 123 /usr/bin/gptui
7f0000000000-7f0000100000 r-xp 00000000 08:01 456 /usr/lib/x86_64-linux-gnu/libnvrtc-builtins.so.11.8
7f0000200000-7f0000300000 r-xp 00000000 08:01 457 /usr/lib/x86_64-linux-gnu/libnvrtc.so.11.8.89
7f0000400000-7f0000500000 r-xp 00000000 08:01 458 /opt/w/nvidia/cu13/lib/libcublasLt.so.13
7f0000600000-7f0000700000 r-xp 00000000 08:01 459 /opt/w/nvidia/cu13/lib/libcublas.so.13
7f0000800000-7f0000801000 rw-p 00000000 00:00 0 [heap]
`
	for _, tc := range []struct {
		lib    Library
		soname string
		want   string
	}{
		{LibNVRTC, "libnvrtc.so.11.2", "/usr/lib/x86_64-linux-gnu/libnvrtc.so.11.8.89"},
		{LibCUBLAS, "libcublas.so.13", "/opt/w/nvidia/cu13/lib/libcublas.so.13"},
		{LibCUBLASLt, "libcublasLt.so.13", "/opt/w/nvidia/cu13/lib/libcublasLt.so.13"},
		{LibNCCL, "libnccl.so.2", "libnccl.so.2"}, // not mapped: the soname
	} {
		if got := mappedFile(maps, tc.lib, tc.soname); got != tc.want {
			t.Errorf("mappedFile(%s) = %q, want %q", tc.lib, got, tc.want)
		}
	}
}

// TestLoadReportsFile: Load returns the file a library came from, a path
// to an existing file even when the system loader found it by soname (as
// NVRTC here, where only ld.so.cache knows it); a missing one is Find's
// one-line error.
func TestLoadReportsFile(t *testing.T) {
	for _, lib := range []Library{LibNVRTC, LibCUBLASLt, LibNCCL} {
		path, err := Load(lib)
		if err != nil {
			if !strings.Contains(err.Error(), lib.String()) || strings.Contains(err.Error(), "\n") {
				t.Errorf("Load(%s): %q does not name it in one line", lib, err)
			}
			t.Logf("Load(%s): %v", lib, err)
			continue
		}
		if !filepath.IsAbs(path) || !isFile(path) || !strings.HasPrefix(filepath.Base(path), lib.String()) {
			t.Errorf("Load(%s) = %q, want the library's file", lib, path)
		}
		t.Logf("Load(%s) = %s", lib, path)
	}
}

// driverEnv is fakeEnv with a driver that supports CUDA version v
// (12040 for 12.4), or whose version cannot be read when v is 0.
func driverEnv(root string, vars map[string]string, v int, system ...string) Env {
	env := fakeEnv(root, vars, system...)
	env.Driver = func() (int, error) {
		if v == 0 {
			return 0, errors.New("cuda: libcuda.so not found")
		}
		return v, nil
	}
	return env
}

// TestChooseDriver: of the candidates of NVRTC, cuBLAS and cuBLASLt, the
// first in search order that the driver's CUDA major version supports,
// each one passed over saying why; NCCL and the driver are not matched;
// nothing the driver supports is one line naming the library, the
// version found and the driver's.
func TestChooseDriver(t *testing.T) {
	for _, tc := range []struct {
		name    string
		lib     Library
		driver  int      // cuDriverGetVersion's; 0: unknown
		files   []string // under the test's root; "a -> b" is a link
		system  []string // sonames the fake loader finds
		want    string   // $R is the root; "" for an error
		cuda    int
		reason  string   // in Reason (or, with want "", the error)
		skipped []string // in Skipped, in order, one each
	}{
		{
			name: "CUDA 12 driver: .so.12 beside .so.13", lib: LibNVRTC, driver: 12040,
			files: []string{"ld/libnvrtc.so.13", "ld/libnvrtc.so.12", "ld/libnvrtc.so.11.2"},
			want:  "$R/ld/libnvrtc.so.12", cuda: 12,
			reason:  "built for CUDA 12, which the driver (CUDA 12.4) supports",
			skipped: []string{"$R/ld/libnvrtc.so.13 skipped: needs a CUDA 13 driver, the driver supports 12.4"},
		},
		{
			name: "CUDA 13 driver: .so.13", lib: LibNVRTC, driver: 13000,
			files: []string{"ld/libnvrtc.so.13", "ld/libnvrtc.so.12"},
			want:  "$R/ld/libnvrtc.so.13", cuda: 13,
			reason: "built for CUDA 13, which the driver (CUDA 13.0) supports",
		},
		{
			name: "newer driver, older libraries", lib: LibCUBLAS, driver: 13010,
			files: []string{"ld/libcublas.so.12", "ld/libcublasLt.so.12"},
			want:  "$R/ld/libcublas.so.12", cuda: 12,
		},
		{
			name: "cuBLAS", lib: LibCUBLAS, driver: 12080,
			files: []string{"ld/libcublas.so.13", "ld/libcublas.so.12", "ld/libcublasLt.so.13", "ld/libcublasLt.so.12"},
			want:  "$R/ld/libcublas.so.12", cuda: 12,
			skipped: []string{"$R/ld/libcublas.so.13 skipped: needs a CUDA 13 driver, the driver supports 12.8"},
		},
		{
			name: "cuBLASLt", lib: LibCUBLASLt, driver: 12020,
			files: []string{"ld/libcublasLt.so.13", "ld/libcublasLt.so.12"},
			want:  "$R/ld/libcublasLt.so.12", cuda: 12,
			skipped: []string{"$R/ld/libcublasLt.so.13 skipped: needs a CUDA 13 driver, the driver supports 12.2"},
		},
		{
			name: "a later folder's older build", lib: LibNVRTC, driver: 12040,
			files: []string{"ld/libnvrtc.so.13", "usr/local/cuda/lib64/libnvrtc.so.12"},
			want:  "$R/usr/local/cuda/lib64/libnvrtc.so.12", cuda: 12,
			skipped: []string{"$R/ld/libnvrtc.so.13 skipped: needs a CUDA 13 driver"},
		},
		{
			name: "the loader's older soname", lib: LibNVRTC, driver: 12040,
			system: []string{"libnvrtc.so.13", "libnvrtc.so.12"},
			want:   "libnvrtc.so.12", cuda: 12,
			reason:  "the newest soname the system loader finds",
			skipped: []string{"libnvrtc.so.13 skipped: needs a CUDA 13 driver, the driver supports 12.4"},
		},
		{
			name: "an unversioned link has its target's version", lib: LibNVRTC, driver: 12040,
			files: []string{"ld/libnvrtc.so.13.0.88", "ld/libnvrtc.so -> libnvrtc.so.13.0.88", "usr/local/cuda/lib64/libnvrtc.so.12"},
			want:  "$R/usr/local/cuda/lib64/libnvrtc.so.12", cuda: 12,
			skipped: []string{"$R/ld/libnvrtc.so skipped: needs a CUDA 13 driver"},
		},
		{
			name: "an unversioned file cannot be ruled out", lib: LibNVRTC, driver: 12040,
			files:  []string{"ld/libnvrtc.so"},
			want:   "$R/ld/libnvrtc.so",
			reason: "its name gives no CUDA version, so the driver's (CUDA 12.4) cannot rule it out",
		},
		{
			name: "driver version unknown: the newest", lib: LibNVRTC,
			files: []string{"ld/libnvrtc.so.13", "ld/libnvrtc.so.12"},
			want:  "$R/ld/libnvrtc.so.13", cuda: 13,
			reason: "the driver's CUDA version is unknown, so no version was ruled out",
		},
		{
			name: "NCCL is not matched", lib: LibNCCL, driver: 11080,
			files:  []string{"ld/libnccl.so.2"},
			want:   "$R/ld/libnccl.so.2",
			reason: "the newest in the first folder that has one",
		},
		{
			name: "only newer builds", lib: LibNVRTC, driver: 12040,
			files:   []string{"ld/libnvrtc.so.13"},
			system:  []string{"libnvrtc.so.13"},
			reason:  "libnvrtc.so: only $R/ld/libnvrtc.so.13 (CUDA 13) found, but the driver supports CUDA 12.4; install a CUDA 12 build (the toolkit, or the nvidia-cuda-nvrtc wheel for CUDA 12) or a driver for CUDA 13, or set GPTUI_CUDA_LIBDIR",
			skipped: []string{"$R/ld/libnvrtc.so.13 skipped", "libnvrtc.so.13 skipped"},
		},
		{
			name: "only a newer cuBLAS from the loader", lib: LibCUBLAS, driver: 11080,
			system:  []string{"libcublas.so.12"},
			reason:  "libcublas.so: only libcublas.so.12 (CUDA 12) found, but the driver supports CUDA 11.8; install a CUDA 11 build (the toolkit, or the nvidia-cublas wheel for CUDA 11) or a driver for CUDA 12",
			skipped: []string{"libcublas.so.12 skipped: needs a CUDA 12 driver, the driver supports 11.8"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			r := func(s string) string { return strings.ReplaceAll(s, "$R", root) }
			for _, f := range tc.files {
				if link, to, ok := strings.Cut(f, " -> "); ok {
					if err := os.Symlink(to, filepath.Join(root, link)); err != nil {
						t.Fatal(err)
					}
				} else {
					tree(t, root, f)
				}
			}
			ld := filepath.Join(root, "ld") + ":" + filepath.Join(root, "usr/local/cuda/lib64")
			env := driverEnv(root, map[string]string{"LD_LIBRARY_PATH": ld}, tc.driver, tc.system...)
			c, err := Choose(tc.lib, env)
			if _, _, ferr := Find(tc.lib, env); (ferr == nil) != (err == nil) || err != nil && ferr.Error() != err.Error() {
				t.Errorf("Find's error %v, Choose's %v", ferr, err)
			}
			if tc.want == "" {
				if err == nil {
					t.Fatalf("Choose = %s, want an error", c.Path)
				}
				if !errors.Is(err, ErrMismatch) || errors.Is(err, ErrNotFound) {
					t.Errorf("error %v: want ErrMismatch", err)
				}
				if msg := err.Error(); !strings.Contains(msg, r(tc.reason)) || strings.Contains(msg, "\n") {
					t.Errorf("error\n%q\ndoes not hold, in one line,\n%q", msg, r(tc.reason))
				}
			} else {
				if err != nil {
					t.Fatalf("Choose: %v", err)
				}
				if c.Path != r(tc.want) || c.CUDA != tc.cuda {
					t.Errorf("Choose = %s (CUDA %d), want %s (CUDA %d)", c.Path, c.CUDA, r(tc.want), tc.cuda)
				}
				if !strings.Contains(c.Reason, tc.reason) {
					t.Errorf("Reason %q does not hold %q", c.Reason, tc.reason)
				}
				if got, _, _ := Find(tc.lib, env); got != c.Path {
					t.Errorf("Find = %s, want Choose's %s", got, c.Path)
				}
				if cs := Candidates(tc.lib, env); len(tc.skipped) > 0 && slices.Contains(cs, r(strings.Fields(tc.skipped[0])[0])) {
					t.Errorf("Candidates %q lists %s, which the driver does not support", cs, tc.skipped[0])
				}
			}
			wantDriver := tc.driver
			if !byCUDA(tc.lib) {
				wantDriver = 0
			}
			if c.Driver != wantDriver || byCUDA(tc.lib) && (tc.driver == 0) != (c.DriverErr != nil) {
				t.Errorf("Driver %d (%v), want %d", c.Driver, c.DriverErr, wantDriver)
			}
			if len(c.Skipped) != len(tc.skipped) {
				t.Errorf("Skipped %q, want %d", c.Skipped, len(tc.skipped))
			}
			for i, s := range tc.skipped {
				if i < len(c.Skipped) && !strings.HasPrefix(c.Skipped[i], r(s)) {
					t.Errorf("Skipped[%d] = %q, want %q…", i, c.Skipped[i], r(s))
				}
			}
		})
	}
}
