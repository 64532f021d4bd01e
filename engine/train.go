package engine

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync/atomic"
	"time"

	"github.com/gptui/gptui/badinput"
	"github.com/gptui/gptui/comm"
	"github.com/gptui/gptui/engine/checkpoint"
	"github.com/gptui/gptui/engine/data"
	"github.com/gptui/gptui/event"
	"github.com/gptui/gptui/kernels"
	"github.com/gptui/gptui/presets"
)

// Options are the inputs of a run that do not come from the config.
type Options struct {
	// Stdout receives the log lines (they also go to <log_dir>/workerlog.<rank>).
	Stdout io.Writer
	// Stderr receives the one-line report of a log file that failed to
	// take a write (nil: discarded).
	Stderr io.Writer
	// Builtin returns the built-in corpus, used when input_dir is empty.
	Builtin func() ([]uint16, error)
	// Rank names the log and metrics files of a single process; with World
	// set, the world rank does.
	Rank int
	// World connects the ranks of a parallel job; nil for one process.
	// Its TCP groups carry the control plane: stop agreement, resume
	// agreement, checkpoint parts, loss and norm scalars.
	World *comm.World
	// Fabric makes the communicators of the data path: gradients,
	// activations, sharded parameters. Nil: World's TCP ring, ordered
	// after the backend's kernels (World.Fabric with the backend as the
	// stream when it computes asynchronously).
	Fabric comm.Fabric
	// Stop, when closed, asks the run to stop at the next step boundary:
	// the ranks agree on the step (see Trainer.Run), save the finished
	// steps and return a *StopError. Unlike cancelling Run's context, it
	// lets the collectives of those steps and of the save run. Nil never
	// stops.
	Stop <-chan struct{}
	// OnCheckpoint, if set, is told of each checkpoint this rank writes:
	// state event.CheckpointSaving when a save begins in the background,
	// event.CheckpointSaved once it is written (the step done and the
	// directory). Only the rank that writes the checkpoint (rank 0) tells
	// it. Launchers learn of checkpoints through it (package agent's
	// ReportCheckpoint), not from the log line that says the same.
	OnCheckpoint func(state string, c event.Checkpoint)
	// Fence, if set, is asked before each write the run makes to its
	// workdir — log lines, metrics records, a checkpoint's start, files
	// and publication — and at each step: an error (a later attempt of the
	// job holds the workdir: package fence's *StaleError) stops the run
	// with that error, and nothing more is written. Nil checks nothing.
	Fence func() error
}

// Metrics is one logged training step, as written to metrics.<rank>.jsonl:
// the record event owns, so that what the engine writes is what the
// agent, the UI and `gptui report` read.
type Metrics = event.Metrics

// Result summarises a finished run.
type Result struct {
	Losses     []float32 // training loss of every step
	EvalLosses []float64 // every evaluation, in order
	TokensPerS float64   // median over the run's steps, after the first
	StepTimeS  float64   // median step time, after the first step
	MFU        float64   // at the median step time
	Checkpoint string    // the last checkpoint written, if any
}

// Trainer owns the model, optimizer and data of one training process.
type Trainer struct {
	Cfg    *presets.Config
	Model  *Model
	Opt    *AdamW
	Sched  Schedule
	Memory Memory

	be   kernels.Backend
	opts Options
	topo Topology
	groups

	scaler      *lossScaler // fp16's loss scale; nil otherwise
	sums        []float64   // the step's loss and Σ g², reduced on the device and read back once
	lastTraffic map[string]int64
	snap        [][]float32 // an asynchronous save's copies of the state
	hosts       []string    // every rank's node name; nil for one process
	train, eval *data.Loader
	B, T, Accum int
	start       int          // first step to run: 0, or the step a checkpoint ends at
	current     atomic.Int64 // the step Run is in, for Step
	resumedFrom string       // the checkpoint resumed from, if any
	run         string       // checkpoint.Manifest.Run of the checkpoints this run writes
	warnings    []string     // logged when the run starts
	tokenIDs    TokenIDs     // the special token ids its checkpoints keep
	flopsPerTok float64
	log         *runLog // opened by Run
}

// Memory is the engine's own account of the bytes one process holds:
// the model states (Params, Grads, Optimizer), the Activations its
// forward passes keep for the backward passes of the micro-batches in
// flight, and the Scratch every micro-batch's passes share beside them
// (the backward pass's buffers, what is recomputed rather than kept, the
// parallel layout's own exchange buffers).
type Memory struct {
	Params, Grads, Optimizer, Activations, Scratch int64
}

