package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/gptui/gptui/cluster"
	"github.com/gptui/gptui/engine"
	"github.com/gptui/gptui/jobdir"
	"github.com/gptui/gptui/ranktable"
	"github.com/gptui/gptui/sshexec"
)

// specOf is the job spec (jobdir.Spec) of 'gptui run' with these flags,
// config and overrides.
func specOf(cf clusterFlags, c string, o []string) jobdir.Spec {
	s := jobdir.Spec{
		Config: c, Overrides: append([]string(nil), o...),
		RankTable: cf.rankTable, AcceptNewHostKeys: cf.acceptNew, MasterPort: cf.port, KeepJobs: cf.keepJobs,
		AgentTimeout: cf.agentTimeout, HangTimeout: cf.hangTimeout,
		MaxRestarts: cf.restarts.Max, MinNodes: cf.restarts.MinNodes, MaxNodes: cf.restarts.MaxNodes,
		ShowRanks: cf.show, SummaryEvery: cf.summaryEvery, NoStaging: cf.stageData == "never",
	}
	if cf.local() {
		s.Nproc = cf.nproc
	} else {
		s.Hosts = cf.hosts
	}
	return s
}

// flagsOf is the inverse of specOf: the flags, config and overrides of a
// job spec.
func flagsOf(s jobdir.Spec) (clusterFlags, string, []string) {
	cf := clusterFlags{
		hosts: s.Hosts, nodes: s.Nodes, continues: s.Continues, rankTable: s.RankTable, nproc: max(s.Nproc, 1), port: s.MasterPort,
		acceptNew: s.AcceptNewHostKeys, show: s.ShowRanks, summaryEvery: s.SummaryEvery,
		keepJobs: s.KeepJobs, agentTimeout: s.AgentTimeout, hangTimeout: s.HangTimeout,
		restarts: cluster.Restarts{Max: s.MaxRestarts, MinNodes: s.MinNodes, MaxNodes: s.MaxNodes},
	}
	if s.NoStaging {
		cf.stageData = "never"
	}
	if cf.show == "" {
		cf.show = "0"
	}
	if cf.summaryEvery <= 0 {
		cf.summaryEvery = 10 * time.Second
	}
	if cf.keepJobs == 0 {
		cf.keepJobs = cluster.DefaultKeepJobs
	}
	o := append([]string(nil), s.Overrides...)
	if s.Resume {
		o = append(o, "Engine.save_load.ckpt_dir=auto")
	}
	return cf, s.Config, o
}

// checkJob checks what a job of 'gptui run' would refuse at once, before
// anything is written: the config, the inventory, the restart policy,
// --show-ranks and the rank table. Its errors are usage errors.
func checkJob(cf clusterFlags, c string, o []string) error {
	cfg, err := loadConfig(c, o)
	if err != nil {
		return err
	}
	world := -1 // not known before the nodes are probed
	if cf.local() {
		world = cf.nproc
	} else {
		nodes, err := sshexec.LoadInventory(cf.hosts)
		if err != nil {
			return usageError{fmt.Errorf("run: %w", err)}
		}
		if err := cf.checkRestarts(len(nodes)); err != nil {
			return usageError{fmt.Errorf("run: %w", err)}
		}
		world = inventoryWorld(nodes, cf.nodes)
	}
	if _, err := rankSet(cf.show, world); err != nil {
		return err
	}
	if cf.rankTable != "" {
		t, err := ranktable.Read(cf.rankTable)
		if err != nil {
			return usageError{fmt.Errorf("run: %w", err)}
		}
		world = t.RankSize()
	}
	// The degrees against the ranks: what every worker would refuse at
	// its start, refused here before a worker (or a detached supervisor)
	// is started. Distributed.auto chooses the degrees for the world.
	if world > 0 && !cfg.Distributed.Auto {
		if _, err := engine.StartupMemory(cfg, 0, world); err != nil {
			return usageError{fmt.Errorf("run: %w", err)}
		}
	}
	return nil
}

// inventoryWorld is the number of workers the inventory's nodes (those
// named in only, or all) run when every one of them gives its devices, or
// -1 when one leaves them to its probe.
func inventoryWorld(nodes []sshexec.Node, only []string) int {
	world := 0
	for _, n := range nodes {
		if len(only) > 0 && !slices.Contains(only, n.Name) {
			continue
		}
		if n.Devices.Count() == 0 {
			return -1
		}
		world += n.Devices.Count()
	}
	return world
}

// newJobDir makes the folder of a new job of 'gptui run' in the current
// directory (jobs/<id>/) and returns it as read back.
func newJobDir(cf clusterFlags, c string, o []string) (*jobdir.Job, error) {
	wd, err := os.Getwd()
	if err != nil {
		return nil, err
	}
	spec := specOf(cf, c, o)
	spec.ID, spec.Dir = jobdir.NewID(), wd
	dir, err := jobdir.Create(wd, spec)
	if err != nil {
		return nil, err
	}
	return jobdir.Read(dir)
}

// detachRun starts the job of 'gptui run --detach': it checks what a run
// in the foreground would refuse at once (checkJob), makes the job's
// folder, starts its supervisor detached from this terminal, prints the
// job's id and returns.
func detachRun(cf clusterFlags, c string, o []string, stdout, stderr io.Writer) error {
	if err := checkJob(cf, c, o); err != nil {
		return err
	}
	j, err := newJobDir(cf, c, o)
	if err != nil {
		return fmt.Errorf("run: %w", err)
	}
	sup, err := jobdir.Launch(j.Dir, "")
	if err != nil {
		return fmt.Errorf("run: %w", err)
	}
	fmt.Fprintln(stdout, j.ID)
	fmt.Fprintf(stderr, "gptui: job %s runs detached (its supervisor: pid %d); 'gptui attach %s' shows it, 'gptui stop %s' stops it; its output: %s\n",
		j.ID, sup.PID, j.ID, j.ID, filepath.Join(jobdir.Path(".", j.ID), jobdir.OutputFile))
	return nil
}
