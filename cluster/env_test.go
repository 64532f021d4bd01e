package cluster

import (
	"slices"
	"testing"
)

// TestPassedEnv: the launcher passes its GPTUI_* and NCCL_* variables on
// to every worker, and nothing else of its environment.
func TestPassedEnv(t *testing.T) {
	got := passedEnv([]string{"HOME=/root", "GPTUI_THREADS=2", "NCCL_SOCKET_IFNAME=eth0", "NCCL_DEBUG=WARN", "CUDA_VISIBLE_DEVICES=1", "XNCCL_A=1", "PATH=/bin"})
	want := []string{"GPTUI_THREADS=2", "NCCL_SOCKET_IFNAME=eth0", "NCCL_DEBUG=WARN"}
	if !slices.Equal(got, want) {
		t.Errorf("passed %q, want %q", got, want)
	}
}
