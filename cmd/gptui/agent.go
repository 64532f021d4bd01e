package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/gptui/gptui/agent"
	"github.com/gptui/gptui/engine/checkpoint"
	"github.com/gptui/gptui/event"
	"github.com/gptui/gptui/launch"
)

// cmdAgent implements 'gptui agent', the node side of a cluster job (see
// package agent and docs/runner.md). Its standard output is the event
// stream: nothing else may be printed there.
func cmdAgent(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	fs := newFlagSet("agent", stderr)
	probe := fs.Bool("probe", false, "print one probe event describing this machine (cores, memory, GPUs) and exit")
	specFile := fs.String("spec", "-", "the job spec `FILE` (one JSON line); - reads it from standard input")
	freePort := fs.String("free-port", "", "print a TCP port free on the local address `HOST` and exit")
	ckptSummary := fs.String("checkpoint-summary", "", "print the newest complete checkpoint of the output directory `DIR` as one JSON line and exit (launcher use)")
	ckptStep := fs.Int("step", -1, "with -checkpoint-summary: describe the checkpoint of step `N` if it loads, not the newest")
	ckptRun := fs.String("run", "", "with -checkpoint-summary: describe only the checkpoints of the training run `ID`")
	ckptInstall := fs.String("checkpoint-install", "", "verify the copied checkpoint `TMPDIR` and publish it in its output directory, then exit (launcher use)")
	ckptManifest := fs.String("manifest", "", "with -checkpoint-install: the `SHA256` the copy's manifest must have")
	keepLast := fs.Int("keep-last", 0, "with -checkpoint-install: keep the newest `N` checkpoints (0 keeps all)")
	preflight := fs.Bool("preflight", false, "check this node for the job described on standard input, meeting the other nodes' pre-flights, print one preflight event and exit (launcher use)")
	serveFiles := fs.Bool("serve-files", false, "serve files of this node to the job's other nodes over TCP, each to one connection presenting a token granted on standard input, until standard input ends (launcher use: relayed pushes)")
	lock := fs.Bool("lock", false, "take the lock of the working directory (the node's workdir) for the job read from standard input, answer, and hold it until standard input ends (launcher use)")
	if err := parse(fs, args); err != nil {
		return err
	}
	w := event.NewWriter(stdout)
	switch {
	case *probe:
		e := event.New(event.KindProbe)
		p := agent.Probe()
		e.Probe = &p
		return w.Write(e)
	case *preflight:
		return agent.RunPreflight(ctx, stdin, stdout)
	case *freePort != "":
		port, err := launch.FreePort(*freePort)
		if err != nil {
			return err
		}
		_, err = fmt.Fprintln(stdout, port)
		return err
	case *ckptSummary != "":
		return printCheckpointSummary(stdout, *ckptSummary, *ckptStep, *ckptRun)
	case *ckptInstall != "":
		_, err := checkpoint.Install(filepath.Dir(filepath.Clean(*ckptInstall)), *ckptInstall, *ckptManifest, *keepLast)
		return err
	case *serveFiles:
		return agent.ServeFiles(ctx, stdin, stdout)
	case *lock:
		// The lock is released at the end of standard input or at a
		// signal; a hang-up is one too.
		ctx, stop := signal.NotifyContext(ctx, syscall.SIGHUP)
		defer stop()
		signal.Ignore(syscall.SIGPIPE)
		defer signal.Reset(syscall.SIGPIPE)
		return agent.HoldLock(ctx, ".", stdin, stdout)
	}

	var spec *agent.Spec
	var err error
	if *specFile == "-" {
		spec, err = agent.ReadSpec(stdin)
	} else {
		var f *os.File
		if f, err = os.Open(*specFile); err != nil {
			return usageError{fmt.Errorf("agent: %w", err)}
		}
		spec, err = agent.ReadSpec(f)
		f.Close()
	}
	if err != nil {
		return usageError{err}
	}
	// A hang-up (the terminal or session is gone) stops the job as SIGINT
	// and SIGTERM do; a write to a closed stdout must fail, not kill the
	// agent before it has stopped its workers.
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGHUP)
	defer stop()
	signal.Ignore(syscall.SIGPIPE)
	defer signal.Reset(syscall.SIGPIPE)
	return agent.Run(ctx, spec, stdin, w)
}

// printCheckpointSummary prints the checkpoint.Describe of outputDir as
// one JSON line.
func printCheckpointSummary(stdout io.Writer, outputDir string, step int, run string) error {
	sum, err := checkpoint.DescribeRun(outputDir, step, run)
	if err != nil {
		return err
	}
	b, err := json.Marshal(sum)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(stdout, "%s\n", b)
	return err
}
