package agent

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gptui/gptui/event"
	"github.com/gptui/gptui/kernels/cuda"
	"github.com/gptui/gptui/units"
)

// The pre-flight (`gptui agent --preflight`, hidden) checks a node before
// any worker of a job starts there: that it reaches the master's
// rendezvous port and the ports its peers' workers will listen on, which
// interface it reaches the master through, and the limits that break
// jobs late (/dev/shm, ulimit -l and -n, the disk the checkpoints go to,
// the CUDA libraries against the driver). The launcher (package cluster)
// runs it on every node of the job at once, so that they can meet,
// speaking JSON lines over the agent's standard streams:
//
//  1. launcher → agent: a PreflightSpec.
//  2. agent → launcher: a PreflightListening, once its listeners are open:
//     on the master node MASTER_ADDR:MASTER_PORT, as rank 0 listens; on
//     every node a port the kernel picks in its ephemeral range
//     (net.ipv4.ip_local_port_range) on the address it reaches the master
//     from, as each worker's mesh listener does (package comm).
//  3. launcher → agent: PreflightTargets, once every node listens: the
//     master's port and each peer's.
//  4. agent → launcher: one event of kind preflight (event.Preflight),
//     after it has dialled every target (PreflightDialTimeout each, all
//     at once) and made its local checks.
//  5. launcher → agent: the end of standard input, once every node has
//     reported: the agent closes its listeners, which its peers may still
//     dial until then, and exits.
//
// Each listener answers a connection with the line "gptui-preflight
// NODE", so that a dial that reaches another machine (a wrong route, a
// NAT) is not taken for the node's.

// PreflightDialTimeout bounds each connection of a pre-flight, and the
// wait for the answering node's line on it.
const PreflightDialTimeout = 2 * time.Second

// ShmMin is the /dev/shm a GPU node should have: NCCL puts its
// intra-node buffers there, and a container's default 64 MiB fails it.
const ShmMin = 1 << 30

// preflightHello starts the line a pre-flight listener answers with.
const preflightHello = "gptui-preflight "

// PreflightSpec is what the launcher asks of a node's pre-flight: the
// first line on the agent's standard input.
type PreflightSpec struct {
	// Node is the node's name in the job, which its listeners answer
	// with.
	Node string `json:"node"`
	// MasterAddr and MasterPort are the job's MASTER_ADDR and
	// MASTER_PORT. An empty MasterAddr leaves the network out: a job on
	// the launcher's machine alone, whose workers meet over loopback.
	MasterAddr string `json:"master_addr,omitempty"`
	MasterPort int    `json:"master_port"`
	// Master: rank 0 runs on this node, which listens on
	// MasterAddr:MasterPort.
	Master bool `json:"master,omitempty"`
	// GPU: the node's workers use GPUs; /dev/shm, ulimit -l and the CUDA
	// libraries are checked. NCCL: the job's GPU workers are more than
	// one, so libnccl is needed too.
	GPU  bool `json:"gpu,omitempty"`
	NCCL bool `json:"nccl,omitempty"`
	// World is the job's number of ranks: the connections each worker
	// opens, against ulimit -n.
	World int `json:"world"`
	// CkptDir is where the node's checkpoints go (the config's
	// Engine.save_load.output_dir), relative to the working directory
	// unless absolute; DiskNeed the bytes they need there, and DiskWhy
	// how that was counted, in words.
	CkptDir  string `json:"ckpt_dir,omitempty"`
	DiskNeed int64  `json:"disk_need,omitempty"`
	DiskWhy  string `json:"disk_why,omitempty"`
}

