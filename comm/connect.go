package comm

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"sync"
	"time"
)

// protocolVersion names the bootstrap protocol; ranks of different builds
// refuse each other.
const protocolVersion = "gptui-comm/2"

// helloMagic starts the first message on every mesh connection.
const helloMagic = "GPTUIHI2"

// handshakeTimeout bounds the join handshake of one connection to the
// master, so that a peer that connects and says nothing holds nothing.
const handshakeTimeout = 10 * time.Second

// Size limits of the messages read during a join: what an unauthenticated
// peer sends, and the rank table the authenticated master sends.
const (
	smallMsg = 4 << 10
	tableMsg = 16 << 20
)

// sha256Size is the size of an HMAC-SHA256.
const sha256Size = sha256.Size

// socketBuffer is the send and receive buffer size asked of the kernel for
// mesh connections.
const socketBuffer = 4 << 20

// registration is what a rank tells the master first.
type registration struct {
	Version   string `json:"version"`
	Rank      int    `json:"rank"`
	WorldSize int    `json:"world_size"`
	Addr      string `json:"addr"`  // the rank's mesh listener
	Nonce     string `json:"nonce"` // the rank's challenge to the master, hex
}

// challenge is the master's answer to a registration: its proof of the
// secret over the rank's nonce and its own, and its own nonce for the
// rank's proof; or why the rank was refused.
type challenge struct {
	Error string `json:"error,omitempty"`
	Nonce string `json:"nonce,omitempty"`
	MAC   string `json:"mac,omitempty"`
}

// proof is the rank's proof of the secret, over both nonces.
type proof struct {
	MAC string `json:"mac"`
}

// rankTable is the master's answer: every rank's mesh address and a token
// that identifies this job's connections, or why the rank was refused.
type rankTable struct {
	Error string   `json:"error,omitempty"`
	Token string   `json:"token,omitempty"`
	Addrs []string `json:"addrs,omitempty"`
}

// Connect joins the World described by cfg. Rank 0 listens on
// MasterAddr:MasterPort; every rank opens its own mesh listener (on the
// local address it reaches the master from, on a port the system picks),
// registers with rank 0, receives the table of all ranks' addresses, and
// the ranks then connect into a full mesh: rank i dials every rank below
// it.
//
// Every connection is authenticated with the job's secret (cfg.Secret)
// before anything of the job crosses it: at registration the rank and the
// master each prove, by an HMAC-SHA256 over random challenges of both
// sides, the rank and the world size, that they know the secret; a mesh
// connection proves it over a challenge of the accepting rank. A peer that
// fails is dropped (and reported through cfg.Logf: a flood of them as a
// count every 10 s) and takes no rank's
// place: the master waits on for the real rank. Traffic is authenticated
// when it is set up, not encrypted. The mesh connections have Nagle's algorithm off and 4 MiB socket
// buffers. Connecting to the master is retried, so the ranks may start in
// any order; Connect fails when ctx ends or cfg.Timeout has passed first,
// with an error that wraps ctx's error or context.DeadlineExceeded. A World
// of size 1 needs no network.
func Connect(ctx context.Context, cfg Config) (*World, error) {
	cfg, err := cfg.check()
	if err != nil {
		return nil, err
	}
	if !littleEndian() {
		return nil, errors.New("comm: this host is big-endian; the wire format needs little-endian hosts")
	}
	if cfg.WorldSize == 1 {
		return newWorld(cfg, []string{""}, nil), nil
	}
	ctx, cancelTimeout := context.WithTimeout(ctx, cfg.InitTimeout)
	defer cancelTimeout()
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	master := net.JoinHostPort(cfg.MasterAddr, strconv.Itoa(cfg.MasterPort))
	var served chan error
	if cfg.Rank == 0 {
		var lc net.ListenConfig
		ln, err := lc.Listen(ctx, "tcp", master)
		if err != nil {
			return nil, fmt.Errorf("comm: rank 0: listening on the master address: %w", err)
		}
		served = make(chan error, 1)
		go func() { served <- serveMaster(ctx, ln, cfg) }()
	}
	addrs, ncs, err := join(ctx, cfg, master)
	if served != nil {
		if err != nil {
			// Stop the master. The connection deadlines are the context's,
			// so join may see its timeout a moment before ctx does: pass
			// the cause on rather than "canceled".
			cause := err
			if errors.Is(err, context.DeadlineExceeded) {
				cause = context.DeadlineExceeded
			}
			cancel(cause)
		}
		if serr := <-served; serr != nil {
			err = serr // it says which ranks are missing
		}
	}
	if err != nil {
		for _, nc := range ncs {
			if nc != nil {
				nc.Close()
			}
		}
		return nil, err
	}
	return newWorld(cfg, addrs, ncs), nil
}

