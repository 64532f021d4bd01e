package engine

import (
	"fmt"
	"math"
	"time"

	"github.com/gptui/gptui/arch"
	"github.com/gptui/gptui/units"
)

// meter times a run's steps and reports them every Engine.logging_freq
// steps and after the last: the [train] line and the metrics record, with
// the window's mean step time, data-reading time and communication time,
// and the throughput and MFU they make. It keeps every step's throughput
// for the run's medians (Result).
type meter struct {
	tr     *Trainer
	tokens float64 // trained per step, every replica together
	window struct {
		n                   int
		reader, batch, comm float64 // seconds, summed over the window's steps
	}
	tps, times []float64 // every step's but the first

	t0    time.Time     // the step's start
	busy0 time.Duration // the communicator's busy time at the step's start
}

func (tr *Trainer) newMeter() *meter {
	return &meter{tr: tr, tokens: float64(tr.B * tr.T * tr.Accum * tr.topo.Replicas())}
}

// busy is the time this rank's communicator operations have run.
func (mt *meter) busy() time.Duration {
	if w := mt.tr.opts.World; w != nil {
		return w.Progress().Busy
	}
	return 0
}

// begin starts timing a step.
func (mt *meter) begin() { mt.t0, mt.busy0 = time.Now(), mt.busy() }

// end ends the step's timing and logs it when the logging frequency (or
// the last step) says so.
func (mt *meter) end(step int, lr, loss, norm float64, reader time.Duration) {
	tr, e := mt.tr, mt.tr.Cfg.Engine
	dt := time.Since(mt.t0).Seconds()
	if step > tr.start {
		mt.tps = append(mt.tps, mt.tokens/dt)
		mt.times = append(mt.times, dt)
	}
	w := &mt.window
	w.n++
	w.reader += reader.Seconds()
	w.batch += dt
	w.comm += (mt.busy() - mt.busy0).Seconds()
	if e.LoggingFreq <= 0 || step%e.LoggingFreq != 0 && step != e.MaxSteps-1 {
		return
	}
	n := float64(w.n)
	avgBatch := w.batch / n
	ips := mt.tokens / avgBatch
	mfu, mfuText := 0.0, "unknown"
	if peak := tr.peakFLOPS(); peak > 0 {
		mfu = tr.flopsPerTok * ips / peak
		mfuText = fmt.Sprintf("%.1f%%", 100*mfu)
	}
	mem := tr.Memory.Total()
	tr.log.logf("[train] epoch: %d step: %d lr: %e loss: %.6f avg_reader_cost: %.5f sec avg_batch_cost: %.5f sec ips: %.0f tokens/s mfu: %s mem: %s",
		tr.train.Epoch(), step, lr, loss, w.reader/n, avgBatch, ips, mfuText, units.Bytes(mem))
	if sc := tr.scaler; sc != nil {
		tr.log.logf("[amp] step: %d loss_scale: %g skipped_steps: %d", step, sc.Scale(), sc.skipped)
	}
	m := Metrics{Step: step, Epoch: tr.train.Epoch(), Loss: loss, LR: lr, GradNorm: norm, TokensPerS: ips,
		StepTimeS: avgBatch, ReaderS: w.reader / n, MFU: mfu, MemBytes: mem, CommBytes: tr.stepTraffic(w.n),
		CommS: w.comm / n}
	if sc := tr.scaler; sc != nil {
		m.LossScale, m.SkippedSteps = sc.Scale(), sc.skipped
	}
	tr.log.writeMetrics(m)
	*w = struct {
		n                   int
		reader, batch, comm float64
	}{}
}

// summarise sets the run's medians: tokens/s, step time and the MFU at
// that step time, over the steps after the first.
func (mt *meter) summarise(res *Result) {
	tr := mt.tr
	res.TokensPerS = median(mt.tps)
	res.StepTimeS = median(mt.times)
	if peak := tr.peakFLOPS(); res.StepTimeS > 0 && peak > 0 {
		res.MFU = tr.flopsPerTok * mt.tokens / res.StepTimeS / peak
	}
}

