package comm

import (
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestRefusals checks the report of refused connections over time: the
// first refusal as a line of its own, those within the interval counted
// in one line when the interval ends, a refusal after a quiet interval as
// a line of its own again, and the count left at close.
func TestRefusals(t *testing.T) {
	var mu sync.Mutex
	var lines []string
	r := newRefusals(func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		lines = append(lines, fmt.Sprintf(format, args...))
	}, "comm: rank 2", "mesh connection")
	r.every = 100 * time.Millisecond
	addr := func(host string, port int) net.Addr { return &net.TCPAddr{IP: net.ParseIP(host), Port: port} }
	bad := errors.New("bad hello")
	r.add(addr("10.0.0.1", 1), bad)
	r.add(addr("10.0.0.1", 2), bad)
	r.add(addr("10.0.0.2", 3), bad)
	time.Sleep(3 * r.every) // the count's line, then a quiet interval
	r.add(addr("10.0.0.3", 4), bad)
	r.add(addr("10.0.0.3", 5), bad)
	r.close()
	r.add(addr("10.0.0.3", 6), bad) // after close: not reported
	time.Sleep(2 * r.every)
	want := []string{
		"comm: rank 2: refused a mesh connection from 10.0.0.1:1: bad hello",
		"comm: rank 2: refused 2 more mesh connections from 2 addresses in 0 s (the last from 10.0.0.2:3: bad hello)",
		"comm: rank 2: refused a mesh connection from 10.0.0.3:4: bad hello",
		"comm: rank 2: refused 1 more mesh connection from 1 address in 0 s (the last from 10.0.0.3:5: bad hello)",
	}
	mu.Lock()
	defer mu.Unlock()
	if strings.Join(lines, "\n") != strings.Join(want, "\n") {
		t.Errorf("lines\n%s\nwant\n%s", strings.Join(lines, "\n"), strings.Join(want, "\n"))
	}
}