// join registers with the master and connects the mesh.
func join(ctx context.Context, cfg Config, master string) ([]string, []*net.TCPConn, error) {
	me := fmt.Sprintf("comm: rank %d", cfg.Rank)
	bc, err := dialRetry(ctx, master)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: reaching the master at %s: %w", me, master, err)
	}
	defer bc.Close()
	defer context.AfterFunc(ctx, func() { bc.SetDeadline(time.Unix(1, 0)) })()
	host := bc.LocalAddr().(*net.TCPAddr).IP.String()
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return nil, nil, fmt.Errorf("%s: opening the mesh listener on %s: %w", me, host, err)
	}
	defer ln.Close()
	self := ln.Addr().String()
	nonce := newNonce()
	reg := registration{Version: protocolVersion, Rank: cfg.Rank, WorldSize: cfg.WorldSize, Addr: self, Nonce: hex.EncodeToString(nonce)}
	if err := writeMsg(bc, reg); err != nil {
		return nil, nil, fmt.Errorf("%s: registering with the master at %s: %w", me, master, ctxErr(ctx, err))
	}
	var ch challenge
	if err := readMsg(bc, &ch, smallMsg); err != nil {
		return nil, nil, fmt.Errorf("%s: registering with the master at %s: %w", me, master, ctxErr(ctx, err))
	}
	if ch.Error != "" {
		return nil, nil, fmt.Errorf("%s: the master at %s refused: %s", me, master, ch.Error)
	}
	masterNonce, ok := decodeHex(ch.Nonce, nonceBytes)
	got, ok2 := decodeHex(ch.MAC, sha256Size)
	wantMaster, rankMAC := joinMACs(cfg.Secret, nonce, masterNonce, cfg.Rank, cfg.WorldSize, self)
	if !ok || !ok2 || !hmac.Equal(got, wantMaster) {
		return nil, nil, fmt.Errorf("%s: the master at %s failed authentication: it does not hold this job's secret (%s); a process that is not this job's rank 0 answers there", me, master, SecretEnv)
	}
	if err := writeMsg(bc, proof{MAC: hex.EncodeToString(rankMAC)}); err != nil {
		return nil, nil, fmt.Errorf("%s: registering with the master at %s: %w", me, master, ctxErr(ctx, err))
	}
	var tab rankTable
	if err := readMsg(bc, &tab, tableMsg); err != nil {
		return nil, nil, fmt.Errorf("%s: waiting for the master at %s to hear from all %d ranks: %w", me, master, cfg.WorldSize, ctxErr(ctx, err))
	}
	if tab.Error != "" {
		return nil, nil, fmt.Errorf("%s: the master at %s refused: %s", me, master, tab.Error)
	}
	if len(tab.Addrs) != cfg.WorldSize || tab.Addrs[cfg.Rank] != self || len(tab.Token) == 0 {
		return nil, nil, fmt.Errorf("%s: the master at %s sent a bad rank table", me, master)
	}
	ncs, err := mesh(ctx, cfg, ln, tab)
	if err != nil {
		return nil, ncs, fmt.Errorf("%s: connecting to the other ranks: %w", me, err)
	}
	return tab.Addrs, ncs, nil
}

