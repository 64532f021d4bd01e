// Package paritymatrix lists the layouts of the engine's parity matrix:
// every parallel dimension and their combinations, each a job of a few
// ranks training a small model on the tiny preset. The engine's
// TestParallelParity trains each to the single process's losses;
// comm/nccl's tests split the NCCL communicators of each and train some
// through the NCCL fabric. Both take the layouts from here, so that a
// layout added to the matrix is tested by both.
package paritymatrix

import "strconv"

// Model is the small model the layouts are sized for: the tiny preset's
// overrides for 2 layers of width 32 over a vocabulary of 96, sequences
// of 32 tokens, a global batch of 8 and no dropout.
var Model = []string{"Model.vocab_size=96", "Model.hidden_size=32", "Model.num_layers=2",
	"Data.Train.dataset.max_seq_len=32", "Global.global_batch_size=8", "Model.hidden_dropout_prob=0", "Model.attention_probs_dropout_prob=0"}

// Layout is one layout of the matrix: a job of World ranks with the
// overrides O (its parallel degrees and batch sizes), applied after
// Model's.
type Layout struct {
	Name  string
	World int
	O     []string
}

// Layouts returns the layouts of the matrix, in a new slice each call.
func Layouts() []Layout {
	return []Layout{
		{"dp2", 2, []string{"Distributed.dp_degree=2", "Global.local_batch_size=4", "Global.micro_batch_size=2"}},
		{"sharding2 stage1", 2, []string{"Distributed.sharding.sharding_degree=2", "Distributed.sharding.sharding_stage=1", "Global.local_batch_size=4", "Global.micro_batch_size=2"}},
		{"sharding2 stage2", 2, []string{"Distributed.sharding.sharding_degree=2", "Distributed.sharding.sharding_stage=2", "Global.local_batch_size=4", "Global.micro_batch_size=2"}},
		{"sharding2 stage2 dp2", 4, []string{"Distributed.dp_degree=2", "Distributed.sharding.sharding_degree=2", "Distributed.sharding.sharding_stage=2", "Global.local_batch_size=2", "Global.micro_batch_size=1"}},
		{"sharding2 stage3", 2, []string{"Distributed.sharding.sharding_degree=2", "Distributed.sharding.sharding_stage=3", "Global.local_batch_size=4", "Global.micro_batch_size=2"}},
		{"sharding2 stage3 dp2", 4, []string{"Distributed.dp_degree=2", "Distributed.sharding.sharding_degree=2", "Distributed.sharding.sharding_stage=3", "Global.local_batch_size=2", "Global.micro_batch_size=1"}},
		{"mp2", 2, []string{"Distributed.mp_degree=2", "Global.local_batch_size=8", "Global.micro_batch_size=4"}},
		{"dp2 mp2", 4, []string{"Distributed.dp_degree=2", "Distributed.mp_degree=2", "Global.local_batch_size=4", "Global.micro_batch_size=2"}},
		{"sharding2 stage2 mp2", 4, []string{"Distributed.sharding.sharding_degree=2", "Distributed.sharding.sharding_stage=2", "Distributed.mp_degree=2", "Global.local_batch_size=4", "Global.micro_batch_size=2"}},
		{"pp2 1f1b", 2, []string{"Distributed.pp_degree=2", "Global.local_batch_size=8", "Global.micro_batch_size=4"}},
		{"pp2 gpipe", 2, []string{"Distributed.pp_degree=2", "Distributed.pp_schedule=gpipe", "Global.local_batch_size=8", "Global.micro_batch_size=2"}},
		{"pp2 interleaved vpp2", 2, []string{"Distributed.pp_degree=2", "Distributed.vpp_degree=2", "Model.num_layers=4", "Global.local_batch_size=8", "Global.micro_batch_size=2"}},
		{"mp2 pp2", 4, []string{"Distributed.mp_degree=2", "Distributed.pp_degree=2", "Global.local_batch_size=8", "Global.micro_batch_size=4"}},
		{"dp2 pp2", 4, []string{"Distributed.dp_degree=2", "Distributed.pp_degree=2", "Global.local_batch_size=4", "Global.micro_batch_size=2"}},
		{"sharding2 stage3 mp2 pp2", 8, []string{"Distributed.sharding.sharding_degree=2", "Distributed.sharding.sharding_stage=3", "Distributed.mp_degree=2", "Distributed.pp_degree=2", "Global.local_batch_size=4", "Global.micro_batch_size=2"}},
		// Sequence parallelism: the residual stream's rows split over
		// the tensor-parallel group.
		{"mp2 sp", 2, []string{"Distributed.mp_degree=2", "Distributed.sequence_parallel=true", "Global.local_batch_size=8", "Global.micro_batch_size=4"}},
		{"mp4 sp", 4, []string{"Distributed.mp_degree=4", "Distributed.sequence_parallel=true", "Global.local_batch_size=8", "Global.micro_batch_size=2"}},
		{"mp2 pp2 sp", 4, []string{"Distributed.mp_degree=2", "Distributed.pp_degree=2", "Distributed.sequence_parallel=true", "Global.local_batch_size=8", "Global.micro_batch_size=4"}},
		{"sharding2 stage3 mp2 sp", 4, []string{"Distributed.sharding.sharding_degree=2", "Distributed.sharding.sharding_stage=3", "Distributed.mp_degree=2", "Distributed.sequence_parallel=true", "Global.local_batch_size=4", "Global.micro_batch_size=2"}},
		// Context parallelism: each sequence's chunks over a ring.
		{"cp2", 2, []string{"Distributed.cp_degree=2", "Global.local_batch_size=8", "Global.micro_batch_size=4"}},
		{"cp4", 4, []string{"Distributed.cp_degree=4", "Global.local_batch_size=8", "Global.micro_batch_size=2"}},
		{"cp2 mp2", 4, []string{"Distributed.cp_degree=2", "Distributed.mp_degree=2", "Global.local_batch_size=8", "Global.micro_batch_size=4"}},
		{"cp2 pp2", 4, []string{"Distributed.cp_degree=2", "Distributed.pp_degree=2", "Global.local_batch_size=8", "Global.micro_batch_size=2"}},
		{"cp2 sharding2 stage3", 4, []string{"Distributed.cp_degree=2", "Distributed.sharding.sharding_degree=2", "Distributed.sharding.sharding_stage=3", "Global.local_batch_size=4", "Global.micro_batch_size=2"}},
		{"cp2 dp2 mp2 sp", 8, []string{"Distributed.cp_degree=2", "Distributed.dp_degree=2", "Distributed.mp_degree=2", "Distributed.sequence_parallel=true", "Global.local_batch_size=4", "Global.micro_batch_size=2"}},
		{"sharding2 mp2 pp2", 8, []string{"Distributed.sharding.sharding_degree=2", "Distributed.sharding.sharding_stage=2", "Distributed.mp_degree=2", "Distributed.pp_degree=2", "Global.local_batch_size=4", "Global.micro_batch_size=2"}},

		// The Llama family: 4 query heads sharing 2 key/value heads, or 1.
		{"llama dp2", 2, llama(2, "Distributed.dp_degree=2", "Global.local_batch_size=4", "Global.micro_batch_size=2")},
		{"llama sharding2 stage1", 2, llama(2, "Distributed.sharding.sharding_degree=2", "Distributed.sharding.sharding_stage=1", "Global.local_batch_size=4", "Global.micro_batch_size=2")},
		{"llama sharding2 stage2", 2, llama(2, "Distributed.sharding.sharding_degree=2", "Distributed.sharding.sharding_stage=2", "Global.local_batch_size=4", "Global.micro_batch_size=2")},
		{"llama sharding2 stage3", 2, llama(2, "Distributed.sharding.sharding_degree=2", "Distributed.sharding.sharding_stage=3", "Global.local_batch_size=4", "Global.micro_batch_size=2")},
		{"llama mp2", 2, llama(2, "Distributed.mp_degree=2", "Global.local_batch_size=8", "Global.micro_batch_size=4")},
		{"llama mp2 kv1 untied", 2, llama(1, "Model.tie_word_embeddings=false", "Distributed.mp_degree=2", "Global.local_batch_size=8", "Global.micro_batch_size=2")},
		{"llama mp4 kv2", 4, llama(2, "Distributed.mp_degree=4", "Global.local_batch_size=8", "Global.micro_batch_size=4")},
		{"llama sharding2 stage3 mp2 kv1 untied", 4, llama(1, "Model.tie_word_embeddings=false", "Distributed.sharding.sharding_degree=2", "Distributed.sharding.sharding_stage=3", "Distributed.mp_degree=2", "Global.local_batch_size=4", "Global.micro_batch_size=2")},
		{"llama pp2 1f1b untied", 2, llama(2, "Model.tie_word_embeddings=false", "Distributed.pp_degree=2", "Global.local_batch_size=8", "Global.micro_batch_size=2")},
		{"llama pp2 interleaved vpp2", 2, llama(2, "Distributed.pp_degree=2", "Distributed.vpp_degree=2", "Model.num_layers=4", "Global.local_batch_size=8", "Global.micro_batch_size=2")},
		{"llama mp2 kv1 pp2 untied", 4, llama(1, "Model.tie_word_embeddings=false", "Distributed.mp_degree=2", "Distributed.pp_degree=2", "Global.local_batch_size=8", "Global.micro_batch_size=4")},
		{"llama dp2 fp16", 2, llama(2, "Engine.mix_precision.dtype=fp16", "Distributed.dp_degree=2", "Global.local_batch_size=4", "Global.micro_batch_size=2")},
		{"llama dp2 mp2", 4, llama(2, "Distributed.dp_degree=2", "Distributed.mp_degree=2", "Global.local_batch_size=4", "Global.micro_batch_size=2")},
		{"llama mp2 kv1 sp", 2, llama(1, "Distributed.mp_degree=2", "Distributed.sequence_parallel=true", "Global.local_batch_size=8", "Global.micro_batch_size=4")},
		{"llama mp4 kv2 sp untied", 4, llama(2, "Model.tie_word_embeddings=false", "Distributed.mp_degree=4", "Distributed.sequence_parallel=true", "Global.local_batch_size=8", "Global.micro_batch_size=2")},
		{"llama cp2 kv1", 2, llama(1, "Distributed.cp_degree=2", "Global.local_batch_size=8", "Global.micro_batch_size=4")},
		{"llama cp2 mp2 kv2 untied", 4, llama(2, "Model.tie_word_embeddings=false", "Distributed.cp_degree=2", "Distributed.mp_degree=2", "Global.local_batch_size=8", "Global.micro_batch_size=2")},
		{"llama pp2 gpipe", 2, llama(2, "Distributed.pp_degree=2", "Distributed.pp_schedule=gpipe", "Global.local_batch_size=8", "Global.micro_batch_size=2")},
	}
}

// llama is a layout's overrides for the Llama family with nkv key/value
// heads (of the 4 heads) and the overrides o: rotary embeddings with
// Llama 3's frequency scaling (from a context of 16, so that it changes
// most frequencies), an intermediate size of 64, the head tied unless o
// unties it.
func llama(nkv int, o ...string) []string {
	return append([]string{"Model.family=llama", "Model.num_key_value_heads=" + strconv.Itoa(nkv), "Model.ffn_hidden_size=64",
		"Model.rope_scaling.rope_type=llama3", "Model.rope_scaling.original_max_position_embeddings=16", "Model.tie_word_embeddings=true"}, o...)
}
