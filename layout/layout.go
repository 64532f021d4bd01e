// Package layout is the one rule of which parallel layouts can train a
// model. The configuration (presets), the engine (each rank's place in the
// grid) and the planner (the strategies it weighs) all ask [Check], so a
// layout the planner proposes is one the config accepts and the engine
// runs, and each refusal reads the same wherever it is made.
//
// The rule follows from how the engine splits the work (see package
// engine): tensor parallelism gives each rank of a group a slice of the
// attention heads (a Llama's key/value heads split or replicated), of the
// MLP's hidden units and of the (padded) vocabulary; pipeline parallelism gives each of pp·vpp chunks the same
// number of blocks; the replicas (dp × sharding) split the global batch
// evenly, and each replica's share into whole micro-batches.
package layout

import (
	"fmt"

	"github.com/gptui/gptui/arch"
)

// Layout is a parallel layout: the degree of each dimension, the sharding
// stage and the pipeline schedule.
type Layout struct {
	DP, Sharding, MP, PP int
	VPP                  int    // model chunks per pipeline rank (virtual stages)
	Stage                int    // sharding stage: 1, 2 or 3
	Schedule             string // "1f1b", "interleaved" or "gpipe"; "" is 1f1b
	SP                   bool   // sequence parallelism: the residual stream's rows split over the MP ranks
	CP                   int    // context parallelism: each sequence's chunks split over CP ranks (0 is 1)
}

// Ranks is the number of ranks the layout needs.
func (l Layout) Ranks() int { return l.DP * l.Sharding * l.CPDegree() * l.MP * l.PP }

// CPDegree is the context-parallel degree, 1 for a layout that leaves CP
// zero.
func (l Layout) CPDegree() int {
	if l.CP == 0 {
		return 1
	}
	return l.CP
}

// Batch is how a step's samples are cut: Global sequences per step over
// all replicas, Local per replica (0: derived, Global divided by the
// replicas), Micro per forward and backward pass.
type Batch struct {
	Global, Local, Micro int
	Seq                  int // tokens per sequence (0: unknown, its rules skipped)
}

// Replicas is the number of ranks that train on different samples.
func (l Layout) Replicas() int { return l.DP * l.Sharding }

// A Problem is a rule that a layout breaks: the configuration key to change
// and a sentence saying what is wrong and what to do.
type Problem struct {
	Key string // the dotted config key, e.g. Model.num_attention_heads
	Msg string
}

func (p *Problem) Error() string { return p.Key + ": " + p.Msg }

// Schedules are the pipeline schedules the engine runs.
var schedules = []string{"1f1b", "interleaved", "gpipe"}

