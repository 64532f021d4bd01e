package comm

import (
	"context"
	"crypto/rand"
	"encoding/binary"
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
const protocolVersion = "gptui-comm/1"

// helloMagic starts the first message on every mesh connection.
const helloMagic = "GPTUIHI1"

// socketBuffer is the send and receive buffer size asked of the kernel for
// mesh connections.
const socketBuffer = 4 << 20

// registration is what a rank tells the master.
type registration struct {
	Version   string `json:"version"`
	Rank      int    `json:"rank"`
	WorldSize int    `json:"world_size"`
	Addr      string `json:"addr"` // the rank's mesh listener
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
// it. The mesh connections have Nagle's algorithm off and 4 MiB socket
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
	ctx, cancelTimeout := context.WithTimeout(ctx, cfg.Timeout)
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
	reg := registration{Version: protocolVersion, Rank: cfg.Rank, WorldSize: cfg.WorldSize, Addr: self}
	if err := writeMsg(bc, reg); err != nil {
		return nil, nil, fmt.Errorf("%s: registering with the master at %s: %w", me, master, ctxErr(ctx, err))
	}
	var tab rankTable
	if err := readMsg(bc, &tab); err != nil {
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
	type arrival struct {
		c   net.Conn
		reg registration
		err error
	}
	arrivals := make(chan arrival)
	quit := make(chan struct{})
	var wg sync.WaitGroup
	defer wg.Wait()
	defer close(quit)
	defer ln.Close() // first: ends the accept loop
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				if dl, ok := ctx.Deadline(); ok {
					c.SetDeadline(dl)
				}
				var a arrival
				a.c, a.err = c, readMsg(c, &a.reg)
				select {
				case arrivals <- a:
				case <-quit:
					c.Close()
				}
			})
		}
	})
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
			if a.err != nil { // not a rank of ours
				a.c.Close()
				continue
			}
			refuse := ""
			switch r := a.reg; {
			case r.Version != protocolVersion:
				refuse = fmt.Sprintf("protocol %q, want %q", r.Version, protocolVersion)
			case r.WorldSize != cfg.WorldSize:
				refuse = fmt.Sprintf("rank %d says the world size is %d, rank 0 says %d", r.Rank, r.WorldSize, cfg.WorldSize)
			case r.Rank < 0 || r.Rank >= cfg.WorldSize:
				refuse = fmt.Sprintf("rank %d is outside [0, %d)", r.Rank, cfg.WorldSize)
			case conns[r.Rank] != nil:
				refuse = fmt.Sprintf("rank %d registered twice (from %s and %s)", r.Rank, addrs[r.Rank], r.Addr)
			}
			if refuse != "" {
				writeMsg(a.c, rankTable{Error: refuse})
				a.c.Close()
				continue
			}
			conns[a.reg.Rank], addrs[a.reg.Rank] = a.c, a.reg.Addr
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
		if err = writeHello(c, tab.Token, cfg.Rank); err != nil {
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
	type hello struct {
		c    *net.TCPConn
		rank int
		err  error
	}
	hellos := make(chan hello)
	quit := make(chan struct{})
	var wg sync.WaitGroup
	defer wg.Wait()
	defer close(quit)
	defer ln.Close() // first: ends the accept loop
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				select {
				case hellos <- hello{err: err}:
				case <-quit:
				}
				return
			}
			wg.Go(func() {
				if dl, ok := ctx.Deadline(); ok {
					c.SetDeadline(dl)
				}
				r, err := readHello(c, token)
				select {
				case hellos <- hello{c.(*net.TCPConn), r, err}:
				case <-quit:
					c.Close()
				}
			})
		}
	})
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
		case h.err != nil || h.rank <= cfg.Rank || h.rank >= cfg.WorldSize || conns[h.rank] != nil:
			h.c.Close()
		default:
			conns[h.rank] = h.c
			got++
		}
	}
	return nil
}

func writeHello(c net.Conn, token string, rank int) error {
	b := make([]byte, 0, len(helloMagic)+len(token)+4)
	b = append(b, helloMagic...)
	b = append(b, token...)
	b = binary.LittleEndian.AppendUint32(b, uint32(rank))
	_, err := c.Write(b)
	return err
}

// readHello reads exactly the hello, nothing after it, and returns the
// dialer's rank.
func readHello(c net.Conn, token string) (int, error) {
	b := make([]byte, len(helloMagic)+len(token)+4)
	if _, err := io.ReadFull(c, b); err != nil {
		return 0, err
	}
	if string(b[:len(helloMagic)]) != helloMagic || string(b[len(helloMagic):len(helloMagic)+len(token)]) != token {
		return 0, errors.New("not a member of this job")
	}
	return int(binary.LittleEndian.Uint32(b[len(b)-4:])), nil
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

// readMsg reads a message of writeMsg into v.
func readMsg(c net.Conn, v any) error {
	var n [4]byte
	if _, err := io.ReadFull(c, n[:]); err != nil {
		return err
	}
	size := binary.LittleEndian.Uint32(n[:])
	if size > 1<<20 {
		return fmt.Errorf("message of %d bytes", size)
	}
	b := make([]byte, size)
	if _, err := io.ReadFull(c, b); err != nil {
		return err
	}
	return json.Unmarshal(b, v)
}
