package main

import (
	"fmt"

	"github.com/gptui/gptui/engine"
	"github.com/gptui/gptui/planner"
	"github.com/gptui/gptui/presets"
)

// checkMemory refuses, before anything is allocated, a CPU process that
// would hold more than it may: the lowest of this machine's memory, its
// cgroup's limit and what its address-space limit (ulimit -v) leaves
// (planner.ProcessMemLimit). The bytes need picks come from the engine's
// own accounting of one process of cfg's layout over world processes (the
// planner's engine model, checked against engine.Trainer.Memory). what
// says what the process does. A layout the planner finds invalid (its
// memory is not estimated) is left to the engine, which says why; so is a
// process whose limit is unknown. Config and plan commands do not call it:
// a launcher plans jobs bigger than itself.
func checkMemory(cfg *presets.Config, s planner.Strategy, world int, what string, need func(planner.Memory) int64) error {
	if cfg.Global.Device != "cpu" {
		return nil
	}
	limit := planner.ProcessMemLimit()
	if limit.Bytes <= 0 {
		return nil
	}
	dev, err := planner.LookupDevice("CPU")
	if err != nil {
		return err
	}
	p := planner.Estimate(planner.ModelOf(cfg), planner.Cluster{Nodes: 1, DevicesPerNode: world, Device: dev}, s)
	if n := need(p.Mem); n > limit.Bytes {
		m := p.Mem
		return &engine.ConfigError{Msg: fmt.Sprintf("%s needs %.1f GiB (parameters %.1f, gradients %.1f, optimizer %.1f, activations %.1f GiB by the engine's accounting), more than %s; lower Model.num_layers, Model.hidden_size, Model.vocab_size, Global.micro_batch_size or Data.Train.dataset.max_seq_len, or split the model over more processes (Distributed.*)",
			what, gib(n), gib(m.Params), gib(m.Grads), gib(m.Optimizer), gib(m.Activations), limit.What)}
	}
	return nil
}

// gib is n bytes in GiB.
func gib(n int64) float64 { return float64(n) / (1 << 30) }
