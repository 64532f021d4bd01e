package planner

import (
	"fmt"
	"github.com/gptui/gptui/units"
	"math"

	"github.com/gptui/gptui/layout"
)

// Memory is the bytes one device holds, by component.
type Memory struct {
	Params      int64 `json:"params"`
	Grads       int64 `json:"grads"`
	Optimizer   int64 `json:"optimizer"`
	Activations int64 `json:"activations"`
	// Other is what is neither model state nor kept activations: the
	// runtime's reserve and the workspace of a recomputed block.
	Other int64 `json:"other"`
	Total int64 `json:"total"`
}

func (m *Memory) sum() { m.Total = m.Params + m.Grads + m.Optimizer + m.Activations + m.Other }

// Time is the predicted step time by part, in seconds.
type Time struct {
	Compute   float64 // forward, backward and recomputation, bubble included
	Bubble    float64 // of which the pipeline bubble
	Comm      float64 // communication not hidden behind computation
	Optimizer float64 // the AdamW update, gradient norm and zeroing
}

// Plan is a strategy with its predicted cost. A plan that cannot run
// (too little memory, not supported, a schedule that does not fit) has
// Feasible false and the reason.
type Plan struct {
	Strategy
	Feasible bool   `json:"feasible"`
	Reason   string `json:"reason"`
	// Mem is the largest device's memory (pipeline stages differ).
	Mem        Memory  `json:"mem_bytes"`
	StepTime   float64 `json:"step_time_s"`
	TokensPerS float64 `json:"tokens_per_s"`
	MFU        float64 `json:"mfu"`

	Time Time `json:"-"`
	// BubbleFraction is (pp−1)/(vpp·m), the idle share of the pipeline
	// relative to its useful work.
	BubbleFraction float64 `json:"-"`
	// CommBytes is the bytes one device sends per step.
	CommBytes float64 `json:"-"`
	// Capacity is the memory of one device.
	Capacity int64 `json:"-"`
}

// MicroBatches is the number of micro-batches per step and replica.
func (p Plan) microBatches(m Model) int {
	return m.GlobalBatch / p.Replicas() / p.MicroBatch
}

// Usable is the fraction of a device's memory a plan may fill; the rest is
// left to allocator fragmentation and to buffers no model counts.
const Usable = 0.95

// Estimate predicts the memory and step time of strategy s for model m on
// cluster c. Invalid combinations (degrees that do not divide the model or
// the batch) come back infeasible with the reason, as do plans that do not
// fit in memory.
func Estimate(m Model, c Cluster, s Strategy) Plan {
	s = s.normalize()
	p := Plan{Strategy: s, Capacity: c.memPerDevice()}
	if r := invalid(m, c, s); r != "" {
		p.Reason = r
		return p
	}
	p.Mem = memory(m, c, s)
	p.Time, p.CommBytes = stepTime(m, c, s)
	p.StepTime = p.Time.Compute + p.Time.Comm + p.Time.Optimizer
	p.TokensPerS = float64(m.GlobalBatch*m.SeqLen) / p.StepTime
	p.MFU = m.FLOPsPerToken(m.SeqLen) * p.TokensPerS / (c.Device.PeakFLOPS * c.share() * float64(c.Size()))
	if s.PP > 1 {
		p.BubbleFraction = float64(s.PP-1) / float64(s.VPP*p.microBatches(m))
	}
	p.Feasible = true
	switch mb := p.microBatches(m); {
	case float64(p.Mem.Total) > Usable*float64(p.Capacity):
		p.Feasible = false
		p.Reason = fmt.Sprintf("out of memory: %s per device, %.0f%% of %s usable", units.Bytes(p.Mem.Total), 100*Usable, units.Bytes(p.Capacity))
	case s.PP > 1 && mb < s.PP:
		p.Feasible = false
		p.Reason = fmt.Sprintf("pipeline never fills: %d micro-batch(es) per step for %d stages", mb, s.PP)
	}
	return p
}

