package cuda_test

import (
	"maps"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/gptui/gptui/kernels/cuda"
)

// Device attributes as cuDeviceGetAttribute reports them (compute
// capability, MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, ..._PER_MULTIPROCESSOR,
// MAX_REGISTERS_PER_BLOCK, MULTIPROCESSOR_COUNT).
var (
	attrsV100 = cuda.DeviceAttrs{Major: 7, Minor: 0, SharedOptin: 96 << 10, SharedPerSM: 96 << 10, RegsPerBlock: 65536, SMs: 80}
	attrsA100 = cuda.DeviceAttrs{Major: 8, Minor: 0, SharedOptin: 163 << 10, SharedPerSM: 164 << 10, RegsPerBlock: 65536, SMs: 108}
	attrsL40S = cuda.DeviceAttrs{Major: 8, Minor: 9, SharedOptin: 99 << 10, SharedPerSM: 100 << 10, RegsPerBlock: 65536, SMs: 142}
	attrsH100 = cuda.DeviceAttrs{Major: 9, Minor: 0, SharedOptin: 227 << 10, SharedPerSM: 228 << 10, RegsPerBlock: 65536, SMs: 132}
)

// smallTiles is what the 96–99 KiB devices (V100, L40S, L4, A10, RTX
// 4090) get away from 64×64.
var smallTiles = map[string]cuda.AttTile{
	"attention_forward_hs128":  {Q: 64, K: 32},
	"attention_forward_any":    {Q: 64, K: 32},
	"attention_backward_hs64":  {Q: 32, K: 64},
	"attention_backward_hs80":  {Q: 32, K: 64},
	"attention_backward_hs128": {Q: 32, K: 32},
	"attention_backward_any":   {Q: 32, K: 32},
}

