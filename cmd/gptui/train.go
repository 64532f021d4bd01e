package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/gptui/gptui"
	"github.com/gptui/gptui/agent"
	"github.com/gptui/gptui/comm"
	"github.com/gptui/gptui/engine"
	"github.com/gptui/gptui/engine/data"
	"github.com/gptui/gptui/event"
	"github.com/gptui/gptui/fence"
	"github.com/gptui/gptui/kernels/cuda"
	"github.com/gptui/gptui/planner"
	"github.com/gptui/gptui/presets"
)

// peerFailureWait is how long a worker that failed because another rank
// did waits before it exits (unless stopped first).
const peerFailureWait = 3 * time.Second

// configFlags registers -c and -o on fs.
func configFlags(fs *flag.FlagSet) (*string, *listFlag) {
	c := new(string)
	o := new(listFlag)
	fs.StringVar(c, "c", "", "config file or preset name (see 'gptui presets')")
	fs.Var(o, "o", "override Section.key=value (repeatable)")
	return c, o
}

func loadConfig(c string, o []string) (*presets.Config, error) {
	if c == "" {
		return nil, usagef("-c CONFIG|PRESET is required (presets: %v)", presets.Names())
	}
	return presets.Load(c, o)
}

func cmdConfig(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("config", stderr)
	c, o := configFlags(fs)
	if err := parse(fs, args); err != nil {
		return err
	}
	cfg, err := loadConfig(*c, *o)
	if err != nil {
		return err
	}
	_, err = stdout.Write(cfg.YAML())
	return err
}

func cmdPresets(stdout io.Writer) error {
	for _, n := range presets.Names() {
		fmt.Fprintf(stdout, "%-18s %s\n", n, presets.Describe(n))
	}
	return nil
}

func cmdTrain(ctx context.Context, args []string, stdout, stderr io.Writer) (err error) {
	defer func() {
		// The GPU backend panics with *cuda.AllocError when the engine's
		// buffers do not fit: that is the config's size, said in one line.
		if r := recover(); r != nil {
			ae, ok := r.(*cuda.AllocError)
			if !ok {
				panic(r)
			}
			err = usagef("%s; lower Global.micro_batch_size, set Engine.use_recompute=true, or see 'gptui plan'", oneLine(ae))
		}
	}()
	fs := newFlagSet("train", stderr)
	c, o := configFlags(fs)
	resume := fs.Bool("resume", false, "resume from the newest checkpoint in Engine.save_load.output_dir (same as -o Engine.save_load.ckpt_dir=auto)")
	force := fs.Bool("force", false, "train from step 0 even where Engine.save_load.output_dir holds another run's checkpoints (the same as -o Engine.save_load.force=true)")
	if err := parse(fs, args); err != nil {
		return err
	}
	if *resume {
		*o = append(*o, "Engine.save_load.ckpt_dir=auto")
	}
	if *force {
		*o = append(*o, "Engine.save_load.force=true")
	}
	cfg, err := loadConfig(*c, *o)
	if err != nil {
		return err
	}
	// An interrupt (ctx) stops the run at a step boundary the ranks agree
	// on, after saving; only a second one (hard) abandons its collectives.
	// Joining the job (soft) has nothing to save: the first interrupt
	// abandons it, or a peer that never comes would hold this rank until
	// the launcher's kill, a stop's grace (launch.DefaultInterruptGrace)
	// later.
	soft := ctx
	stop, ctx := ctx.Done(), hardContext(ctx)
	// A worker of a parallel job (started by 'gptui run') finds its peers
	// through torchrun's variables.
	var world *comm.World
	var commTimeout, commInit time.Duration
	if os.Getenv("WORLD_SIZE") != "" {
		cc, err := comm.ConfigFromEnv()
		if err != nil {
			return usageError{err}
		}
		commTimeout, commInit = cc.Timeout, cc.InitTimeout
		if cc.WorldSize > 1 {
			// Peers that fail the job's authentication are dropped; say so.
			cc.Logf = func(format string, args ...any) { fmt.Fprintf(stderr, "[comm] "+format+"\n", args...) }
			if world, err = comm.Connect(soft, cc); err != nil {
				return fmt.Errorf("rank %d: joining the job: %w", cc.Rank, err)
			}
			defer world.Close()
		}
	}
	// A worker of a job's attempt writes into its workdir only while that
	// attempt holds it (package fence).
	tok, err := fence.FromEnv(os.Getenv, "")
	if err != nil {
		return usageError{err}
	}
	var plan *planner.Plan // Distributed.auto: the chosen plan and its prediction
	if cfg.Distributed.Auto {
		if cfg, plan, err = autoPlan(cfg, *o, worldSize(world), stdout); err != nil {
			return err
		}
	}
	if err := checkTrainMemory(cfg, worldSize(world)); err != nil {
		return err
	}
	builtin, err := builtinCorpusWith(cfg)
	if err != nil {
		return err
	}
	be, release, err := newBackend(cfg, world, stderr)
	if err != nil {
		return err
	}
	defer release()
	// A GPU job's gradients and activations go over NCCL, the rest over
	// the World; a CPU job's all over the World (over NCCL with
	// GPTUI_FABRIC=nccl, for tests).
	fabric, releaseFabric, err := newFabric(soft, world, be, commTimeout, commInit, stdout)
	if err != nil {
		return err
	}
	defer releaseFabric()
	var fab comm.Fabric
	if fabric != nil {
		defer fabric.Close() // before the World's and releaseFabric
		fab = fabric
	}
	tr, err := engine.NewTrainer(cfg, be, engine.Options{
		Stdout:  stdout,
		Stderr:  stderr,
		Builtin: builtin,
		World:   world,
		Fabric:  fab,
		Stop:    stop,
		// Under an agent, each checkpoint is a record the agent sends on
		// as a typed event (restarts, replicas and the UI act on it).
		OnCheckpoint: func(state string, c event.Checkpoint) { agent.ReportCheckpoint(stderr, state, c) },
		Fence:        fenceCheck(tok),
	})
	if err != nil {
		return err
	}
	// Under an agent the worker says where it is every second, so that a
	// hang can be told from a slow step, and who is stuck.
	published := make(chan struct{})
	defer close(published)
	go agent.PublishProgress(stderr, published, tr.Progress)
	res, err := tr.Run(ctx)
	if err != nil && fabric != nil && fabric.Err() != nil {
		// Say now why the NCCL data path ended: leaving the World
		// (deferred) waits for every peer to close its side, up to the
		// communicator timeout, and a stopped peer never does.
		fmt.Fprintf(stderr, "[comm] rank %d: the NCCL data path failed: %s\n", world.Rank(), oneLine(fabric.Err()))
	}
	var pe *comm.PeerError
	if errors.As(err, &pe) && world != nil && pe.Rank != world.Rank() {
		// Another rank failed: give the launchers time to hear of it from
		// its own node first, so that the job names the rank that failed
		// rather than one that saw it fail. The job's stop (SIGTERM) ends
		// the wait.
		select {
		case <-time.After(peerFailureWait):
		case <-stop:
		}
	}
	// A log file that lost writes fails the run after it has finished.
	if err != nil && !onlyLogErrors(err) {
		return err
	}
	if n := len(res.Losses); n > 0 {
		fmt.Fprintf(stdout, "[done] steps: %d first loss: %.6f final loss: %.6f median step: %.3f s ips: %.0f tokens/s mfu: %.1f%%\n",
			n, res.Losses[0], res.Losses[n-1], res.StepTimeS, res.TokensPerS, 100*res.MFU)
	}
	if plan != nil && len(res.Losses) > 1 {
		reportPlan(stdout, plan, res.StepTimeS, tr.Memory)
	}
	if res.Checkpoint != "" {
		fmt.Fprintf(stdout, "[done] checkpoint: %s\n", res.Checkpoint)
	}
	return err
}