// invalid returns why s cannot be laid out for m on c, or "".
func invalid(m Model, c Cluster, s Strategy) string {
	switch {
	case s.Devices() != c.Size():
		cp := ""
		if s.CP > 1 {
			cp = fmt.Sprintf(" × cp %d", s.CP)
		}
		return fmt.Sprintf("dp %d × sharding %d%s × mp %d × pp %d = %d devices, the cluster has %d", s.DP, s.ShardingDegree, cp, s.MP, s.PP, s.Devices(), c.Size())
	case s.MP > c.DevicesPerNode:
		return fmt.Sprintf("mp %d exceeds the %d devices of a node", s.MP, c.DevicesPerNode)
	case s.Recompute != RecomputeNone && s.Recompute != RecomputeFull && s.Recompute != RecomputeOnlyAttn:
		return fmt.Sprintf("recompute %q: want none, full or only_attn", s.Recompute)
	}
	if p := layout.Check(m.Shape, s.layout(), s.batch(m)); p != nil {
		return p.Error()
	}
	if s.CP > 1 && m.Dropout {
		return "dropout: context parallelism runs without it (the config refuses cp_degree > 1 with dropout); set Model.*_dropout_prob to 0 to weigh cp"
	}
	return ""
}

// stageParams is the parameter count one device of pipeline stage st
// holds (before sharding): its blocks split over mp and the tensors
// outside them (outerParams), by arch's account of the stage's part
// ([arch.Shape.Stage], the one the engine lays out).
func stageParams(m Model, s Strategy, st int) int64 {
	return m.PartParams(m.Stage(s.MP, s.PP, st))
}

// outerParams is the parameters of pipeline stage st outside its blocks:
// the embeddings on the first stage, the final norm and the head's own
// matrix (an untied Llama's lm_head, or the tied embedding's copy when
// the last stage is not the first) on the last.
func outerParams(m Model, s Strategy, st int) int64 {
	p := m.Stage(s.MP, s.PP, st)
	p.Layers = 0
	return m.PartParams(p)
}

// memory is the larger of the first and the last pipeline stage's memory.
func memory(m Model, c Cluster, s Strategy) Memory {
	best := Memory{Total: -1}
	for _, st := range []int{0, s.PP - 1} {
		var mm Memory
		if c.Device.Accounting == AccountingEngine {
			mm = engineMemory(m, s, st)
		} else {
			mm = mixedMemory(m, c, s, st)
		}
		if mm.Total > best.Total {
			best = mm
		}
	}
	return best
}

// inflight is how many micro-batches' activations pipeline stage st keeps
// at once: one without a pipeline; with 1F1B, pp − st (at most the
// micro-batches of a step); interleaved, 1 + (pp−1)/(pp·vpp) times that.
func inflight(m Model, s Strategy, st int) float64 {
	if s.PP <= 1 {
		return 1
	}
	mb := m.GlobalBatch / s.Replicas() / s.MicroBatch
	n := float64(min(s.PP-st, mb))
	if s.VPP > 1 {
		n *= 1 + float64(s.PP-1)/float64(s.PP*s.VPP)
	}
	return n
}

// engineMemory is the engine's own account (engine.Trainer.Memory) of the
// rank with the largest share: 4 bytes per parameter and gradient, the
// AdamW moments (8 bytes) of its shard, a stage-2 rank's reduced gradient
// shard beside the full buffer, and the fp32 activations its forward pass
// keeps for one micro-batch.
//
// Checked against the engine for dp, sharding stages 1–3, tensor
// parallelism with and without sequence parallelism and pipeline
// parallelism (planner/engine_test.go); context parallelism as soon as the
// engine runs it.
func engineMemory(m Model, s Strategy, st int) Memory {
	P := stageParams(m, s, st)
	S := int64(s.ShardingDegree)
	chunk := (P + S - 1) / S // the engine pads the flat buffer to a multiple of S
	var mm Memory
	mm.Params, mm.Grads, mm.Optimizer = 4*P, 4*P, 8*P
	if S > 1 {
		mm.Optimizer = 8 * chunk
		switch s.ShardingStage {
		case 2:
			mm.Grads += 4 * chunk
		case 3:
			// The shard, plus the tensors outside the blocks (gathered
			// for the step) and one block at a time.
			work := 4 * (chunk + outerParams(m, s, st) + m.layerParamsTP(s.MP))
			mm.Params, mm.Grads = work, work
		}
	}
	if s.PP > 1 && s.VPP > 1 {
		mm.Activations = engineInterleaved(m, s, st)
	} else {
		mm.Activations = int64(inflight(m, s, st) * float64(engineActivations(m, s, st)))
	}
	mm.sum()
	return mm
}