// peakFLOPS is the peak of every rank together, the denominator of MFU:
// the backend's PeakFLOPS times the world's size, or 0 when the backend
// does not know its peak (a PeakFLOPS of 0, or not a finite positive
// number), so that the MFU shows as unknown, never as Inf or NaN.
func (tr *Trainer) peakFLOPS() float64 {
	p := tr.be.PeakFLOPS()
	if !(p > 0) || math.IsInf(p, 1) {
		return 0
	}
	return p * float64(tr.topo.World)
}

// logStart writes the run's opening lines — what resumed, the model, the
// batch, the config's notes, the memory account, the backend, fp16's
// loss scaling, the checkpoint warnings — and reports whether there are
// steps to run (a checkpoint at Engine.max_steps leaves none).
func (tr *Trainer) logStart() bool {
	e, c, mem := tr.Cfg.Engine, tr.Model.Cfg, tr.Memory
	if tr.start > 0 {
		tr.log.logf("[resume] resumed from step %d (%s); the metrics file keeps the steps before it, this log all it held", tr.start, tr.resumedFrom)
	}
	if tr.start >= e.MaxSteps {
		// Every rank resumed from the same step (NewTrainer checked), so
		// every rank stops here.
		msg := fmt.Sprintf("[done] nothing to do: the checkpoint is at step %d and Engine.max_steps is %d; raise Engine.max_steps (-o Engine.max_steps=N) to train further", tr.start, e.MaxSteps)
		if _, ok := tr.Cfg.DerivedFrom("Optimizer.lr.decay_steps"); ok {
			msg += fmt.Sprintf(", with Optimizer.lr.decay_steps set, which is derived from it now (-o Optimizer.lr.decay_steps=%d keeps the schedule)", tr.Sched.DecaySteps)
		}
		tr.log.logf("%s", msg)
		return false
	}
	if c.Family == arch.Llama {
		tr.log.logf("[model] llama layers: %d hidden: %d heads: %d kv_heads: %d ffn: %d vocab: %d (padded %d) positions: %d tied: %t params: %d",
			c.L, c.C, c.NH, c.KVHeads(), c.F, c.V, c.Vp, c.MaxT, c.Tied(), tr.Model.NumParams())
	} else {
		tr.log.logf("[model] layers: %d hidden: %d heads: %d ffn: %d vocab: %d (padded %d) positions: %d params: %d", c.L, c.C, c.NH, c.F, c.V, c.Vp, c.MaxT, tr.Model.NumParams())
	}
	tr.log.logf("[batch] global: %d local: %d micro: %d accumulate: %d seq_len: %d", tr.Cfg.Global.GlobalBatchSize, tr.Cfg.Global.LocalBatchSize, tr.B, tr.Accum, tr.T)
	for _, n := range tr.Cfg.Notes {
		tr.log.logf("[config] %s", n)
	}
	tr.log.logf("[memory] rank %d: params %s grads %s optimizer %s activations %s (recompute: %s) scratch %s total %s",
		tr.opts.Rank, units.Bytes(mem.Params), units.Bytes(mem.Grads), units.Bytes(mem.Optimizer), units.Bytes(mem.Activations), tr.recomputeName(),
		units.Bytes(mem.Scratch), units.Bytes(mem.Total()))
	if peak := tr.peakFLOPS(); peak > 0 {
		tr.log.logf("[backend] %s, peak %.1f GFLOP/s", tr.be.Name(), tr.be.PeakFLOPS()/1e9)
	} else {
		tr.log.logf("[backend] %s, peak unknown (MFU not shown)", tr.be.Name())
	}
	if sc := tr.scaler; sc != nil {
		tr.log.logf("[amp] fp16 dynamic loss scaling from %g (halved on overflow, doubled after %d clean steps)", sc.Scale(), growthInterval)
	}
	for _, w := range tr.warnings {
		tr.log.logf("[checkpoint] %s", w)
	}
	if peak := peakResident(); peak > 0 {
		// The process's high-water mark so far: its part of the model and
		// whatever building it took, beside the account logged above.
		tr.log.logf("[memory] rank %d: peak resident %s before the first step", tr.opts.Rank, units.Bytes(peak))
	}
	return true
}
