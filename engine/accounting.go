package engine

import (
	"github.com/gptui/gptui/kernels"
	"github.com/gptui/gptui/presets"
)

// memory is the engine's account of the bytes this rank holds: parameters,
// gradients, optimizer state, the activations of the micro-batches in
// flight and the scratch their passes share, by its layout. It is what
// the [memory] line logs and what the planner's model is checked against.
func (tr *Trainer) memory() Memory {
	m := tr.Model
	n := int64(4 * m.NumParams())
	mem := Memory{Params: n, Grads: n, Optimizer: int64(4 * (len(tr.Opt.M) + len(tr.Opt.V)))}
	T := tr.T / tr.topo.CP // a context-parallel rank's rows of each sequence
	if tr.pp != nil {
		mem.Activations = tr.pp.activationBytes(m, tr.B, T) // the micro-batches in flight
	} else {
		mem.Activations = int64(m.ActivationBytes(tr.B, T))
	}
	mem.Scratch = tr.scratchBytes(T) // allocated with the activations above
	if tr.dp != nil {
		mem.Params += int64(4 * len(tr.dp.scratch)) // stages 1 and 2: the chunk the updated parameters are all-gathered from
	}
	if tr.topo.Stage >= 2 {
		mem.Grads += int64(4 * len(tr.dp.grads)) // the reduced shard, beside the full buffer backward accumulates into
	}
	if tr.dp != nil {
		mem.Grads += int64(kernels.ActivationBytes(tr.be) * len(tr.dp.half)) // the bfloat16 copy the buckets are summed in
	}
	if z := m.stage3; z != nil {
		// Stage 3 holds its shard and the gather buffers of the outer
		// tensors and of one block, and the same of the gradients.
		mem.Params = int64(4 * z.resident())
		mem.Grads = int64(4 * (len(z.grads) + len(z.gouter) + len(z.gblock)))
	}
	return mem
}

// scratchBytes is the bytes of the buffers every micro-batch's passes
// share, for the rank's (tr.B, T) micro-batches (T its rows of each
// sequence): the model's scratch as newScratch allocated it (the backward
// pass's buffers, and what is recomputed rather than kept: the block
// being rebuilt, the attention's store), and the layout's own buffers,
// which the layouts allocate at their first use and reuse, counted here
// from the shapes they are sized from — sequence parallelism's gathered
// and scattered rows, the vocabulary-parallel embedding's sum on the
// embedding's stage and the loss's exchange buffers for a chunk of the
// head's rows on the head's stage,
// context parallelism's ring, the pipeline's second gradient buffer. The model's scratch must exist: allocated with the
// activations (ActivationBytes, pipeline.activationBytes).
func (tr *Trainer) scratchBytes(T int) int64 {
	m := tr.Model
	n := m.scratch.bytes
	N, C := tr.B*T, m.Cfg.C
	if m.tp != nil {
		if m.Part.Embed {
			n += int64(4 * embedFloats(N, C))
		}
		if m.Part.SP {
			_, nr := m.par.rows(N)
			n += spBufferBytes(N, nr, C, kernels.ActivationBytes(tr.be))
		}
		if m.Part.Head {
			n += m.tp.crossEntropyBytes(m.scratch.headRows)
		}
	}
	if m.cp != nil {
		n += m.cp.bufferBytes(tr.B, T, C, m.attnShape(), m.Part.Embed && !m.Cfg.llama())
	}
	if tr.pp != nil {
		n += tr.pp.dnextBytes(m)
	}
	return n
}

// StartupMemory is the engine's account of what rank of a world-rank job
// of cfg holds from its start: the parameters, gradients and optimizer
// state of its part of the model (its tensor-parallel slice of its
// pipeline stage's blocks), sharded as the layout says — the fields of
// [Trainer.Memory] but the activations and the scratch, which the forward
// pass allocates.
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
	k := 0
	for _, s := range optimizerSpans(topo, ts, len(part.Layers), n) {
		k = max(k, s.At+s.N)
	}
	mem.Optimizer = int64(8 * k)
	if topo.Stage == 3 {
		units, length := stage3Units(ts, len(part.Layers), S)
		held := length + S*units[0].piece // the shard, the outer tensors' gather buffer …
		if len(units) > 1 {
			held += S * units[1].piece // … and one block's
		}
		mem.Params, mem.Grads = int64(4*held), int64(4*held)
		return mem, nil
	}
	chunk, _ := flatShards(n, S)
	mem.Params += int64(4 * chunk) // the chunk the updated parameters are all-gathered from
	if topo.Stage == 2 {
		mem.Grads += int64(4 * chunk) // the reduced shard
	}
	return mem, nil
}

// SaveCost is what a checkpoint costs one rank, by [SaveMemory].
type SaveCost struct {
	// Write is the bytes of tensor data the rank writes: the parameters
	// and both moments of its share (ckptwrite.go).
	Write int64
	// Host is the host memory an asynchronous save (or any save from a
	// device's memory) copies the share into; a synchronous save on the
	// CPU writes from the training buffers and copies nothing.
	Host int64
	// Block is the largest block copied out of the rank's buffers as it
	// is written (one not contiguous there): the buffer a synchronous
	// save on the CPU needs.
	Block int64
}

// SaveMemory is the engine's account of what a parallel save of cfg
// (ranks on one machine) costs rank of a world-rank job, from the layout
// alone, with the rules a save follows (writeRanges, saveBlocks), and
// allocating nothing of the model, like [StartupMemory].
func SaveMemory(cfg *presets.Config, rank, world int) (SaveCost, error) {
	shape := ShapeOf(cfg)
	if err := shape.Validate(); err != nil {
		return SaveCost{}, &ConfigError{Err: err}
	}
	topo, err := NewTopology(cfg.Layout(), cfg.Batch(), shape, rank, world)
	if err != nil {
		return SaveCost{}, err
	}
	part := topo.part(shape)
	ts, n := PartTensors(shape, part)
	held := optimizerSpans(topo, ts, len(part.Layers), n)
	ws := writeRanges(topo, held)
	var c SaveCost
	for _, w := range ws {
		c.Host += 3 * 4 * int64(w[1]-w[0])
	}
	saveBlocks(ts, part, shape.Tied(), []Span{{0, 0, n}}, ws, func(b saveBlock) {
		k := int64(4 * numel(b.shape))
		c.Write += 3 * k
		if !b.whole {
			c.Block = max(c.Block, k)
		}
	})
	return c, nil
}

// optimizerSpans are the spans of the flat layout of a rank's part (n
// elements, tensors ts, layers blocks) whose moments the rank at topo
// holds (AdamW.Spans): the whole part without sharding, its flat shard
// under stages 1 and 2, its piece of every unit under stage 3.
func optimizerSpans(topo Topology, ts []Tensor, layers, n int) []Span {
	S := topo.Sharding
	switch {
	case S <= 1:
		return []Span{{0, 0, n}}
	case topo.Stage == 3:
		units, _ := stage3Units(ts, layers, S)
		return unitSpans(units, topo.ShardIndex)
	}
	_, spans := flatShards(n, S)
	return spans[topo.ShardIndex]
}
