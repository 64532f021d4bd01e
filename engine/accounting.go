package engine

// memory is the engine's account of the bytes this rank holds: parameters,
// gradients, optimizer state and the activations of the micro-batches in
// flight, by its layout. It is what the [memory] line logs and what the
// planner's model is checked against.
func (tr *Trainer) memory() Memory {
	m := tr.Model
	n := int64(4 * m.NumParams())
	mem := Memory{Params: n, Grads: n, Optimizer: int64(4 * (len(tr.Opt.M) + len(tr.Opt.V)))}
	if tr.pp != nil {
		mem.Activations = tr.pp.activationBytes(m, tr.B, tr.T) // the micro-batches in flight
	} else {
		mem.Activations = int64(m.ActivationBytes(tr.B, tr.T))
	}
	if tr.topo.Stage >= 2 {
		mem.Grads += int64(4 * len(tr.dp.grads)) // the reduced shard, beside the full buffer backward accumulates into
	}
	if z := m.z3; z != nil {
		// Stage 3 holds its shard and the gather buffers of the outer
		// tensors and of one block, and the same of the gradients.
		mem.Params = int64(4 * z.resident())
		mem.Grads = int64(4 * (len(z.grads) + len(z.gouter) + len(z.gblock)))
	}
	return mem
}

// flopsPerToken is the training FLOPs per token of model c at sequence
// length T: 6·N for the matrix multiplies of forward and backward (N: every
// parameter but the position embedding and the padded vocabulary rows)
// plus 6·L·C·T for attention's scores and weighted sums (causal, so half
// of 12·L·C·T).
func flopsPerToken(c ModelConfig, T int) float64 {
	_, total := Layout(c)
	N := total - c.MaxT*c.C - (c.Vp-c.V)*c.C
	return 6*float64(N) + 6*float64(c.L*c.C*T)
}