// serveMaster collects every rank's registration and answers each with the
// rank table.
func serveMaster(ctx context.Context, ln net.Listener, cfg Config) error {
	defer context.AfterFunc(ctx, func() { ln.Close() })()
	refused := newRefusals(cfg.Logf, "comm: master", "connection")
	defer refused.close() // after stop: every handshake has ended
	arrivals, stop := acceptAll(ctx, ln, func(c net.Conn) (registration, error) { return authenticate(c, cfg) }, refused.add)
	defer stop()
	conns := make([]net.Conn, cfg.WorldSize)
	addrs := make([]string, cfg.WorldSize)
	closeAll := func() {
		for _, c := range conns {
			if c != nil {
				c.Close()
			}
		}
	}
	for n := 0; n < cfg.WorldSize; {
		select {
		case <-ctx.Done():
			closeAll()
			var missing []int
			for r, c := range conns {
				if c == nil {
					missing = append(missing, r)
				}
			}
			return fmt.Errorf("comm: master: ranks %v did not register: %w", missing, context.Cause(ctx))
		case a := <-arrivals:
			if a.c == nil { // the listener closed: ctx ended
				continue
			}
			if a.err != nil { // not a rank of ours
				a.c.Close()
				continue
			}
			refuse := ""
			if r := a.v; conns[r.Rank] != nil {
				refuse = fmt.Sprintf("rank %d registered twice (from %s and %s)", r.Rank, addrs[r.Rank], r.Addr)
			}
			if refuse != "" {
				writeMsg(a.c, rankTable{Error: refuse})
				a.c.Close()
				continue
			}
			conns[a.v.Rank], addrs[a.v.Rank] = a.c, a.v.Addr
			n++
		}
	}
	defer closeAll()
	var tok [16]byte
	rand.Read(tok[:])
	tab := rankTable{Token: fmt.Sprintf("%x", tok), Addrs: addrs}
	for r, c := range conns {
		if err := writeMsg(c, tab); err != nil {
			return fmt.Errorf("comm: master: sending the rank table to rank %d: %w", r, ctxErr(ctx, err))
		}
	}
	return nil
}

// authenticate runs the master's side of a join on c: it reads the
// registration, answers with its proof and challenge, and checks the
// rank's proof. It returns the registration of a rank that knows the
// secret; any other peer gets an error (and, for a registration of the
// wrong protocol or shape, a refusal it can print).
func authenticate(c net.Conn, cfg Config) (registration, error) {
	var r registration
	if err := readMsg(c, &r, smallMsg); err != nil {
		return r, fmt.Errorf("reading its registration: %w", err)
	}
	refuse := ""
	rankNonce, ok := decodeHex(r.Nonce, nonceBytes)
	switch {
	case r.Version != protocolVersion:
		refuse = fmt.Sprintf("protocol %q, want %q (gptui builds differ)", r.Version, protocolVersion)
	case r.WorldSize != cfg.WorldSize:
		refuse = fmt.Sprintf("rank %d says the world size is %d, rank 0 says %d", r.Rank, r.WorldSize, cfg.WorldSize)
	case r.Rank < 0 || r.Rank >= cfg.WorldSize:
		refuse = fmt.Sprintf("rank %d is outside [0, %d)", r.Rank, cfg.WorldSize)
	case !ok:
		refuse = "a registration without a valid challenge"
	}
	if refuse != "" {
		writeMsg(c, challenge{Error: refuse})
		return r, errors.New(refuse)
	}
	masterNonce := newNonce()
	masterMAC, rankMAC := joinMACs(cfg.Secret, rankNonce, masterNonce, r.Rank, r.WorldSize, r.Addr)
	if err := writeMsg(c, challenge{Nonce: hex.EncodeToString(masterNonce), MAC: hex.EncodeToString(masterMAC)}); err != nil {
		return r, fmt.Errorf("answering rank %d: %w", r.Rank, err)
	}
	var p proof
	if err := readMsg(c, &p, smallMsg); err != nil {
		return r, fmt.Errorf("waiting for the proof of rank %d: %w", r.Rank, err)
	}
	if got, ok := decodeHex(p.MAC, sha256Size); !ok || !hmac.Equal(got, rankMAC) {
		return r, fmt.Errorf("it claimed rank %d without this job's secret (%s)", r.Rank, SecretEnv)
	}
	return r, nil
}