// onlyLogErrors reports whether err is made of log files' write errors
// alone: the run itself finished.
func onlyLogErrors(err error) bool {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		for _, e := range j.Unwrap() {
			if !onlyLogErrors(e) {
				return false
			}
		}
		return true
	}
	_, ok := err.(*engine.LogWriteError)
	return ok
}

// builtinCorpus returns the tokens of the built-in corpus, kept in the
// user's cache directory (gptui/corpus) so that the workers of a job, and
// later jobs, read what the first one tokenized.
func builtinCorpus() ([]uint16, error) { return cachedCorpus(nil) }

func cachedCorpus(tok *data.Tokenizer) ([]uint16, error) {
	dir, err := os.UserCacheDir()
	if err == nil {
		dir = filepath.Join(dir, "gptui", "corpus")
	}
	return data.CachedCorpusWith(gptui.Docs, dir, tok)
}

// builtinCorpusWith returns the built-in corpus tokenized with the
// config's Data.tokenizer (GPT-2's when it is empty), after checking that
// the tokenizer's vocabulary fits Model.vocab_size.
func builtinCorpusWith(cfg *presets.Config) (func() ([]uint16, error), error) {
	if cfg.Data.Tokenizer == "" {
		return builtinCorpus, nil
	}
	tok, err := loadTokenizer(cfg.Data.Tokenizer)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, usagef("Data.tokenizer %s: no such file; put the model's tokenizer.json there (the llama-1b and llama-8b-4node presets need Llama 3's, from its Hugging Face folder) or set Data.tokenizer to its path",
			cfg.Data.Tokenizer)
	}
	if err != nil {
		return nil, fmt.Errorf("Data.tokenizer: %w", err)
	}
	if tok.VocabSize() > cfg.Model.VocabSize {
		return nil, usagef("Data.tokenizer %s has %d tokens, more than Model.vocab_size %d; raise Model.vocab_size to at least %d",
			cfg.Data.Tokenizer, tok.VocabSize(), cfg.Model.VocabSize, tok.VocabSize())
	}
	return func() ([]uint16, error) { return cachedCorpus(tok) }, nil
}

// fenceCheck is the engine's Fence for the token tok: nil without one.
func fenceCheck(tok *fence.Token) func() error {
	if tok == nil {
		return nil
	}
	return tok.Check
}
