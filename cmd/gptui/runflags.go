package main

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gptui/gptui/cluster"
)

// clusterFlags are the flags of a job: on an inventory's nodes (hosts)
// or, without hosts, on this machine (nproc workers).
type clusterFlags struct {
	hosts, rankTable string
	nodes            []string // the inventory's nodes to run on (a detached job's spec); none: every node
	continues        string   // the failed job a detached job's spec resumes in its place (cluster.Options.Continues)
	nproc, port      int
	acceptNew        bool
	dryRun           bool
	show             string
	summaryEvery     time.Duration
	keepJobs         int
	agentTimeout     time.Duration
	hangTimeout      time.Duration
	restarts         cluster.Restarts
	binaries         binaryFlags     // --binary: cluster.Options.Binaries
	stageData        string          // --stage-data: missing (or ""), never
	set              map[string]bool // the flags given
}

// binaryFlags are --binary GOOS/GOARCH=PATH, repeated: the gptui
// executable pushed to the nodes of each platform in place of this one
// (cluster.Options.Binaries), by absolute path.
type binaryFlags map[string]string

func (b binaryFlags) String() string {
	var kv []string
	for k, v := range b {
		kv = append(kv, k+"="+v)
	}
	slices.Sort(kv)
	return strings.Join(kv, ",")
}

// Set takes one GOOS/GOARCH=PATH; the file must exist (package cluster
// checks, before any node is set up, that it is built for the platform).
func (b binaryFlags) Set(s string) error {
	plat, file, ok := strings.Cut(s, "=")
	goos, arch, ok2 := strings.Cut(plat, "/")
	if !ok || !ok2 || goos == "" || arch == "" || strings.Contains(arch, "/") || file == "" {
		return fmt.Errorf("%q: want GOOS/GOARCH=PATH, such as linux/arm64=gptui-arm64 (built with GOOS=linux GOARCH=arm64 CGO_ENABLED=0 go build -o gptui-arm64 ./cmd/gptui)", s)
	}
	if prev, ok := b[plat]; ok {
		return fmt.Errorf("%q: %s already has %s", s, plat, prev)
	}
	abs, err := filepath.Abs(file)
	if err != nil {
		return err
	}
	if _, err := os.Stat(abs); err != nil {
		return fmt.Errorf("%s: %w", plat, err)
	}
	b[plat] = abs
	return nil
}

// local reports whether the job is this machine alone.
func (cf clusterFlags) local() bool { return cf.hosts == "" }

// check checks the flags that need no file but --show-ranks (runCluster
// parses it); its error is a usageError.
func (cf clusterFlags) check() error {
	if cf.local() {
		// --max-restarts restarts a local job as it does one on SSH
		// nodes (and as the UI's Job screen does); the nodes' bounds have
		// only this machine to bound.
		if cf.rankTable != "" || cf.acceptNew || cf.dryRun || cf.keepJobs != cluster.DefaultKeepJobs || cf.agentTimeout != cluster.DefaultAgentTimeout || cf.hangTimeout != cluster.DefaultHangTimeout || cf.set["min-nodes"] || cf.set["max-nodes"] || len(cf.binaries) > 0 {
			return usagef("run: --rank-table, --accept-new-host-keys, --dry-run, --keep-jobs, --agent-timeout, --hang-timeout, --min-nodes, --max-nodes and --binary need --hosts FILE")
		}
		if cf.restarts.Max < 0 {
			return usagef("--max-restarts %d: want 0 (never restart) or more", cf.restarts.Max)
		}
		if cf.set["stage-data"] {
			return usagef("run: --stage-data needs --hosts FILE (this machine's workers read its own files)")
		}
		if cf.nproc < 1 {
			return usagef("run: --nproc %d: need at least one worker", cf.nproc)
		}
		if cf.port < 0 || cf.port > 65535 {
			return usagef("run: --master-port %d is not a TCP port", cf.port)
		}
		return nil
	}
	for _, name := range []string{"nproc", "master-port"} {
		if cf.set[name] {
			return usagef("run: --%s is for a local job; with --hosts the inventory says where the workers run", name)
		}
	}
	if cf.agentTimeout < 2*time.Second {
		return usagef("run: --agent-timeout %v: want at least 2s (agents send a heartbeat every second)", cf.agentTimeout)
	}
	if cf.hangTimeout < 2*time.Second {
		return usagef("run: --hang-timeout %v: want at least 2s (workers report their progress every second)", cf.hangTimeout)
	}
	if cf.keepJobs < -1 || cf.keepJobs == 0 {
		return usagef("run: --keep-jobs %d: keep at least 1 job directory, or -1 for all", cf.keepJobs)
	}
	if cf.summaryEvery <= 0 {
		return usagef("run: --summary-every %v: want a positive duration", cf.summaryEvery)
	}
	if cf.stageData != "" && cf.stageData != "missing" && cf.stageData != "never" {
		return usagef("run: --stage-data %q: want missing (copy what a node lacks from this machine) or never", cf.stageData)
	}
	return nil
}

// parseRanks parses --show-ranks: "all" (nil: every rank) or a
// comma-separated list of ranks below nproc.
func parseRanks(s string, nproc int) (func(int) bool, error) {
	set, err := rankSet(s, nproc)
	if set == nil {
		return nil, err
	}
	return func(r int) bool { return set[r] }, nil
}

// rankSet parses --show-ranks: nil for "all", else the set of ranks. With
// world ≥ 0 (the job's size, when known) a rank of world or more is an
// error too; the error is a usageError.
func rankSet(s string, world int) (map[int]bool, error) {
	if s == "all" {
		return nil, nil
	}
	want := "ranks separated by commas"
	if world >= 0 {
		want = fmt.Sprintf("ranks from 0 to %d separated by commas", world-1)
	}
	set := map[int]bool{}
	for _, f := range strings.Split(s, ",") {
		r, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || r < 0 || (world >= 0 && r >= world) {
			return nil, usagef("run: --show-ranks %q: want 'all' or %s", s, want)
		}
		set[r] = true
	}
	return set, nil
}

// checkRestarts checks --max-restarts, --min-nodes and --max-nodes against
// an inventory of n nodes; its error is a usageError.
func (cf clusterFlags) checkRestarts(n int) error {
	r := cf.restarts
	switch {
	case r.Max < 0:
		return usagef("--max-restarts %d: want 0 (never restart) or more", r.Max)
	case cf.set["min-nodes"] && (r.MinNodes < 1 || r.MinNodes > n):
		return usagef("--min-nodes %d: want 1 to %d, the nodes of %s", r.MinNodes, n, cf.hosts)
	case cf.set["max-nodes"] && (r.MaxNodes < 1 || r.MaxNodes > n):
		return usagef("--max-nodes %d: want 1 to %d, the nodes of %s", r.MaxNodes, n, cf.hosts)
	case cf.set["min-nodes"] && cf.set["max-nodes"] && r.MaxNodes < r.MinNodes:
		return usagef("--max-nodes %d is below --min-nodes %d", r.MaxNodes, r.MinNodes)
	case cf.rankTable != "" && (cf.set["min-nodes"] || cf.set["max-nodes"]):
		return usagef("--min-nodes and --max-nodes do not go with --rank-table, which fixes the nodes")
	}
	return nil
}