// engineInterleaved is the engine's activation memory on stage st under the
// interleaved schedule: it keeps one set per (micro-batch, chunk) in
// flight, each the residual stream and blocks of one chunk of
// layers/(pp·vpp) blocks (engine/pipeline.go). The schedule runs `warm`
// forward passes, then alternates, so warm+1 sets are live at the peak
// (all of them when warm covers the step); on the last stage exactly one
// of them is the last chunk, with the head's buffers.
func engineInterleaved(m Model, s Strategy, st int) int64 {
	mb := m.GlobalBatch / s.Replicas() / s.MicroBatch
	total := mb * s.VPP
	warm := total
	if mb != s.PP {
		warm = min((s.PP-st-1)*2+(s.VPP-1)*s.PP, total)
	}
	live := int64(min(warm+1, total))
	chunk := s
	chunk.PP = s.PP * s.VPP // a stage of one chunk's blocks …
	perChunk := engineActivations(m, chunk, 0)
	if st < s.PP-1 {
		return live * perChunk
	}
	last := engineActivations(m, chunk, chunk.PP-1) // … with the head's buffers
	return (live-1)*perChunk + last
}

// engineActivations is the bytes of the activations the engine keeps
// between the forward and backward pass of one micro-batch on stage st
// (engine/gpt2.go newActivations: the residual stream, each block's norm
// outputs and statistics, qkv, attention output, the MLP's two tensors,
// the attention probabilities, the final norm, the logits over the rank's
// padded vocabulary and the losses).
//
// The widths per row are the family's (engine blockWidths): GPT-2's
// LayerNorms keep a mean and a reciprocal standard deviation, its qkv is
// 3C/t wide and its MLP keeps fc's and GELU's F/t outputs; a Llama's
// RMSNorms keep the reciprocal alone, its qkv is C/t + 2·(key/value
// width) (kvWidthTP: a replicated head's columns on every rank that
// holds it) and its MLP keeps gate and up (2F/t) and their SwiGLU (F/t).
// The attention probabilities are per query head in both.
//
// The rows: a context-parallel rank holds N = B·T/cp of them (its chunks
// of every sequence), and under sequence parallelism its Nr = N/mp rows
// of the residual stream between the tensor-parallel regions (the stream
// itself, the norms' outputs and statistics, res2), all N inside them
// (qkv, the attention output, the MLP's tensors, the logits). Under
// context parallelism the ring attention keeps no probabilities, only
// one log-sum-exp per row and query head.
func engineActivations(m Model, s Strategy, st int) int64 {
	B, T, C, F := int64(s.MicroBatch), int64(m.SeqLen), int64(m.C), int64(m.F)
	NH, t, cp := int64(m.NH), int64(s.MP), int64(s.cp())
	L := int64(m.L / s.PP)
	N := B * T / cp // the rank's rows
	Nr := N         // … of the residual stream
	if s.SP {
		Nr = N / t
	}
	qkv, fc, act, stats := 3*C/t, F/t, F/t, int64(2) // GPT-2
	if m.llama() {
		qkv, fc, act, stats = C/t+2*m.kvWidthTP(s.MP), 2*F/t, F/t, 1
	}
	n := (L + 1) * Nr * C // resid: block inputs and the stage's output
	if s.Recompute != RecomputeFull {
		n += L * (3*Nr*C + 2*stats*Nr + N*(qkv+C/t+fc+act)) // ln1, res2, ln2 (C) and their statistics; qkv, atty, fch, fchGelu (split)
	}
	if s.Recompute == RecomputeNone {
		if cp > 1 {
			n += L * N * (NH / t) // the ring's log-sum-exp
		} else {
			n += L * B * (NH / t) * T * T
		}
	}
	if st == s.PP-1 {
		Vpl := int64(m.Vp) / t           // logits over the rank's rows of the padded vocabulary (engine dims.Vpl)
		n += Nr*C + stats*Nr + N*Vpl + N // final norm, logits, losses
	}
	return 4 * n
}

