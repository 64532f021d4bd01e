package cluster

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gptui/gptui/sshexec"
)

// The two ends of a relay on the nodes: a source's server (package
// agent's ServeFiles, started over SSH), and a destination's fetch
// (relayFetchScript).

// relayServer is `gptui agent --serve-files` on a source node.
type relayServer struct {
	n    *node
	host string // the address the other nodes reach n at
	port int
	sess *sshexec.Session

	ready    chan struct{} // closed once it listens, or failed to (startErr)
	startErr error
	down     chan struct{} // closed when it failed to start or ended
	endErr   error         // how it ended, valid after down
	stderr   limitedBuffer // its standard error, valid after down

	mu       sync.Mutex // serializes the grants and guards watchers
	watchers map[string]chan string
}

// server returns n's server, starting it on first use.
func (d *distributor) server(ctx context.Context, n *node) (*relayServer, error) {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return nil, errors.New("the distribution is over")
	}
	s := d.servers[n]
	starts := s == nil
	if starts {
		s = &relayServer{n: n, ready: make(chan struct{}), down: make(chan struct{}), watchers: map[string]chan string{}}
		s.stderr.max = 4096
		d.servers[n] = s
	}
	d.mu.Unlock()
	if starts {
		s.start(d.ctx)
	}
	select {
	case <-s.ready:
	case <-ctx.Done():
		return nil, context.Cause(ctx)
	}
	if s.startErr != nil {
		return nil, s.startErr
	}
	return s, nil
}

// start starts the server and waits, for at most relayReady, for the port
// it listens on; ctx bounds its life. Its standard output is read until
// it ends: the port, then each transfer's reports, to its watcher.
func (s *relayServer) start(ctx context.Context) {
	n := s.n
	var once sync.Once
	started := func(err error) {
		once.Do(func() {
			if err != nil {
				s.startErr = fmt.Errorf("relay server on %s: %w", n.name, err)
			}
			close(s.ready)
		})
	}
	host, _, err := net.SplitHostPort(n.client.RemoteAddr().String())
	if err != nil {
		started(err)
		close(s.down)
		return
	}
	s.host = host
	// In the login directory, where the grants' relative paths start.
	sess, err := n.client.Start(ctx, "exec "+n.shellDir()+"/gptui agent --serve-files")
	if err != nil {
		started(err)
		close(s.down)
		return
	}
	s.sess = sess
	var errDone sync.WaitGroup
	errDone.Add(1)
	go func() {
		defer errDone.Done()
		io.Copy(&s.stderr, sess.Stderr)
	}()
	go func() {
		sc := bufio.NewScanner(sess.Stdout)
		for sc.Scan() {
			l := sc.Text()
			if p, ok := strings.CutPrefix(l, "listening "); ok && s.port == 0 {
				port, err := strconv.Atoi(p)
				if err == nil && port > 0 && port < 65536 {
					s.port = port
					started(nil)
				}
				continue
			}
			f := strings.SplitN(l, " ", 3)
			if len(f) < 2 {
				continue
			}
			s.mu.Lock()
			w := s.watchers[f[1]]
			s.mu.Unlock()
			if w != nil {
				select {
				case w <- l:
				default: // a watcher behind by 64 reports misses one
				}
			}
		}
		io.Copy(io.Discard, sess.Stdout)
		errDone.Wait()
		code, err := sess.Wait()
		if err == nil {
			err = fmt.Errorf("exit status %d", code)
		}
		if msg := strings.TrimSpace(s.stderr.String()); msg != "" {
			err = fmt.Errorf("%w: %s", err, msg)
		}
		s.endErr = err
		started(err)
		close(s.down)
	}()
	t := time.AfterFunc(relayReady, func() {
		started(fmt.Errorf("no port within %v", relayReady))
		sess.Close()
	})
	<-s.ready
	t.Stop()
}

// err is how the server ended; call it after down is closed.
func (s *relayServer) err() error { return s.endErr }

// watch returns the channel that gets the reports of transfer id.
func (s *relayServer) watch(id string) <-chan string {
	c := make(chan string, 64)
	s.mu.Lock()
	s.watchers[id] = c
	s.mu.Unlock()
	return c
}

// unwatch stops the reports of transfer id.
func (s *relayServer) unwatch(id string) {
	s.mu.Lock()
	delete(s.watchers, id)
	s.mu.Unlock()
}

