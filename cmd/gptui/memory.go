package main

import (
	"fmt"
	"os"

	"github.com/gptui/gptui/arch"
	"github.com/gptui/gptui/engine"
	"github.com/gptui/gptui/engine/data"
	"github.com/gptui/gptui/kernels/cuda"
	"github.com/gptui/gptui/planner"
	"github.com/gptui/gptui/presets"
	"github.com/gptui/gptui/units"
)

// refuseOver is the memory rule every check of this file applies, before
// anything of the size checked is allocated: a process that would hold
// need bytes, more than it may (the lowest of this machine's memory, its
// cgroup's limit and what its address-space limit, ulimit -v, leaves:
// planner.ProcessMemLimit), is refused with the one-line message say
// makes of the limit, bad input (exit 2). A process whose limit is
// unknown is left to run.
func refuseOver(need int64, say func(limit planner.MemLimit) string) error {
	limit := planner.ProcessMemLimit()
	if limit.Bytes <= 0 || need <= limit.Bytes {
		return nil
	}
	return &engine.ConfigError{Msg: say(limit)}
}

// checkMemory refuses a CPU process of cfg that would hold more than it
// may (refuseOver). The bytes need picks come from the engine's own
// accounting of one process of cfg's layout over world processes (the
// planner's engine model, checked against engine.Trainer.Memory). what
// says what the process does. A layout the planner finds invalid (its
// memory is not estimated) is left to the engine, which says why. Config
// and plan commands do not call it: a launcher plans jobs bigger than
// itself.
func checkMemory(cfg *presets.Config, s planner.Strategy, world int, what string, need func(planner.Memory) int64) error {
	return checkModelMemory(cfg, planner.ModelOf(cfg), s, world, what, configFix, need)
}

// configFix says how to make a config's model smaller.
const configFix = "lower Model.num_layers, Model.hidden_size, Model.vocab_size, Global.micro_batch_size or Data.Train.dataset.max_seq_len, or split the model over more processes (Distributed.*)"

// checkModelMemory is checkMemory for the model of shape m (the config's,
// or that of a file the config names), fix saying what to do.
func checkModelMemory(cfg *presets.Config, m planner.Model, s planner.Strategy, world int, what, fix string, need func(planner.Memory) int64) error {
	if cfg.Global.Device != "cpu" {
		return nil
	}
	mem, err := engineMemory(m, s, world)
	if err != nil {
		return err
	}
	return refuseOver(need(mem), func(limit planner.MemLimit) string {
		return fmt.Sprintf("%s needs %s, more than %s; %s", what, memoryWords(need(mem), mem), limit.What, fix)
	})
}

// engineMemory is the engine's own accounting of one process of the model
// m in the layout s over world processes (the planner's engine model,
// checked against engine.Trainer.Memory): the buffers it allocates on the
// CPU.
func engineMemory(m planner.Model, s planner.Strategy, world int) (planner.Memory, error) {
	dev, err := planner.LookupDevice("CPU")
	if err != nil {
		return planner.Memory{}, err
	}
	return planner.Estimate(m, planner.Cluster{Nodes: 1, DevicesPerNode: world, Device: dev}, s).Mem, nil
}

// gpuMemory is engineMemory on a GPU (the planner's engine-gpu
// accounting, checked against the engine with the CUDA backend's
// attention): the same buffers but attention's, which keeps one
// log-sum-exp per row and head rather than the T×T probabilities, and
// the backend's own workspaces. It leaves out the CUDA context and the
// runtime's reserve, which a device's free memory (cuMemGetInfo, once the
// context is made) no longer holds. Any GPU profile gives it: the account
// does not depend on the device.
func gpuMemory(m planner.Model, s planner.Strategy, world int) (planner.Memory, error) {
	dev, err := planner.LookupDevice("H100-80G")
	if err != nil {
		return planner.Memory{}, err
	}
	mem := planner.Estimate(m, planner.Cluster{Nodes: 1, DevicesPerNode: world, Device: dev}, s).Mem
	mem.Other -= dev.ReservedBytes
	mem.Total -= dev.ReservedBytes
	return mem, nil
}

// memoryWords says need bytes of mem and their parts: "52.9 GiB
// (parameters 6.6 GiB, gradients 6.6 GiB, optimizer 13.2 GiB, activations
// 25.3 GiB, scratch 1.2 GiB by the engine's accounting)".
func memoryWords(need int64, mem planner.Memory) string {
	return fmt.Sprintf("%s (parameters %s, gradients %s, optimizer %s, activations %s, scratch %s by the engine's accounting)",
		units.Bytes(need), units.Bytes(mem.Params), units.Bytes(mem.Grads), units.Bytes(mem.Optimizer), units.Bytes(mem.Activations), units.Bytes(mem.Scratch))
}