// mixedMemory is mixed-precision training's memory on an accelerator:
// 16-bit parameters and gradients and fp32 master weights and moments (12
// bytes), divided by sharding by stage; Korthikanti et al.'s activations;
// the runtime reserve and, with full recompute, one block's activations
// rebuilt at a time.
func mixedMemory(m Model, c Cluster, s Strategy, st int) Memory {
	P := float64(stageParams(m, s, st))
	pb, ob := 2.0, 12.0
	if m.Dtype == "fp32" {
		pb, ob = 4, 8
	}
	S := float64(s.ShardingDegree)
	params, grads, opt := pb*P, pb*P, ob*P
	if s.ShardingDegree > 1 {
		opt /= S
		if s.ShardingStage >= 2 {
			grads /= S
		}
		if s.ShardingStage >= 3 {
			params /= S
		}
	}
	layer := mixedLayerActivations(m, s, s.Recompute)
	acts := inflight(m, s, st) * float64(m.L/s.PP) * layer
	sb := float64(s.MicroBatch) * float64(m.SeqLen) / float64(s.cp()) // the rank's rows
	sbh := sb * float64(m.C)                                          // … of the residual stream
	if s.SP {
		sbh /= float64(s.MP)
	}
	k := pb / 2
	if st == 0 {
		if m.llama() {
			acts += 2 * sbh * k // embedding output (no dropout)
		} else {
			acts += 3 * sbh * k // embedding output and its dropout mask
		}
	}
	if st == s.PP-1 {
		// final norm input and output; logits in the training dtype
		// and the fp32 softmax of the loss, over the vocabulary shard.
		acts += 4*sbh*k + sb*float64(m.Vp)/float64(s.MP)*(pb+4)
	}
	other := float64(c.Device.ReservedBytes)
	if s.Recompute == RecomputeFull {
		other += mixedLayerActivations(m, s, RecomputeNone)
	}
	mm := Memory{Params: int64(params), Grads: int64(grads), Optimizer: int64(opt), Activations: int64(acts), Other: int64(other)}
	mm.sum()
	return mm
}

// mixedLayerActivations is one block's activations for one micro-batch
// in 16-bit training (twice for fp32), after Korthikanti et al.:
// s·b·h·(10 + 24/t + 5·a·s/(h·t)) bytes without sequence parallelism,
// s·b·h·(34/t + 5·a·s/(h·t)) with it (the 10·s·b·h of the norms, dropouts
// and residual adds split over the t ranks too), with the 24 = 8 + 4·F/h
// written for any F; only_attn drops the 5·a·s/h attention-score term,
// full keeps only the block input (2·s·b·h, /t with sequence
// parallelism).
//
// Under context parallelism s is a rank's s/cp positions of each
// sequence in every term, and there is no score term: the ring attention
// is flash-style, keeping no probabilities (its log-sum-exp per row and
// head, 4·a·s·b/(t·cp) bytes, is left out).
//
// A Llama's block, counted the same way (llamaLayerActivations), has no
// dropout masks, grouped key/value heads and a SwiGLU MLP.
func mixedLayerActivations(m Model, s Strategy, rc string) float64 {
	sb := float64(s.MicroBatch) * float64(m.SeqLen) / float64(s.cp())
	h, F, a, t := float64(m.C), float64(m.F), float64(m.NH), float64(s.MP)
	rt := 1.0 // the split of the residual stream's rows: t with sequence parallelism
	if s.SP {
		rt = t
	}
	k := 1.0
	if m.Dtype == "fp32" {
		k = 2
	}
	if rc == RecomputeFull {
		return k * 2 * sb * h / rt
	}
	scores := rc == RecomputeNone && s.cp() == 1
	if m.llama() {
		return k * llamaLayerActivations(m, s, scores)
	}
	n := 10*sb*h/rt + (8*sb*h+4*sb*F)/t
	if scores {
		n += 5 * a * sb * float64(m.SeqLen) / t
	}
	return k * n
}

