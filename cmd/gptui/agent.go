package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/gptui/gptui/agent"
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
	case *freePort != "":
		port, err := launch.FreePort(*freePort)
		if err != nil {
			return err
		}
		_, err = fmt.Fprintln(stdout, port)
		return err
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
