// Package launch starts and supervises the worker processes of one node.
//
// Run starts one process per Worker, relays each line of their output with a
// "[rank] " prefix, and waits for all of them. The job fails as a whole: when
// one worker exits non-zero or is killed, or the caller's context is
// cancelled, Run stops every other worker (SIGTERM to its process group, then
// SIGKILL after a grace period) and reports the first failure.
//
// Each worker runs in its own process group, so that signalling the group
// also reaches the processes the worker started itself. On Linux a worker
// also receives SIGKILL when the launcher dies, so that no worker outlives a
// launcher killed with SIGKILL; processes the worker started in turn are not
// covered by that and should arrange the same for themselves.
//
// The package needs a Unix system.
package launch

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/gptui/gptui/comm"
)

// DefaultInterruptGrace is how long workers have, after an interrupt, to
// save their checkpoint and exit before they are killed.
const DefaultInterruptGrace = 120 * time.Second

// TailLines is the number of output lines Run keeps of each worker.
const TailLines = 20

// maxLine is the longest line Run relays in one piece; longer lines are
// split at this length.
const maxLine = 64 << 10

// drainTimeout bounds how long Run waits, after a worker and its process
// group are gone, for its output pipes to reach end of file. They stay open
// only if a process the worker started left its process group.
const drainTimeout = time.Second

// Worker is one process to start.
type Worker struct {
	Rank      int      // global rank: prefixes its output and names it in errors
	LocalRank int      // rank on this node
	Args      []string // arguments, after the executable's name
	Env       []string // KEY=value entries added to (and overriding) os.Environ()
	LogPath   string   // if set, the worker's output is also written, unprefixed, to this file
}

// Options configure Run.
type Options struct {
	// Exe is the program every worker runs; empty means os.Executable().
	Exe string
	// Workers are the processes to start, one per entry.
	Workers []Worker
	// Stdout and Stderr receive the workers' standard output and error
	// lines, each prefixed "[rank] ". Whole lines are written in one Write
	// call, one at a time, so Stdout and Stderr may be the same writer.
	// Lines longer than 64 KiB are split. Nil discards the lines.
	Stdout, Stderr io.Writer
	// Show reports whether a rank's lines are written to Stdout and Stderr;
	// nil shows every rank. The lines of hidden ranks still go to their
	// LogPath and Result.Tail.
	Show func(rank int) bool
	// Grace is how long a worker has between SIGTERM and SIGKILL when the
	// job is stopped for a failure or ctx's end; zero means 5 seconds.
	Grace time.Duration
	// Interrupt, when closed, stops the job for an interrupt: SIGTERM to
	// every worker (a 'gptui train' worker then saves its finished steps
	// and exits), and SIGKILL only after InterruptGrace. Ending ctx during
	// that grace kills the workers at once. Nil never interrupts.
	Interrupt <-chan struct{}
	// InterruptGrace is how long the workers have to save and exit after
	// an interrupt; zero means DefaultInterruptGrace.
	InterruptGrace time.Duration

	// OnStart, if set, is called once a worker's process has started, with
	// its pid (which is also its process group id).
	OnStart func(w Worker, pid int)
	// OnLine, if set, is called with each line of every worker's standard
	// output (stderr false) and error (stderr true), shown or not, without
	// its newline. line is only valid during the call.
	OnLine func(rank int, stderr bool, line []byte)
	// OnExit, if set, is called when a worker has exited and its output
	// has been read, with the Result that Run will return for it; a
	// worker that could not be started gets no call.
	//
	// The callbacks are called from Run's goroutines, possibly at the same
	// time for different workers, and all calls have returned when Run
	// returns. A callback that blocks holds up that worker's output (and
	// so, eventually, the worker) or Run's return.
	OnExit func(r Result)
	// Finished, if set, is asked about a worker that exited with a
	// non-zero status of its own (not a signal, and not while the job was
	// being stopped), after OnExit: true means the worker finished its work
	// all the same and failed only afterwards (a 'gptui train' whose log
	// files failed after its last step says so before it exits). Its exit
	// then neither stops the other workers nor fails the job.
	Finished func(r Result) bool
}

