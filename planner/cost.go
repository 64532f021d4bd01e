package planner

import (
	"fmt"
	"math"

	"github.com/gptui/gptui/arch"
	"github.com/gptui/gptui/kernels/cuda"
	"github.com/gptui/gptui/layout"
	"github.com/gptui/gptui/units"
)

// Memory is the bytes one device holds, by component: the engine's
// account (engine.Memory, field by field) and Other.
type Memory struct {
	Params      int64 `json:"params"`
	Grads       int64 `json:"grads"`
	Optimizer   int64 `json:"optimizer"`
	Activations int64 `json:"activations"`
	// Scratch is the buffers every micro-batch's passes share beside the
	// kept activations: the backward pass's, what is recomputed, the
	// parallel layout's exchange buffers (engineScratch).
	Scratch int64 `json:"scratch"`
	// Other is what the engine does not allocate itself: the runtime's
	// reserve and the CUDA backend's workspaces (gpuMemory).
	Other int64 `json:"other"`
	Total int64 `json:"total"`
}

func (m *Memory) sum() {
	m.Total = m.Params + m.Grads + m.Optimizer + m.Activations + m.Scratch + m.Other
}

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
		if mm := stageMemory(m, c, s, st); mm.Total > best.Total {
			best = mm
		}
	}
	return best
}