// mesh connects this rank to every other: it dials the ranks below it and
// accepts the ranks above it. The first message on each connection is a
// hello: helloMagic, the job's token, and the dialer's rank.
func mesh(ctx context.Context, cfg Config, ln net.Listener, tab rankTable) ([]*net.TCPConn, error) {
	ncs := make([]*net.TCPConn, cfg.WorldSize)
	accepted := make(chan error, 1)
	higher := make([]*net.TCPConn, cfg.WorldSize) // filled by acceptPeers
	go func() { accepted <- acceptPeers(ctx, cfg, ln, tab.Token, higher) }()
	var err error
	for r := 0; r < cfg.Rank && err == nil; r++ {
		var c *net.TCPConn
		if c, err = dialRetry(ctx, tab.Addrs[r]); err != nil {
			err = fmt.Errorf("dialing rank %d at %s: %w", r, tab.Addrs[r], err)
			break
		}
		ncs[r] = c
		if err = writeHello(c, cfg.Secret, tab.Token, cfg.Rank); err != nil {
			err = fmt.Errorf("greeting rank %d at %s: %w", r, tab.Addrs[r], ctxErr(ctx, err))
		}
	}
	if err != nil {
		ln.Close() // stops acceptPeers
	}
	if aerr := <-accepted; err == nil {
		err = aerr
	}
	for r := cfg.Rank + 1; r < cfg.WorldSize; r++ {
		ncs[r] = higher[r]
	}
	if err != nil {
		return ncs, err
	}
	for _, c := range ncs {
		if c != nil {
			tune(c)
			c.SetDeadline(time.Time{})
		}
	}
	return ncs, nil
}

// acceptPeers accepts the ranks above this one into conns, checking each
// hello; connections that do not belong to the job are closed and ignored.
func acceptPeers(ctx context.Context, cfg Config, ln net.Listener, token string, conns []*net.TCPConn) error {
	want := cfg.WorldSize - 1 - cfg.Rank
	if want == 0 {
		return nil
	}
	defer context.AfterFunc(ctx, func() { ln.Close() })()
	refused := newRefusals(cfg.Logf, fmt.Sprintf("comm: rank %d", cfg.Rank), "mesh connection")
	defer refused.close() // after stop: every handshake has ended
	hellos, stop := acceptAll(ctx, ln, func(c net.Conn) (int, error) { return readHello(c, cfg.Secret, token) }, refused.add)
	defer stop()
	for got := 0; got < want; {
		h := <-hellos
		switch {
		case h.c == nil:
			missing := []int{}
			for r := cfg.Rank + 1; r < cfg.WorldSize; r++ {
				if conns[r] == nil {
					missing = append(missing, r)
				}
			}
			return fmt.Errorf("ranks %v did not connect: %w", missing, ctxErr(ctx, h.err))
		case h.err != nil || h.v <= cfg.Rank || h.v >= cfg.WorldSize || conns[h.v] != nil:
			h.c.Close()
		default:
			conns[h.v] = h.c.(*net.TCPConn)
			got++
		}
	}
	return nil
}

// accepted is a connection acceptAll took, with what its handshake found;
// c is nil when the listener failed (err says why), which ends acceptAll.
type accepted[T any] struct {
	c   net.Conn
	v   T
	err error
}

// acceptAll accepts connections on ln and runs handshake on each in a
// goroutine of its own, the connection's deadline at most
// handshakeTimeout away (and no later than ctx's), so that a peer that
// connects and says nothing holds nothing for long. Each outcome arrives
// on the channel returned, with the connection's deadline then set to
// ctx's; a failed handshake is also reported through refused. stop closes
// ln, closes the connections no one received, and waits for the
// goroutines.
func acceptAll[T any](ctx context.Context, ln net.Listener, handshake func(net.Conn) (T, error), refused func(net.Addr, error)) (<-chan accepted[T], func()) {
	out := make(chan accepted[T])
	quit := make(chan struct{})
	var wg sync.WaitGroup
	deadline := func(limit time.Duration) time.Time {
		dl, ok := ctx.Deadline()
		if limit > 0 && (!ok || time.Now().Add(limit).Before(dl)) {
			return time.Now().Add(limit)
		}
		return dl // the zero time (no deadline) without one
	}
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				select {
				case out <- accepted[T]{err: err}:
				case <-quit:
				}
				return
			}
			wg.Go(func() {
				c.SetDeadline(deadline(handshakeTimeout))
				v, err := handshake(c)
				if err != nil {
					refused(c.RemoteAddr(), err)
				}
				c.SetDeadline(deadline(0))
				select {
				case out <- accepted[T]{c, v, err}:
				case <-quit:
					c.Close()
				}
			})
		}
	})
	stop := func() {
		ln.Close() // first: ends the accept loop
		close(quit)
		wg.Wait()
	}
	return out, stop
}

