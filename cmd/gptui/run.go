package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"strconv"
	"strings"

	"github.com/gptui/gptui/launch"
)

// masterAddr is where the workers of a local job meet.
const masterAddr = "127.0.0.1"

// cmdRun implements 'gptui run': it trains with --nproc worker processes on
// this machine, each one 'gptui train' with the same -c and -o and its rank
// in RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT.
func cmdRun(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("run: %w", err)
	}
	return runJob(ctx, []string{exe}, args, stdout, stderr)
}

// runJob is cmdRun with the command line that runs gptui given: self[0] is
// the program and self[1:] go before the 'train' arguments.
func runJob(ctx context.Context, self, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("run", stderr)
	c, o := configFlags(fs)
	noTUI := fs.Bool("no-tui", false, "print the workers' output lines instead of the interactive UI (required for now)")
	nproc := fs.Int("nproc", 1, "number of worker processes to start on this machine")
	show := fs.String("show-ranks", "0", "whose output to print: 'all' or a comma-separated list of ranks")
	port := fs.Int("master-port", 0, "MASTER_PORT for the workers; 0 picks a free port")
	if err := parse(fs, args); err != nil {
		return err
	}
	if !*noTUI {
		return usagef("run: the interactive UI is not built yet; pass --no-tui")
	}
	if *nproc < 1 {
		return usagef("run: --nproc %d: need at least one worker", *nproc)
	}
	if *port < 0 || *port > 65535 {
		return usagef("run: --master-port %d is not a TCP port", *port)
	}
	showRank, err := parseRanks(*show, *nproc)
	if err != nil {
		return err
	}
	// Check the config here, once, rather than in every worker.
	if _, err := loadConfig(*c, *o); err != nil {
		return err
	}
	if *port == 0 {
		if *port, err = launch.FreePort(masterAddr); err != nil {
			return err
		}
	}

	train := []string{"train", "-c", *c}
	for _, kv := range *o {
		train = append(train, "-o", kv)
	}
	// The workers share this machine's cores: each gets its share for its
	// GEMM and kernels, unless the user chose (GPTUI_THREADS).
	var threads []string
	if os.Getenv("GPTUI_THREADS") == "" {
		threads = []string{fmt.Sprintf("GPTUI_THREADS=%d", max(1, runtime.NumCPU() / *nproc))}
	}
	workers := make([]launch.Worker, *nproc)
	for r := range workers {
		workers[r] = launch.Worker{
			Rank:      r,
			LocalRank: r,
			Args:      append(append([]string(nil), self[1:]...), train...),
			Env:       append(launch.Env(r, r, *nproc, masterAddr, *port), threads...),
		}
	}
	_, err = launch.Run(ctx, launch.Options{
		Exe:     self[0],
		Workers: workers,
		Stdout:  stdout,
		Stderr:  stderr,
		Show:    showRank,
	})
	var je *launch.JobError
	if !errors.As(err, &je) || je.Cancelled {
		return err
	}
	how := fmt.Sprintf("exited with code %d", je.Code)
	if je.Signal != "" {
		how = "was killed by " + je.Signal
	}
	if len(je.Tail) == 0 {
		fmt.Fprintf(stderr, "gptui run: rank %d %s without printing anything\n", je.Rank, how)
	} else {
		fmt.Fprintf(stderr, "gptui run: rank %d %s; its last lines:\n", je.Rank, how)
	}
	for _, line := range je.Tail {
		fmt.Fprintf(stderr, "[%d] %s\n", je.Rank, line)
	}
	if je.Code == 2 {
		// 'gptui train' exits 2 for bad input: so does the job.
		return usageError{err}
	}
	return err
}

// parseRanks parses --show-ranks: "all" (nil: every rank) or a
// comma-separated list of ranks below nproc.
func parseRanks(s string, nproc int) (func(int) bool, error) {
	if s == "all" {
		return nil, nil
	}
	show := make([]bool, nproc)
	for _, f := range strings.Split(s, ",") {
		r, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || r < 0 || r >= nproc {
			return nil, usagef("run: --show-ranks %q: want 'all' or ranks from 0 to %d separated by commas", s, nproc-1)
		}
		show[r] = true
	}
	return func(r int) bool { return r >= 0 && r < nproc && show[r] }, nil
}