// Result is how one worker ended.
type Result struct {
	Rank     int
	ExitCode int      // the exit status, or -1 if it was killed by a signal or did not run
	Signal   string   // the signal that killed it, such as "SIGKILL"; empty if it exited
	Err      error    // why the worker could not be started or waited for, if so
	Tail     []string // its last TailLines lines of output, stdout and stderr together
	// Stopped reports that Run signalled the worker (the job's stop after
	// another worker failed, a cancellation or an interrupt) while it was
	// still running: it was ended by the stop, whatever its exit status.
	Stopped bool
}

// JobError reports a job that did not succeed: the first worker that failed,
// or the cancellation that stopped the job.
type JobError struct {
	Rank      int      // the first rank that failed; -1 if Cancelled
	Code      int      // its exit status, or -1 if it was killed by a signal
	Signal    string   // the signal that killed it, such as "SIGSEGV"
	Tail      []string // its last TailLines lines of output
	Cancelled bool     // the context was cancelled before any worker failed

	cause error // the context's error when Cancelled
}

func (e *JobError) Error() string {
	switch {
	case e.Cancelled:
		return fmt.Sprintf("launch: job stopped: %v", e.cause)
	case e.Signal != "":
		return fmt.Sprintf("launch: rank %d was killed by %s", e.Rank, e.Signal)
	}
	return fmt.Sprintf("launch: rank %d exited with code %d", e.Rank, e.Code)
}

// Unwrap returns the context's error (context.Canceled or
// context.DeadlineExceeded) when the job was cancelled, and nil otherwise.
func (e *JobError) Unwrap() error { return e.cause }

// Env returns the environment that tells a worker its place in the job,
// under the names torchrun uses: RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR
// and MASTER_PORT; and the job's secret (comm.SecretEnv), with which the
// ranks prove to each other that they belong to the job. Make the secret
// with comm.NewSecret, one for each start of a job, and print the
// environment through Redact.
func Env(rank, localRank, world int, masterAddr string, masterPort int, secret string) []string {
	return []string{
		"RANK=" + strconv.Itoa(rank),
		"WORLD_SIZE=" + strconv.Itoa(world),
		"LOCAL_RANK=" + strconv.Itoa(localRank),
		"MASTER_ADDR=" + masterAddr,
		"MASTER_PORT=" + strconv.Itoa(masterPort),
		comm.SecretEnv + "=" + secret,
	}
}

// Redact returns a copy of env with the job's secret hidden, for printing.
func Redact(env []string) []string {
	out := slices.Clone(env)
	for i, kv := range out {
		if strings.HasPrefix(kv, comm.SecretEnv+"=") {
			out[i] = comm.SecretEnv + "=(hidden)"
		}
	}
	return out
}

