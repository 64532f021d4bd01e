package sshexec

import (
	"net"
	"strconv"
	"syscall"
	"testing"
)

// unreachable returns an address on 127.0.0.4 where a TCP connect neither
// succeeds nor fails: a listening socket whose accept queue is full, so the
// kernel drops further SYNs as it would for an unroutable host.
func unreachable(t *testing.T) string {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 4}}); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Listen(fd, 0); err != nil {
		t.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	addr := net.JoinHostPort("127.0.0.4", strconv.Itoa(sa.(*syscall.SockaddrInet4).Port))
	// Fill the queue (a backlog of 0 still admits one connection).
	filler, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { filler.Close() })
	return addr
}
