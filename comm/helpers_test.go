package comm

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"syscall"
	"testing"
	"time"
)

// freePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// connectWorlds connects a world of size ranks inside this process, one
// goroutine per rank, each with its own Connect, and closes them when the
// test ends. edit, if not nil, adjusts every rank's Config.
func connectWorlds(t testing.TB, size int, edit func(*Config)) []*World {
	t.Helper()
	for attempt := 0; ; attempt++ {
		port := freePort(t)
		worlds := make([]*World, size)
		errs := make([]error, size)
		var wg sync.WaitGroup
		for r := range size {
			wg.Go(func() {
				cfg := Config{Rank: r, WorldSize: size, MasterAddr: "127.0.0.1", MasterPort: port, Timeout: 20 * time.Second, Secret: []byte("test")}
				if edit != nil {
					edit(&cfg)
				}
				worlds[r], errs[r] = Connect(context.Background(), cfg)
			})
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			closeWorlds(worlds)
			// Another process may have taken the port in between.
			if errors.Is(errs[0], syscall.EADDRINUSE) && attempt < 3 {
				continue
			}
			t.Fatalf("connecting %d ranks: %v", size, err)
		}
		t.Cleanup(func() { closeWorlds(worlds) })
		return worlds
	}
}

// closeWorlds closes the worlds concurrently (Close waits for the peers).
func closeWorlds(worlds []*World) {
	var wg sync.WaitGroup
	for _, w := range worlds {
		if w != nil {
			wg.Go(func() { w.Close() })
		}
	}
	wg.Wait()
}

// groups makes the group of the given world ranks on each of its members
// (worlds indexed by world rank) and returns them by group rank.
func groups(t testing.TB, worlds []*World, ranks []int) []*Group {
	t.Helper()
	gs := make([]*Group, len(ranks))
	for i, r := range ranks {
		g, err := worlds[r].Group(ranks)
		if err != nil {
			t.Fatal(err)
		}
		gs[i] = g
	}
	return gs
}

func allRanks(n int) []int {
	r := make([]int, n)
	for i := range r {
		r[i] = i
	}
	return r
}

// onAll runs f for every member concurrently and returns the errors by
// member.
func onAll(n int, f func(r int) error) []error {
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Go(func() {
			defer func() {
				if p := recover(); p != nil {
					errs[r] = fmt.Errorf("panic: %v", p)
				}
			}()
			errs[r] = f(r)
		})
	}
	wg.Wait()
	return errs
}

// mustAll fails the test if any member's f fails.
func mustAll(t testing.TB, n int, f func(r int) error) {
	t.Helper()
	for r, err := range onAll(n, f) {
		if err != nil {
			t.Fatalf("member %d: %v", r, err)
		}
	}
}