// llamaLayerActivations is a Llama block's 16-bit activations for one
// micro-batch, by Korthikanti et al.'s count with Llama's layers: the
// inputs of the two RMSNorms (4·sbh), of the q, k, v projection and of
// the MLP (2·sbh each), replicated over the tensor-parallel ranks (split
// over them with sequence parallelism: 8·sbh/t); q after the rotary
// embedding (2·sbh/t), k and v (2·2·sb·w, w the rank's key/value width,
// kvWidthTP), the input of o_proj (2·sbh/t), gate's and up's outputs and
// their SwiGLU, down_proj's input (6·sbF/t); with scores, the softmax's
// output (2·a·s²b/t). No dropout masks: a Llama has none. Under context
// parallelism s·b is the rank's rows, s/cp of each sequence.
func llamaLayerActivations(m Model, s Strategy, scores bool) float64 {
	sb := float64(s.MicroBatch) * float64(m.SeqLen) / float64(s.cp())
	h, F, a, t := float64(m.C), float64(m.F), float64(m.NH), float64(s.MP)
	w := float64(m.kvWidthTP(s.MP))
	repl := 8 * sb * h
	if s.SP {
		repl /= t
	}
	n := repl + 2*sb*h/t + 4*sb*w + 2*sb*h/t + 6*sb*F/t
	if scores {
		n += 2 * a * sb * float64(m.SeqLen) / t
	}
	return n
}

// gemmTime is the time of a product of rows × (2·flops/rows) on one
// device: flops at the device's rate, slowed for few rows.
func gemmTime(c Cluster, flops, rows float64) float64 {
	d := c.Device
	eff := rows / (rows + d.GEMMHalfRows)
	return flops / (d.GEMMFLOPS * c.share() * eff)
}