// PreflightListening is the node's answer once it listens.
type PreflightListening struct {
	// Iface is the interface the node reaches the master through, Addr
	// its address there; IfaceErr says why neither is known.
	Iface    string `json:"iface,omitempty"`
	Addr     string `json:"addr,omitempty"`
	IfaceErr string `json:"iface_err,omitempty"`
	// Port is the port of the node's listener in its ephemeral range,
	// Range that range; ListenErr says why there is none.
	Port      int    `json:"port,omitempty"`
	Range     [2]int `json:"range"`
	ListenErr string `json:"listen_err,omitempty"`
	// MasterErr, on the master node, says why it cannot listen on
	// MASTER_ADDR:MASTER_PORT.
	MasterErr string `json:"master_err,omitempty"`
	// Time is the node's clock when it answered.
	Time time.Time `json:"time"`
}

// PreflightTargets are the ports a node dials: the launcher's second
// line.
type PreflightTargets struct {
	Targets []PreflightTarget `json:"targets"`
}

// PreflightTarget is one port a node dials.
type PreflightTarget struct {
	Node string `json:"node"` // the node that listens there
	Addr string `json:"addr"` // host:port
	// Master: the master's rendezvous port (MASTER_ADDR:MASTER_PORT),
	// else a port of the peer's ephemeral range, Range.
	Master bool   `json:"master,omitempty"`
	Range  [2]int `json:"range"`
}

// RunPreflight runs a node's pre-flight: it reads the spec and then the
// targets from in, writes its listening line and then its report (an
// event of kind preflight) to out, and returns at the end of in. The end
// of ctx, or of in before the targets, ends it early with an error.
func RunPreflight(ctx context.Context, in io.Reader, out io.Writer) error {
	r := bufio.NewReader(in)
	var spec PreflightSpec
	if err := readLine(r, &spec); err != nil {
		return fmt.Errorf("agent: preflight spec: %w", err)
	}
	var l PreflightListening
	l.Range = ephemeralRange()
	network := spec.MasterAddr != ""
	if !network {
		// A job on the launcher's machine alone: its workers meet over
		// loopback.
	} else if ip, iface, err := RouteTo(spec.MasterAddr, spec.MasterPort); err != nil {
		l.IfaceErr = err.Error()
	} else {
		l.Iface, l.Addr = iface, ip.String()
	}

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var lns []net.Listener
	defer func() {
		for _, ln := range lns {
			ln.Close()
		}
	}()
	var lc net.ListenConfig
	if spec.Master && network {
		ln, err := lc.Listen(ctx, "tcp", net.JoinHostPort(spec.MasterAddr, strconv.Itoa(spec.MasterPort)))
		if err != nil {
			l.MasterErr = err.Error()
		} else {
			lns = append(lns, ln)
		}
	}
	if l.Addr != "" {
		// As a worker's mesh listener: the address toward the master, a
		// port the kernel picks.
		ln, err := lc.Listen(ctx, "tcp", net.JoinHostPort(l.Addr, "0"))
		if err != nil {
			l.ListenErr = err.Error()
		} else {
			lns = append(lns, ln)
			l.Port = ln.Addr().(*net.TCPAddr).Port
		}
	}
	for _, ln := range lns {
		go answer(ln, spec.Node)
	}
	// The local checks run while the launcher gathers every node's
	// ports.
	var local []event.Check
	checked := make(chan struct{})
	go func() {
		defer close(checked)
		local = localChecks(&spec)
	}()

	l.Time = time.Now()
	if err := writeLine(out, l); err != nil {
		return fmt.Errorf("agent: preflight: %w", err)
	}
	var tg PreflightTargets
	if err := readLine(r, &tg); err != nil {
		return fmt.Errorf("agent: preflight targets: %w", err)
	}
	reached := dialTargets(ctx, spec.Node, tg.Targets)
	<-checked

	p := &event.Preflight{Iface: l.Iface, Addr: l.Addr}
	for _, k := range []string{"NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"} {
		if v, ok := os.LookupEnv(k); ok {
			p.NodeEnv = append(p.NodeEnv, k+"="+v)
		}
	}
	if network {
		ic := ifaceCheck(&spec, &l)
		if len(p.NodeEnv) > 0 && ic.Status == event.PreflightOK {
			ic.Value += " (the node sets " + strings.Join(p.NodeEnv, " ") + ")"
		}
		p.Checks = append(p.Checks, ic)
	}
	if c, ok := masterListenCheck(&spec, &l); ok {
		p.Checks = append(p.Checks, c)
	}
	if l.ListenErr != "" {
		p.Checks = append(p.Checks, event.Check{Name: event.CheckPeer, Status: event.PreflightFailed, Peer: spec.Node,
			Message: fmt.Sprintf("%s cannot listen on %s, as its workers will: %s", spec.Node, l.Addr, l.ListenErr),
			Fix:     "see what holds the node's ports (ss -ltn)"})
	}
	p.Checks = append(p.Checks, reached...)
	p.Checks = append(p.Checks, local...)
	e := event.New(event.KindPreflight)
	e.Node, e.Preflight, e.State = spec.Node, p, p.Status()
	if err := event.NewWriter(out).Write(e); err != nil {
		return err
	}
	// The listeners stay open for the peers still dialling them, until
	// the launcher, which has every report, closes standard input.
	done := make(chan struct{})
	go func() {
		io.Copy(io.Discard, r)
		close(done)
	}()
	select {
	case <-done:
	case <-ctx.Done():
	}
	return nil
}

