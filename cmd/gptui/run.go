package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/gptui/gptui/cluster"
	"github.com/gptui/gptui/comm"
	"github.com/gptui/gptui/event"
	"github.com/gptui/gptui/launch"
	"github.com/gptui/gptui/ranktable"
	"github.com/gptui/gptui/sshexec"
)

// masterAddr is where the workers of a local job meet.
const masterAddr = "127.0.0.1"

// cmdRun implements 'gptui run': it trains with --nproc worker processes on
// this machine, each one 'gptui train' with the same -c and -o and its rank
// in RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT; or, with
// --hosts, on the nodes of an inventory over SSH (package cluster).
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
	preset := fs.String("preset", "", "a preset `NAME` (the same as -c NAME)")
	noTUI := fs.Bool("no-tui", false, "print the workers' output lines instead of the interactive UI (required for now)")
	nproc := fs.Int("nproc", 1, "number of worker processes to start on this machine")
	show := fs.String("show-ranks", "0", "whose output to print: 'all' or a comma-separated list of ranks")
	port := fs.Int("master-port", 0, "MASTER_PORT for the workers; 0 picks a free port")
	resume := fs.Bool("resume", false, "resume from the newest checkpoint of Engine.save_load.output_dir (the same as -o Engine.save_load.ckpt_dir=auto); with --hosts, nodes without it get a copy first")
	var cf clusterFlags
	fs.StringVar(&cf.hosts, "hosts", "", "run on the nodes of the inventory `FILE` over SSH (one node per line: [user@]host[:port] devices=0-7 ...)")
	fs.StringVar(&cf.rankTable, "rank-table", "", "with --hosts: take ranks and devices from the rank table `FILE` instead of the inventory and probes")
	fs.BoolVar(&cf.acceptNew, "accept-new-host-keys", false, "with --hosts: accept and record the host keys of nodes that ~/.ssh/known_hosts does not know")
	fs.BoolVar(&cf.dryRun, "dry-run", false, "with --hosts: set the nodes up (connect, push, probe), print the rank table and each node's commands, and start nothing")
	fs.DurationVar(&cf.summaryEvery, "summary-every", 10*time.Second, "with --hosts: how often to print the summary line")
	fs.DurationVar(&cf.agentTimeout, "agent-timeout", cluster.DefaultAgentTimeout, "with --hosts: a node whose agent sends nothing (not even its heartbeat, every second) for this long is lost")
	fs.DurationVar(&cf.hangTimeout, "hang-timeout", cluster.DefaultHangTimeout, "with --hosts: the job is hung when a worker sends no progress report (every second) for this long, or ranks wait this long in one collective; the stuck rank is named and the job stopped (or restarted)")
	fs.IntVar(&cf.keepJobs, "keep-jobs", cluster.DefaultKeepJobs, "with --hosts: after a successful job, each node keeps the newest `K` jobs/<id> directories (this job's included; -1 keeps all)")
	fs.IntVar(&cf.restarts.Max, "max-restarts", 0, "with --hosts: restart the job from its newest checkpoint up to `N` times after a worker fails, a node is lost or the job hangs")
	fs.IntVar(&cf.restarts.MinNodes, "min-nodes", 0, "with --hosts: at a restart, leave out nodes that stay unreachable and re-plan for those left, down to `K` nodes (default: every node)")
	fs.IntVar(&cf.restarts.MaxNodes, "max-nodes", 0, "with --hosts: use at most the first `K` nodes of the inventory (default: all)")
	if err := parse(fs, args); err != nil {
		return err
	}
	if *resume {
		*o = append(*o, "Engine.save_load.ckpt_dir=auto")
	}
	if *preset != "" {
		if *c != "" && *c != *preset {
			return usagef("run: -c %s and --preset %s: give one", *c, *preset)
		}
		*c = *preset
	}
	if !*noTUI {
		return usagef("run: pass --no-tui to run headless; the interactive UI is `gptui --hosts FILE --preset NAME` (no command)")
	}
	if cf.hosts != "" {
		set := map[string]bool{}
		fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
		for _, name := range []string{"nproc", "master-port"} {
			if set[name] {
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
		cf.show, cf.set = *show, set
		return runCluster(ctx, cf, *c, *o, stdout, stderr)
	}
	if cf.rankTable != "" || cf.acceptNew || cf.dryRun || cf.keepJobs != cluster.DefaultKeepJobs || cf.agentTimeout != cluster.DefaultAgentTimeout || cf.hangTimeout != cluster.DefaultHangTimeout || cf.restarts != (cluster.Restarts{}) {
		return usagef("run: --rank-table, --accept-new-host-keys, --dry-run, --keep-jobs, --agent-timeout, --hang-timeout, --max-restarts, --min-nodes and --max-nodes need --hosts FILE")
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
	secret, err := comm.NewSecret()
	if err != nil {
		return err
	}
	workers := make([]launch.Worker, *nproc)
	for r := range workers {
		workers[r] = launch.Worker{
			Rank:      r,
			LocalRank: r,
			Args:      append(append([]string(nil), self[1:]...), train...),
			Env:       append(launch.Env(r, r, *nproc, masterAddr, *port, secret), threads...),
		}
	}
	// An interrupt reaches the workers as SIGTERM, on which they save and
	// exit; a second one kills them.
	var interrupt <-chan struct{}
	if hard := hardContext(ctx); hard != ctx {
		interrupt, ctx = ctx.Done(), hard
	}
	_, err = launch.Run(ctx, launch.Options{
		Exe:       self[0],
		Workers:   workers,
		Stdout:    stdout,
		Stderr:    stderr,
		Show:      showRank,
		Interrupt: interrupt,
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

// clusterFlags are the flags of a job on an inventory's nodes.
type clusterFlags struct {
	hosts, rankTable string
	acceptNew        bool
	dryRun           bool
	show             string
	summaryEvery     time.Duration
	keepJobs         int
	agentTimeout     time.Duration
	hangTimeout      time.Duration
	restarts         cluster.Restarts
	set              map[string]bool // the flags given
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

// runCluster runs 'gptui run --hosts FILE': it plans the job on the nodes,
// then (unless --dry-run) runs it, printing its events.
func runCluster(ctx context.Context, cf clusterFlags, c string, o []string, stdout, stderr io.Writer) error {
	show, err := parseRankList(cf.show)
	if err != nil {
		return err
	}
	if cf.summaryEvery <= 0 {
		return usagef("run: --summary-every %v: want a positive duration", cf.summaryEvery)
	}
	cfg, err := loadConfig(c, o)
	if err != nil {
		return err
	}
	for _, n := range cfg.Notes {
		fmt.Fprintf(stdout, "[config] %s\n", n)
	}
	nodes, err := sshexec.LoadInventory(cf.hosts)
	if err != nil {
		return usageError{fmt.Errorf("run: %w", err)}
	}
	if err := cf.checkRestarts(len(nodes)); err != nil {
		return usageError{fmt.Errorf("run: %w", err)}
	}
	opts := cluster.Options{
		Nodes:        nodes,
		Hosts:        cf.hosts,
		Config:       cfg,
		SSH:          sshexec.ClientConfig{AcceptNewHostKeys: cf.acceptNew},
		KeepJobs:     cf.keepJobs,
		AgentTimeout: cf.agentTimeout,
		HangTimeout:  cf.hangTimeout,
	}
	if cf.rankTable != "" {
		t, err := ranktable.Read(cf.rankTable)
		if err != nil {
			return usageError{fmt.Errorf("run: %w", err)}
		}
		opts.RankTable, opts.RankTableFile = t, cf.rankTable
	}

	start := time.Now()
	job := cluster.NewSupervisor(opts, cf.restarts)
	pr := &printer{out: stdout, show: show, every: cf.summaryEvery, start: start}
	printed := make(chan struct{})
	go func() {
		defer close(printed)
		pr.consume(job.Events())
	}()
	plan, err := job.Plan(ctx)
	if err != nil {
		job.Close()
		<-printed
		var ie *cluster.InputError
		if errors.As(err, &ie) {
			return usageError{fmt.Errorf("run: %w", err)}
		}
		return fmt.Errorf("run: %w", err)
	}
	for r := range show {
		if r >= plan.World {
			job.Close()
			<-printed
			return usagef("run: --show-ranks %q: the job has ranks 0 to %d", cf.show, plan.World-1)
		}
	}
	if cf.dryRun {
		job.Close()
		<-printed
		return printPlan(stdout, plan)
	}
	// An interrupt (ctx) reaches the workers, which save and exit; a
	// second one (hard) kills them.
	if hard := hardContext(ctx); hard != ctx {
		defer context.AfterFunc(hard, job.Stop)()
	}
	if err := job.Start(ctx); err != nil {
		job.Wait()
		<-printed
		return fmt.Errorf("run: %w", err)
	}
	err = job.Wait()
	<-printed
	pr.final(err)
	var f *cluster.Failure
	if errors.As(err, &f) {
		prefix := "[" + f.Node + "]"
		switch {
		case f.Lost:
			fmt.Fprintf(stderr, "gptui run: node %s was lost: %s\n", f.Node, f.Msg)
		case len(f.Tail) == 0:
			fmt.Fprintf(stderr, "gptui run: %s without printing anything\n", f.Error())
		default:
			fmt.Fprintf(stderr, "gptui run: %s; its last lines:\n", f.Error())
			prefix = fmt.Sprintf("[%s/%d]", f.Node, f.Rank)
		}
		for _, line := range f.Tail {
			fmt.Fprintf(stderr, "%s %s\n", prefix, line)
		}
		if f.Code == 2 {
			// 'gptui train' exits 2 for bad input: so does the job.
			return usageError{f}
		}
		return f
	}
	return err
}

// parseRankList parses --show-ranks for a job whose size is not known
// yet: nil for "all", else the set of ranks.
func parseRankList(s string) (map[int]bool, error) {
	if s == "all" {
		return nil, nil
	}
	set := map[int]bool{}
	for _, f := range strings.Split(s, ",") {
		r, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || r < 0 {
			return nil, usagef("run: --show-ranks %q: want 'all' or ranks separated by commas", s)
		}
		set[r] = true
	}
	return set, nil
}

// printPlan prints what --dry-run shows: the rank table, and each node's
// agent command and workers.
func printPlan(w io.Writer, p *cluster.Plan) error {
	if _, err := p.Table.WriteTo(w); err != nil {
		return err
	}
	fmt.Fprintf(w, "# job %s: %d ranks, MASTER_ADDR=%s MASTER_PORT=%d\n", p.JobID, p.World, p.MasterAddr, p.MasterPort)
	for _, n := range p.Nodes {
		fmt.Fprintf(w, "[%s] %s: %s\n", n.Name, n.Addr, n.Command)
		for _, wk := range n.Spec.Workers {
			dev := "cpu"
			if wk.Device >= 0 {
				dev = "device " + strconv.Itoa(wk.Device)
			}
			exe := "./gptui"
			if n.Spec.Exe != "" {
				exe = n.Spec.Exe
			}
			fmt.Fprintf(w, "[%s/%d] %s: %s %s %s\n", n.Name, wk.Rank, dev, strings.Join(launch.Redact(wk.Env), " "), exe, strings.Join(wk.Args, " "))
		}
	}
	return nil
}

// printer is the headless front end: it prints a job's events as lines.
type printer struct {
	out   io.Writer
	show  map[int]bool // nil: every rank
	every time.Duration
	start time.Time

	last    map[int]*event.Metrics // rank -> newest training metrics
	nodeOf  map[int]string
	changed bool
	done    doneLine // from rank 0's [done] lines
}

// doneLine is what 'gptui train' prints at its end.
type doneLine struct {
	steps      int
	finalLoss  string
	tokensPerS string
	checkpoint string
}

func (p *printer) shown(rank int) bool { return p.show == nil || p.show[rank] }

func (p *printer) printf(format string, args ...any) {
	fmt.Fprintf(p.out, format+"\n", args...)
}

// consume prints events until the channel is closed, and a summary line
// every p.every while metrics come in.
func (p *printer) consume(events <-chan event.Event) {
	p.last, p.nodeOf = map[int]*event.Metrics{}, map[int]string{}
	t := time.NewTicker(p.every)
	defer t.Stop()
	for {
		select {
		case e, ok := <-events:
			if !ok {
				return
			}
			p.event(e)
		case <-t.C:
			if p.changed {
				p.summary()
				p.changed = false
			}
		}
	}
}

func (p *printer) event(e event.Event) {
	switch e.Kind {
	case event.KindNode:
		msg := e.Message
		if msg != "" {
			msg = ": " + msg
		}
		p.printf("[%s] %s%s", e.Node, e.State, msg)
	case event.KindLog:
		p.nodeOf[e.Rank] = e.Node
		if e.Rank == 0 {
			p.parseDone(e.Line)
		}
		if p.shown(e.Rank) {
			p.printf("[%s/%d] %s", e.Node, e.Rank, e.Line)
		}
	case event.KindMetrics:
		if e.Metrics != nil && e.Metrics.EvalLoss == 0 {
			p.last[e.Rank] = e.Metrics
			p.nodeOf[e.Rank] = e.Node
			p.changed = true
		}
	case event.KindWorker:
		switch {
		case e.State == event.WorkerFailed && e.Signal != "":
			p.printf("[%s/%d] killed by %s", e.Node, e.Rank, e.Signal)
		case e.State == event.WorkerFailed:
			p.printf("[%s/%d] exited with code %d", e.Node, e.Rank, e.Code)
		}
	case event.KindJob:
		switch e.State {
		case event.JobRestarting:
			p.printf("[restart] %s", e.Message)
			return
		case event.JobReplanned:
			p.printf("[elastic] %s", e.Message)
			return
		case event.JobHung:
			p.printf("[hang] %s", e.Message)
			return
		}
		msg := e.Message
		if msg != "" {
			msg = ": " + msg
		}
		p.printf("[job] %s%s", e.State, msg)
	}
}

// parseDone picks the figures out of rank 0's "[done] steps: N first loss:
// A final loss: B median step: S s ips: T tokens/s ..." and "[done]
// checkpoint: DIR" lines.
func (p *printer) parseDone(line string) {
	rest, ok := strings.CutPrefix(line, "[done] ")
	if !ok {
		return
	}
	if dir, ok := strings.CutPrefix(rest, "checkpoint: "); ok {
		p.done.checkpoint = dir
		return
	}
	f := strings.Fields(rest)
	for i := 0; i+1 < len(f); i++ {
		switch {
		case f[i] == "steps:":
			p.done.steps, _ = strconv.Atoi(f[i+1])
		case f[i] == "final" && i+2 < len(f) && f[i+1] == "loss:":
			p.done.finalLoss = f[i+2]
		case f[i] == "ips:":
			p.done.tokensPerS = f[i+1]
		}
	}
}

// summary prints the periodic line: rank 0's step and loss, the job's
// tokens/s and the slowest rank.
func (p *printer) summary() {
	if len(p.last) == 0 {
		return
	}
	ranks := make([]int, 0, len(p.last))
	for r := range p.last {
		ranks = append(ranks, r)
	}
	sort.Ints(ranks)
	lead := p.last[ranks[0]]
	if m, ok := p.last[0]; ok {
		lead = m
	}
	slow := slices.MaxFunc(ranks, func(a, b int) int {
		ma, mb := p.last[a], p.last[b]
		return cmp.Or(cmp.Compare(mb.Step, ma.Step), cmp.Compare(ma.StepTimeS, mb.StepTimeS)) // behind is slower
	})
	sm := p.last[slow]
	p.printf("[summary] step %d loss %.4f tokens/s %.0f slowest rank %d (%s) step %d %.3f s/step elapsed %v",
		lead.Step, lead.Loss, lead.TokensPerS, slow, p.nodeOf[slow], sm.Step, sm.StepTimeS, time.Since(p.start).Round(time.Second))
}

// final prints the end-of-job summary.
func (p *printer) final(err error) {
	wall := time.Since(p.start).Round(time.Millisecond)
	if err != nil {
		p.printf("[summary] wall time %v", wall)
		return
	}
	d := p.done
	loss, tps := d.finalLoss, d.tokensPerS
	if m, ok := p.last[0]; ok {
		if loss == "" {
			loss = strconv.FormatFloat(m.Loss, 'f', 6, 64)
		}
		if tps == "" {
			tps = strconv.FormatFloat(m.TokensPerS, 'f', 0, 64)
		}
		if d.steps == 0 {
			d.steps = m.Step + 1
		}
	}
	ckpt := d.checkpoint
	if ckpt == "" {
		ckpt = "none"
	} else if n := p.nodeOf[0]; n != "" {
		// The path is on rank 0's node (relative to its workdir).
		ckpt = n + ":" + ckpt
	}
	p.printf("[summary] steps %d final loss %s tokens/s %s wall time %v checkpoint %s", d.steps, loss, tps, wall, ckpt)
}
