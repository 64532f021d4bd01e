// Package engine trains GPT-2 models: the model with its forward and backward
// passes written out layer by layer (as llm.c's train_gpt2.c), the AdamW
// optimizer and learning-rate schedule, the training loop with evaluation,
// logging and checkpoints, every parallel dimension, and generation.
//
// The model keeps its parameters in one flat buffer and its gradients in
// another, laid out tensor by tensor in llm.c's order ([Tensors]); each layer
// runs on a [kernels.Backend] (kernels/cpu or kernels/cuda). A [Trainer]
// owns a model, its optimizer, the data and the communication groups of
// one rank, and [Trainer.Run] trains it.
//
// # The life of a step
//
// Every rank runs the same loop, [Trainer.Run] (train.go): each step it
// agrees with the other ranks on whether to stop (checkStop), runs
// trainStep (step.go, its phases named after the list below), logs the
// step (meter.go), evaluates (evaluateAt) and saves on schedule
// (saver.go). trainStep reads as llm.c's loop; each parallel dimension
// takes part through a hook in its own file, a no-op where it is not used:
//
//  1. data: every rank reads the whole global batch (engine/data's loader
//     serves global batches, so the samples do not depend on the split)
//     and keeps the micro-batches of its data index;
//  2. forward: embedding, the blocks, the final LayerNorm, the tied head
//     and the cross-entropy (gpt2.go: embedForward, blockForward,
//     headForward), keeping what backward needs;
//  3. loss: the head computes the logits a chunk of rows at a time
//     (classify), and, training, their gradient, scaled so that the
//     accumulated gradient is that of the mean loss of the global batch,
//     and its products with the head's weights and input at once, so that
//     no more logits are kept than a block keeps activations; the mean
//     losses add up on the device;
//  4. backward: headBackward, blockBackward from the last block down,
//     embedBackward, accumulating into the gradient buffer;
//  5. reduce: the gradients are summed over the replicas (dataparallel.go),
//     block by block while the blocks below still compute;
//  6. update: the step's loss and Σ g² are read back from the device,
//     once (readSums), the global gradient norm is clipped and AdamW
//     applied (update.go, optimizer.go), on a shard of the buffer under
//     sharding.
//
// The losses, gradients, dropout masks and updates are those of one process
// training on the whole batch, whatever the parallel layout: the parity
// tests (parallel_test.go) check every layout against one process.
//
// # Where is
//
//	a layer's forward and backward   gpt2.go: blockForward / blockBackward, side by side;
//	                                 the kernels themselves in kernels/cpu, one file per family
//	the hooks the layers call        parallel.go: parallel (the fixed points, the ordering
//	                                 rules), oneProcess (a whole model's)
//	the parameter layout             params.go: Tensors, PartTensors, Tensor, Part
//	initialising, loading a part     init.go: the counter-based generator, fillSpans (a rank's
//	                                 part or shard from the generator, a checkpoint or an llm.c file)
//	the parallel layout of the ranks topology.go: Topology (dp × pp × sharding × cp × mp grid)
//	data parallel                    dataParallel (dataparallel.go)
//	sharding (ZeRO stages 1-3)       stage3 (sharding.go), shardedUpdate (update.go)
//	tensor parallel                  tensorParallel, sliceDims (tensorparallel.go), the slices in PartTensors
//	sequence parallel                sequenceParallel (sequenceparallel.go)
//	context parallel                 contextParallel, cpRows (contextparallel.go); the ring's
//	                                 kernels: kernels.Backend's Ring*
//	pipeline parallel                pipeSchedule, pipeline (pipeline.go)
//	recompute                        Recompute (gpt2.go), Engine.use_recompute
//	mixed precision                  precision.go (fp16 loss scaling); the backends run the GEMMs
//	checkpoints, resume              ckpt.go (save, restore), agree.go (every rank resumes the same step),
//	                                 engine/checkpoint (the format), engine/safetensors (its data files)
//	the training loop, one step      train.go: Run; step.go: trainStep; meter.go, saver.go
//	the update, the gradient norm    update.go (shardedUpdate for sharding), optimizer.go
//	stops and interrupts             stop.go; saves during a run, async too: saver.go
//	training logs and metrics        logs.go, event.Metrics
//	llm.c and Hugging Face files     llmc.go, engine/hf
//	generation                       generate.go (key/value cache)
//
// # The layers and the parallel layout
//
// The layers compute; the layout communicates. gpt2.go and llama.go hold
// no collective and no rank arithmetic: at fixed points — entering and
// leaving a tensor-parallel region, the vocabulary-parallel embedding and
// loss, the heads a rank holds, a Llama's key/value head copies, the
// attention over the sequence, the rows of the residual stream a rank
// holds, a block's parameters needed and its gradients done — they call
// the model's layout, one small interface (parallel, in parallel.go,
// whose doc comment lists the points and the rules of their order). Each
// dimension that acts inside a pass implements it in its own file:
// tensorParallel (tensorparallel.go), with sequence parallelism
// sequenceParallel (sequenceparallel.go), contextParallel
// (contextparallel.go), which wraps either or oneProcess, a whole model's
// layout that does nothing, and stage3 (sharding.go), which wraps any of
// them. Data parallelism and the pipeline act between passes and need no
// hook.
//
// # Data parallel and sharding
//
// Ranks that hold the same part of the model and read different
// micro-batches are replicas. Data parallelism all-reduces their gradients.
// Sharding (ZeRO) splits the flat parameter buffer into sharding_degree
// equal shards (padded with zeros to divide evenly); each rank of a
// sharding group keeps the AdamW moments of its shard only, updates only
// its shard of the parameters, and the group then all-gathers them:
//
//	stage 1  gradients all-reduced in full; optimizer state 1/S per rank
//	stage 2  gradients reduce-scattered, so each rank sums only its shard
//	stage 3  parameters sharded too, unit by unit (a block, the outer
//	         tensors), each gathered into a reusable buffer for its passes
//	         (see stage3); the rank never allocates its whole part
//
// A rank's buffers are laid out for its sharding when the model is built
// (newShardedModel), so none is copied or replaced afterwards.
//
// The global gradient norm is the norm of the full summed gradient (stage 2
// adds up the shards' squares across the group), so each element sees the
// update one process would make.
//
// # Host and device
//
// The backend's kernels may run asynchronously (kernels.Memory: the GPU's
// one stream), on memory that is the device's — a GPU's cuMemAlloc'd
// memory, which the host cannot address — so the host touches the
// backend's memory only through ordered copies, never in place, not even
// after a sync: each micro-batch's tokens are uploaded (Model.stage), the
// losses and the gradients' squares are reduced on the device into
// Trainer.sums and downloaded once, checkpoints and saved models download
// what they write and restores, loads and initialisation upload what they
// read (fillSpans), decoding uploads its tokens, appends to its key/value
// cache with device copies and downloads the logits it samples from, and
// every buffer a communicator is given is the backend's (the
// communicators are ordered on the stream and move the data as the
// device). The parity tests run on kernels/deferred, which queues every
// kernel until the next sync and poisons its outputs until then, so a
// missing sync fails them; its sealed memory (deferred.NewSealed), on
// which they run, faults on any other host access.
//
// # Tensor parallel
//
// Megatron-LM's 1D scheme splits every block over the mp_degree ranks of a
// tensor-parallel group:
//
//	qkv, fc          column-parallel: each rank computes its heads / hidden units
//	attproj, fcproj  row-parallel: each rank's output is a partial sum, all-reduced
//	wte              vocabulary-parallel: the embedding sums the ranks' lookups,
//	                 the loss crosses the group only as per-row maxima and sums
//
// Per block that is two all-reduces of (B,T,C) in the forward pass (after
// attproj and fcproj) and two in the backward pass (the input gradients of
// qkv and fc), plus one each for the embedding and the head's input
// gradient. LayerNorms, the row-parallel biases and wpe are held whole by
// every rank of the group; their gradients come out identical on every
// rank, so they need no communication, and the gradient norm counts them
// once. With sequence parallelism the all-reduces become reduce-scatters
// and all-gathers, the rows between the regions are split, and the norms'
// gradients, each from a rank's rows, are summed over the group. Dropout draws the masks one process would: the residual-stream sites
// act on whole (B,T,C) tensors after the all-reduce, and the attention
// probabilities' mask is placed by global head.
//
// # Pipeline parallel
//
// The blocks are cut into pp·vpp chunks of equal size: virtual stage
// v = k·pp + s is chunk k of pipeline rank s. The first stage also runs the
// embedding, the last the final LayerNorm, the tied head and the loss; both
// hold wte, and after the backward passes they sum its gradients, so the two
// copies stay equal. The micro-batches of a step are the gradient
// accumulation steps, and a schedule (gpipe, 1f1b, interleaved) is a list of
// forward and backward passes each rank runs in order (pipeSchedule).
// Between two passes a rank trades the outputs it has and the inputs it
// needs with its neighbours in one exchange (pipeComms): with sends that
// wait for their receive, as NCCL's do, the 1F1B steady state would hang if
// the two were issued one after the other.
//
// # Mixed precision
//
// Engine.mix_precision.dtype bf16 or fp16 runs the GEMMs in that type and
// keeps fp32 master weights, gradients and optimizer state (the backend's
// part); fp16 adds dynamic loss scaling (lossScaler in precision.go).
package engine