// readLine reads one JSON line of r into v.
func readLine(r *bufio.Reader, v any) error {
	line, err := r.ReadBytes('\n')
	if len(line) == 0 && err != nil {
		if errors.Is(err, io.EOF) {
			return io.ErrUnexpectedEOF
		}
		return err
	}
	return json.Unmarshal(line, v)
}

// writeLine writes v as one JSON line.
func writeLine(w io.Writer, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	_, err = w.Write(append(b, '\n'))
	return err
}

// answer accepts ln's connections until it is closed, answering each
// with the node's line.
func answer(ln net.Listener, node string) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			c.SetWriteDeadline(time.Now().Add(PreflightDialTimeout))
			io.WriteString(c, preflightHello+node+"\n")
			c.Close()
		}()
	}
}

// RouteTo returns the local address this machine reaches host:port from
// (a UDP "connect", which sends nothing) and the name of the interface
// that holds it.
func RouteTo(host string, port int) (net.IP, string, error) {
	c, err := net.Dial("udp", net.JoinHostPort(host, strconv.Itoa(port)))
	if err != nil {
		return nil, "", fmt.Errorf("no route to %s: %w", host, err)
	}
	ip := c.LocalAddr().(*net.UDPAddr).IP
	c.Close()
	ifs, err := net.Interfaces()
	if err != nil {
		return ip, "", err
	}
	for _, ifc := range ifs {
		addrs, err := ifc.Addrs()
		if err != nil {
			continue
		}
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok && n.IP.Equal(ip) {
				return ip, ifc.Name, nil
			}
		}
	}
	return ip, "", fmt.Errorf("no interface holds %s, the address toward %s", ip, host)
}

// ephemeralRange is the kernel's range of ports for a listener on port 0,
// net.ipv4.ip_local_port_range; Linux's default where it cannot be read.
func ephemeralRange() [2]int {
	r := [2]int{32768, 60999}
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return r
	}
	f := strings.Fields(string(b))
	if len(f) == 2 {
		lo, err1 := strconv.Atoi(f[0])
		hi, err2 := strconv.Atoi(f[1])
		if err1 == nil && err2 == nil {
			r = [2]int{lo, hi}
		}
	}
	return r
}

// ifaceCheck is the check of the interface toward the master.
func ifaceCheck(spec *PreflightSpec, l *PreflightListening) event.Check {
	c := event.Check{Name: event.CheckIface}
	if l.IfaceErr != "" {
		c.Status = event.PreflightFailed
		c.Message = fmt.Sprintf("%s cannot reach MASTER_ADDR %s: %s", spec.Node, spec.MasterAddr, l.IfaceErr)
		c.Fix = "give the node a route to the master's address (ip route)"
		return c
	}
	c.Status, c.Value = event.PreflightOK, l.Iface+" "+l.Addr
	return c
}