// Total is the sum of the parts.
func (m Memory) Total() int64 { return m.Params + m.Grads + m.Optimizer + m.Activations + m.Scratch }

// ConfigError is an input problem found while setting up a run (data or
// model files that do not fit the config): bad input (badinput.Err), which
// the CLI reports with exit 2. Msg says what is wrong and what to do; Err,
// when set, is the cause, and Msg defaults to its message.
type ConfigError struct {
	Msg string
	Err error
}

func (e *ConfigError) Error() string {
	if e.Msg == "" && e.Err != nil {
		return e.Err.Error()
	}
	return e.Msg
}

// Unwrap returns the cause.
func (e *ConfigError) Unwrap() error { return e.Err }

// Is reports that a ConfigError is bad input (badinput.Err).
func (e *ConfigError) Is(target error) bool { return badinput.Is(target) }

// NewTrainer builds one rank's part of the model (fresh or from
// Model.init_from), its communication groups, the optimizer, the schedule
// and the data loaders of cfg, and restores the checkpoint it resumes
// from, if any.
func NewTrainer(cfg *presets.Config, be kernels.Backend, opts Options) (*Trainer, error) {
	if opts.Stdout == nil {
		opts.Stdout = io.Discard
	}
	if opts.Stderr == nil {
		opts.Stderr = io.Discard
	}
	rank, world := opts.Rank, 1
	if opts.World != nil {
		rank, world = opts.World.Rank(), opts.World.Size()
	}
	opts.Rank = rank
	// The checkpoints the run loads settle what its model computes: they
	// are opened, and the config takes their settings, first.
	st, err := openStart(cfg, opts.World)
	if err != nil {
		return nil, err
	}
	cfg, ids, adopted, err := st.settle(cfg)
	if err != nil {
		return nil, err
	}
	m, topo, src, err := newRankModel(cfg, be, rank, world, st.init)
	if err != nil {
		return nil, err
	}
	defer src.Close()
	B, T := cfg.Global.MicroBatchSize, cfg.Data.Train.Dataset.MaxSeqLen
	tr := &Trainer{Cfg: cfg, Model: m, be: be, opts: opts, topo: topo, B: B, T: T, Accum: cfg.AccumulateSteps(),
		tokenIDs: ids, hosts: st.hosts, warnings: append(st.warnings, adopted...)}
	tr.scaler = newLossScaler(cfg.Engine.MixPrecision.Dtype, cfg.Engine.MixPrecision.ScaleLoss)
	if opts.World != nil && opts.Fabric == nil {
		opts.Fabric = opts.World.Fabric(backendStream(be))
		tr.opts.Fabric = opts.Fabric
	}
	if tr.groups, err = newGroups(opts.World, opts.Fabric, topo, m, tr.Accum, opts.Stop); err != nil {
		return nil, err
	}
	if cfg.Engine.MixPrecision.ReduceDtype == "bf16" {
		tr.dp.reduceInBF16(m)
	}
	o := cfg.Optimizer
	spans := []Span{{0, 0, m.NumParams()}}
	if tr.dp != nil {
		spans = tr.dp.own() // sharding: the moments of this rank's shard
	}
	tr.Opt = NewAdamW(be, AdamWConfig{Beta1: float32(o.Beta1), Beta2: float32(o.Beta2), Eps: float32(o.Epsilon),
		WeightDecay: float32(o.WeightDecay), ClipNorm: o.GradClip.ClipNorm}, spans)
	tr.Sched = Schedule{MaxLR: o.LR.MaxLR, MinLR: o.LR.MinLR, Warmup: int(o.LR.WarmupRate * float64(o.LR.DecaySteps)), DecaySteps: o.LR.DecaySteps}
	if err := tr.openData(); err != nil {
		return nil, err
	}
	if err := tr.resume(st.resume); err != nil {
		return nil, err
	}
	if tr.resumedFrom == "" {
		// The first weights, filled only now that the sharding has laid
		// out the buffers: each rank computes or reads the part it holds,
		// under stage 3 its shard alone.
		params, spans := tr.heldParams()
		if err := fillSpans(be, m.Tensors, spans, params, src.block); err != nil {
			return nil, err
		}
	}
	tr.sums = kernels.Float64s(be, 2)
	tr.Memory = tr.memory()
	tr.flopsPerTok = m.Cfg.FLOPsPerToken(T)
	return tr, nil
}

