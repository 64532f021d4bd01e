package cuda

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
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
