package planner

import "testing"

// TestDefaultProfile: a plan that names no device assumes one that has
// the config's precision: never a V100 for bf16.
func TestDefaultProfile(t *testing.T) {
	for _, tt := range []struct{ device, dtype, want string }{
		{"cpu", "bf16", "cpu"},
		{"gpu", "fp16", "V100-32G"},
		{"gpu", "fp32", "V100-32G"},
		{"gpu", "bf16", "A100-80G"},
		{"gpu", "bfloat16", "A100-80G"},
	} {
		if got := DefaultProfile(tt.device, tt.dtype); got != tt.want {
			t.Errorf("DefaultProfile(%q, %q) = %q, want %q", tt.device, tt.dtype, got, tt.want)
		}
	}
}