// masterListenCheck is, on the master node, the check that it listens on
// MASTER_ADDR:MASTER_PORT; ok is false on the others.
func masterListenCheck(spec *PreflightSpec, l *PreflightListening) (event.Check, bool) {
	if !spec.Master || l.MasterErr == "" {
		return event.Check{}, false
	}
	return event.Check{Name: event.CheckMaster, Status: event.PreflightFailed, Peer: spec.Node, Port: spec.MasterPort,
		Message: fmt.Sprintf("%s, the master, cannot listen on MASTER_PORT %d: %s", spec.Node, spec.MasterPort, l.MasterErr),
		Fix:     fmt.Sprintf("stop what holds port %d on %s (ss -ltnp), or let the launcher pick a free one", spec.MasterPort, spec.Node)}, true
}

// dialTargets dials every target at once (at most 64 at a time), each
// within PreflightDialTimeout, and returns the checks: one per target
// that failed, the master's whether it failed or not, and one for the
// peers reached.
func dialTargets(ctx context.Context, self string, ts []PreflightTarget) []event.Check {
	res := make([]event.Check, len(ts))
	sem := make(chan struct{}, 64)
	var wg sync.WaitGroup
	for i, t := range ts {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			res[i] = dialTarget(ctx, self, t)
		}()
	}
	wg.Wait()
	var out []event.Check
	peers := 0
	for _, c := range res {
		if c.Name == event.CheckPeer && c.Status == event.PreflightOK {
			peers++
			continue
		}
		out = append(out, c)
	}
	if peers > 0 {
		out = append(out, event.Check{Name: event.CheckPeer, Status: event.PreflightOK, Have: int64(peers),
			Value: fmt.Sprintf("%d %s reached in their ephemeral ranges", peers, units.Plural(peers, "peer"))})
	}
	return out
}

// dialTarget dials one target and reads its answer.
func dialTarget(ctx context.Context, self string, t PreflightTarget) event.Check {
	c := event.Check{Name: event.CheckPeer, Peer: t.Node}
	if t.Master {
		c.Name = event.CheckMaster
	}
	_, port, _ := net.SplitHostPort(t.Addr)
	c.Port, _ = strconv.Atoi(port)
	start := time.Now()
	err := reach(ctx, t)
	if err == nil {
		c.Status = event.PreflightOK
		c.Value = fmt.Sprintf("%s reached in %v", t.Addr, time.Since(start).Round(10*time.Microsecond))
		return c
	}
	c.Status = event.PreflightFailed
	if t.Master {
		c.Message = fmt.Sprintf("%s cannot reach the master %s at MASTER_ADDR:MASTER_PORT %s: %v", self, t.Node, t.Addr, err)
		c.Fix = fmt.Sprintf("open TCP port %d on %s to %s (nft, iptables, firewalld, a security group)", c.Port, t.Node, self)
		return c
	}
	c.Message = fmt.Sprintf("%s cannot reach %s at %s, a port of the range its workers listen in: %v", self, t.Node, t.Addr, err)
	c.Fix = fmt.Sprintf("open TCP ports %d-%d on %s to the job's nodes: the workers (and NCCL) listen on ports the kernel picks in that range (net.ipv4.ip_local_port_range)",
		t.Range[0], t.Range[1], t.Node)
	return c
}

