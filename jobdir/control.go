package jobdir

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"
)

// Requests of the control endpoint.
const (
	// OpPing asks whether the supervisor answers.
	OpPing = "ping"
	// OpStop stops the job with a checkpoint, as the UI's stop does: the
	// workers save their finished steps and exit.
	OpStop = "stop"
	// OpRestart stops the gang as OpStop does and starts it again from
	// the checkpoint it saved, in the same job.
	OpRestart = "restart"
)

// request and reply are the control endpoint's messages: one JSON line
// each way.
type request struct {
	Op string `json:"op"`
}

type reply struct {
	OK    bool   `json:"ok"`
	Error string `json:"error,omitempty"`
}

// maxSocketPath is the longest path a Unix socket is bound at here: the
// kernel takes 107 bytes.
const maxSocketPath = 100

// callTimeout bounds a request and its answer.
const callTimeout = 10 * time.Second

// Control is a job's control endpoint: a Unix socket of mode 0600 in a
// folder of mode 0700 that answers only processes of the supervisor's own
// user (SO_PEERCRED on Linux).
type Control struct {
	l      *net.UnixListener
	path   string
	tmpDir string // the folder made for a socket whose path would be too long

	wg sync.WaitGroup
}

// Listen opens the control socket of the job in the folder dir: its
// control.sock, or, when that path is too long for a Unix socket, one in a
// new 0700 folder of the system's temporary directory (the path is in
// supervisor.json either way). A socket left by a supervisor that died is
// replaced.
func Listen(dir string) (*Control, error) {
	abs, err := filepath.Abs(filepath.Join(dir, SocketFile))
	if err != nil {
		return nil, fmt.Errorf("jobdir: %w", err)
	}
	c := &Control{path: abs}
	if len(abs) > maxSocketPath {
		if c.tmpDir, err = os.MkdirTemp("", "gptui-ctl-"); err != nil {
			return nil, fmt.Errorf("jobdir: %w", err)
		}
		c.path = filepath.Join(c.tmpDir, "control.sock")
	}
	os.Remove(c.path)
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: c.path, Net: "unix"})
	if err == nil {
		err = os.Chmod(c.path, 0o600)
	}
	if err != nil {
		if l != nil {
			l.Close()
		}
		if c.tmpDir != "" {
			os.RemoveAll(c.tmpDir)
		}
		return nil, fmt.Errorf("jobdir: the control socket: %w", err)
	}
	l.SetUnlinkOnClose(true)
	c.l = l
	return c, nil
}

// Path returns the socket's path.
func (c *Control) Path() string { return c.path }

// Serve answers requests with h until Close: h's error, or nil, goes back
// to the caller. A peer of another user is refused without an answer.
func (c *Control) Serve(h func(op string) error) {
	for {
		conn, err := c.l.AcceptUnix()
		if err != nil {
			return
		}
		c.wg.Go(func() {
			defer conn.Close()
			if uid, err := peerUID(conn); err != nil || uid != os.Getuid() {
				return
			}
			conn.SetDeadline(time.Now().Add(callTimeout))
			sc := bufio.NewScanner(conn)
			sc.Buffer(make([]byte, 1024), 4096)
			if !sc.Scan() {
				return
			}
			var req request
			rep := reply{OK: true}
			if err := json.Unmarshal(sc.Bytes(), &req); err != nil {
				rep = reply{Error: "a request is one JSON line: " + err.Error()}
			} else if err := h(req.Op); err != nil {
				rep = reply{Error: err.Error()}
			}
			b, _ := json.Marshal(rep)
			conn.Write(append(b, '\n'))
		})
	}
}

// Close stops serving and removes the socket.
func (c *Control) Close() {
	c.l.Close()
	c.wg.Wait()
	if c.tmpDir != "" {
		os.RemoveAll(c.tmpDir)
	}
}

// Call sends op to the supervisor whose control socket is at socket and
// returns its answer: nil, or the error it gave.
func Call(socket, op string) error {
	conn, err := net.DialTimeout("unix", socket, callTimeout)
	if err != nil {
		return fmt.Errorf("the job's supervisor does not answer on %s: %w", socket, err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(callTimeout))
	b, _ := json.Marshal(request{Op: op})
	if _, err := conn.Write(append(b, '\n')); err != nil {
		return fmt.Errorf("the job's supervisor: %w", err)
	}
	sc := bufio.NewScanner(conn)
	sc.Buffer(make([]byte, 1024), 64<<10)
	if !sc.Scan() {
		if err := sc.Err(); err != nil {
			return fmt.Errorf("the job's supervisor: %w", err)
		}
		return errors.New("the job's supervisor closed the connection without answering (is it another user's?)")
	}
	var rep reply
	if err := json.Unmarshal(sc.Bytes(), &rep); err != nil {
		return fmt.Errorf("the job's supervisor answered %q: %w", sc.Text(), err)
	}
	if !rep.OK {
		return errors.New(rep.Error)
	}
	return nil
}