// newRankModel allocates rank's part of the model of cfg — its shape from
// the config (settled by the checkpoints the run loads: start.settle) or
// from an llm.c model file Model.init_from names, its place in the
// layout, and recompute — and returns where its first weights come from:
// init, the gptui checkpoint init_from names (nil for none), the llm.c
// file, or the initialisation. Nothing of the model outside the part is
// allocated or read. The caller fills the part (NewTrainer, once the
// sharding is known) and closes the source.
func newRankModel(cfg *presets.Config, be kernels.Backend, rank, world int, init *checkpoint.Checkpoint) (*Model, Topology, *weightSource, error) {
	mc := cfg.Model
	T := cfg.Data.Train.Dataset.MaxSeqLen
	shape := ShapeOf(cfg)
	seed := uint64(cfg.Global.Seed)
	src := &weightSource{block: initSource(shape, mc.InitializerRange, seed)}
	// fromFile takes the shape of a file's model, with the config's dropout.
	fromFile := func(s ModelConfig) {
		s.HiddenDropout, s.AttnDropout = shape.HiddenDropout, shape.AttnDropout
		shape = s
	}
	if init != nil {
		// Weights only, from a gptui checkpoint of the config's shape.
		src.block = ckptSource(init, ckptParams)
	} else if mc.InitFrom != "" {
		if shape.llama() {
			return nil, Topology{}, nil, &ConfigError{Msg: fmt.Sprintf("Model.init_from %s: an llm.c model file holds a GPT-2, and Model.family is %s; give a gptui checkpoint directory", mc.InitFrom, shape.Family)}
		}
		f, err := openLLMC(mc.InitFrom)
		if err != nil {
			return nil, Topology{}, nil, err
		}
		if T > f.cfg.MaxT {
			f.Close()
			return nil, Topology{}, nil, &ConfigError{Msg: fmt.Sprintf("Data.Train.dataset.max_seq_len %d exceeds the %d positions of %s; lower max_seq_len", T, f.cfg.MaxT, mc.InitFrom)}
		}
		fromFile(f.cfg)
		src.block, src.close = f.block, f.Close
	}
	m, topo, err := func() (*Model, Topology, error) {
		if err := shape.Validate(); err != nil {
			return nil, Topology{}, &ConfigError{Err: err}
		}
		topo, err := NewTopology(cfg.Layout(), cfg.Batch(), shape, rank, world)
		if err != nil {
			return nil, Topology{}, err
		}
		// Under sharding the buffers are laid out for it from the start:
		// none is copied later, and a stage 3 rank never holds its whole
		// part.
		m, err := newShardedModel(be, shape, topo.part(shape), max(topo.Sharding, 1), topo.Sharding > 1 && topo.Stage == 3)
		if err != nil {
			return nil, Topology{}, &ConfigError{Err: err}
		}
		return m, topo, nil
	}()
	if err != nil {
		src.Close()
		return nil, Topology{}, nil, err
	}
	m.seed = seed
	if cfg.Engine.UseRecompute {
		switch cfg.Engine.RecomputeGranularity {
		case "only_attn":
			m.SetRecompute(RecomputeOnlyAttn)
		default:
			m.SetRecompute(RecomputeFull)
		}
	}
	return m, topo, src, nil
}

// weightSource is where a rank's first weights come from.
type weightSource struct {
	block blockSource
	close func() error // nil, or releases the file read
}

// Close releases the file the source reads, if any.
func (s *weightSource) Close() error {
	if s.close == nil {
		return nil
	}
	return s.close()
}

// heldParams returns the buffer of the parameters this rank keeps and its
// spans of the part's flat layout: the part's whole buffer, or under
// sharding stage 3 its shard (the rest is gathered unit by unit when
// used).
func (tr *Trainer) heldParams() ([]float32, []Span) {
	if z := tr.Model.stage3; z != nil {
		return z.shard, tr.dp.own()
	}
	return tr.Model.Params, tr.Model.whole()
}

// resume restores ck, the checkpoint the run resumes from
// (Engine.save_load.ckpt_dir), which every rank has agreed on (openStart),
// if any.
func (tr *Trainer) resume(ck *checkpoint.Checkpoint) error {
	// The run goes on under the checkpoint's identity, or starts one.
	if ck != nil {
		tr.run = ck.Manifest.Run
	}
	if tr.run == "" {
		tr.run = checkpoint.NewRun()
	}
	if ck == nil {
		return tr.checkFreshOutput()
	}
	if err := tr.restore(ck); err != nil {
		return err
	}
	tr.warnings = append(tr.warnings, fmt.Sprintf("resumed from %s at step %d", ck.Dir, tr.start))
	tr.resumedFrom = ck.Dir
	return nil
}

