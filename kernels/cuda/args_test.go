package cuda

import (
	"encoding/binary"
	"math"
	"reflect"
	"strings"
	"testing"
	"unsafe"
)

func TestPackArgs(t *testing.T) {
	for _, tc := range []struct {
		name    string
		args    []any
		offsets []int
		size    int
	}{
		{"none", nil, []int{}, 0},
		{"mixed", []any{Ptr(0x7f0000001000), int32(-3), float32(1.5), uint64(1 << 40)}, []int{0, 8, 12, 16}, 24},
		{"4 then 8 pads", []any{int32(1), Ptr(2)}, []int{0, 8}, 16},
		{"4s pack", []any{uint32(1), int32(2), float32(3)}, []int{0, 4, 8}, 12},
		{"8 after 4+4", []any{float32(1), int32(2), float64(3)}, []int{0, 4, 8}, 16},
		{"int64 and uint32", []any{int64(-1), uint32(7), int64(9)}, []int{0, 8, 16}, 24},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := packArgs(tc.args)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(p.offsets, tc.offsets) {
				t.Errorf("offsets = %v, want %v", p.offsets, tc.offsets)
			}
			if len(p.buf) != tc.size {
				t.Errorf("size = %d, want %d", len(p.buf), tc.size)
			}
			// Each value reads back from its offset.
			ne := binary.NativeEndian
			for i, a := range tc.args {
				off := p.offsets[i]
				var got any
				switch a.(type) {
				case Ptr:
					got = Ptr(ne.Uint64(p.buf[off:]))
				case int32:
					got = int32(ne.Uint32(p.buf[off:]))
				case uint32:
					got = ne.Uint32(p.buf[off:])
				case int64:
					got = int64(ne.Uint64(p.buf[off:]))
				case uint64:
					got = ne.Uint64(p.buf[off:])
				case float32:
					got = math.Float32frombits(ne.Uint32(p.buf[off:]))
				case float64:
					got = math.Float64frombits(ne.Uint64(p.buf[off:]))
				}
				if got != a {
					t.Errorf("argument %d reads back %v, want %v", i, got, a)
				}
			}
		})
	}
}

func TestPackArgsErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []any
		want string
	}{
		{"int", []any{Ptr(1), 3}, "argument 1 is a int"},
		{"uintptr", []any{uintptr(1)}, "argument 0 is a uintptr"},
		{"float16 as uint16", []any{uint16(1)}, "argument 0 is a uint16"},
		{"pointer", []any{new(float32)}, "argument 0 is a *float32"},
		{"nil", []any{nil}, "argument 0 is a <nil>"},
		{"too many", make([]any, maxArgs+1), "at most 256"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.name == "too many" {
				for i := range tc.args {
					tc.args[i] = int32(i)
				}
			}
			_, err := packArgs(tc.args)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("packArgs: %v, want an error with %q", err, tc.want)
			}
		})
	}
}

func TestArgArena(t *testing.T) {
	a, err := newArgArena()
	if err != nil {
		t.Fatal(err)
	}
	defer a.close()
	args := []any{Ptr(0xdeadbeef000), int32(-7), float32(0.25), uint64(123456789012)}
	p, err := packArgs(args)
	if err != nil {
		t.Fatal(err)
	}
	a.mu.Lock()
	params := a.fill(p)
	a.mu.Unlock()
	if params == 0 {
		t.Fatal("fill returned no kernelParams")
	}
	// kernelParams[i] points at argument i's value, in the arena.
	base := uintptr(unsafe.Pointer(&a.mem[0]))
	if params != base {
		t.Errorf("kernelParams at %#x, want the arena's start %#x", params, base)
	}
	for i, arg := range args {
		ptr := uintptr(binary.NativeEndian.Uint64(a.mem[i*8:]))
		off := int(ptr - base)
		if off < maxArgs*8 || off >= len(a.mem) {
			t.Fatalf("kernelParams[%d] = %#x, outside the arena's values", i, ptr)
		}
		val := a.mem[off:]
		var got any
		switch arg.(type) {
		case Ptr:
			got = Ptr(binary.NativeEndian.Uint64(val))
		case int32:
			got = int32(binary.NativeEndian.Uint32(val))
		case float32:
			got = math.Float32frombits(binary.NativeEndian.Uint32(val))
		case uint64:
			got = binary.NativeEndian.Uint64(val)
		}
		if got != arg {
			t.Errorf("kernelParams[%d] points at %v, want %v", i, got, arg)
		}
	}
	empty, _ := packArgs(nil)
	if a.fill(empty) != 0 {
		t.Error("fill of no arguments should give a null kernelParams")
	}
}

func TestCStrings(t *testing.T) {
	strs := []string{"--gpu-architecture=sm_90", "", "-default-device"}
	m, arr, err := cStrings(strs)
	if err != nil {
		t.Fatal(err)
	}
	defer m.free()
	if arr != m.addr(0) {
		t.Fatalf("array at %#x, want %#x", arr, m.addr(0))
	}
	base := m.addr(0)
	for i, s := range strs {
		p := m.word(i)
		off := int(p - base)
		end := off
		for m.b[end] != 0 {
			end++
		}
		if got := string(m.b[off:end]); got != s {
			t.Errorf("string %d = %q, want %q", i, got, s)
		}
	}
	m2, arr2, err := cStrings(nil)
	if err != nil || arr2 != 0 {
		t.Errorf("cStrings(nil) = %#x, %v; want a null array", arr2, err)
	}
	m2.free()
}