// FreePort returns a TCP port that was free on host ("" for every
// interface) when FreePort returned. Another process may take it before the
// caller's workers bind it.
func FreePort(host string) (int, error) {
	l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return 0, fmt.Errorf("launch: free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// Run starts every worker, relays its output and waits for all of them. It
// returns one Result per worker, in the order of opt.Workers.
//
// If opt.Interrupt is closed, Run sends SIGTERM to every worker and SIGKILL
// after opt.InterruptGrace (at once if ctx ends meanwhile), and returns a
// Cancelled *JobError that wraps context.Canceled.
//
// If a worker exits non-zero or is killed while the job runs, or ctx is
// cancelled, Run sends SIGTERM to the process group of every worker still
// running, SIGKILL after opt.Grace, and waits for them; the error is then a
// *JobError naming the first worker that failed, or marking the job
// Cancelled. When a worker exits, whatever remains of its process group is
// killed. Run returns nil only if every worker exited with status 0. If a
// worker cannot be started, Run stops the others and returns that error.
func Run(ctx context.Context, opt Options) ([]Result, error) {
	if len(opt.Workers) == 0 {
		return nil, errors.New("launch: no workers")
	}
	if opt.Exe == "" {
		exe, err := os.Executable()
		if err != nil {
			return nil, fmt.Errorf("launch: %w", err)
		}
		opt.Exe = exe
	}
	if opt.Grace <= 0 {
		opt.Grace = 5 * time.Second
	}
	if opt.InterruptGrace <= 0 {
		opt.InterruptGrace = DefaultInterruptGrace
	}
	out := &output{stdout: opt.Stdout, stderr: opt.Stderr}
	if out.stdout == nil {
		out.stdout = io.Discard
	}
	if out.stderr == nil {
		out.stderr = io.Discard
	}

	var (
		procs     = make([]*proc, len(opt.Workers))
		exited    = make(chan *proc, len(opt.Workers))
		running   int
		startErr  error       // why a worker could not be started
		first     *proc       // the first worker that failed
		cancelled error       // ctx.Err(), if cancellation stopped the job
		killTimer *time.Timer // set once the job is being stopped
		killC     <-chan time.Time
		done      = ctx.Done()
		interrupt = opt.Interrupt
		graceful  bool // the stop in progress is an interrupt's
	)
	for i, w := range opt.Workers {
		p := &proc{w: w, res: Result{Rank: w.Rank, ExitCode: -1}}
		procs[i] = p
		if startErr == nil && cancelled == nil {
			cancelled = ctx.Err()
		}
		if startErr != nil || cancelled != nil {
			p.res.Err = errNotStarted
			continue
		}
		show := opt.Show == nil || opt.Show(w.Rank)
		if err := p.start(opt.Exe, out, show, opt.OnLine); err != nil {
			startErr = fmt.Errorf("launch: starting rank %d: %w", w.Rank, err)
			p.res.Err = err
			continue
		}
		running++
		if opt.OnStart != nil {
			opt.OnStart(w, p.cmd.Process.Pid)
		}
		go p.wait(exited, opt.OnExit)
	}

	stop := func(grace time.Duration) {
		if killTimer != nil {
			return
		}
		for _, p := range procs {
			p.signal(syscall.SIGTERM)
		}
		killTimer = time.NewTimer(grace)
		killC = killTimer.C
	}
	kill := func() {
		killC = nil
		for _, p := range procs {
			p.signal(syscall.SIGKILL)
		}
	}
	if startErr != nil || cancelled != nil {
		stop(opt.Grace)
	}
	for running > 0 {
		select {
		case p := <-exited:
			running--
			if !p.ok() && killTimer == nil && !p.finished(opt.Finished) {
				first = p
				stop(opt.Grace)
			}
		case <-interrupt:
			interrupt = nil
			if killTimer == nil {
				cancelled, graceful = context.Canceled, true
				stop(opt.InterruptGrace)
			}
		case <-done:
			done = nil
			switch {
			case killTimer == nil:
				cancelled = ctx.Err()
				stop(opt.Grace)
			case graceful:
				kill() // a second interrupt
			}
		case <-killC:
			kill()
		}
	}
	if killTimer != nil {
		killTimer.Stop()
	}

	results := make([]Result, len(procs))
	for i, p := range procs {
		results[i] = p.res
	}
	switch {
	case startErr != nil:
		return results, startErr
	case first != nil:
		r := first.res
		return results, &JobError{Rank: r.Rank, Code: r.ExitCode, Signal: r.Signal, Tail: r.Tail}
	case cancelled != nil:
		return results, &JobError{Rank: -1, Code: -1, Cancelled: true, cause: cancelled}
	}
	return results, nil
}

// errNotStarted is the Result.Err of a worker Run did not start because the
// job had already failed or been cancelled.
var errNotStarted = errors.New("launch: not started")

// output serialises the lines of all workers.
type output struct {
	mu             sync.Mutex
	stdout, stderr io.Writer
	buf            []byte
}

// line writes "[rank] text\n" to w in one call.
func (o *output) line(w io.Writer, rank int, text []byte) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.buf = append(o.buf[:0], '[')
	o.buf = strconv.AppendInt(o.buf, int64(rank), 10)
	o.buf = append(o.buf, "] "...)
	o.buf = append(o.buf, text...)
	o.buf = append(o.buf, '\n')
	w.Write(o.buf) // a failing terminal must not stop the job
}

// proc is one started worker.
type proc struct {
	w   Worker
	cmd *exec.Cmd
	res Result // owned by wait until it sends on exited

	mu      sync.Mutex // guards exited and serialises log writes and tail
	exited  bool       // the process has been reaped: its pid may be reused
	stopped bool       // signal reached the worker before it was reaped
	log     *os.File
	scratch []byte   // a line and its newline, for log
	tail    []string // ring of the last TailLines lines
	next    int      // where the next line goes in tail, once it is full

	pipes   []*os.File // read ends of stdout and stderr
	readers sync.WaitGroup
}

// start starts the worker and the goroutines that relay its output.
func (p *proc) start(exe string, out *output, show bool, onLine func(int, bool, []byte)) (err error) {
	if p.w.LogPath != "" {
		if err := os.MkdirAll(filepath.Dir(p.w.LogPath), 0o755); err != nil {
			return err
		}
		if p.log, err = os.Create(p.w.LogPath); err != nil {
			return err
		}
	}
	var writeEnds []*os.File
	defer func() {
		for _, f := range writeEnds {
			f.Close() // the worker holds its own copies
		}
		if err != nil {
			for _, f := range p.pipes {
				f.Close()
			}
			if p.log != nil {
				p.log.Close()
			}
		}
	}()
	for range 2 {
		r, w, err := os.Pipe()
		if err != nil {
			return err
		}
		p.pipes = append(p.pipes, r)
		writeEnds = append(writeEnds, w)
	}
	cmd := exec.Command(exe, p.w.Args...)
	cmd.Env = append(os.Environ(), p.w.Env...)
	cmd.Stdout, cmd.Stderr = writeEnds[0], writeEnds[1]
	cmd.SysProcAttr = sysProcAttr()
	if err := cmd.Start(); err != nil {
		return err
	}
	p.cmd = cmd
	dest := []io.Writer{out.stdout, out.stderr}
	for i, r := range p.pipes {
		p.readers.Add(1)
		go func() {
			defer p.readers.Done()
			scanLines(r, func(line []byte) {
				p.record(line)
				if onLine != nil {
					onLine(p.w.Rank, i == 1, line)
				}
				if show {
					out.line(dest[i], p.w.Rank, line)
				}
			})
		}()
	}
	return nil
}

// record adds a line to the worker's log file and tail.
func (p *proc) record(line []byte) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.log != nil {
		// line aliases the reader's buffer: appending to it in place
		// would overwrite unread output.
		p.scratch = append(append(p.scratch[:0], line...), '\n')
		p.log.Write(p.scratch)
	}
	if len(p.tail) < TailLines {
		p.tail = append(p.tail, string(line))
		return
	}
	p.tail[p.next] = string(line)
	p.next = (p.next + 1) % TailLines
}