// grant lets the connection that presents token have the file p
// (relative to the login directory, or absolute).
func (s *relayServer) grant(id, token, p string) error {
	if strings.ContainsAny(p, "\n\r") {
		return fmt.Errorf("relay: a path with a line break: %q", p)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, err := fmt.Fprintf(s.sess.Stdin, "grant %s %s %s\n", id, token, p); err != nil {
		return fmt.Errorf("relay server on %s: %w", s.n.name, err)
	}
	return nil
}

// stop ends the server: its standard input closed, on which it exits,
// and killed unless it has within a second.
func (s *relayServer) stop() {
	<-s.ready
	if s.sess == nil {
		return
	}
	s.mu.Lock()
	s.sess.Stdin.Close()
	s.mu.Unlock()
	select {
	case <-s.down:
	case <-time.After(time.Second):
	}
	s.sess.Close()
}

// relayFetchScript fetches a relayed file on the destination node: bash,
// so that it runs before the node has gptui. Its arguments are the target
// (relative to the login directory, or absolute), the temporary file next
// to it, the source's host and port, the file's SHA-256 and the mode; the
// token is the first line of its standard input. It receives the bytes
// into the temporary file, syncs it, checks its SHA-256 and renames it
// into place.
// Exit status: 70 no sha256sum, 71 no token, 72 no directory for the
// target, 73 the source not reached, 74 the file not received whole, 75
// a copy of another SHA-256, 76 not renamed, 77 a bash without /dev/tcp.
const relayFetchScript = `set -u
export LC_ALL=C
dst=$1 tmp=$2 host=$3 port=$4 want=$5 mode=$6
command -v sha256sum >/dev/null 2>&1 || { echo "no sha256sum" >&2; exit 70; }
IFS= read -r token || { echo "no token on standard input" >&2; exit 71; }
case $dst in */*) mkdir -p -- "${dst%/*}" || exit 72 ;; esac
trap 'rm -f -- "$tmp"' EXIT
if ! { exec 3<>"/dev/tcp/$host/$port"; } 2>"$tmp"; then
	if grep -q "No such file" "$tmp"; then echo "this bash has no /dev/tcp" >&2; exit 77; fi
	cat "$tmp" >&2
	exit 73
fi
printf '%s\n' "$token" >&3 || exit 73
cat <&3 >"$tmp" || exit 74
exec 3<&-
sync -- "$tmp" 2>/dev/null
sum=$(sha256sum -- "$tmp") || exit 74
sum=${sum#\\}
sum=${sum%% *}
if [ "$sum" != "$want" ]; then
	echo "the copy received has SHA-256 $sum, not $want ($(wc -c <"$tmp") bytes)" >&2
	exit 75
fi
chmod "$mode" -- "$tmp" && mv -f -- "$tmp" "$dst" || exit 76
trap - EXIT
`

// fetch runs relayFetchScript on n: the file with SHA-256 sum from
// host:port, with token, to remote (as Push takes it) with mode. It
// returns the script's exit status and standard error; err is not nil
// when it did not run to its end (ctx ended, the connection was lost),
// and then the temporary file is removed, as far as possible.
func (n *node) fetch(ctx context.Context, host string, port int, token, sum, remote string, mode os.FileMode) (code int, msg string, err error) {
	dst := loginPath(remote)
	tmp := dst + ".relay-" + newToken()[:12]
	cmd := "exec bash -c " + shellQuote(relayFetchScript) + " gptui-fetch " + shellQuote(dst) + " " + shellQuote(tmp) + " " +
		shellQuote(host) + " " + strconv.Itoa(port) + " " + sum + " " + fmt.Sprintf("%04o", mode.Perm())
	defer func() {
		if err != nil {
			// The script was killed before its trap could remove it.
			rmCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			n.client.Run(rmCtx, "rm -f -- "+shellQuote(tmp), nil, nil)
		}
	}()
	s, err := n.client.Start(ctx, cmd)
	if err != nil {
		return -1, "", err
	}
	var stderr limitedBuffer
	stderr.max = 4096
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		io.Copy(io.Discard, s.Stdout)
	}()
	go func() {
		defer wg.Done()
		io.Copy(&stderr, s.Stderr)
	}()
	_, werr := io.WriteString(s.Stdin, token+"\n")
	s.Stdin.Close()
	wg.Wait()
	code, err = s.Wait()
	if err == nil && werr != nil && code == 0 {
		err = werr
	}
	return code, strings.TrimSpace(stderr.String()), err
}

// sameFile reports whether the SSH node n holds the file remote (as Push
// takes it) with SHA-256 sum, and then gives it mode. errCannotFetch
// says that n has no sha256sum.
func (n *node) sameFile(ctx context.Context, remote, sum string, mode os.FileMode) (bool, error) {
	p := shellQuote(loginPath(remote))
	if strings.HasPrefix(loginPath(remote), "-") {
		p = "./" + p
	}
	cmd := `command -v sha256sum >/dev/null 2>&1 || exit 70
[ -f ` + p + ` ] || exit 0
s=$(sha256sum -- ` + p + `) || exit 71
s=${s#\\}
[ "${s%% *}" = ` + sum + ` ] || exit 0
chmod ` + fmt.Sprintf("%04o", mode.Perm()) + ` -- ` + p + ` && echo same`
	var stdout, stderr bytes.Buffer
	code, err := n.client.Run(ctx, cmd, &stdout, &stderr)
	switch {
	case err != nil:
		return false, fmt.Errorf("node %s: checking %s: %w", n.name, remote, err)
	case code == 70:
		return false, fmt.Errorf("%w: no sha256sum on %s", errCannotFetch, n.name)
	case code != 0:
		return false, fmt.Errorf("node %s: checking %s: exit status %d: %s", n.name, remote, code, strings.TrimSpace(stderr.String()))
	}
	return strings.TrimSpace(stdout.String()) == "same", nil
}
