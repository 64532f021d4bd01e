package engine

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
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
	train, eval *data.Loader
	B, T, Accum int
	start       int          // first step to run: 0, or the step a checkpoint ends at
	current     atomic.Int64 // the step Run is in, for Step
	resumedFrom string       // the checkpoint resumed from, if any
	run         string       // checkpoint.Manifest.Run of the checkpoints this run writes
	warnings    []string     // logged when the run starts
	flopsPerTok float64
	log         *runLog // opened by Run
}

// Memory is the engine's own account of the bytes one process holds.
type Memory struct {
	Params, Grads, Optimizer, Activations int64
}

// Total is the sum of the parts.
func (m Memory) Total() int64 { return m.Params + m.Grads + m.Optimizer + m.Activations }

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
	m, topo, err := newRankModel(cfg, be, rank, world)
	if err != nil {
		return nil, err
	}
	B, T := cfg.Global.MicroBatchSize, cfg.Data.Train.Dataset.MaxSeqLen
	tr := &Trainer{Cfg: cfg, Model: m, be: be, opts: opts, topo: topo, B: B, T: T, Accum: cfg.AccumulateSteps()}
	tr.scaler = newLossScaler(cfg.Engine.MixPrecision.Dtype, cfg.Engine.MixPrecision.ScaleLoss)
	if opts.World != nil && opts.Fabric == nil {
		opts.Fabric = opts.World.Fabric(backendStream(be))
		tr.opts.Fabric = opts.Fabric
	}
	if tr.groups, err = newGroups(opts.World, opts.Fabric, topo, m, tr.Accum, opts.Stop); err != nil {
		return nil, err
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
	if err := tr.resume(); err != nil {
		return nil, err
	}
	if z := m.z3; z != nil {
		z.keepShard(m) // stage 3 keeps its shard only, from here on
	}
	tr.sums = kernels.Float64s(be, 2)
	tr.Memory = tr.memory()
	tr.flopsPerTok = flopsPerToken(m.Cfg, T)
	return tr, nil
}

// newRankModel builds rank's part of the model of cfg: its shape from the
// config or from Model.init_from (a gptui checkpoint's weights, or an llm.c
// model file, of which each rank keeps its part), its place in the layout,
// and recompute.
func newRankModel(cfg *presets.Config, be kernels.Backend, rank, world int) (*Model, Topology, error) {
	mc := cfg.Model
	T := cfg.Data.Train.Dataset.MaxSeqLen
	drop := ModelConfig{HiddenDropout: float32(mc.HiddenDropoutProb), AttnDropout: float32(mc.AttentionProbsDropoutProb)}
	// The whole model when it comes from a file, else just its shape.
	var whole *Model
	var err error
	shape := ShapeOf(cfg)
	if fi, serr := os.Stat(mc.InitFrom); mc.InitFrom != "" && serr == nil && fi.IsDir() {
		// Weights only, from a gptui checkpoint of the same shape.
		var saved *presets.Config
		if whole, saved, err = LoadModel(be, mc.InitFrom); err != nil {
			return nil, Topology{}, err
		}
		if err := compareShape(cfg, saved, mc.InitFrom); err != nil {
			return nil, Topology{}, err
		}
		whole.Cfg.HiddenDropout, whole.Cfg.AttnDropout = drop.HiddenDropout, drop.AttnDropout
		whole.SetDropoutSeed(uint64(cfg.Global.Seed))
		shape = whole.Cfg
	} else if mc.InitFrom != "" {
		if whole, err = LoadLLMC(be, mc.InitFrom, drop, uint64(cfg.Global.Seed)); err != nil {
			return nil, Topology{}, err
		}
		if T > whole.Cfg.MaxT {
			return nil, Topology{}, &ConfigError{Msg: fmt.Sprintf("Data.Train.dataset.max_seq_len %d exceeds the %d positions of %s; lower max_seq_len", T, whole.Cfg.MaxT, mc.InitFrom)}
		}
		shape = whole.Cfg
	}
	if err := shape.Validate(); err != nil {
		return nil, Topology{}, &ConfigError{Err: err}
	}
	topo, err := NewTopology(cfg.Layout(), cfg.Batch(), shape, rank, world)
	if err != nil {
		return nil, Topology{}, err
	}
	part := topo.part(shape)
	var m *Model
	if whole != nil {
		m, err = whole.partOf(part)
	} else {
		m, err = NewModelPart(be, shape, part, mc.InitializerRange, uint64(cfg.Global.Seed))
	}
	if err != nil {
		return nil, Topology{}, &ConfigError{Err: err}
	}
	if cfg.Engine.UseRecompute {
		switch cfg.Engine.RecomputeGranularity {
		case "only_attn":
			m.SetRecompute(RecomputeOnlyAttn)
		default:
			m.SetRecompute(RecomputeFull)
		}
	}
	return m, topo, nil
}