// wait waits for the worker, kills what is left of its process group,
// collects its output, calls onExit (if not nil) and sends p on exited.
func (p *proc) wait(exited chan<- *proc, onExit func(Result)) {
	err := p.cmd.Wait()
	p.mu.Lock()
	// Kill what is left of the worker's process group. The group's id is
	// the worker's pid, which was reaped only just now: no other process
	// can have been given it since.
	syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	p.exited = true
	p.res.Stopped = p.stopped
	p.mu.Unlock()

	drained := make(chan struct{})
	go func() { p.readers.Wait(); close(drained) }()
	select {
	case <-drained:
	case <-time.After(drainTimeout):
		for _, f := range p.pipes {
			f.Close() // unblocks the readers
		}
		<-drained
	}
	for _, f := range p.pipes {
		f.Close()
	}

	p.mu.Lock()
	if p.log != nil {
		if cerr := p.log.Close(); cerr != nil && err == nil {
			p.res.Err = fmt.Errorf("log: %w", cerr)
		}
	}
	p.res.Tail = make([]string, 0, len(p.tail))
	p.res.Tail = append(p.res.Tail, p.tail[p.next:]...)
	p.res.Tail = append(p.res.Tail, p.tail[:p.next]...)
	p.mu.Unlock()

	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		p.res.ExitCode = ee.ExitCode()
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			p.res.Signal = signalName(ws.Signal())
		}
	case err != nil:
		p.res.Err = err
	default:
		p.res.ExitCode = 0
	}
	if onExit != nil {
		onExit(p.res)
	}
	exited <- p
}