// openData reads the token shards (or the built-in corpus) and carves the
// train and validation ranges: 16-bit tokens, or 32-bit ones for a
// vocabulary beyond 65536 (openDataOf).
func (tr *Trainer) openData() error {
	if tr.Model.Cfg.V > 1<<16 {
		return openDataOf[uint32](tr)
	}
	return openDataOf[uint16](tr)
}

// openDataOf is openData with tokens of type T.
func openDataOf[T data.Token](tr *Trainer) error {
	load := func(ds presets.Dataset) ([]T, error) {
		if ds.InputDir == "" {
			if tr.opts.Builtin == nil {
				return nil, &ConfigError{Msg: "Data.Train.dataset.input_dir is empty and no built-in corpus is available; set it to a directory made by `gptui data prepare`"}
			}
			toks, err := tr.opts.Builtin()
			return widen[T](toks), err
		}
		toks, err := data.LoadOf[T](ds.InputDir)
		if err != nil {
			return nil, badinput.Wrap(fmt.Errorf("Data.*.dataset.input_dir %s (make it with `gptui data prepare`): %w", ds.InputDir, err))
		}
		return toks, nil
	}
	td := tr.Cfg.Data.Train.Dataset
	toks, err := load(td)
	if err != nil {
		return err
	}
	if err := checkVocab(td, toks, tr.Model.Cfg.V); err != nil {
		return err
	}
	r := data.SplitRanges(len(toks), td.Split)
	seed := uint64(tr.Cfg.Global.Seed)
	// The training loader serves whole global batches, so the stream of
	// samples (epoch boundaries included) is the same however a batch is
	// split into ranks and micro-batches, and a checkpoint resumes under
	// any layout with the same global batch size.
	tr.train, err = data.NewLoader(toks[r[0][0]:r[0][1]], tr.Cfg.Global.GlobalBatchSize, tr.T, td.Shuffle, seed)
	if err != nil {
		return &ConfigError{Err: err, Msg: fmt.Sprintf("training split of %s: %v", orBuiltin(td.InputDir), err)}
	}
	if tr.Cfg.Engine.EvalFreq > 0 {
		ed := tr.Cfg.Data.Eval.Dataset
		etoks := toks
		if ed.InputDir != td.InputDir {
			if etoks, err = load(ed); err != nil {
				return err
			}
			if err := checkVocab(ed, etoks, tr.Model.Cfg.V); err != nil {
				return err
			}
		}
		r := data.SplitRanges(len(etoks), ed.Split)
		// Evaluation draws global batches as training does, so its loss
		// is the same under any split into ranks and micro-batches.
		tr.eval, err = data.NewLoader(etoks[r[1][0]:r[1][1]], tr.Cfg.Global.GlobalBatchSize, tr.T, false, seed)
		if err != nil {
			return &ConfigError{Err: err, Msg: fmt.Sprintf("validation split of %s is too small for one batch (%v); lower Engine.eval_freq to 0 or give more data", orBuiltin(ed.InputDir), err)}
		}
	}
	return nil
}

// checkVocab refuses tokens of the data set ds (as loaded) that are not
// below the model's vocabulary V, naming the shard and the byte offset.
func checkVocab[T data.Token](ds presets.Dataset, toks []T, V int) error {
	if ds.InputDir == "" {
		if i := slices.IndexFunc(toks, func(t T) bool { return int(t) >= V }); i >= 0 {
			return &ConfigError{Msg: fmt.Sprintf("token %d at position %d of the built-in corpus is outside the model's vocabulary of %d; check Model.vocab_size", toks[i], i, V)}
		}
		return nil
	}
	return data.CheckVocab(ds.InputDir, toks, V)
}

func orBuiltin(dir string) string {
	if dir == "" {
		return "the built-in corpus"
	}
	return dir
}