// resume finds the checkpoint the run resumes from (Engine.save_load.ckpt_dir),
// checks that every rank resumes from the same one, and restores it.
func (tr *Trainer) resume() error {
	ck, warn, err := openCheckpoint(tr.Cfg)
	tr.warnings = warn
	if err != nil {
		return err
	}
	if err := agreeResume(context.Background(), tr.opts.World, ck); err != nil {
		return err
	}
	// The run goes on under the checkpoint's identity, or starts one.
	if ck != nil {
		tr.run = ck.Manifest.Run
	}
	if tr.run == "" {
		tr.run = checkpoint.NewRun()
	}
	if ck == nil {
		return nil
	}
	if err := tr.restore(ck); err != nil {
		return err
	}
	tr.warnings = append(tr.warnings, fmt.Sprintf("resumed from %s at step %d", ck.Dir, tr.start))
	tr.resumedFrom = ck.Dir
	return nil
}

// openData reads the token shards (or the built-in corpus) and carves the
// train and validation ranges.
func (tr *Trainer) openData() error {
	load := func(ds presets.Dataset) ([]uint16, error) {
		if ds.InputDir == "" {
			if tr.opts.Builtin == nil {
				return nil, &ConfigError{Msg: "Data.Train.dataset.input_dir is empty and no built-in corpus is available; set it to a directory made by `gptui data prepare`"}
			}
			return tr.opts.Builtin()
		}
		toks, err := data.Load(ds.InputDir)
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
func checkVocab(ds presets.Dataset, toks []uint16, V int) error {
	if ds.InputDir == "" {
		if i := slices.IndexFunc(toks, func(t uint16) bool { return int(t) >= V }); i >= 0 {
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
	if tr.log, err = openRunLog(tr.Cfg.Engine.LogDir, tr.opts.Rank, tr.start, tr.opts.Stdout, tr.opts.Stderr); err != nil {
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
	if tr.start > 0 {
		tr.log.logf("[resume] resumed from step %d (%s); the log and metrics files keep the steps before it", tr.start, tr.resumedFrom)
	}
	e, c, mem := tr.Cfg.Engine, tr.Model.Cfg, tr.Memory
	if tr.start >= e.MaxSteps {
		// Every rank resumed from the same step (NewTrainer checked), so
		// every rank stops here.
		msg := fmt.Sprintf("[done] nothing to do: the checkpoint is at step %d and Engine.max_steps is %d; raise Engine.max_steps (-o Engine.max_steps=N) to train further", tr.start, e.MaxSteps)
		if _, ok := tr.Cfg.DerivedFrom("Optimizer.lr.decay_steps"); ok {
			msg += fmt.Sprintf(", with Optimizer.lr.decay_steps set, which is derived from it now (-o Optimizer.lr.decay_steps=%d keeps the schedule)", tr.Sched.DecaySteps)
		}
		tr.log.logf("%s", msg)
		return res, nil
	}
	tr.log.logf("[model] layers: %d hidden: %d heads: %d ffn: %d vocab: %d (padded %d) positions: %d params: %d", c.L, c.C, c.NH, c.F, c.V, c.Vp, c.MaxT, tr.Model.NumParams())
	tr.log.logf("[batch] global: %d local: %d micro: %d accumulate: %d seq_len: %d", tr.Cfg.Global.GlobalBatchSize, tr.Cfg.Global.LocalBatchSize, tr.B, tr.Accum, tr.T)
	for _, n := range tr.Cfg.Notes {
		tr.log.logf("[config] %s", n)
	}
	tr.log.logf("[memory] rank %d: params %s grads %s optimizer %s activations %s (recompute: %s) total %s",
		tr.opts.Rank, gb(mem.Params), gb(mem.Grads), gb(mem.Optimizer), gb(mem.Activations), tr.recomputeName(), gb(mem.Total()))
	tr.log.logf("[backend] %s, peak %.1f GFLOP/s", tr.be.Name(), tr.be.PeakFLOPS()/1e9)
	if sc := tr.scaler; sc != nil {
		tr.log.logf("[amp] fp16 dynamic loss scaling from %g (halved on overflow, doubled after %d clean steps)", sc.Scale(), growthInterval)
	}
	for _, w := range tr.warnings {
		tr.log.logf("[checkpoint] %s", w)
	}
	saveSteps := tr.Cfg.Engine.SaveLoad.SaveSteps
	saved := -1 // the last step saved
	var pending *pendingSave
	// collect reports the background save, waiting for it if wait is set
	// or it has finished; it returns the save's error.
	collect := func(wait bool) error {
		if pending == nil || !wait && !pending.finished() {
			return nil
		}
		if !pending.finished() {
			tr.log.logf("[checkpoint] waiting for the save of step %d in flight", pending.step)
		}
		<-pending.done
		p := pending
		pending = nil
		if p.err != nil {
			return fmt.Errorf("saving checkpoint in the background: %w", p.err)
		}
		res.Checkpoint = p.dir
		tr.log.logf("%s", checkpoint.SavedLine(p.step, p.dir, fmt.Sprintf("blocked the step %.1f ms; write %.1f ms in background", ms(p.blocked), ms(p.write))))
		tr.onCheckpoint(event.CheckpointSaved, p.step, p.dir)
		return nil
	}
	defer func() {
		if cerr := collect(true); cerr != nil && err == nil {
			err = cerr
		}
	}()
	save := func(step int) error {
		saved = step
		if tr.Cfg.Engine.SaveLoad.Async {
			t0 := time.Now()
			if err := collect(true); err != nil {
				return err
			}
			j, err := tr.snapshot(context.WithoutCancel(ctx), step, true)
			if err != nil {
				return fmt.Errorf("saving checkpoint: %w", err)
			}
			if j != nil {
				pending = startSave(j, time.Since(t0))
				tr.log.logf("%s", checkpoint.SavingLine(pending.step))
				tr.onCheckpoint(event.CheckpointSaving, pending.step, "")
			}
			return nil
		}
		t0 := time.Now()
		dir, err := tr.Save(context.WithoutCancel(ctx), step)
		if err != nil {
			return fmt.Errorf("saving checkpoint: %w", err)
		}
		if dir != "" {
			res.Checkpoint = dir
			tr.log.logf("%s", checkpoint.SavedLine(step+1, dir, fmt.Sprintf("blocked the step %.1f ms", ms(time.Since(t0)))))
			tr.onCheckpoint(event.CheckpointSaved, step+1, dir)
		}
		return nil
	}

	G := tr.Cfg.Global.GlobalBatchSize
	inputs := make([]int32, G*tr.T)
	targets := make([]int32, G*tr.T)
	var window struct {
		n                   int
		reader, batch, comm float64
	}
	// busy is the time this rank's communicator operations have run.
	busy := func() time.Duration {
		if tr.opts.World == nil {
			return 0
		}
		return tr.opts.World.Progress().Busy
	}
	var tps, times []float64
	for step := tr.start; step < e.MaxSteps; step++ {
		tr.current.Store(int64(step))
		if err := collect(false); err != nil {
			return res, err
		}
		stop, err := tr.stop.requested(ctx)
		if err != nil {
			return res, err
		}
		if stop {
			if saveSteps > 0 && step > tr.start && saved != step-1 {
				if err := save(step - 1); err != nil {
					return res, err
				}
			}
			if err := collect(true); err != nil {
				return res, err
			}
			tr.log.logf("[stop] stopped before step %d", step)
			return res, &StopError{Step: step, Checkpoint: res.Checkpoint}
		}
		if err := ctx.Err(); err != nil {
			// Interrupted between steps: keep the work done so far. (A
			// parallel job's ranks may see the signal at different steps,
			// so only a single process saves here.)
			if saveSteps > 0 && step > tr.start && tr.topo.World == 1 && saved != step-1 {
				if serr := save(step - 1); serr != nil {
					return res, errors.Join(err, serr)
				}
			}
			return res, err
		}
		t0, busy0 := time.Now(), busy()
		lr := tr.Sched.LR(step)
		loss, norm, reader, err := tr.trainStep(ctx, step, lr, inputs, targets)
		if err != nil {
			return res, err
		}
		dt := time.Since(t0).Seconds()
		res.Losses = append(res.Losses, float32(loss))
		tokens := float64(tr.B * tr.T * tr.Accum * tr.topo.Replicas())
		if step > tr.start {
			tps = append(tps, tokens/dt)
			times = append(times, dt)
		}
		window.n++
		window.reader += reader.Seconds()
		window.batch += dt
		window.comm += (busy() - busy0).Seconds()

		last := step == e.MaxSteps-1
		if e.LoggingFreq > 0 && (step%e.LoggingFreq == 0 || last) {
			avgBatch := window.batch / float64(window.n)
			ips := tokens / avgBatch
			mfu := tr.flopsPerTok * ips / (tr.be.PeakFLOPS() * float64(tr.topo.World))
			tr.log.logf("[train] epoch: %d step: %d lr: %e loss: %.6f avg_reader_cost: %.5f sec avg_batch_cost: %.5f sec ips: %.0f tokens/s mfu: %.1f%% mem: %s",
				tr.train.Epoch(), step, lr, loss, window.reader/float64(window.n), avgBatch, ips, 100*mfu, gb(mem.Total()))
			if sc := tr.scaler; sc != nil {
				tr.log.logf("[amp] step: %d loss_scale: %g skipped_steps: %d", step, sc.Scale(), sc.skipped)
			}
			mt := Metrics{Step: step, Epoch: tr.train.Epoch(), Loss: loss, LR: lr, GradNorm: norm, TokensPerS: ips,
				StepTimeS: avgBatch, ReaderS: window.reader / float64(window.n), MFU: mfu, MemBytes: mem.Total(), CommBytes: tr.stepTraffic(window.n),
				CommS: window.comm / float64(window.n)}
			if sc := tr.scaler; sc != nil {
				mt.LossScale, mt.SkippedSteps = sc.Scale(), sc.skipped
			}
			tr.log.writeMetrics(mt)
			window.n, window.reader, window.batch, window.comm = 0, 0, 0, 0
		}
		if tr.eval != nil && e.EvalFreq > 0 && ((step+1)%e.EvalFreq == 0 || last) {
			el, err := tr.Evaluate(ctx)
			if err != nil {
				return res, err
			}
			res.EvalLosses = append(res.EvalLosses, el)
			tr.log.logf("[eval] epoch: %d step: %d loss: %.6f ppl: %.4f", tr.train.Epoch(), step, el, exp(el))
			tr.log.writeMetrics(Metrics{Step: step, Epoch: tr.train.Epoch(), Loss: loss, LR: lr, EvalLoss: el, MemBytes: mem.Total()})
		}
		if saveSteps > 0 && ((step+1)%saveSteps == 0 || last) {
			if err := save(step); err != nil {
				return res, err
			}
		}
	}
	res.TokensPerS = median(tps)
	res.StepTimeS = median(times)
	if res.StepTimeS > 0 {
		res.MFU = tr.flopsPerTok * float64(tr.B*tr.T*tr.Accum*tr.topo.Replicas()) / res.StepTimeS / (tr.be.PeakFLOPS() * float64(tr.topo.World))
	}
	return res, nil
}

// trainStep runs one optimizer step: the forward and backward passes of
// this rank's micro-batches, the gradient reduction across replicas, and the
// update. inputs and targets hold the global batch. It returns the mean loss
// of the global batch, the gradient norm before clipping and the time spent
// reading data.
//
// Every rank reads the whole global batch and keeps the micro-batches of its
// data index (rank d takes micro-batches d·accum … (d+1)·accum−1), so the
// samples, their order and their dropout masks (Pass.Sample is the global
// sample index) are those of one process training on the whole batch.
func (tr *Trainer) trainStep(ctx context.Context, step int, lr float64, inputs, targets []int32) (loss, norm float64, reader time.Duration, err error) {
	m, D, d := tr.Model, tr.topo.Replicas(), tr.topo.DataIndex()
	r0 := time.Now()
	tr.train.Next(inputs, targets)
	reader = time.Since(r0)
	// The step's loss and Σ g² add up on the device, in tr.sums.
	kernels.Upload(tr.be, tr.sums, []float64{0, 0})
	// outer is the work on the tensors outside the blocks that brackets
	// the step's passes (stage 3 gathers them for the step).
	outer := &pass{ctx: ctx}
	if z := m.z3; z != nil {
		// Stage 3: the gradient buffers are zero already; the reduced
		// shard accumulates the micro-batches. The outer tensors stay
		// gathered for the step.
		tr.be.Zero(z.grads)
		z.gather(outer, 0)
		if outer.err != nil {
			return 0, 0, reader, outer.err
		}
	} else {
		m.ZeroGrad()
	}
	dscale := 1 / float32(tr.B*tr.T*tr.Accum*D)
	if tr.scaler != nil {
		dscale *= float32(tr.scaler.Scale())
	}
	bt := tr.B * tr.T
	var hook func(int)
	if tr.dp != nil {
		hook = tr.dp.hook(m)
	}
	if tr.pp != nil {
		if err = tr.pp.step(ctx, m, step, d*tr.Accum, inputs, targets, tr.B, tr.T, dscale, hook, tr.sums[:1]); err != nil {
			return 0, 0, reader, err
		}
	} else {
		for gm := d * tr.Accum; gm < (d+1)*tr.Accum; gm++ {
			ps := &pass{ctx: ctx, Pass: Pass{Step: step, Sample: gm * tr.B}, train: true, dscale: dscale, loss: tr.sums[:1]}
			if gm == (d+1)*tr.Accum-1 {
				ps.onGrads = hook // the last micro-batch completes each block's gradients
			}
			m.forward(ps, inputs[gm*bt:(gm+1)*bt], targets[gm*bt:(gm+1)*bt], tr.B, tr.T)
			m.backward(ps)
			if ps.err != nil {
				return 0, 0, reader, ps.err
			}
		}
	}
	if tr.pp != nil {
		if err = tr.pp.sumTied(ctx, m); err != nil {
			return 0, 0, reader, err
		}
	}
	if z := m.z3; z != nil {
		z.reduce(outer, 0)
		if outer.err != nil {
			return 0, 0, reader, outer.err
		}
	}
	if tr.dp != nil {
		if err = tr.dp.finish(ctx, m); err != nil {
			return 0, 0, reader, err
		}
	}
	// The one read-back of the step: its loss and this rank's Σ g².
	tr.gradSquares(tr.sums[1:])
	sums := []float64{0, 0}
	if err := kernels.Download(tr.be, sums, tr.sums); err != nil {
		return 0, 0, reader, err
	}
	loss = sums[0]
	if tr.dp != nil {
		if loss, err = tr.dp.sumLoss(ctx, loss); err != nil {
			return 0, 0, reader, err
		}
	}
	if tr.pp != nil {
		if loss, err = tr.lastStageSum(ctx, loss); err != nil {
			return 0, 0, reader, err
		}
	}
	loss /= float64(tr.Accum * D)
	if norm, err = tr.update(ctx, sums[1], float32(lr)); err != nil {
		return loss, norm, reader, err
	}
	// The update runs asynchronously on a GPU: its failures surface here.
	return loss, norm, reader, kernels.Sync(tr.be)
}

// gradSquares adds to out[0], on the device, the Σ g² of the gradients
// this rank holds for the norm: its shard's reduced gradients under
// sharding stages 2 and 3, else all of its gradients.
func (tr *Trainer) gradSquares(out []float64) {
	m := tr.Model
	if tr.topo.Sharding > 1 && tr.topo.Stage >= 2 {
		m.gradSquares(out, tr.dp.grads, tr.dp.own())
		return
	}
	m.gradSquares(out, m.Grads, []Span{{0, 0, m.NumParams()}})
}

// update clips the gradients to their global norm and applies one AdamW
// step to the parameters this rank updates, given sq, this rank's Σ g²
// (gradSquares). It returns the norm.
func (tr *Trainer) update(ctx context.Context, sq float64, lr float32) (float64, error) {
	if tr.topo.Sharding > 1 {
		return tr.shardedUpdate(ctx, sq, lr)
	}
	m := tr.Model
	sq, err := tr.modelSum(ctx, sq)
	if err != nil {
		return 0, err
	}
	return tr.apply(m.Params, m.Grads, sq, lr), nil
}

// apply runs AdamW on params with grads, the parameters this rank updates
// and their gradients (laid out by Opt.Spans), given the
// global sum of the gradients' squares sq, and returns the global norm of
// the true gradient. Under fp16 the gradients are loss-scaled: the scale
// comes off inside the update, and a non-finite norm skips the step.
func (tr *Trainer) apply(params, grads []float32, sq float64, lr float32) float64 {
	s := tr.scaler.Scale()
	norm := math.Sqrt(sq) / s
	if !tr.scaler.update(norm) {
		tr.log.logf("[amp] gradient overflow at loss scale %g: step skipped, loss scale now %g (skipped steps: %d)", s, tr.scaler.Scale(), tr.scaler.skipped)
		return norm
	}
	tr.Opt.Apply(tr.be, tr.Model, params, grads, tr.Opt.ClipScale(norm)/float32(s), lr)
	return norm
}

// modelSum adds x up over the ranks that hold the parts of one model (the
// tensor- and pipeline-parallel groups).
func (tr *Trainer) modelSum(ctx context.Context, x float64) (float64, error) {
	if tr.model == nil {
		return x, nil
	}
	b := []float64{x}
	if err := tr.model.AllReduce64(ctx, b); err != nil {
		return 0, fmt.Errorf("model parallel: gradient norm: %w", err)
	}
	return b[0], nil
}

// Step returns the step Run is in (0 before Run). It is safe to call
// from any goroutine while Run runs.
func (tr *Trainer) Step() int { return int(tr.current.Load()) }

// onCheckpoint tells Options.OnCheckpoint of a checkpoint of step (steps
// done) in dir.
func (tr *Trainer) onCheckpoint(state string, step int, dir string) {
	if f := tr.opts.OnCheckpoint; f != nil {
		f(state, event.Checkpoint{Step: step, Dir: dir})
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
	if tr.model != nil {
		now["model"] = tr.model.Traffic().SentBytes
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
	D, d, bt := tr.topo.Replicas(), tr.topo.DataIndex(), tr.B*tr.T
	inputs := make([]int32, bt*tr.Accum*D)
	targets := make([]int32, bt*tr.Accum*D)
	n := max(1, tr.Cfg.Engine.EvalIters)
	m := tr.Model
	// The micro-batches' mean losses add up on the device, read back once.
	kernels.Upload(tr.be, tr.sums[:1], []float64{0})
	ps := &pass{ctx: ctx, loss: tr.sums[:1]} // an evaluation: no dropout, no gradient
	m.z3.gather(ps, 0)
	for i := 0; i < n; i++ {
		tr.eval.Next(inputs, targets)
		for gm := d * tr.Accum; gm < (d+1)*tr.Accum; gm++ {
			in, tg := inputs[gm*bt:(gm+1)*bt], targets[gm*bt:(gm+1)*bt]
			if tr.pp == nil {
				m.forward(ps, in, tg, tr.B, tr.T)
			} else if err := tr.pp.evaluate(ctx, m, in, tg, tr.B, tr.T, ps.loss); err != nil {
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
	if tr.dp != nil {
		if loss, err = tr.dp.sumLoss(ctx, loss); err != nil {
			return 0, err
		}
	}
	return loss / float64(n*tr.Accum*D), nil
}

// lastStageSum gives every rank of the model group the value x of the
// last pipeline stage (its first tensor-parallel rank's).
func (tr *Trainer) lastStageSum(ctx context.Context, x float64) (float64, error) {
	if !tr.Model.Part.Head || tr.topo.MPIndex != 0 {
		x = 0
	}
	b := []float64{x}
	if err := tr.model.AllReduce64(ctx, b); err != nil {
		return 0, fmt.Errorf("pipeline: loss: %w", err)
	}
	return b[0], nil
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

func gb(n int64) string { return fmt.Sprintf("%.3f GB", float64(n)/1e9) }