// reach dials t and reads its answer line, which must name t's node.
func reach(ctx context.Context, t PreflightTarget) error {
	ctx, cancel := context.WithTimeout(ctx, PreflightDialTimeout)
	defer cancel()
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", t.Addr)
	if err != nil {
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return fmt.Errorf("no answer within %v (packets dropped)", PreflightDialTimeout)
		}
		return errors.Unwrap(errors.Unwrap(err)) // "connection refused", not the dial's wrapping
	}
	defer conn.Close()
	dl, _ := ctx.Deadline()
	conn.SetReadDeadline(dl)
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		return fmt.Errorf("connected, but the node's pre-flight did not answer: %w", err)
	}
	got := strings.TrimSpace(strings.TrimPrefix(line, preflightHello))
	if !strings.HasPrefix(line, preflightHello) || got != t.Node {
		return fmt.Errorf("reached %q there instead of %s's pre-flight (a wrong address, or a NAT)", strings.TrimSpace(line), t.Node)
	}
	return nil
}

// localChecks are the node's own checks: its limits, disk and CUDA.
func localChecks(spec *PreflightSpec) []event.Check {
	var cs []event.Check
	if spec.GPU {
		cs = append(cs, shmCheck(), memlockCheck())
	}
	cs = append(cs, nofileCheck(spec.World))
	if spec.CkptDir != "" && spec.DiskNeed > 0 {
		cs = append(cs, diskCheck(spec))
	}
	if spec.GPU {
		cs = append(cs, cudaCheck(spec.NCCL))
	}
	return cs
}

// shmCheck checks the size of /dev/shm against ShmMin.
func shmCheck() event.Check {
	c := event.Check{Name: event.CheckShm, Need: ShmMin}
	size, _, err := diskSpace("/dev/shm")
	fix := "give the node a larger /dev/shm: mount -o remount,size=8G /dev/shm, or in a container docker run --shm-size=8g (Kubernetes: an emptyDir of medium Memory on /dev/shm)"
	switch {
	case err != nil:
		c.Status, c.Value = event.PreflightWarning, "none"
		c.Message = fmt.Sprintf("no /dev/shm (%v): NCCL keeps its buffers between the node's GPUs there", err)
		c.Fix = fix
	case size < ShmMin:
		c.Status, c.Have, c.Value = event.PreflightWarning, size, units.Bytes(size)
		c.Message = fmt.Sprintf("/dev/shm is %s, below %s: NCCL keeps its buffers between the node's GPUs there and fails or hangs when it fills (a container's default is 64 MiB)", units.Bytes(size), units.Bytes(ShmMin))
		c.Fix = fix
	default:
		c.Status, c.Have, c.Value = event.PreflightOK, size, units.Bytes(size)
	}
	return c
}

// memlockCheck checks ulimit -l: NCCL over InfiniBand or RoCE registers
// (pins) its buffers, which a low limit refuses.
func memlockCheck() event.Check {
	c := event.Check{Name: event.CheckMemlock, Need: -1}
	cur, _, err := rlimit(rlimitMemlock)
	switch {
	case err != nil:
		c.Status, c.Value = event.PreflightOK, "unknown: "+err.Error()
	case cur < 0:
		c.Status, c.Have, c.Value = event.PreflightOK, -1, "unlimited"
	default:
		c.Status, c.Have, c.Value = event.PreflightWarning, cur, units.Bytes(cur)
		c.Message = fmt.Sprintf("ulimit -l (locked memory) is %s: NCCL over InfiniBand or RoCE pins its buffers and fails with a low limit", units.Bytes(cur))
		c.Fix = "make it unlimited for the user's SSH sessions: '* - memlock unlimited' in /etc/security/limits.conf (LimitMEMLOCK=infinity for sshd's unit, docker run --ulimit memlock=-1)"
	}
	return c
}

// nofileNeed is the open files a worker of a job of world ranks may
// need: a connection to each other rank, NCCL's sockets, its files.
func nofileNeed(world int) int64 { return max(1024, 256+8*int64(world)) }