// trainModel is the model a training process of cfg builds: the shape of
// the llm.c model file Model.init_from names, where it names one, else the
// config's (a gptui checkpoint that init_from names must have the config's
// shape); with what and fix, the words of a refusal. The file's header is
// read, and checked against the file's size, before anything of the model
// is allocated; its errors are the engine's.
func trainModel(cfg *presets.Config) (m planner.Model, what, fix string, err error) {
	m, what, fix = planner.ModelOf(cfg), "each training process", configFix
	file := cfg.Model.InitFrom
	if fi, err := os.Stat(file); file == "" || cfg.Model.Llama() || err == nil && fi.IsDir() {
		return m, what, fix, nil
	}
	shape, err := engine.LLMCShape(file)
	if err != nil {
		return m, what, fix, err
	}
	m.Shape = shape.Shape
	return m, fmt.Sprintf("%s, of the model of Model.init_from %s (%s)", what, file, shapeWords(shape.Shape)),
		"init from a smaller model file, or split the model over more processes (Distributed.*)", nil
}

// checkTrainMemory is checkMemory for a training process of cfg on the
// CPU, one of world, of the model it builds (trainModel).
func checkTrainMemory(cfg *presets.Config, world int) error {
	if cfg.Global.Device != "cpu" {
		return nil // a GPU's memory is its own: newBackend checks it
	}
	m, what, fix, err := trainModel(cfg)
	if err != nil {
		return err
	}
	return checkModelMemory(cfg, m, planner.StrategyOf(cfg), world, what, fix, func(m planner.Memory) int64 { return m.Total })
}

// gpuNeed is what a training process of cfg, one of world, allocates on
// its GPU by the engine's accounting, and the refusal of a GPU with less
// free (the *cuda.MemoryError of cuda.New) as a one-line usage error.
func gpuNeed(cfg *presets.Config, world int) (need int64, refuse func(*cuda.MemoryError) error, err error) {
	m, what, fix, err := trainModel(cfg)
	if err != nil {
		return 0, nil, err
	}
	mem, err := gpuMemory(m, planner.StrategyOf(cfg), world)
	if err != nil {
		return 0, nil, err
	}
	return mem.Total, func(e *cuda.MemoryError) error {
		return &engine.ConfigError{Msg: fmt.Sprintf("Global.device=gpu: %s needs %s, and %s has %s free of %s; %s ('gptui plan' ranks the layouts that fit)",
			what, memoryWords(mem.Total, mem), e.Device, units.Bytes(e.Free), units.Bytes(e.Total), fix)}
	}, nil
}

// checkFileMemory refuses the model of shape c, read from file, when
// copies fp32 buffers of its parameters (the model's parameters and
// gradients, and any buffer the file is read into first) are more than
// the process may hold; doing says what the process does with it
// ("import").
func checkFileMemory(file string, c engine.ModelConfig, copies int, doing string) error {
	need := int64(copies) * 4 * c.Params()
	return refuseOver(need, func(limit planner.MemLimit) string {
		return fmt.Sprintf("%s %s: its model (%s) needs %s to %s (%d fp32 copies of its %d parameters: %s each), more than %s; %s it on a machine with more memory",
			doing, file, shapeWords(c.Shape), units.Bytes(need), doing, copies, c.Params(), units.Bytes(4*c.Params()), limit.What, doing)
	})
}

// shapeWords describes a model's shape for a message.
func shapeWords(s arch.Shape) string {
	fam := "GPT-2"
	if s.Family == arch.Llama {
		fam = "Llama"
	}
	return fmt.Sprintf("%s of %s parameters: %d layers, hidden %d, vocabulary %d", fam, units.Params(float64(s.Params())), s.L, s.C, s.Vp)
}

// loadTokenizer is data.LoadTokenizer with the tables the file implies
// checked against the memory rule (refuseOver) before they are built.
func loadTokenizer(path string) (*data.Tokenizer, error) {
	return data.LoadTokenizerChecked(path, func(t data.TokenizerTables) error {
		return refuseOver(t.Bytes, func(limit planner.MemLimit) string {
			return fmt.Sprintf("tokenizer %s: its %d vocabulary entries, %d merges and %d added tokens need %s of tables, more than %s; use a smaller tokenizer.json",
				path, t.Vocab, t.Merges, t.Added, units.Bytes(t.Bytes), limit.What)
		})
	})
}