// ok reports whether the worker succeeded; it is called after wait.
func (p *proc) ok() bool { return p.res.ExitCode == 0 && p.res.Err == nil }

// finished reports whether a worker that exited non-zero of its own
// accord finished its work all the same, as finished (Options.Finished,
// which may be nil) says; it is called after wait.
func (p *proc) finished(finished func(Result) bool) bool {
	r := p.res
	return finished != nil && r.ExitCode > 0 && r.Signal == "" && r.Err == nil && !r.Stopped && finished(r)
}

// signal sends sig to the worker's process group unless the worker has been
// reaped.
func (p *proc) signal(sig syscall.Signal) {
	if p.cmd == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.exited {
		p.stopped = true
		syscall.Kill(-p.cmd.Process.Pid, sig)
	}
}

// scanLines calls emit with each line read from r, without its "\n" or
// "\r\n". Lines longer than maxLine are passed on in pieces; a last line
// without "\n" is passed on too. The slice is only valid during the call.
func scanLines(r io.Reader, emit func([]byte)) {
	br := bufio.NewReaderSize(r, maxLine)
	for {
		line, err := br.ReadSlice('\n')
		if len(line) > 0 {
			line = bytes.TrimSuffix(line, []byte("\n"))
			if err == nil {
				line = bytes.TrimSuffix(line, []byte("\r"))
			}
			emit(line)
		}
		if err != nil && err != bufio.ErrBufferFull {
			return
		}
	}
}

// signalName names sig the way kill -l does, with a "SIG" prefix.
func signalName(sig syscall.Signal) string {
	switch sig {
	case syscall.SIGHUP:
		return "SIGHUP"
	case syscall.SIGINT:
		return "SIGINT"
	case syscall.SIGQUIT:
		return "SIGQUIT"
	case syscall.SIGILL:
		return "SIGILL"
	case syscall.SIGTRAP:
		return "SIGTRAP"
	case syscall.SIGABRT:
		return "SIGABRT"
	case syscall.SIGBUS:
		return "SIGBUS"
	case syscall.SIGFPE:
		return "SIGFPE"
	case syscall.SIGKILL:
		return "SIGKILL"
	case syscall.SIGUSR1:
		return "SIGUSR1"
	case syscall.SIGSEGV:
		return "SIGSEGV"
	case syscall.SIGUSR2:
		return "SIGUSR2"
	case syscall.SIGPIPE:
		return "SIGPIPE"
	case syscall.SIGALRM:
		return "SIGALRM"
	case syscall.SIGTERM:
		return "SIGTERM"
	case syscall.SIGXCPU:
		return "SIGXCPU"
	case syscall.SIGXFSZ:
		return "SIGXFSZ"
	}
	return "signal " + strconv.Itoa(int(sig))
}
