// Package planner chooses a parallel training strategy: how many devices do
// data parallelism, sharding (and at which stage), tensor and pipeline
// parallelism, with which micro-batch size and which activation
// recomputation, for a model, a global batch and a cluster.
//
// It has three parts:
//
//   - a cost model ([Estimate]) giving, for one [Strategy] on one
//     [Cluster], the bytes each device holds by component (parameters,
//     gradients, optimizer state, activations, other) and the predicted
//     step time, split into computation, communication, the optimizer and
//     the pipeline bubble;
//   - device profiles ([Devices], [Device]): the built-in accelerators
//     (V100-32G, A100-40G, A100-80G, H100-80G, H200-141G) and a CPU
//     profile, which may be replaced by one measured on this machine
//     (package planner/profile measures it) and saved as JSON;
//   - a search ([Search]) over every valid combination for the global
//     batch, keeping the infeasible plans with the reason they fail.
//
// Memory follows two accountings. The "engine" accounting of the CPU
// profile is exactly what gptui's engine reports for a rank (its
// engine.Memory: fp32 parameters, gradients and AdamW moments, and the
// activations its forward pass keeps), so a prediction can be checked
// against the [memory] log line. The accelerator profiles use mixed
// precision (2 + 2 + 12 bytes per parameter) and the activation formula of
// Korthikanti et al., "Reducing Activation Recomputation in Large
// Transformer Models" (2022): s·b·h·(34 + 5·a·s/h) bytes per layer, the
// tensor-parallel parts divided by the tensor-parallel degree.
//
// Both model families are priced from their shape ([Model] embeds
// arch.Shape): GPT-2, and Llama with its grouped key/value heads (split
// over the tensor-parallel ranks, or replicated when they are fewer),
// SwiGLU MLP, RMSNorms, no position embedding and a head tied or its own
// matrix. The engine accounting is exact for both; the accelerator one
// counts a Llama block's activations as Korthikanti et al. count GPT's,
// with its own layers and no dropout masks.
package planner