// stageMemory is the memory of a device of pipeline stage st: the
// engine's allocation on the CPU backend (engineMemory) or on the CUDA
// backend (gpuMemory).
func stageMemory(m Model, c Cluster, s Strategy, st int) Memory {
	if c.Device.Accounting == AccountingEngineGPU {
		return gpuMemory(m, c, s, st)
	}
	return engineMemory(m, s, st, false)
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
// rank with the largest share: 4 bytes per parameter and gradient, under
// sharding stages 1 and 2 the chunk the updated parameters are
// all-gathered from, the AdamW moments (8 bytes) of its shard, a stage-2
// rank's reduced gradient shard beside the full buffer, the fp32
// activations its forward pass keeps for the micro-batches in flight and
// the scratch their passes share (engineScratch). lse says the backend's
// attention is flash-style, keeping one log-sum-exp per row and query head
// rather than the probabilities (kernels.AttentionStore: the CUDA
// backend's); the CPU backend's keeps the probabilities.
//
// Checked against the engine for dp, sharding stages 1–3, tensor
// parallelism with and without sequence parallelism, context parallelism
// and pipeline parallelism (planner/engine_test.go), with the CPU's
// attention and with the CUDA backend's (TestGPUMemoryMatchesEngine).
func engineMemory(m Model, s Strategy, st int, lse bool) Memory {
	P := stageParams(m, s, st)
	S := int64(s.ShardingDegree)
	chunk := (P + S - 1) / S // the engine pads the flat buffer to a multiple of S
	var mm Memory
	mm.Params, mm.Grads, mm.Optimizer = 4*P, 4*P, 8*P
	if S > 1 {
		mm.Optimizer = 8 * chunk
		if s.ShardingStage < 3 {
			mm.Params += 4 * chunk // the all-gather's chunk (engine dataParallel.scratch)
		}
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
	if m.ReduceBF16 && s.Replicas()*s.cp() > 1 && (S == 1 || s.ShardingStage == 1) {
		mm.Grads += actBytes(m, lse) * P // the bfloat16 copy the buckets are summed in (engine dataParallel.half)
	}
	if s.PP > 1 && s.VPP > 1 {
		mm.Activations = engineInterleaved(m, s, st, lse)
	} else {
		mm.Activations = int64(inflight(m, s, st) * float64(engineActivations(m, s, st, lse)))
	}
	mm.Scratch = engineScratch(m, s, st, lse)
	mm.sum()
	return mm
}

// gpuMemory is the memory of a GPU training with the engine on the CUDA
// backend (kernels/cuda): the engine's own account of its buffers
// (engineMemory, with the backend's flash-style attention: one
// log-sum-exp per row and query head), plus, in Other, what the backend
// allocates beside them (cudaWorkspace) and the runtime's reserve (the
// CUDA context, NCCL's buffers: Device.ReservedBytes).
//
// The engine keeps parameters, gradients and AdamW moments in fp32 on a
// GPU as on the CPU, so the model states are 4 + 4 + 8 bytes a
// parameter, divided by sharding exactly as on the CPU; under bf16 the
// activations are 2 bytes each (kernels.ActivationBytes).
func gpuMemory(m Model, c Cluster, s Strategy, st int) Memory {
	mm := engineMemory(m, s, st, true)
	mm.Other = c.Device.ReservedBytes + cudaWorkspace(m, s, st)
	mm.sum()
	return mm
}

// cudaWorkspace is the device memory the CUDA backend allocates beyond
// the engine's buffers (kernels/cuda/backend.go, Backend.WorkspaceBytes):
// the cuBLAS and cuBLASLt workspace (cuda.WorkspaceBytes), Sum's partials
// (cuda.SumScratch), and, when the GEMMs multiply in 16 bits, the scratch
// buffers their float32 operands are rounded into (Backend.operand),
// 2 bytes an element, each as large as the largest operand it has held
// (they only grow), over the GEMMs of stage st (rankGEMMs):
//
//   - fp16, whose activations are float32: A the input (forward) or the
//     output gradient (backward, both products), n·max(in, out)
//     elements; B the weight (forward, input gradient) or the input
//     (weight gradient), max(out·in, n·in);
//   - bf16, whose activations are bfloat16 and read as they are: no A,
//     and no B either but under sharding stage 3, whose GEMMs read the
//     weights from gather buffers (B the weights, out·in): elsewhere the
//     backend rounds the stage's parameters once into a copy of 2 bytes
//     each (kernels.CopyWeights), which the GEMMs read. Besides, the bias of a GEMM into activations
//     rounded for cuBLASLt's bias epilogue (qkv and fc, a GPT-2's: its
//     width), attention's dq summed in float32 beside a bfloat16 dqkv
//     (n·C/mp; not under context parallelism, whose ring sums in the
//     engine's own float32 buffers) and the flash kernels' backward
//     scratch (delta, a float per row and head).
//
// Where cuBLASLt refuses an epilogue (or GPTUI_CUBLASLT_EPILOGUES=off),
// the backend's float32 product of the GEMM, at most n·max(qkv, fc)
// floats, comes on top (gpu check says so).
func cudaWorkspace(m Model, s Strategy, st int) int64 {
	n := int64(cuda.WorkspaceBytes + cuda.SumScratch)
	if !m.sixteenBit() {
		return n // fp32 GEMMs: no rounding, no cast buffers
	}
	gs := rankGEMMs(m, s, st)
	var a, b int64
	if m.Dtype != "bf16" {
		for _, g := range gs {
			a = max(a, g.n*max(g.in, g.out))
			b = max(b, g.out*g.in, g.n*g.in)
		}
		return n + 2*(a+b)
	}
	if !m.weightCopy(s) {
		for _, g := range gs {
			b = max(b, g.out*g.in)
		}
		n += 2 * b
	} else {
		n += 2 * stageParams(m, s, st)
	}
	N := int64(s.MicroBatch) * int64(m.SeqLen) / int64(s.cp())
	if m.flash(s) {
		n += 4 * int64(cuda.FlashDeltaFloats(s.MicroBatch, m.NH/s.MP, m.SeqLen))
	}
	if w := m.blockWidths(s.MP); !m.llama() {
		n += 2 * max(w.qkv, w.fc)
	}
	if s.cp() == 1 {
		n += 4 * N * int64(m.C/s.MP)
	}
	return n
}

// gemm is one linear layer of the engine on a rank: n rows of in features
// to out features (a GEMM of n × in by in × out forward, two like it
// backward), with a bias or without.
type gemm struct {
	n, in, out int64
	bias       bool
}

// rankGEMMs are the linear layers of one block and, on the last stage,
// the head's logits, as a rank of stage st multiplies them for one
// micro-batch (engine/gpt2.go and llama.go blockForward, classify): N =
// B·T/cp rows (all of them under sequence parallelism, whose regions
// gather them), the widths of blockWidths; the last element is the
// logits' when st is the last stage, of one chunk of the head's rows
// (headRows, on the GPU).
func rankGEMMs(m Model, s Strategy, st int) []gemm {
	N := int64(s.MicroBatch) * int64(m.SeqLen) / int64(s.cp())
	C, t := int64(m.C), int64(s.MP)
	w := m.blockWidths(s.MP)
	bias := !m.llama()
	g := []gemm{
		{N, C, w.qkv, bias}, // qkv (column-parallel)
		{N, C / t, C, bias}, // attention projection (row-parallel)
		{N, C, w.fc, bias},  // fc, or a Llama's gate and up (column-parallel)
		{N, w.act, C, bias}, // fcproj, or down_proj (row-parallel)
	}
	if st == s.PP-1 {
		g = append(g, gemm{headRows(m, s, true), C, int64(m.Vp) / t, false}) // logits over the rank's padded vocabulary
	}
	return g
}

// widths are the per-row widths of a block's tensors on one of t
// tensor-parallel ranks (the engine's blockWidths): qkv's, the MLP's
// first product's (fc, or a Llama's gate and up) and its activation's
// (GELU's, or SwiGLU's), and how many statistics each norm keeps a row.
type widths struct{ qkv, fc, act, stats int64 }

// blockWidths are the widths of a block on one of t tensor-parallel
// ranks: GPT-2's qkv is 3C/t wide, its MLP keeps fc's and GELU's F/t
// outputs and its LayerNorms a mean and a reciprocal standard deviation;
// a Llama's qkv is C/t + 2·(key/value width) (kvWidthTP: a replicated
// head's columns on every rank that holds it), its MLP keeps gate and up
// (2F/t) and their SwiGLU (F/t), its RMSNorms the reciprocal alone.
func (m Model) blockWidths(t int) widths {
	C, F, T := int64(m.C), int64(m.F), int64(t)
	if m.llama() {
		return widths{qkv: C/T + 2*m.kvWidthTP(t), fc: 2 * F / T, act: F / T, stats: 1}
	}
	return widths{qkv: 3 * C / T, fc: F / T, act: F / T, stats: 2}
}

// sixteenBit reports whether the GEMMs multiply in 16 bits (bf16, or fp16
// where there is no bf16): every dtype but fp32.
func (m Model) sixteenBit() bool { return m.Dtype != "fp32" && m.Dtype != "float32" }

// weightCopy reports whether the GPU backend's GEMMs read the weights of
// m under s from the bfloat16 copy made once a step (kernels.CopyWeights,
// engine Trainer.copyWeights): under bf16, but for sharding stage 3, whose
// GEMMs read the blocks' gather buffers.
func (m Model) weightCopy(s Strategy) bool {
	return m.Dtype == "bf16" && !(s.ShardingStage == 3 && s.ShardingDegree > 1)
}

// flash reports whether the GPU backend runs the attention of m under s
// on its tensor-core kernels (kernels/cuda flashattention.go): bf16
// GEMMs, a head size of 64 or 128, no attention dropout, and one
// process's attention (context parallelism's ring has its own, fp32).
func (m Model) flash(s Strategy) bool {
	hd := m.C / m.NH
	return m.Dtype == "bf16" && (hd == 64 || hd == 128) && !m.AttnDropout && s.cp() == 1
}

// engineInterleaved is the engine's activation memory on stage st under the
// interleaved schedule: it keeps one set per (micro-batch, chunk) in
// flight, each the residual stream and blocks of one chunk of
// layers/(pp·vpp) blocks (engine/pipeline.go). The schedule runs `warm`
// forward passes, then alternates, so warm+1 sets are live at the peak
// (all of them when warm covers the step); on the last stage exactly one
// of them is the last chunk, with the head's buffers.
func engineInterleaved(m Model, s Strategy, st int, lse bool) int64 {
	mb := m.GlobalBatch / s.Replicas() / s.MicroBatch
	total := mb * s.VPP
	warm := total
	if mb != s.PP {
		warm = min((s.PP-st-1)*2+(s.VPP-1)*s.PP, total)
	}
	live := int64(min(warm+1, total))
	chunk := s
	chunk.PP = s.PP * s.VPP // a stage of one chunk's blocks …
	perChunk := engineActivations(m, chunk, 0, lse)
	if st < s.PP-1 {
		return live * perChunk
	}
	last := engineActivations(m, chunk, chunk.PP-1, lse) // … with the head's buffers
	return (live-1)*perChunk + last
}

// engineActivations is the bytes of the activations the engine keeps
// between the forward and backward pass of one micro-batch on stage st
// (engine/gpt2.go newActivations: the residual stream, each block's norm
// outputs and statistics, qkv, attention output, the MLP's two tensors,
// what the attention keeps, the final norm, the head's input gradient
// and the losses; the head's logits are scratch, a chunk of rows at a
// time: engineScratch), with the family's widths
// (blockWidths).
//
// The rows (rankRows): a context-parallel rank holds N = B·T/cp of them
// (its chunks of every sequence), and under sequence parallelism its
// Nr = N/mp rows of the residual stream between the tensor-parallel
// regions (the stream itself, the norms' outputs and statistics, res2),
// all N inside them (qkv, the attention output, the MLP's tensors, the
// head's input gradient). What the attention keeps: attentionFloats.
//
// The layers' outputs are activations, actBytes each; the statistics, the
// attention's store, the losses and the head's input gradient float32s.
func engineActivations(m Model, s Strategy, st int, lse bool) int64 {
	C := int64(m.C)
	L := int64(m.L / s.PP)
	N, Nr := rankRows(m, s)
	w := m.blockWidths(s.MP)
	act, f32 := (L+1)*Nr*C, int64(0) // resid: block inputs and the stage's output
	if s.Recompute != RecomputeFull {
		a, f := blockFloats(m, s)
		act, f32 = act+L*a, f32+L*f
	}
	if s.Recompute == RecomputeNone {
		f32 += L * attentionFloats(m, s, lse)
	}
	if st == s.PP-1 {
		act += Nr * C               // final norm
		f32 += w.stats*Nr + N + N*C // its statistics, the losses, the head's input gradient
	}
	return actBytes(m, lse)*act + 4*f32
}

// blockBytes is what one block keeps of a micro-batch between its
// forward and backward pass under the strategy's recompute (engine
// Model.blockBytes): its input, unless it is recomputed whole its layers'
// outputs and statistics (blockFloats), unless attention is recomputed
// the attention's store.
func blockBytes(m Model, s Strategy, lse bool) int64 {
	C := int64(m.C)
	_, Nr := rankRows(m, s)
	act, f32 := Nr*C, int64(0)
	if s.Recompute != RecomputeFull {
		a, f := blockFloats(m, s)
		act, f32 = act+a, f
	}
	if s.Recompute == RecomputeNone {
		f32 += attentionFloats(m, s, lse)
	}
	return actBytes(m, lse)*act + 4*f32
}

// headRows is the rows of each chunk of the head's logits on the last
// stage (arch.HeadRows): no more logits than a block keeps.
func headRows(m Model, s Strategy, lse bool) int64 {
	N, _ := rankRows(m, s)
	Vpl := int64(m.Vp) / int64(s.MP) // the rank's columns of the padded vocabulary (engine dims.Vpl)
	return int64(arch.HeadRows(int(N), blockBytes(m, s, lse), actBytes(m, lse)*Vpl))
}

// actBytes is the memory of one of the engine's activations
// (kernels.ActivationBytes): 2 on the GPU under bf16, whose backend stores
// them in 16 bits (lse: the CUDA backend's accounting), else 4 — the
// CPU's bf16 activations are float32s rounded to bfloat16.
func actBytes(m Model, lse bool) int64 {
	if lse && m.Dtype == "bf16" {
		return 2
	}
	return 4
}

// rankRows are the rows of a micro-batch a rank holds: N = B·T/cp (a
// context-parallel rank's chunks of every sequence), and Nr of them of
// the residual stream between the tensor-parallel regions (N/mp under
// sequence parallelism).
func rankRows(m Model, s Strategy) (N, Nr int64) {
	N = int64(s.MicroBatch) * int64(m.SeqLen) / int64(s.cp())
	Nr = N
	if s.SP {
		Nr = N / int64(s.MP)
	}
	return N, Nr
}

// blockFloats is what one block keeps for its backward pass but the
// attention's store (engine/gpt2.go newLayerActs): activations — ln1,
// res2, ln2 (Nr rows of C); qkv, the attention output, the MLP's two
// tensors (N rows, split over mp) — and float32s, the norms' statistics.
func blockFloats(m Model, s Strategy) (act, f32 int64) {
	C, t := int64(m.C), int64(s.MP)
	N, Nr := rankRows(m, s)
	w := m.blockWidths(s.MP)
	return 3*Nr*C + N*(w.qkv+C/t+w.fc+w.act), 2 * w.stats * Nr
}

// attentionFloats is what one block's attention keeps
// (kernels.AttentionFloats), per query head of the rank: the T×T
// probabilities of the CPU backend's attention; one log-sum-exp per row
// where the attention is flash-style — lse, the CUDA backend's
// (kernels.AttentionStore) — and under context parallelism, whose ring
// attention is flash-style on every backend.
func attentionFloats(m Model, s Strategy, lse bool) int64 {
	B, T, NHl := int64(s.MicroBatch), int64(m.SeqLen), int64(m.NH/s.MP)
	if s.cp() > 1 || lse {
		N, _ := rankRows(m, s)
		return N * NHl
	}
	return B * NHl * T * T
}

// engineScratch is the bytes of the buffers the engine's passes of every
// micro-batch share on a rank of stage st (engine.Trainer.Memory's
// Scratch), as the engine allocates them — float32s, and activations
// (their gradients, gathered norm outputs) at actBytes:
//
//   - the model's scratch (engine/gpt2.go newScratch): a branch output
//     and a region's input gradient (N rows of C), the residual stream's
//     gradient (Nr rows), the gradients of qkv, of the attention output
//     and of fc's output (N rows, split), and a Llama's of SwiGLU's
//     output (GPT-2's GELU backward is fcproj's epilogue); a Llama's qkv weight
//     gradient of one block where its key/value heads are replicated;
//     under sequence parallelism the norms' weight gradients (4·C); under
//     recompute `full` the block being rebuilt (blockFloats), under either
//     recompute the attention's store of one block (attentionFloats);
//   - sequence parallelism's own buffers (engine/sequenceparallel.go):
//     gathered rows (N·C) and a rank's rows of a sum (Nr·C), two of each;
//   - on the first stage under tensor parallelism the vocabulary-parallel
//     embedding's float32 sum (N·C, engine/tensorparallel.go);
//   - on the last stage one chunk of the head's logits (headRows rows of
//     the rank's padded vocabulary), and under tensor parallelism the
//     vocabulary-parallel loss's exchange buffers for a chunk
//     (engine/tensorparallel.go): the row maxima and every rank's, and two
//     float64 sums a row;
//   - context parallelism's ring (engine/contextparallel.go): two
//     key/value blocks and their gradients (N rows × both widths each),
//     the online softmax's two statistics and backward's delta (per row
//     and query head), the float32 sums of the attention's output and of
//     qkv's gradient (N rows of the query heads' width, and of qkv's),
//     and on a GPT-2's first stage the rank's rows of wpe and of its
//     gradient;
//   - a pipeline stage that receives gradients (all but the last, every
//     one when interleaved) a second residual-gradient buffer (Nr·C,
//     engine/pipeline.go dnext).
func engineScratch(m Model, s Strategy, st int, lse bool) int64 {
	C, t := int64(m.C), int64(s.MP)
	N, Nr := rankRows(m, s)
	w := m.blockWidths(s.MP)
	// act: activations (actBytes each); n: float32s.
	act := Nr*C + N*(w.qkv+C/t+w.fc) // dresid; dqkv, datty, dfch
	if m.llama() {
		act += N * w.act // dfchG, SwiGLU's output gradient (GPT-2's GELU backward is a GEMM's epilogue)
	}
	n := 2 * N * C // proj, dln
	if m.HiddenDropout {
		act += Nr * C // dy
	}
	if m.kvCopies(s.MP) > 1 {
		n += w.qkv * C // dqkvw
	}
	if s.SP {
		n += 4 * C // dnorm
	}
	if s.Recompute == RecomputeFull {
		a, f := blockFloats(m, s)
		act, n = act+a, n+f
	}
	if s.Recompute != RecomputeNone {
		n += attentionFloats(m, s, lse)
	}
	if s.SP {
		act += 2 * N * C // gathered norm outputs and output gradients
		n += 2 * Nr * C  // a rank's rows of two sums
	}
	if s.MP > 1 && st == 0 {
		n += N * C // the embedding's sum
	}
	if cp := s.cp(); cp > 1 {
		NHl := int64(m.NH / s.MP)
		n += 4*N*2*m.kvWidthTP(s.MP) + 3*N*NHl + N*(C/t+w.qkv)
		if st == 0 && !m.llama() {
			n += 2 * int64(m.SeqLen/cp) * C // wpe's rows and their gradient
		}
	}
	if s.PP > 1 && (s.VPP > 1 || st < s.PP-1) {
		act += Nr * C // dnext, as dresid
	}
	var r int64 // the head's rows a chunk, on the last stage
	if st == s.PP-1 {
		r = headRows(m, s, lse)
		act += r * int64(m.Vp) / t // one chunk of the head's logits
	}
	b := actBytes(m, lse)*act + 4*n
	if s.MP > 1 && st == s.PP-1 {
		b += 4*r*(1+t) + 8*2*r // a chunk's maxima, every rank's, the sums
	}
	return b
}

// gemmTime is the time of a product of rows × (2·flops/rows) on one
// device: flops at the device's rate, slowed for few rows.
func gemmTime(c Cluster, flops, rows float64) float64 {
	d := c.Device
	eff := rows / (rows + d.GEMMHalfRows)
	return flops / (d.GEMMFLOPS * c.share() * eff)
}

// passTime is one micro-batch's computation on the last pipeline stage
// (the slowest: it adds the logits), by part, in seconds.
type passTime struct {
	layerFwd, layerBwd float64 // one block's GEMMs and other kernels but attention
	attnFwd, attnBwd   float64 // one block's attention
	headFwd, headBwd   float64 // the logits' GEMM and the final norm
	classifier         float64 // the softmax cross-entropy, forward and gradient in one pass
}

// fwd is the forward pass of the stage's L blocks and the head.
func (p passTime) fwd(L float64) float64 { return L*(p.layerFwd+p.attnFwd) + p.headFwd }

// bwd is the backward pass of the stage's L blocks and the head.
func (p passTime) bwd(L float64) float64 { return L*(p.layerBwd+p.attnBwd) + p.headBwd }

// measuredPass is a micro-batch's computation on a device of measured
// rates (the CPU's): the forward GEMM FLOPs at the achieved rate, slowed
// for few rows, the backward pass twice the forward, the classifier at
// its measured rate.
func measuredPass(m Model, c Cluster, s Strategy) passTime {
	B, T, C := float64(s.MicroBatch), float64(m.SeqLen), float64(m.C)
	V, tp, cp := float64(m.V), float64(s.MP), float64(s.cp())
	rows := B * T / cp // the rank's rows of a micro-batch
	var p passTime
	p.layerFwd = gemmTime(c, 2*rows*float64(m.layerMatmulTP(s.MP)), rows)
	p.attnFwd = gemmTime(c, 4*B*T*T*C/(tp*cp), T/cp)
	p.headFwd = gemmTime(c, 2*rows*C*V/tp, rows)
	p.layerBwd, p.attnBwd, p.headBwd = 2*p.layerFwd, 2*p.attnFwd, 2*p.headFwd
	if r := c.Device.ClassifierPerS; r > 0 {
		p.classifier = rows * V / tp / (r * c.share())
	}
	return p
}

// rooflinePass is a micro-batch's computation on an accelerator running
// the engine's CUDA backend, each kernel priced by the roofline: the
// larger of its FLOPs at the data sheet's peak and the bytes it moves at
// the memory bandwidth (Device.MemBW), kernels one after another on one
// stream. The dtypes are the engine's (kernels/activations.go,
// kernels/cuda/backend.go): under bf16 the activations and their
// gradients are bfloat16 (ab, 2 bytes), but for the row-parallel GEMMs'
// output (proj) and the column-parallel GEMMs' input gradient (dln),
// which stay float32; under fp16 and fp32 every activation is float32.
//
//   - GEMMs (rankGEMMs; forward, and backward the input's gradient and
//     the weight's, accumulated) multiply at the tensor cores' peak
//     (PeakFLOPS) with 16-bit dtypes, reading 2 bytes an operand element:
//     a bfloat16 activation as it is, a weight under bf16 from the copy
//     made once a step (but under sharding stage 3), any other float32
//     operand (under fp16 every operand) first rounded into scratch by a
//     cast kernel of its own (reads 4 bytes, writes 2). They store their
//     output at its dtype's size (the weight gradient float32, read and
//     written: β = 1). fp32 GEMMs read and write 4 bytes at the CUDA
//     cores' FP32FLOPS, without casts.
//   - Biases (a GPT-2's): into bfloat16 activations (qkv, fc) in
//     cuBLASLt's epilogue, free; into float32 (proj, and every GEMM under
//     fp16 and fp32) a kernel of its own, reading and writing the output;
//     backward, a kernel reading the output's gradient.
//   - A GPT-2's GELU under bf16: in fc's epilogue (cuBLASLt's
//     GELU_AUX_BIAS), which stores GELU's input beside its output, and
//     backward in the epilogue of fcproj's input gradient (DGELU), which
//     reads that input: no kernel of its own. Under fp16 and fp32 a
//     kernel forward (read, write) and backward in place over the input
//     gradient (read it and GELU's input, write).
//   - Attention: the backend's flash-style kernels, causal, 4·B·T²·C/2
//     FLOPs forward a block (over tp ranks of the heads, and cp of the
//     rows), 2.5 times that backward: on the tensor cores (PeakFLOPS)
//     where the backend runs its flash kernels (bf16, head size 64 or
//     128, no attention dropout, no context parallelism: Model.flash),
//     else in fp32 on the CUDA cores (FP32FLOPS); their bytes are qkv,
//     the output (ab each), the log-sum-exps (4) and, backward, the
//     gradients.
//   - Elementwise kernels, by their bytes, each argument read or written
//     once at the activations' size (ab; the float32 branch output that
//     the residual adds read is counted at ab too, an underestimate of 2
//     bytes an element under bf16): the norms (read the input, write the
//     output; backward read the gradient and input, accumulate into the
//     input's gradient), the fused residual add and norm, the residual
//     add, GELU or SwiGLU, a Llama's rotary embedding on q and k, dropout
//     where the model has it.
//   - The classifier: the fused softmax cross-entropy reads the logits
//     and writes their gradient in place (the vocabulary-parallel one
//     reads them three times: maxima, exponentials, gradient).
func rooflinePass(m Model, c Cluster, s Strategy) passTime {
	d := c.Device
	bw := d.MemBW
	B, T, C := float64(s.MicroBatch), float64(m.SeqLen), float64(m.C)
	tp, cp := float64(s.MP), float64(s.cp())
	N := B * T / cp // the rank's rows of a micro-batch
	Nr := N         // … of the residual stream
	if s.SP {
		Nr = N / tp
	}
	sixteen, bf16 := m.sixteenBit(), m.Dtype == "bf16"
	peak, e := d.PeakFLOPS, 2.0 // the bytes a GEMM reads of an operand element
	if !sixteen {
		peak, e = d.FP32FLOPS, 4
	}
	ab := 4.0 // the bytes of an activation
	if bf16 {
		ab = 2
	}
	// cast is the bytes of rounding x float32 elements to 16 bits; half
	// says that they are bfloat16 activations already.
	cast := func(x float64, half bool) float64 {
		if !sixteen || half {
			return 0
		}
		return 6 * x
	}
	// copied says that the GEMMs read the weights from the bfloat16 copy
	// made once a step (kernels.CopyWeights; its cost: stepTime), not
	// each cast first: under bf16 but for sharding stage 3.
	copied := m.weightCopy(s)
	// out is the bytes of storing x outputs: 2 into bfloat16 activations.
	out := func(x float64, half bool) float64 {
		if half {
			return 2 * x
		}
		return 4 * x
	}
	roof := func(flops, bytes, rate float64) float64 { return math.Max(flops/rate, bytes/bw) }
	// pair prices a GEMM forward and backward. col: column-parallel (qkv,
	// fc) or the logits, whose input, output and output gradient are
	// activations and input gradient float32; else row-parallel (proj),
	// whose input and both gradients are activations and output float32.
	// auxFwd and auxBwd are the bytes of an epilogue's auxiliary matrix
	// (GELU's input) that the forward GEMM writes and the input
	// gradient's reads.
	pair := func(g gemm, col bool, auxFwd, auxBwd float64) (fwd, bwd float64) {
		n, in, o := float64(g.n), float64(g.in), float64(g.out)
		f := 2 * n * in * o
		inH, outH, doutH := bf16, bf16 && col, bf16 // the input; the output; its gradient
		dinH := bf16 && !col                        // the input's gradient
		fwd = roof(f, e*(n*in+o*in)+out(n*o, outH)+auxFwd, peak) + (cast(n*in, inH)+cast(o*in, copied))/bw
		bwd = roof(f, e*(n*o+o*in)+out(n*in, dinH)+auxBwd, peak) + (cast(n*o, doutH)+cast(o*in, copied))/bw + // input gradient
			roof(f, e*(n*o+n*in)+8*o*in, peak) + (cast(n*o, doutH)+cast(n*in, inH))/bw // weight gradient, accumulated
		if g.bias {
			if !outH { // else cuBLASLt's epilogue
				fwd += 8 * n * o / bw
			}
			bwd += out(n*o, doutH) / bw // the bias gradient reads the output's
		}
		return fwd, bwd
	}
	var p passTime
	gs := rankGEMMs(m, s, s.PP-1)
	geluEpilogue := bf16 && !m.llama() // GELU in fc's and fcproj's epilogues
	for i, g := range gs[:4] {
		var auxFwd, auxBwd float64
		switch {
		case geluEpilogue && i == 2: // fc stores GELU's input
			auxFwd = 2 * float64(g.n*g.out)
		case geluEpilogue && i == 3: // fcproj's input gradient reads it
			auxBwd = 2 * float64(g.n*g.in)
		}
		f, b := pair(g, i%2 == 0, auxFwd, auxBwd) // qkv and fc column-parallel, the projections row-parallel
		p.layerFwd += f
		p.layerBwd += b
	}
	// The head multiplies its rows a chunk at a time (engine classify):
	// each chunk reads the weights and accumulates their gradient again.
	head := gs[4]
	for r, rows := int64(0), head.n; r < int64(N); r += rows {
		g := head
		g.n = min(rows, int64(N)-r)
		f, b := pair(g, true, 0, 0)
		p.headFwd += f
		p.headBwd += b
	}

	// Elementwise kernels of a block, in elements read or written.
	w := m.blockWidths(s.MP)
	F := float64(w.act) // the MLP's activation width on this rank
	norm, normBwd := 2*Nr*C, 4*Nr*C
	fwd := norm + 4*Nr*C + 3*Nr*C // the first norm; the residual add fused with the second (two in, two out); the last residual add
	bwd := 2 * normBwd
	if m.llama() {
		rope := 2 * N * (C/tp + float64(m.kvWidthTP(s.MP))) // q and k, read and written
		fwd += 3*N*F + rope                                 // SwiGLU: gate and up in, the product out
		bwd += 5*N*F + rope
	} else if !geluEpilogue {
		fwd += 2 * N * F // GELU
		bwd += 3 * N * F // in place over fcproj's input gradient, from GELU's input
	}
	if m.HiddenDropout {
		fwd += 2 * 2 * Nr * C // the two branches' dropouts
		bwd += 2 * 2 * Nr * C
	}
	p.layerFwd += ab * fwd / bw
	p.layerBwd += ab * bwd / bw

	// Attention: the flash-style kernels, on the tensor cores where the
	// backend runs its flash kernels (Model.flash), else in fp32.
	NH := float64(m.NH)
	qkv, ao, lse := float64(w.qkv), C/tp, NH/tp
	af := 2 * B * T * T * C / (tp * cp) // 4·B·T²·(C/tp)/2, causal, over cp
	rate := d.FP32FLOPS
	if m.flash(s) {
		rate = d.PeakFLOPS
	}
	p.attnFwd = roof(af, N*(ab*(qkv+ao)+4*lse), rate)
	p.attnBwd = roof(2.5*af, N*(ab*(2*qkv+2*ao)+4*lse), rate)

	// The head: the final norm, and the classifier over the rank's
	// padded vocabulary.
	p.headFwd += ab * norm / bw
	p.headBwd += ab * normBwd / bw
	logits := N * float64(m.Vp) / tp
	if s.MP > 1 {
		p.classifier = 4 * ab * logits / bw
	} else {
		p.classifier = 2 * ab * logits / bw
	}
	return p
}

// stepTime predicts one optimizer step and the bytes a device sends.
//
// A context-parallel rank computes its rows, B·T/cp of a micro-batch, and
// 1/cp of the attention; the ranks of its ring pass keys and values around
// in every layer and sum their gradients with the replicas'.
func stepTime(m Model, c Cluster, s Strategy) (Time, float64) {
	var t Time
	C := float64(m.C)
	tp, cp := float64(s.MP), float64(s.cp())
	L := float64(m.L / s.PP)
	rows := float64(s.MicroBatch) * float64(m.SeqLen) / cp // the rank's rows of a micro-batch
	mb := float64(m.GlobalBatch / s.Replicas() / s.MicroBatch)

	// One micro-batch on the last stage (the slowest: it adds the logits).
	var pass passTime
	if c.Device.Accounting == AccountingEngineGPU {
		pass = rooflinePass(m, c, s)
	} else {
		pass = measuredPass(m, c, s)
	}
	fwd := pass.fwd(L)
	perMB := fwd + pass.bwd(L) + pass.classifier
	switch s.Recompute {
	case RecomputeFull:
		perMB += L * (pass.layerFwd + pass.attnFwd)
	case RecomputeOnlyAttn:
		perMB += L * pass.attnFwd
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
	// parallelism its input's gather and its gradient's reduce-scatter, 2
	// halves still: the head's backward runs in its forward pass, on the
	// rows it gathered), and the loss its
	// row maxima (all-gathered) and sums (two float64s a row,
	// all-reduced). Sequence parallelism all-reduces the norms' weight
	// gradients too, every micro-batch.
	// The engine sends fp32 on every backend: activations, their
	// gradients and the parameters' gradients.
	pb := 4.0
	act := rows * C * pb
	var sent float64
	if s.MP > 1 {
		halves, outer := 8.0, 2.0 // a block's, the head's
		if s.SP {
			halves, outer = 10, 2
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
		avg := perMB - (pass.headFwd+pass.headBwd+pass.classifier)*float64(s.PP-1)/float64(s.PP)
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
	gb := pb * P // gradient bytes (fp32, as the engine reduces them)
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
	bwdLast := pass.bwd(L) // the last micro-batch's backward, which the block all-reduces overlap
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
		rb := pb // the bytes of a summed gradient: bfloat16 on NCCL under reduce_dtype bf16
		if m.ReduceBF16 && c.Device.Accounting == AccountingEngineGPU {
			rb = 2
		}
		v := 2 * (R - 1) / R * rb * P
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
	if bw := c.Device.MemBW; bw > 0 && m.weightCopy(s) {
		// The weights' bfloat16 copy for the next step's GEMMs
		// (kernels.CopyWeights): each parameter read, and written in 16
		// bits.
		t.Optimizer += 6 * P / bw
	}
	return t, sent
}