// Run trains for Engine.max_steps steps, logging every logging_freq steps and
// evaluating every eval_freq steps. It stops early, with ctx's error, when
// ctx is cancelled.
//
// When Options.Stop is closed, Run stops at the next step boundary: in a
// parallel job the ranks agree on that boundary (an 8-byte all-reduce over
// the world at every boundary), save the finished steps if saving is on
// (Engine.save_load.save_steps > 0) and not saved already, wait for a
// save in flight, and return a *StopError.
//
// With Engine.save_load.async, a save copies the state to host memory (the
// gathering from the other ranks stays synchronous) and rank 0 writes it
// in the background while training goes on; at most one save is in
// flight, the next one waits for it, and its error is returned by the next
// save or the end of the run, which waits for it.
func (tr *Trainer) Run(ctx context.Context) (res *Result, err error) {
	if err := tr.fence(); err != nil {
		return nil, err // before the log files are opened (and cut)
	}
	if tr.log, err = openRunLog(tr.Cfg.Engine.LogDir, tr.opts.Rank, tr.start, tr.opts.Stdout, tr.opts.Stderr, tr.opts.Fence); err != nil {
		return nil, err
	}
	defer func() {
		if cerr := tr.log.Close(); cerr != nil && err == nil {
			err = cerr
		}
		// A log that lost writes fails the run, once it has finished.
		err = errors.Join(err, tr.log.lost())
	}()
	res = &Result{}
	if !tr.logStart() {
		return res, nil
	}
	sv, mt, b := tr.newSaver(res), tr.newMeter(), tr.newBatch()
	defer func() {
		if cerr := sv.collect(true); cerr != nil && err == nil {
			err = cerr
		}
	}()
	for step := tr.start; step < tr.Cfg.Engine.MaxSteps; step++ {
		tr.current.Store(int64(step))
		if err := tr.fence(); err != nil {
			return res, err
		}
		if err := sv.collect(false); err != nil {
			return res, err
		}
		if err := tr.checkStop(ctx, step, sv); err != nil {
			return res, err
		}
		mt.begin()
		lr := tr.Sched.LR(step)
		loss, norm, reader, err := tr.trainStep(ctx, step, lr, b)
		if err != nil {
			return res, err
		}
		res.Losses = append(res.Losses, float32(loss))
		mt.end(step, lr, loss, norm, reader)
		if err := tr.evaluateAt(ctx, step, lr, loss, res); err != nil {
			return res, err
		}
		if err := sv.after(ctx, step); err != nil {
			return res, err
		}
	}
	mt.summarise(res)
	return res, nil
}

// fence returns Options.Fence's answer: nil while this process may write
// into its workdir.
func (tr *Trainer) fence() error {
	if tr.opts.Fence == nil {
		return nil
	}
	return tr.opts.Fence()
}

// checkStop ends the run before step when the ranks agree to stop: it
// saves the finished steps, waits for a save in flight and returns a
// *StopError. When ctx has ended it returns ctx's error, after saving the
// finished steps in a single process (a parallel job's ranks may see the
// signal at different steps, so only Options.Stop saves there).
func (tr *Trainer) checkStop(ctx context.Context, step int, sv *saver) error {
	stop, err := tr.stop.requested(ctx)
	if err != nil {
		return err
	}
	if stop {
		if err := sv.saveFinished(ctx, step); err != nil {
			return err
		}
		if err := sv.collect(true); err != nil {
			return err
		}
		tr.log.logf("[stop] stopped before step %d", step)
		return &StopError{Step: step, Checkpoint: sv.res.Checkpoint}
	}
	if err := ctx.Err(); err != nil {
		if tr.topo.World == 1 {
			if serr := sv.saveFinished(ctx, step); serr != nil {
				return errors.Join(err, serr)
			}
		}
		return err
	}
	return nil
}

// evaluateAt evaluates after step when Engine.eval_freq (or the last
// step) says so, and logs the loss and its perplexity.
func (tr *Trainer) evaluateAt(ctx context.Context, step int, lr, loss float64, res *Result) error {
	e := tr.Cfg.Engine
	if tr.eval == nil || e.EvalFreq <= 0 || (step+1)%e.EvalFreq != 0 && step != e.MaxSteps-1 {
		return nil
	}
	el, err := tr.Evaluate(ctx)
	if err != nil {
		return err
	}
	res.EvalLosses = append(res.EvalLosses, el)
	tr.log.logf("[eval] epoch: %d step: %d loss: %.6f ppl: %.4f", tr.train.Epoch(), step, el, exp(el))
	tr.log.writeMetrics(Metrics{Step: step, Epoch: tr.train.Epoch(), Loss: loss, LR: lr, EvalLoss: el, MemBytes: tr.Memory.Total()})
	return nil
}

