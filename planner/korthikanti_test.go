package planner

// Korthikanti et al.'s mixed-precision memory model, kept for the tests
// alone: the planner prices every device by gptui's engine (engineMemory,
// gpuMemory), and this model is what TestSeedMemoryFigures checks against
// the seeds' measurements of PaddlePaddle (a different engine, mixed
// precision as Megatron-LM does it) — evidence that the formula is
// implemented right, not a prediction of gptui's memory.

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