// writeHello answers the accepting rank's challenge on a mesh connection
// it dialed: helloMagic, the dialer's rank, and its proof of the secret.
func writeHello(c net.Conn, secret []byte, token string, rank int) error {
	nonce := make([]byte, nonceBytes)
	if _, err := io.ReadFull(c, nonce); err != nil {
		return fmt.Errorf("reading the challenge: %w", err)
	}
	b := make([]byte, 0, len(helloMagic)+4+sha256Size)
	b = append(b, helloMagic...)
	b = binary.LittleEndian.AppendUint32(b, uint32(rank))
	b = append(b, meshMAC(secret, token, nonce, rank)...)
	_, err := c.Write(b)
	return err
}

// readHello challenges the dialer of an accepted mesh connection, reads
// exactly its hello, nothing after it, and returns the dialer's rank.
func readHello(c net.Conn, secret []byte, token string) (int, error) {
	nonce := newNonce()
	if _, err := c.Write(nonce); err != nil {
		return 0, err
	}
	b := make([]byte, len(helloMagic)+4+sha256Size)
	if _, err := io.ReadFull(c, b); err != nil {
		return 0, err
	}
	rank := int(binary.LittleEndian.Uint32(b[len(helloMagic):]))
	if string(b[:len(helloMagic)]) != helloMagic || !hmac.Equal(b[len(helloMagic)+4:], meshMAC(secret, token, nonce, rank)) {
		return 0, errors.New("not a member of this job")
	}
	return rank, nil
}

// dialRetry dials addr until it answers or ctx ends.
func dialRetry(ctx context.Context, addr string) (*net.TCPConn, error) {
	var d net.Dialer
	wait := 10 * time.Millisecond
	for {
		c, err := d.DialContext(ctx, "tcp", addr)
		if err == nil {
			if dl, ok := ctx.Deadline(); ok {
				c.SetDeadline(dl)
			}
			return c.(*net.TCPConn), nil
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("%w (last attempt: %v)", context.Cause(ctx), err)
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("%w (last attempt: %v)", context.Cause(ctx), err)
		case <-t.C:
		}
		wait = min(2*wait, 500*time.Millisecond)
	}
}

// tune sets the mesh connections' socket options: no Nagle delay (frames
// are written whole), and large buffers.
func tune(c *net.TCPConn) {
	c.SetNoDelay(true)
	if socketBuffer > 0 {
		c.SetReadBuffer(socketBuffer)
		c.SetWriteBuffer(socketBuffer)
	}
}

// ctxErr returns ctx's error, which explains err, if ctx has ended.
func ctxErr(ctx context.Context, err error) error {
	if cerr := context.Cause(ctx); cerr != nil {
		return fmt.Errorf("%w (%v)", cerr, err)
	}
	if errors.Is(err, os.ErrDeadlineExceeded) {
		// A connection deadline set from ctx's deadline fired first.
		if dl, ok := ctx.Deadline(); ok && !time.Now().Before(dl.Add(-time.Millisecond)) {
			return fmt.Errorf("%w (%v)", context.DeadlineExceeded, err)
		}
	}
	return err
}

// writeMsg writes v as JSON after its 4-byte length.
func writeMsg(c net.Conn, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	_, err = c.Write(binary.LittleEndian.AppendUint32(nil, uint32(len(b))))
	if err == nil {
		_, err = c.Write(b)
	}
	return err
}

// readMsg reads a message of writeMsg into v; a message longer than
// limit bytes is an error, read no further.
func readMsg(c net.Conn, v any, limit int) error {
	var n [4]byte
	if _, err := io.ReadFull(c, n[:]); err != nil {
		return err
	}
	size := binary.LittleEndian.Uint32(n[:])
	if int64(size) > int64(limit) {
		return fmt.Errorf("message of %d bytes (at most %d)", size, limit)
	}
	b := make([]byte, size)
	if _, err := io.ReadFull(c, b); err != nil {
		return err
	}
	return json.Unmarshal(b, v)
}
