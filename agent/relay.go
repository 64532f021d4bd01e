package agent

import (
	"bufio"
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
)

// File relays between nodes: `gptui agent --serve-files`, the source side
// of the launcher's relayed distribution (package cluster, distribute.go).
// A node that holds a verified copy of a file serves it to the job's other
// nodes over plain TCP, so that the launcher's own link carries each file
// about once. The protocol:
//
//   - ServeFiles listens on a TCP port of every local address and prints
//     "listening PORT" on standard output.
//   - The launcher, over its SSH session, writes a grant per transfer on
//     standard input: "grant ID TOKEN PATH", ID a number naming the
//     transfer in reports, TOKEN 64 hex digits (32 random bytes) that the
//     launcher gave the receiving node too (on its SSH session, never on
//     a command line), PATH the file, absolute or relative to the
//     directory ServeFiles runs in. ServeFiles answers "granted ID" once
//     the grant is in force; the launcher gives the receiver its token
//     only after that line, so that a receiver never connects before its
//     grant is known (a fast receiver was refused, and read 0 bytes).
//   - The receiver connects and sends TOKEN and a newline. A connection
//     that does not present a granted token within RelayHelloTimeout is
//     closed without a byte sent; a grant is used once, and lapses after
//     RelayGrantTTL unused.
//   - ServeFiles sends the file's bytes, nothing before or after them, and
//     closes the connection. The receiver checks them against the SHA-256
//     the launcher gave it; a short or wrong copy is refused there.
//   - ServeFiles reports each transfer on standard output: "sending ID
//     SIZE" once the token is accepted, "progress ID BYTES" about every
//     second, then "sent ID BYTES" or "failed ID REASON" — the launcher's
//     sign of life of a transfer. "refused ADDR REASON" reports a
//     connection without a granted token.
//
// ServeFiles exits when standard input ends. The channel is authenticated
// (only a holder of a token gets a byte), not encrypted, as the job's own
// network is.

// Bounds of ServeFiles.
const (
	// RelayHelloTimeout is how long a connection has to present its token.
	RelayHelloTimeout = 10 * time.Second
	// RelayGrantTTL is how long a grant waits for its connection.
	RelayGrantTTL = 2 * time.Minute
	// RelayWriteTimeout bounds each write of RelayChunk bytes to a
	// receiver: a receiver that stops reading is cut off after it.
	RelayWriteTimeout = 30 * time.Second
	// RelayChunk is how many bytes are sent between two deadlines.
	RelayChunk = 1 << 20
	// relayProgressEvery is how often a transfer reports its progress.
	relayProgressEvery = time.Second
	// relayMaxSending and relayMaxHello bound the transfers and the
	// connections waiting for their token at once.
	relayMaxSending = 8
	relayMaxHello   = 16
)

// RelayTokenLen is the length of a relay token: 64 hex digits.
const RelayTokenLen = 64

// relayGrant is one granted transfer.
type relayGrant struct {
	id      string
	token   []byte
	path    string
	expires time.Time
}

// relayServer is one ServeFiles.
type relayServer struct {
	mu     sync.Mutex
	grants []relayGrant
	out    io.Writer // standard output, written under mu
}

// report writes one line of the protocol to standard output.
func (s *relayServer) report(format string, args ...any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	fmt.Fprintf(s.out, format+"\n", args...)
}

// ServeFiles serves files of this node to other nodes over TCP, each to a
// connection that presents a token granted on in, and reports on out, as
// the protocol above says, until in ends or ctx does.
func ServeFiles(ctx context.Context, in io.Reader, out io.Writer) error {
	ln, err := net.Listen("tcp", ":0")
	if err != nil {
		return fmt.Errorf("serve files: %w", err)
	}
	defer ln.Close()
	s := &relayServer{out: out}
	s.report("listening %d", ln.Addr().(*net.TCPAddr).Port)

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	inErr := make(chan error, 1)
	go func() {
		defer cancel()
		inErr <- s.readGrants(in)
	}()
	context.AfterFunc(ctx, func() { ln.Close() })

	hello := make(chan struct{}, relayMaxHello)
	sending := make(chan struct{}, relayMaxSending)
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		conn, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				select {
				case err := <-inErr:
					if err != nil {
						return fmt.Errorf("serve files: reading grants: %w", err)
					}
				default:
				}
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return fmt.Errorf("serve files: %w", err)
		}
		select {
		case hello <- struct{}{}:
		default:
			s.report("refused %s too many connections waiting for their token", conn.RemoteAddr())
			conn.Close()
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			stop := context.AfterFunc(ctx, func() { conn.Close() })
			defer stop()
			defer conn.Close()
			g, ok := s.hello(conn)
			<-hello
			if !ok {
				return
			}
			sending <- struct{}{}
			defer func() { <-sending }()
			s.send(conn, g)
		}()
	}
}