// TestSelectVariants checks the choice for V100, A100, L40S and H100
// attributes: an H100 keeps every 64×64 kernel (today's), the others get,
// kernel by kernel, the largest tile that fits, and no chosen variant asks
// for more than the device allows.
func TestSelectVariants(t *testing.T) {
	cases := []struct {
		name  string
		attrs cuda.DeviceAttrs
		limit int
		want  map[string]cuda.AttTile // kernels not on 64×64 tiles
	}{
		{"V100", attrsV100, 98304, smallTiles},
		{"A100", attrsA100, 166912, map[string]cuda.AttTile{
			"attention_backward_hs128": {Q: 32, K: 64},
			"attention_backward_any":   {Q: 32, K: 64},
		}},
		{"L40S", attrsL40S, 101376, smallTiles},
		{"H100", attrsH100, 232448, nil},
		// No opt-in figure from the driver: the compute capability's.
		{"A100 by compute capability", cuda.DeviceAttrs{Major: 8, Minor: 0}, 166912, map[string]cuda.AttTile{
			"attention_backward_hs128": {Q: 32, K: 64},
			"attention_backward_any":   {Q: 32, K: 64},
		}},
	}
	kernels := []string{}
	for _, n := range cuda.KernelNames() {
		if (strings.HasPrefix(n, "attention_forward_") || strings.HasPrefix(n, "attention_backward_")) && !strings.Contains(n, "_q") {
			kernels = append(kernels, n)
		}
	}
	if len(kernels) != 10 {
		t.Fatalf("%d attention kernels in KernelNames (%v), want forward and backward for hs 32, 64, 80, 128 and any", len(kernels), kernels)
	}
	for _, c := range cases {
		t.Run(strings.ReplaceAll(c.name, " ", "_"), func(t *testing.T) {
			v, err := cuda.SelectVariants(c.attrs)
			if err != nil {
				t.Fatal(err)
			}
			t.Log(v)
			if v.SharedLimit() != c.limit {
				t.Errorf("limit %d, want %d", v.SharedLimit(), c.limit)
			}
			for _, name := range kernels {
				kv, ok := v.Kernel(name)
				if !ok {
					t.Errorf("%s: no variant chosen", name)
					continue
				}
				want, small := c.want[name]
				if !small {
					want = cuda.AttTile{Q: 64, K: 64}
				}
				if kv.Tile != want {
					t.Errorf("%s: %v tiles, want %v", name, kv.Tile, want)
				}
				wantFn := name
				if small {
					wantFn = name + "_q" + strconv.Itoa(want.Q) + "k" + strconv.Itoa(want.K)
				}
				if kv.Function != wantFn {
					t.Errorf("%s: launches %s, want %s", name, kv.Function, wantFn)
				}
				if kv.Shared > c.limit {
					t.Errorf("%s: %v tiles need %d bytes, more than the device's %d", name, kv.Tile, kv.Shared, c.limit)
				}
				if !slices.Contains(cuda.KernelNames(), kv.Function) {
					t.Errorf("%s: %s is not in KernelNames", name, kv.Function)
				}
			}
			// The limits raised at New are the chosen variants' own.
			for fn, n := range v.SharedNeeds() {
				if n <= 48<<10 || n > c.limit {
					t.Errorf("SharedNeeds: %s %d bytes", fn, n)
				}
			}
		})
	}

	// H100: today's choice and sizes, exactly.
	h, err := cuda.SelectVariants(attrsH100)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := h.SharedNeeds(), cuda.DefaultVariants().SharedNeeds(); !maps.Equal(got, want) {
		t.Errorf("H100 SharedNeeds %v, want the defaults %v", got, want)
	}
	for name, want := range map[string]int{
		"attention_backward_hs128": 176128, "attention_backward_any": 171008,
		"attention_forward_hs128": 121856, "attention_forward_any": 118016,
		"attention_backward_hs80": 126976, "attention_backward_hs64": 110592,
		"attention_forward_hs80": 84992, "attention_forward_hs64": 72704, "attention_backward_hs32": 77824,
	} {
		if got := h.SharedNeeds()[name]; got != want {
			t.Errorf("H100 %s: %d bytes, want %d", name, got, want)
		}
	}
	if _, ok := h.SharedNeeds()["attention_forward_hs32"]; ok {
		t.Error("attention_forward_hs32 (48,128 bytes) listed above 48 KiB")
	}
}

// TestSelectVariantsRefused: a device with too little shared memory for
// some kernel's smallest variant (a T4's 64 KiB) is refused in one line
// naming the first such kernel, its bytes and the limit.
func TestSelectVariantsRefused(t *testing.T) {
	_, err := cuda.SelectVariants(cuda.DeviceAttrs{Major: 7, Minor: 5, SharedOptin: 64 << 10, SMs: 40})
	if err == nil {
		t.Fatal("a 64 KiB device accepted")
	}
	t.Log(err)
	if strings.Contains(err.Error(), "\n") {
		t.Error("more than one line")
	}
	for _, want := range []string{"attention_backward_hs32", "77824 bytes", "allows 65536", "sm_75", "8 more"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
}

// TestVariantsString: the one line New logs and 'gptui gpu check' shows.
func TestVariantsString(t *testing.T) {
	for _, c := range []struct {
		attrs cuda.DeviceAttrs
		want  []string
	}{
		{attrsH100, []string{"sm_90", "227 KiB", "attention on 64×64 tiles;", "layernorm backward up to C=29056"}},
		{attrsV100, []string{"sm_70", "96 KiB", "backward_hs128 32×32 (79872 B)", "forward_any 64×32 (77312 B)", "C=12288"}},
	} {
		v, err := cuda.SelectVariants(c.attrs)
		if err != nil {
			t.Fatal(err)
		}
		s := v.String()
		if strings.Contains(s, "\n") {
			t.Errorf("%q: more than one line", s)
		}
		for _, w := range c.want {
			if !strings.Contains(s, w) {
				t.Errorf("%q does not say %q", s, w)
			}
		}
	}
}