// nofileCheck checks the hard limit of ulimit -n: the Go runtime raises
// a worker's soft limit to it.
func nofileCheck(world int) event.Check {
	c := event.Check{Name: event.CheckNofile, Need: nofileNeed(world)}
	_, hard, err := rlimit(rlimitNofile)
	switch {
	case err != nil:
		c.Status, c.Value = event.PreflightOK, "unknown: "+err.Error()
	case hard >= 0 && hard < c.Need:
		c.Status, c.Have, c.Value = event.PreflightWarning, hard, strconv.FormatInt(hard, 10)
		c.Message = fmt.Sprintf("ulimit -Hn (open files) is %d, below the %d a worker of %d %s may open", hard, c.Need, world, units.Plural(world, "rank"))
		c.Fix = "raise it: '* - nofile 1048576' in /etc/security/limits.conf (LimitNOFILE for sshd's unit, docker run --ulimit nofile=1048576)"
	default:
		c.Status, c.Have, c.Value = event.PreflightOK, hard, strconv.FormatInt(hard, 10)
		if hard < 0 {
			c.Value = "unlimited"
		}
	}
	return c
}

// diskCheck checks the free space where the checkpoints go against
// spec.DiskNeed.
func diskCheck(spec *PreflightSpec) event.Check {
	c := event.Check{Name: event.CheckDisk, Need: spec.DiskNeed}
	dir := existing(spec.CkptDir)
	_, free, err := diskSpace(dir)
	if err != nil {
		c.Status, c.Value = event.PreflightWarning, "unknown"
		c.Message = fmt.Sprintf("the free space of %s (for %s) is unknown: %v", dir, spec.CkptDir, err)
		return c
	}
	c.Have, c.Value = free, units.Bytes(free)+" free in "+dir
	if free >= spec.DiskNeed {
		c.Status = event.PreflightOK
		return c
	}
	c.Status = event.PreflightFailed
	why := ""
	if spec.DiskWhy != "" {
		why = ": " + spec.DiskWhy
	}
	c.Message = fmt.Sprintf("%s has %s (%d bytes) free in %s, where the checkpoints go (%s), and they need %s (%d bytes)%s",
		spec.Node, units.Bytes(free), free, dir, spec.CkptDir, units.Bytes(spec.DiskNeed), spec.DiskNeed, why)
	c.Fix = fmt.Sprintf("free %s there, point Engine.save_load.output_dir to a larger disk, or lower Engine.save_load.keep_last", units.Bytes(spec.DiskNeed-free))
	return c
}

// existing returns dir, or its nearest parent that exists.
func existing(dir string) string {
	d, err := filepath.Abs(dir)
	if err != nil {
		d = filepath.Clean(dir)
	}
	for {
		if _, err := os.Stat(d); err == nil {
			return d
		}
		up := filepath.Dir(d)
		if up == d {
			return d
		}
		d = up
	}
}

// cudaCheck finds the CUDA libraries a GPU worker loads (package
// kernels/cuda's discovery, as the worker will) and checks each against
// the driver's CUDA version.
func cudaCheck(nccl bool) event.Check {
	c := event.Check{Name: event.CheckCUDA}
	drv, err := cuda.DriverVersion()
	if err != nil {
		c.Status, c.Value = event.PreflightFailed, "no driver"
		c.Message = err.Error() // it says what to install
		return c
	}
	env := cuda.SystemEnv()
	env.Driver = func() (int, error) { return drv, nil }
	libs := []cuda.Library{cuda.LibNVRTC, cuda.LibCUBLAS, cuda.LibCUBLASLt}
	if nccl {
		libs = append(libs, cuda.LibNCCL)
	}
	found := []string{fmt.Sprintf("driver CUDA %d.%d", drv/1000, drv%1000/10)}
	var bad []string
	for _, lib := range libs {
		ch, err := cuda.Choose(lib, env)
		if err != nil {
			bad = append(bad, err.Error())
			continue
		}
		found = append(found, filepath.Base(ch.Path))
	}
	c.Value = strings.Join(found, ", ")
	if len(bad) > 0 {
		c.Status = event.PreflightFailed
		c.Message = strings.Join(slices.Compact(bad), "; ")
		return c
	}
	c.Status = event.PreflightOK
	return c
}
