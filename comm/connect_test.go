package comm

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestConfigFromEnv(t *testing.T) {
	for _, tc := range []struct {
		name    string
		env     map[string]string
		want    Config
		wantErr string // a substring of the error; "" for none
	}{
		{"torchrun", map[string]string{"RANK": "3", "WORLD_SIZE": "8", "MASTER_ADDR": "node0", "MASTER_PORT": "29500", "LOCAL_RANK": "1", "GPTUI_JOB_SECRET": "s3"},
			Config{Rank: 3, WorldSize: 8, MasterAddr: "node0", MasterPort: 29500, InitTimeout: DefaultInitTimeout, Secret: []byte("s3")}, ""},
		{"timeout", map[string]string{"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "1", "GPTUI_COMM_TIMEOUT": "90s", "GPTUI_JOB_SECRET": "x"},
			Config{Rank: 0, WorldSize: 2, MasterAddr: "h", MasterPort: 1, Timeout: 90 * time.Second, InitTimeout: DefaultInitTimeout, Secret: []byte("x")}, ""},
		{"init timeout", map[string]string{"WORLD_SIZE": "1", "GPTUI_COMM_INIT_TIMEOUT": "20m"}, Config{WorldSize: 1, InitTimeout: 20 * time.Minute}, ""},
		{"nothing set", map[string]string{}, Config{WorldSize: 1, InitTimeout: DefaultInitTimeout}, ""},
		{"world of one", map[string]string{"WORLD_SIZE": "1"}, Config{WorldSize: 1, InitTimeout: DefaultInitTimeout}, ""},
		{"no rank", map[string]string{"WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "1"}, Config{}, "RANK is not set"},
		{"bad rank", map[string]string{"RANK": "x", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "1"}, Config{}, `RANK="x"`},
		{"rank too big", map[string]string{"RANK": "2", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "1"}, Config{}, "RANK=2"},
		{"bad world", map[string]string{"WORLD_SIZE": "0"}, Config{}, "WORLD_SIZE=0"},
		{"world not a number", map[string]string{"WORLD_SIZE": "two"}, Config{}, `WORLD_SIZE="two"`},
		{"no address", map[string]string{"RANK": "1", "WORLD_SIZE": "2", "MASTER_PORT": "1"}, Config{}, "MASTER_ADDR"},
		{"no port", map[string]string{"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "h"}, Config{}, "MASTER_PORT is not set"},
		{"bad port", map[string]string{"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "70000"}, Config{}, "MASTER_PORT=70000"},
		{"no secret", map[string]string{"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "1"}, Config{}, "GPTUI_JOB_SECRET is not set"},
		{"bad timeout", map[string]string{"WORLD_SIZE": "1", "GPTUI_COMM_TIMEOUT": "30"}, Config{}, "GPTUI_COMM_TIMEOUT"},
		{"negative timeout", map[string]string{"WORLD_SIZE": "1", "GPTUI_COMM_TIMEOUT": "-1s"}, Config{}, "GPTUI_COMM_TIMEOUT"},
		{"bad init timeout", map[string]string{"WORLD_SIZE": "1", "GPTUI_COMM_INIT_TIMEOUT": "ten"}, Config{}, "GPTUI_COMM_INIT_TIMEOUT"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := configFrom(func(k string) (string, bool) { v, ok := tc.env[k]; return v, ok })
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("got %+v, %v; want %+v", got, err, tc.want)
			}
		})
	}
	// ConfigFromEnv itself reads the process environment.
	t.Setenv("RANK", "1")
	t.Setenv("WORLD_SIZE", "4")
	t.Setenv("MASTER_ADDR", "10.0.0.1")
	t.Setenv("MASTER_PORT", "1234")
	t.Setenv("GPTUI_COMM_TIMEOUT", "2m")
	t.Setenv("GPTUI_JOB_SECRET", "k")
	got, err := ConfigFromEnv()
	if want := (Config{Rank: 1, WorldSize: 4, MasterAddr: "10.0.0.1", MasterPort: 1234, Timeout: 2 * time.Minute, InitTimeout: DefaultInitTimeout, Secret: []byte("k")}); err != nil || !reflect.DeepEqual(got, want) {
		t.Errorf("ConfigFromEnv: %+v, %v; want %+v", got, err, want)
	}
}

func TestConnectInvalidConfig(t *testing.T) {
	for _, cfg := range []Config{
		{Rank: 0, WorldSize: 0},
		{Rank: 2, WorldSize: 2, MasterAddr: "127.0.0.1", MasterPort: 1},
		{Rank: 0, WorldSize: 2, MasterPort: 1},
		{Rank: 0, WorldSize: 2, MasterAddr: "127.0.0.1"},
		{Rank: 0, WorldSize: 2, MasterAddr: "127.0.0.1", MasterPort: 1}, // no secret
		{Rank: 0, WorldSize: 1, Timeout: -time.Second},
	} {
		if w, err := Connect(context.Background(), cfg); err == nil {
			w.Close()
			t.Errorf("Connect(%+v): no error", cfg)
		}
	}
}

// TestConnectTimeout checks that Connect gives up after the timeout when
// the master never appears, or the other ranks never register, and says so.
func TestConnectTimeout(t *testing.T) {
	t.Parallel() // it waits on timeouts
	const timeout = 500 * time.Millisecond
	for _, tc := range []struct {
		name string
		rank int
		want string
	}{
		{"no master", 1, "reaching the master"},
		{"missing ranks", 0, "ranks [1 2] did not register"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			port := freePort(t)
			start := time.Now()
			w, err := Connect(context.Background(), Config{Rank: tc.rank, WorldSize: 3, MasterAddr: "127.0.0.1", MasterPort: port, Timeout: timeout, Secret: []byte("test")})
			d := time.Since(start)
			if err == nil {
				w.Close()
				t.Fatal("Connect succeeded")
			}
			if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q, want one wrapping context.DeadlineExceeded and containing %q", err, tc.want)
			}
			if d < timeout || d > timeout+time.Second {
				t.Errorf("gave up after %v, want about %v", d, timeout)
			}
		})
	}
}

// TestConnectCanceled checks that Connect returns when its context ends.
func TestConnectCanceled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(100*time.Millisecond, cancel)
	start := time.Now()
	_, err := Connect(ctx, Config{Rank: 1, WorldSize: 2, MasterAddr: "127.0.0.1", MasterPort: freePort(t), Secret: []byte("test")})
	if !errors.Is(err, context.Canceled) || time.Since(start) > time.Second {
		t.Errorf("got %v after %v, want context.Canceled at once", err, time.Since(start))
	}
}

// joining are the Connect calls of a test's ranks, each started when the
// test says, in goroutines of this process.
type joining struct {
	wg     sync.WaitGroup
	worlds []*World
	errs   []error
}

func newJoining(size int) *joining {
	return &joining{worlds: make([]*World, size), errs: make([]error, size)}
}

// join starts the Connect of rank cfg.Rank.
func (j *joining) join(cfg Config) {
	j.wg.Go(func() { j.worlds[cfg.Rank], j.errs[cfg.Rank] = Connect(context.Background(), cfg) })
}

// formed waits for every rank's Connect, closes the worlds when the test
// ends, and fails the test unless every rank connected.
func (j *joining) formed(t *testing.T) []*World {
	t.Helper()
	j.wg.Wait()
	t.Cleanup(func() { closeWorlds(j.worlds) })
	if err := errors.Join(j.errs...); err != nil {
		t.Fatal(err)
	}
	return j.worlds
}

// barrierAll fails the test unless a barrier of all the worlds' ranks
// passes.
func barrierAll(t *testing.T, worlds []*World) {
	t.Helper()
	gs := groups(t, worlds, allRanks(len(worlds)))
	mustAll(t, len(worlds), func(r int) error { return gs[r].Barrier(context.Background()) })
}

// dialMaster connects to the master at addr once it listens, trying for
// about a second.
func dialMaster(t *testing.T, addr string) net.Conn {
	t.Helper()
	var c net.Conn
	for i := 0; c == nil && i < 100; i++ {
		c, _ = net.Dial("tcp", addr)
		time.Sleep(10 * time.Millisecond)
	}
	if c == nil {
		t.Fatal("the master does not listen")
	}
	return c
}

// TestConnectLateMaster starts the other ranks well before rank 0: they
// keep retrying until it listens.
func TestConnectLateMaster(t *testing.T) {
	port := freePort(t)
	j := newJoining(3)
	for _, r := range []int{1, 2, 0} {
		if r == 0 {
			time.Sleep(300 * time.Millisecond)
		}
		j.join(Config{Rank: r, WorldSize: 3, MasterAddr: "127.0.0.1", MasterPort: port, Timeout: 10 * time.Second, Secret: []byte("test")})
	}
	barrierAll(t, j.formed(t))
}

// TestConnectRefusals checks that the master refuses a rank registered
// twice and a rank with another world size, and that strangers knocking on
// the master's port are ignored; the job then forms as if nothing happened.
func TestConnectRefusals(t *testing.T) {
	port := freePort(t)
	master := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	cfg := func(rank, size int) Config {
		return Config{Rank: rank, WorldSize: size, MasterAddr: "127.0.0.1", MasterPort: port, Timeout: 10 * time.Second, Secret: []byte("test")}
	}
	j := newJoining(3)
	j.join(cfg(0, 3))
	stranger := dialMaster(t, master)
	stranger.Write([]byte("GET / HTTP/1.0\r\n\r\n"))
	stranger.Close()
	if _, err := Connect(context.Background(), cfg(1, 4)); err == nil || !strings.Contains(err.Error(), "world size is 4") {
		t.Errorf("a rank with another world size: %v", err)
	}
	j.join(cfg(1, 3))
	time.Sleep(200 * time.Millisecond) // rank 1 has registered
	if _, err := Connect(context.Background(), cfg(1, 3)); err == nil || !strings.Contains(err.Error(), "rank 1 registered twice") {
		t.Errorf("a second rank 1: %v", err)
	}
	j.join(cfg(2, 3))
	barrierAll(t, j.formed(t))
}

// TestConnectAuthentication checks that a peer without the job's secret
// takes no rank's place: a forger that speaks the protocol and claims rank
// 1 before the real rank 1, and a rank started with another secret, are
// refused and reported, and the job then forms from its own ranks.
func TestConnectAuthentication(t *testing.T) {
	port := freePort(t)
	master := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	var mu sync.Mutex
	var refusals []string
	cfg := func(rank int, secret string) Config {
		return Config{Rank: rank, WorldSize: 3, MasterAddr: "127.0.0.1", MasterPort: port, Timeout: 10 * time.Second, Secret: []byte(secret),
			Logf: func(format string, args ...any) {
				mu.Lock()
				defer mu.Unlock()
				refusals = append(refusals, fmt.Sprintf(format, args...))
			}}
	}
	j := newJoining(3)
	j.join(cfg(0, "job"))

	// A forger that knows the protocol but not the secret registers as
	// rank 1 and answers the challenge with a made-up proof.
	c := dialMaster(t, master)
	if err := writeMsg(c, registration{Version: protocolVersion, Rank: 1, WorldSize: 3, Addr: "127.0.0.1:1", Nonce: hex.EncodeToString(newNonce())}); err != nil {
		t.Fatal(err)
	}
	var ch challenge
	if err := readMsg(c, &ch, smallMsg); err != nil || ch.Error != "" {
		t.Fatalf("the master's challenge: %+v, %v", ch, err)
	}
	if err := writeMsg(c, proof{MAC: hex.EncodeToString(make([]byte, sha256Size))}); err != nil {
		t.Fatal(err)
	}
	var tab rankTable
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if err := readMsg(c, &tab, tableMsg); err == nil {
		t.Fatalf("the forger got a rank table: %+v", tab)
	}
	c.Close()

	// A rank with another secret is refused too, and refuses the master.
	if _, err := Connect(context.Background(), cfg(2, "another job")); err == nil || !strings.Contains(err.Error(), "failed authentication") {
		t.Errorf("a rank with another secret: %v", err)
	}
	j.join(cfg(1, "job"))
	j.join(cfg(2, "job"))
	barrierAll(t, j.formed(t))
	mu.Lock()
	defer mu.Unlock()
	if len(refusals) != 2 || !strings.Contains(refusals[0], "claimed rank 1 without this job's secret") {
		t.Errorf("refusals reported: %q, want the forger's and the other job's rank's", refusals)
	}
}

// TestConnectRefusalFlood floods the master with 200 connections that
// send garbage before the job forms: they are reported in a few lines (the
// first with its address, the rest counted), not one line each, and the
// job forms.
func TestConnectRefusalFlood(t *testing.T) {
	const flood = 200
	port := freePort(t)
	master := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	var mu sync.Mutex
	var lines []string
	cfg := func(rank int) Config {
		return Config{Rank: rank, WorldSize: 2, MasterAddr: "127.0.0.1", MasterPort: port, Timeout: 20 * time.Second, Secret: []byte("job"),
			Logf: func(format string, args ...any) {
				mu.Lock()
				defer mu.Unlock()
				lines = append(lines, fmt.Sprintf(format, args...))
			}}
	}
	j := newJoining(2)
	j.join(cfg(0))
	for i := 0; i < flood; {
		c, err := net.Dial("tcp", master)
		if err != nil {
			if i > 0 {
				t.Fatal(err)
			}
			time.Sleep(10 * time.Millisecond) // the master is not listening yet
			continue
		}
		c.Write([]byte("GET / HTTP/1.0\r\n\r\n"))
		c.Close()
		i++
	}
	j.join(cfg(1))
	j.formed(t)
	mu.Lock()
	defer mu.Unlock()
	if len(lines) < 2 || len(lines) > 4 {
		t.Fatalf("%d lines for %d refused connections, want 2 to 4:\n%s", len(lines), flood, strings.Join(lines, "\n"))
	}
	if !strings.HasPrefix(lines[0], "comm: master: refused a connection from 127.0.0.1:") {
		t.Errorf("first line %q", lines[0])
	}
	counted := 1
	more := regexp.MustCompile(`^comm: master: refused (\d+) more connections? from 1 address in \d+ s \(the last from 127\.0\.0\.1:\d+: .+\)$`)
	for _, l := range lines[1:] {
		m := more.FindStringSubmatch(l)
		if m == nil {
			t.Fatalf("line %q is not a count of refusals", l)
		}
		n, _ := strconv.Atoi(m[1])
		counted += n
	}
	if counted != flood {
		t.Errorf("the lines count %d refused connections, want %d:\n%s", counted, flood, strings.Join(lines, "\n"))
	}
}

// TestMeshHelloAuthentication checks a mesh connection's hello: the
// accepting rank takes the dialer's rank only from a dialer that holds the
// secret.
func TestMeshHelloAuthentication(t *testing.T) {
	for _, tc := range []struct {
		name, secret string
		ok           bool
	}{{"same secret", "job", true}, {"another secret", "other", false}} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := net.Pipe()
			defer a.Close()
			defer b.Close()
			go writeHello(a, []byte(tc.secret), "token", 2)
			r, err := readHello(b, []byte("job"), "token")
			if tc.ok && (err != nil || r != 2) {
				t.Errorf("readHello = %d, %v; want 2", r, err)
			}
			if !tc.ok && err == nil {
				t.Errorf("readHello took rank %d from a dialer without the secret", r)
			}
		})
	}
}
