//go:build !linux

package sshexec

import "testing"

// unreachable needs Linux's accept-queue behaviour to simulate a host that
// never answers a TCP connect.
func unreachable(t *testing.T) string {
	t.Skip("simulating an unreachable host needs Linux")
	return ""
}