// readGrants reads the grant lines of in until it ends.
func (s *relayServer) readGrants(in io.Reader) error {
	sc := bufio.NewScanner(in)
	for sc.Scan() {
		f := strings.SplitN(sc.Text(), " ", 4)
		if len(f) != 4 || f[0] != "grant" || len(f[2]) != RelayTokenLen || f[3] == "" {
			s.report("bad-grant %q", sc.Text())
			continue
		}
		now := time.Now()
		s.mu.Lock()
		kept := s.grants[:0]
		for _, g := range s.grants {
			if now.Before(g.expires) {
				kept = append(kept, g)
			}
		}
		s.grants = append(kept, relayGrant{id: f[1], token: []byte(f[2]), path: f[3], expires: now.Add(RelayGrantTTL)})
		s.mu.Unlock()
		s.report("granted %s", f[1])
	}
	return sc.Err()
}

// hello reads the token a connection presents and takes its grant, which
// is used up.
func (s *relayServer) hello(conn net.Conn) (relayGrant, bool) {
	conn.SetReadDeadline(time.Now().Add(RelayHelloTimeout))
	line, err := bufio.NewReaderSize(io.LimitReader(conn, RelayTokenLen+1), RelayTokenLen+1).ReadSlice('\n')
	if err != nil {
		s.report("refused %s no token: %v", conn.RemoteAddr(), err)
		return relayGrant{}, false
	}
	token := line[:len(line)-1]
	now := time.Now()
	s.mu.Lock()
	found := -1
	for i, g := range s.grants {
		// Every grant compared, in constant time.
		if subtle.ConstantTimeCompare(g.token, token) == 1 && now.Before(g.expires) {
			found = i
		}
	}
	var g relayGrant
	if found >= 0 {
		g = s.grants[found]
		s.grants = append(s.grants[:found], s.grants[found+1:]...)
	}
	s.mu.Unlock()
	if found < 0 {
		s.report("refused %s a token not granted", conn.RemoteAddr())
		return relayGrant{}, false
	}
	return g, true
}

// send sends the file of g on conn and reports how it went.
func (s *relayServer) send(conn net.Conn, g relayGrant) {
	sent, err := func() (int64, error) {
		f, err := os.Open(g.path)
		if err != nil {
			return 0, err
		}
		defer f.Close()
		fi, err := f.Stat()
		if err != nil {
			return 0, err
		}
		if !fi.Mode().IsRegular() {
			return 0, fmt.Errorf("%s is not a regular file", g.path)
		}
		s.report("sending %s %d", g.id, fi.Size())
		var sent int64
		last := time.Now()
		for {
			conn.SetWriteDeadline(time.Now().Add(RelayWriteTimeout))
			// A *net.TCPConn sends from the *os.File with sendfile.
			n, err := io.Copy(conn, io.LimitReader(f, RelayChunk))
			sent += n
			if err != nil {
				return sent, err
			}
			if n < RelayChunk {
				break
			}
			if time.Since(last) >= relayProgressEvery {
				s.report("progress %s %d", g.id, sent)
				last = time.Now()
			}
		}
		return sent, conn.Close()
	}()
	if err != nil {
		s.report("failed %s %s", g.id, strings.ReplaceAll(err.Error(), "\n", " "))
		return
	}
	s.report("sent %s %s", g.id, strconv.FormatInt(sent, 10))
}