// stepTime predicts one optimizer step and the bytes a device sends.
//
// A context-parallel rank computes its rows, B·T/cp of a micro-batch, and
// 1/cp of the attention; the ranks of its ring pass keys and values around
// in every layer and sum their gradients with the replicas'.
func stepTime(m Model, c Cluster, s Strategy) (Time, float64) {
	var t Time
	B, T, C := float64(s.MicroBatch), float64(m.SeqLen), float64(m.C)
	V, tp, cp := float64(m.V), float64(s.MP), float64(s.cp())
	L := float64(m.L / s.PP)
	rows := B * T / cp // the rank's rows of a micro-batch
	mb := float64(m.GlobalBatch / s.Replicas() / s.MicroBatch)

	// One micro-batch on the last stage (the slowest: it adds the logits).
	layerFwd := gemmTime(c, 2*rows*float64(m.layerMatmulTP(s.MP)), rows)
	attnFwd := gemmTime(c, 4*B*T*T*C/(tp*cp), T/cp)
	logitsFwd := gemmTime(c, 2*rows*C*V/tp, rows)
	fwd := L*(layerFwd+attnFwd) + logitsFwd
	// The softmax cross-entropy over this rank's columns of the logits,
	// forward and gradient in one pass.
	var classifier float64
	if r := c.Device.ClassifierPerS; r > 0 {
		classifier = rows * V / tp / (r * c.share())
	}
	perMB := 3*fwd + classifier
	switch s.Recompute {
	case RecomputeFull:
		perMB += L * (layerFwd + attnFwd)
	case RecomputeOnlyAttn:
		perMB += L * attnFwd
	}

	// Tensor parallel, inside the node, per micro-batch: counted in
	// halves of an all-reduce of b·s·h (a reduce-scatter or an
	// all-gather, (t−1)/t of it each), as the engine moves them
	// (engine's TestModelParallelTraffic). Each block's 2 all-reduces
	// forward and 2 backward are 8 halves; sequence parallelism makes each
	// a reduce-scatter and an all-gather and gathers each column-parallel
	// GEMM's input again in the backward pass, 10; a recomputed block
	// repeats its forward's 4. The embedding adds an all-reduce (the first
	// stage), the head's input gradient another (the last; with sequence
	// parallelism its input's gather again, 3 halves), and the loss its
	// row maxima (all-gathered) and sums (two float64s a row,
	// all-reduced). Sequence parallelism all-reduces the norms' weight
	// gradients too, every micro-batch.
	pb := 2.0
	if m.Dtype == "fp32" || c.Device.Accounting == AccountingEngine {
		pb = 4
	}
	act := rows * C * pb
	var sent float64
	if s.MP > 1 {
		halves, outer := 8.0, 2.0 // a block's, the head's
		if s.SP {
			halves, outer = 10, 3
		}
		if s.Recompute == RecomputeFull {
			halves += 4
		}
		if s.PP == 1 {
			outer += 2 // the embedding's, on the same stage
		}
		v := (halves*L+outer)*(tp-1)/tp*act + (tp-1)*4*rows + 2*(tp-1)/tp*16*rows
		if s.SP {
			norms := 4*C*L + 2*C // two LayerNorms' weights and biases a block, the final one's
			if m.llama() {
				norms = 2*C*L + C // two RMSNorms' weights a block, the final one's
			}
			v += 2 * (tp - 1) / tp * norms * pb
		}
		if k := float64(m.kvCopies(s.MP)); k > 1 {
			// A Llama's replicated key/value heads: each block's
			// gradient of its k and v rows summed over the k ranks
			// holding them, in every micro-batch's backward.
			v += L * 2 * (k - 1) / k * 2 * float64(m.kvWidthTP(s.MP)) * C * pb
		}
		perMB += v / c.bandwidth(s.MP)
		sent += mb * v
	}
	// Context parallel: per block the ring passes cp−1 blocks of keys and
	// values (the rank's rows × both widths) forward, and cp−1 of them and
	// cp of their gradients backward (recomputed attention, under either
	// recompute granularity, passes its forward's again), each to the next
	// rank of the ring, which spans cp·mp consecutive ranks
	// (engine/contextparallel.go).
	if s.CP > 1 {
		fwd := cp - 1
		if s.Recompute != RecomputeNone {
			fwd *= 2
		}
		v := L * (fwd + cp - 1 + cp) * rows * 2 * float64(m.kvWidthTP(s.MP)) * pb
		perMB += v / c.bandwidth(s.MP*s.CP)
		sent += mb * v
	}
	t.Compute = perMB * mb
	if s.PP > 1 && c.Device.SharedNode {
		// Workers sharing a node's cores: a stage waiting in the bubble
		// gives its core to the others, so the node's work runs at the
		// node's rate, unless one stage has more work than a worker's
		// threads can do in that time. perMB is the last stage's (it
		// holds the logits); the average stage's has 1/pp of them.
		avg := perMB - (3*logitsFwd+classifier)*float64(s.PP-1)/float64(s.PP)
		threads := max(1, c.Device.Cores/c.DevicesPerNode)
		bottleneck := perMB * mb * float64(c.Device.Cores) / float64(c.DevicesPerNode*threads)
		t.Compute = math.Max(avg*mb, bottleneck)
		t.Bubble = t.Compute - avg*mb
	} else if s.PP > 1 {
		bubble := perMB * float64(s.PP-1) / float64(s.VPP)
		t.Bubble = bubble
		t.Compute += bubble
		// Point-to-point: the activation forward and its gradient back,
		// per micro-batch and boundary crossing (vpp per rank): the rank's
		// rows of the residual stream.
		v := 2 * float64(s.VPP) * act
		if s.SP {
			v /= tp
		}
		t.Comm += mb * v / c.bandwidth(s.MP*s.CP*s.ShardingDegree*s.PP)
		sent += mb * v
	}

	// Gradient reduction over the replicas, and sharding's gathers.
	stage := s.PP - 1
	P := float64(stageParams(m, s, stage))
	gb := pb * P // gradient bytes (16-bit on accelerators, fp32 in the engine)
	blocks := L * float64(m.layerParamsTP(s.MP)) * pb
	// The ranks of a context-parallel ring hold the same part and sum
	// their gradients with the replicas' (engine/topology.go: the dp
	// groups take them in): R·cp ranks all-reduce, or under stage 2 and 3
	// the D·cp holding each shard.
	R, S, D := float64(s.Replicas())*cp, float64(s.ShardingDegree), float64(s.DP)*cp
	// The engine's rank order is dp × pp × sharding × cp × mp, mp
	// innermost: a sharding group spans sharding·cp·mp consecutive ranks,
	// a pipeline pp·sharding·cp·mp, a dp group the world (a ring of
	// context-parallel ranks alone cp·mp).
	shardSpan := s.ShardingDegree * s.CP * s.MP
	replicaSpan, dpSpan := c.Size(), c.Size()
	if s.Replicas() == 1 {
		replicaSpan = s.CP * s.MP
	}
	if s.DP == 1 {
		dpSpan = s.CP * s.MP
	}
	bwdLast := 2 * fwd // the last micro-batch's backward, which the block all-reduces overlap
	hide := func(comm, bytes float64) float64 {
		// The blocks' share of comm overlaps the backward pass of the
		// last micro-batch (all but the first block's); the embeddings
		// and final LayerNorm go after it.
		blk := comm * blocks / bytes
		hidden := math.Min(blk*(L-1)/L, c.Device.Overlap*bwdLast*(L-1)/L)
		return comm - hidden
	}
	var opt float64 // parameters this device updates
	normN, zeroN := P, P
	switch {
	case R == 1:
		opt = P
	case s.ShardingDegree == 1 || s.ShardingStage == 1:
		v := 2 * (R - 1) / R * gb
		t.Comm += hide(v/c.bandwidth(replicaSpan), gb)
		sent += v
		opt = P
		if s.ShardingDegree > 1 {
			g := (S - 1) / S * pb * P
			t.Comm += g / c.bandwidth(shardSpan)
			sent += g
			opt = math.Ceil(P / S)
		}
	case s.ShardingStage == 2:
		rs := (S - 1) / S * gb
		ar := 2 * (D - 1) / D * gb / S
		ag := (S - 1) / S * pb * P
		t.Comm += rs/c.bandwidth(shardSpan) + ar/c.bandwidth(dpSpan) + ag/c.bandwidth(shardSpan)
		sent += rs + ar + ag
		opt = math.Ceil(P / S)
		normN = opt
	default: // stage 3: parameters gathered for forward and backward, gradients reduce-scattered
		// The engine gathers a block for each micro-batch's forward and
		// backward pass and reduce-scatters its gradients after the
		// backward; the tensors outside the blocks once per step each way.
		// Each unit is cut in S equal pieces, so each collective moves
		// (S−1)/S of the unit per member. Nothing overlaps: the engine
		// waits for each gather.
		block := float64(m.layerParamsTP(s.MP))
		outer := P - L*block
		v := (S - 1) / S * pb * (3*mb*L*block + 2*outer)
		ar := 2 * (D - 1) / D * gb / S
		t.Comm += v/c.bandwidth(shardSpan) + ar/c.bandwidth(dpSpan)
		sent += v + ar
		opt = math.Ceil(P / S)
		normN = opt
	}
	if s.PP > 1 && m.Tied() {
		// the tied embedding's gradients between the first and last stage
		v := float64(m.Vp) * C / tp * pb
		t.Comm += v / c.bandwidth(s.MP*s.CP*s.ShardingDegree*s.PP)
		sent += v
	}
	rate := c.Device.OptimizerParamsPerS * c.share()
	// AdamW over the shard, then a read (norm) and a write (zeroing) of
	// the gradients at about 1/7 of AdamW's 28 bytes per parameter each.
	t.Optimizer = opt/rate + (normN+zeroN)/(7*rate)
	return t, sent
}
