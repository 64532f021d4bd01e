// Package planner chooses a parallel training strategy: how many devices do
// data parallelism, sharding (and at which stage), tensor and pipeline
// parallelism, with which micro-batch size and which activation
// recomputation, for a model, a global batch and a cluster.
//
// It has three parts:
//
//   - a cost model ([Estimate]) giving, for one [Strategy] on one
//     [Cluster], the bytes each device holds by component (parameters,
//     gradients, optimizer state, activations, scratch, other) and the
//     predicted step time, split into computation, communication, the
//     optimizer and the pipeline bubble;
//   - device profiles ([Devices], [Device]): the built-in accelerators
//     (V100-32G, A100-40G, A100-80G, H100-80G, H200-141G) and a CPU
//     profile, which may be replaced by one measured on this machine
//     (package planner/profile measures it) and saved as JSON;
//   - a search ([Search]) over every valid combination for the global
//     batch, keeping the infeasible plans with the reason they fail.
//
// Memory is gptui's engine's own: what it allocates for a rank (its
// engine.Memory: fp32 parameters, gradients and AdamW moments, the
// activations its forward pass keeps and the scratch its passes share),
// so that a prediction can be checked against the [memory] log line. The CPU profile's "engine"
// accounting counts the CPU backend's attention (the probabilities); the
// accelerator profiles' "engine-gpu" accounting the CUDA backend's
// (flash-style: a log-sum-exp per row and head), and beside the engine's
// buffers the backend's own workspaces and the runtime's reserve. Step
// times on the CPU come from measured rates; on accelerators from a
// roofline of the data sheet's peaks and memory bandwidth over the
// engine's kernels.
//
// Both model families are priced from their shape ([Model] embeds
// arch.Shape): GPT-2, and Llama with its grouped key/value heads (split
// over the tensor-parallel ranks, or replicated when they are fewer),
// SwiGLU MLP, RMSNorms, no position embedding and a head tied or its own
// matrix; the accounting is exact for both.
package planner