// Step returns the step Run is in (0 before Run). It is safe to call
// from any goroutine while Run runs.
func (tr *Trainer) Step() int { return int(tr.current.Load()) }

// onCheckpoint tells Options.OnCheckpoint of a checkpoint of step (steps
// done) in dir.
func (tr *Trainer) onCheckpoint(state string, step int, dir string) {
	if f := tr.opts.OnCheckpoint; f != nil {
		f(state, event.Checkpoint{Step: step, Dir: dir, Run: tr.run})
	}
}

// stepTraffic returns the bytes sent per group and step, averaged over the
// steps since the last call.
func (tr *Trainer) stepTraffic(steps int) map[string]int64 {
	now := map[string]int64{}
	if tr.dp != nil {
		for k, v := range tr.dp.traffic() {
			now[k] = v
		}
	}
	if tp := tr.Model.tp; tp != nil {
		now["mp"] = tp.g.Traffic().SentBytes
	}
	if tr.modelGroup != nil {
		now["model"] = tr.modelGroup.Traffic().SentBytes
	}
	if p := tr.pp; p != nil {
		now["pp"] = p.c.Traffic().SentBytes
		if p.tied != nil {
			now["tied"] = p.tied.Traffic().SentBytes
		}
	}
	if len(now) == 0 {
		return nil
	}
	out := map[string]int64{}
	for k, v := range now {
		out[k] = (v - tr.lastTraffic[k]) / int64(max(steps, 1))
	}
	tr.lastTraffic = now
	return out
}

// Evaluate returns the mean loss over eval_iters global batches read from
// the start of the validation range, without dropout. As in a training
// step, every rank reads each global batch and evaluates the micro-batches
// of its data index, and the replicas' sums are added up, so the loss is
// that of one process whatever the strategy. In a parallel job every rank
// calls it and gets the same loss.
func (tr *Trainer) Evaluate(ctx context.Context) (float64, error) {
	tr.eval.Reset()
	D, d, T := tr.topo.Replicas(), tr.topo.DataIndex(), tr.T/tr.topo.CP
	bt := tr.B * T // this rank's rows of a micro-batch (localRows)
	inputs := make([]int32, tr.B*tr.T*tr.Accum*D)
	targets := make([]int32, tr.B*tr.T*tr.Accum*D)
	n := max(1, tr.Cfg.Engine.EvalIters)
	m := tr.Model
	// The micro-batches' mean losses add up on the device, read back once.
	kernels.Upload(tr.be, tr.sums[:1], []float64{0})
	ps := &pass{ctx: ctx, loss: tr.sums[:1]} // an evaluation: no dropout, no gradient
	m.stage3.gather(ps, 0)
	defer tr.copyWeights()()
	for i := 0; i < n; i++ {
		tr.eval.Next(inputs, targets)
		lin, ltg := tr.localRows(inputs), tr.localRows(targets)
		for gm := d * tr.Accum; gm < (d+1)*tr.Accum; gm++ {
			in, tg := lin[gm*bt:(gm+1)*bt], ltg[gm*bt:(gm+1)*bt]
			if tr.pp == nil {
				m.forward(ps, in, tg, tr.B, T)
			} else if err := tr.pp.evaluate(ctx, m, in, tg, tr.B, T, ps.loss); err != nil {
				return 0, err
			}
			if ps.err != nil {
				return 0, ps.err
			}
		}
	}
	sum := []float64{0}
	if err := kernels.Download(tr.be, sum, tr.sums[:1]); err != nil {
		return 0, err
	}
	loss, err := sum[0], error(nil)
	if tr.pp != nil {
		if loss, err = tr.lastStageSum(ctx, loss); err != nil {
			return 0, err
		}
	}
	if loss, err = tr.dp.sumLoss(ctx, loss); err != nil {
		return 0, err
	}
	return loss / float64(n*tr.Accum*D), nil
}

// lastStageSum gives every rank of the model group the value x of the
// last pipeline stage (its first tensor-parallel rank's).
func (tr *Trainer) lastStageSum(ctx context.Context, x float64) (float64, error) {
	if !tr.Model.Part.Head || tr.topo.MPIndex != 0 {
		x = 0
	}
	return sum64(ctx, tr.modelGroup, x, "pipeline: loss")
}

func (tr *Trainer) recomputeName() string {
	switch tr.Model.recompute {
	case RecomputeFull:
		return "full"
	case RecomputeOnlyAttn:
		return "only_attn"
	}
	return "off"
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