// Check returns the first rule that l breaks for model m and batch b, or
// nil. A zero Batch skips the batch rules. The rules, in order:
//
//   - every degree is at least 1, the sharding stage is 1, 2 or 3 and the
//     schedule one the engine runs;
//   - mp divides the heads, the MLP's hidden units and the padded
//     vocabulary; in a Llama it also divides the key/value heads or is
//     a multiple of them (each rank then holds one key/value head, as
//     Megatron-LM replicates it);
//   - sequence parallelism needs mp > 1 and a sequence length that mp
//     divides (each rank holds T/mp rows of every sequence); context
//     parallelism a sequence length that 2·cp divides (each rank holds
//     two chunks of T/(2·cp) positions), and with sequence parallelism
//     too, that mp divides those T/cp rows;
//   - pp·vpp divides the layers; vpp > 1 needs pp > 1 and the interleaved
//     schedule;
//   - the global batch is local × dp × sharding, the local batch a multiple
//     of the micro-batch, and with virtual stages (the interleaved
//     schedule) the micro-batches of a step a multiple of pp.
func Check(m arch.Shape, l Layout, b Batch) *Problem {
	for _, d := range []struct {
		key string
		v   int
	}{{"Distributed.dp_degree", l.DP}, {"Distributed.sharding.sharding_degree", l.Sharding},
		{"Distributed.mp_degree", l.MP}, {"Distributed.pp_degree", l.PP}, {"Distributed.vpp_degree", l.VPP}, {"Distributed.cp_degree", l.CPDegree()}} {
		if d.v < 1 {
			return &Problem{d.key, fmt.Sprintf("got %d; set it to a positive integer", d.v)}
		}
	}
	if l.Stage < 1 || l.Stage > 3 {
		return &Problem{"Distributed.sharding.sharding_stage", fmt.Sprintf("got %d; set it to 1, 2 or 3", l.Stage)}
	}
	sched := l.Schedule
	if sched == "" {
		sched = "1f1b"
	}
	known := false
	for _, s := range schedules {
		known = known || s == sched
	}
	if !known {
		return &Problem{"Distributed.pp_schedule", fmt.Sprintf("%q is not a schedule; use 1f1b, interleaved or gpipe", l.Schedule)}
	}
	switch {
	case m.NH%l.MP != 0:
		return multiple("Model.num_attention_heads", m.NH, "Distributed.mp_degree", l.MP)
	case m.Family == arch.Llama && m.KVHeads()%l.MP != 0 && l.MP%m.KVHeads() != 0:
		return &Problem{"Model.num_key_value_heads", fmt.Sprintf("%d key/value heads and mp_degree %d: mp_degree must divide them or be a multiple of them; change one of them", m.KVHeads(), l.MP)}
	case m.F%l.MP != 0:
		return multiple("Model.ffn_hidden_size", m.F, "Distributed.mp_degree", l.MP)
	case m.Vp%l.MP != 0:
		return &Problem{"Distributed.mp_degree", fmt.Sprintf("%d does not divide the padded vocabulary %d (vocab_size rounded up to a multiple of 128); pick a divisor", l.MP, m.Vp)}
	case l.CP > 1 && b.Seq > 0 && b.Seq%(2*l.CP) != 0:
		return &Problem{"Data.Train.dataset.max_seq_len", fmt.Sprintf("%d is not a multiple of 2 × cp_degree (%d): context parallelism cuts each sequence into 2·cp_degree chunks; change one of them", b.Seq, 2*l.CP)}
	case l.SP && l.MP == 1:
		return &Problem{"Distributed.sequence_parallel", "splits the rows of a tensor-parallel group, and mp_degree is 1; set mp_degree > 1 or turn it off"}
	case l.SP && b.Seq > 0 && b.Seq/l.CPDegree()%l.MP != 0:
		return &Problem{"Data.Train.dataset.max_seq_len", fmt.Sprintf("%d is not a multiple of mp_degree × cp_degree (%d): sequence parallelism splits a rank's T/cp_degree rows of each sequence over mp_degree ranks; change one of them", b.Seq, l.MP*l.CPDegree())}
	case l.VPP == 1 && m.L%l.PP != 0:
		return multiple("Model.num_layers", m.L, "Distributed.pp_degree", l.PP)
	case l.VPP > 1 && l.PP == 1:
		return &Problem{"Distributed.vpp_degree", fmt.Sprintf("%d needs pp_degree > 1: virtual stages are chunks of a pipeline", l.VPP)}
	case l.VPP > 1 && m.L%(l.PP*l.VPP) != 0:
		return &Problem{"Model.num_layers", fmt.Sprintf("%d is not a multiple of pp_degree × vpp_degree (%d × %d = %d); change one of them", m.L, l.PP, l.VPP, l.PP*l.VPP)}
	case l.VPP > 1 && sched != "interleaved":
		return &Problem{"Distributed.pp_schedule", fmt.Sprintf("%s does not run vpp_degree %d; use interleaved", sched, l.VPP)}
	}
	if b == (Batch{}) {
		return nil
	}
	local := b.Local
	switch want := local * l.Replicas(); {
	case local == 0 && b.Global%l.Replicas() != 0:
		return &Problem{"Global.global_batch_size", fmt.Sprintf("the global batch %d does not divide into %d replicas", b.Global, l.Replicas())}
	case local == 0:
		local = b.Global / l.Replicas()
	case b.Global != want:
		return &Problem{"Global.global_batch_size", fmt.Sprintf(
			"%d is not local_batch_size (%d) × dp_degree (%d) × sharding_degree (%d); set it to %d or leave it unset to derive it",
			b.Global, local, l.DP, l.Sharding, want)}
	}
	if b.Micro > 0 && local%b.Micro != 0 {
		return multiple("Global.local_batch_size", local, "micro_batch_size", b.Micro)
	}
	if b.Micro > 0 && l.VPP > 1 && (local/b.Micro)%l.PP != 0 {
		return &Problem{"Global.micro_batch_size", fmt.Sprintf(
			"the interleaved schedule needs the micro-batches per step (local_batch_size / micro_batch_size = %d) to be a multiple of pp_degree %d",
			local/b.Micro, l.PP)}
	}
	return nil
}

// multiple is the problem of a size that is not a multiple of a degree.
func multiple(key string, v int, by string, d int) *Problem {
	return &Problem{key, fmt.Sprintf("%d is not a multiple of %s (%d); change one of them", v, by, d)}
}
