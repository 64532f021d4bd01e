package engine

import "github.com/gptui/gptui/presets"

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
	if z := m.stage3; z != nil {
		// Stage 3 holds its shard and the gather buffers of the outer
		// tensors and of one block, and the same of the gradients.
		mem.Params = int64(4 * z.resident())
		mem.Grads = int64(4 * (len(z.grads) + len(z.gouter) + len(z.gblock)))
	}
	return mem
}

// StartupMemory is the engine's account of what rank of a world-rank job
// of cfg holds from its start: the parameters, gradients and optimizer
// state of its part of the model (its tensor-parallel slice of its
// pipeline stage's blocks), sharded as the layout says — the fields of
// [Trainer.Memory] but the activations, which the forward pass allocates.
// It is computed from the layout alone, with the rules that lay out the
// rank's buffers, allocating nothing of the model, so it can be asked of
// a job far larger than this machine. The shape is the config's
// (Model.*), not an init_from file's.
func StartupMemory(cfg *presets.Config, rank, world int) (Memory, error) {
	shape := ShapeOf(cfg)
	if err := shape.Validate(); err != nil {
		return Memory{}, &ConfigError{Err: err}
	}
	topo, err := NewTopology(cfg.Layout(), cfg.Batch(), shape, rank, world)
	if err != nil {
		return Memory{}, err
	}
	part := topo.part(shape)
	ts, n := PartTensors(shape, part)
	b := int64(4 * n)
	mem := Memory{Params: b, Grads: b, Optimizer: 2 * b}
	S := topo.Sharding
	if S <= 1 {
		return mem, nil
	}
	// The moments of the rank's shard: as many as its spans reach.
	moments := func(spans []Span) int64 {
		k := 0
		for _, s := range spans {
			k = max(k, s.At+s.N)
		}
		return int64(8 * k)
	}
	if topo.Stage == 3 {
		units, length := stage3Units(ts, len(part.Layers), S)
		held := length + S*units[0].piece // the shard, the outer tensors' gather buffer …
		if len(units) > 1 {
			held += S * units[1].piece // … and one block's
		}
		mem.Params, mem.Grads = int64(4*held), int64(4*held)
		mem.Optimizer = moments(unitSpans(units, topo.ShardIndex))
		return mem, nil
	}
	chunk, spans := flatShards(n, S)
	mem.Optimizer = moments(spans[topo.ShardIndex])
	if topo.Stage == 2 {
		mem.Grads += int64(4 * chunk) // the reduced shard
	}
	return mem, nil
}
