package arch

import "math"

// Part is the piece of a model one rank holds, as far as its sizes go:
// the tensor-parallel slice it holds of every tensor that is split, how
// many of its pipeline stage's blocks it holds, and whether it holds the
// tensors before the blocks and after them.
//
// Tensor parallelism (Megatron) gives each of MP ranks NH/MP query heads
// (a Llama's key/value heads split alike, or replicated when MP exceeds
// them: [Shape.KVWidth]), F/MP hidden units of the MLP and Vp/MP rows of
// the padded vocabulary. Pipeline parallelism gives each stage L/PP
// blocks, the embeddings to the first stage and the final norm and head
// to the last; a tied head on a last stage that is not the first holds
// its own copy of the token embedding.
type Part struct {
	MP     int  // tensor-parallel degree; 0 is 1
	Layers int  // blocks held
	Embed  bool // holds the embeddings: the token embedding and GPT-2's position embedding (first stage)
	Head   bool // holds the final norm and the head: the tied token embedding or an untied lm_head (last stage)
}

// Whole is the part of one process holding all of s.
func (s Shape) Whole() Part { return Part{MP: 1, Layers: s.L, Embed: true, Head: true} }

// Stage is the part one of mp tensor-parallel ranks of pipeline stage st
// of pp holds: L/pp blocks (with virtual stages, as many, in chunks), the
// embeddings on the first stage, the final norm and head on the last.
func (s Shape) Stage(mp, pp, st int) Part {
	pp = max(pp, 1)
	return Part{MP: mp, Layers: s.L / pp, Embed: st == 0, Head: st == pp-1}
}

// Tensor is one parameter tensor of a part: its name and its shape on the
// rank and in the whole model. A block's tensor (Layered) holds all the
// part's blocks, layer-major as llm.c lays them out, its dimension 0
// being the layer.
type Tensor struct {
	Name    string // llm.c's name: wte, wpe, ln1w, …; a Llama's untied head is lmhead
	Shape   []int  // held by the rank
	Global  []int  // in the whole model (equal to Shape without parallelism)
	Layered bool   // a block's tensor, the layer its first dimension
	Split   bool   // sliced over the tensor-parallel group (else each rank holds it whole)
	Decay   bool   // weight decay applies: the matrices and embeddings, as Megatron
}

// Size is the element count of the rank's tensor.
func (t Tensor) Size() int64 {
	n := int64(1)
	for _, d := range t.Shape {
		n *= int64(d)
	}
	return n
}

// Tensors lists the parameter tensors part holds, in the order the engine
// lays them out in its buffer (package engine's Tensors documents each
// one), with their shapes on one rank of the part and in the whole model.
// It is the one account of the model's parameters: [Shape.Params],
// [Shape.ParamBound], the planner's per-device counts and the engine's
// buffers are its sums.
//
// GPT-2: wte (Vp, C), wpe (MaxT, C), the blocks' ln1w, ln1b (C), qkvw
// (3C, C), qkvb (3C), attprojw (C, C), attprojb, ln2w, ln2b (C), fcw (F,
// C), fcb (F), fcprojw (C, F), fcprojb (C), then lnfw and lnfb (C).
// Llama (hd = C/NH): wte (Vp, C), the blocks' ln1w (C), qkvw ((NH +
// 2·NKV)·hd, C), attprojw (C, C), ln2w (C), fcw (2F, C: gate and up),
// fcprojw (C, F), then lnfw (C) and, untied, lmhead (Vp, C). Under
// tensor parallelism the heads' rows (or columns), the hidden units and
// the vocabulary's rows are divided by MP, the key/value heads as
// [Shape.KVWidth] says.
func (s Shape) Tensors(p Part) []Tensor {
	var ts []Tensor
	s.eachTensor(p, func(t tensor) {
		ts = append(ts, Tensor{Name: t.name, Shape: t.local.slice(), Global: t.global.slice(), Layered: t.layered, Split: t.split, Decay: t.decay})
	})
	return ts
}

// PartParams is the parameter count of part: the sizes of its
// [Shape.Tensors].
func (s Shape) PartParams(p Part) int64 {
	var n int64
	s.eachTensor(p, func(t tensor) { n += t.local.size() })
	return n
}

// LayerMatmulParams is one block's matrix parameters on one of mp
// tensor-parallel ranks: the weights its forward multiplies touch (the
// block's tensors that decay), 2 FLOPs each per row.
func (s Shape) LayerMatmulParams(mp int) int64 {
	var n int64
	s.eachTensor(Part{MP: mp, Layers: 1}, func(t tensor) {
		if t.decay {
			n += t.local.size()
		}
	})
	return n
}

// dims is a shape of at most three dimensions, held without allocating.
type dims struct {
	n int
	d [3]int
}

// dimsOf is the shape d.
func dimsOf(d ...int) dims {
	var x dims
	x.n = copy(x.d[:], d)
	return x
}

// slice is x as a slice of its own.
func (x dims) slice() []int { return append([]int(nil), x.d[:x.n]...) }

// size is the element count of x.
func (x dims) size() int64 {
	n := int64(1)
	for _, d := range x.d[:x.n] {
		n *= int64(d)
	}
	return n
}

// tensor is a Tensor whose shapes are dims: what eachTensor passes on,
// so that a count allocates nothing.
type tensor struct {
	name                  string
	local, global         dims
	layered, split, decay bool
}

// eachTensor calls f with each tensor of [Shape.Tensors] in turn.
func (s Shape) eachTensor(p Part, f func(tensor)) {
	C, F, L, Vp := s.C, s.F, s.L, s.Vp
	M := max(p.MP, 1)
	Cl, Fl, Vpl, Ll := C/M, F/M, Vp/M, p.Layers
	// whole passes on a tensor outside the blocks that every rank holds
	// whole.
	whole := func(held bool, name string, shape dims, decay bool) {
		if held {
			f(tensor{name: name, local: shape, global: shape, decay: decay})
		}
	}
	// vocab passes on a tensor of the vocabulary's rows, Vp/M of them a
	// rank.
	vocab := func(held bool, name string) {
		if held {
			f(tensor{name: name, local: dimsOf(Vpl, C), global: dimsOf(Vp, C), split: M > 1, decay: true})
		}
	}
	// block passes on a block's tensor, of local shape (Ll, row[, col])
	// and global (L, grow[, col]): split when row and grow differ under
	// M > 1, or cols and gcol. A col of 0 is a tensor of one dimension
	// a layer.
	block := func(name string, row, col, grow, gcol int, decay bool) {
		if Ll <= 0 {
			return
		}
		t := tensor{name: name, local: dimsOf(Ll, row, col), global: dimsOf(L, grow, gcol), layered: true,
			split: M > 1 && (row != grow || col != gcol), decay: decay}
		if col == 0 {
			t.local.n, t.global.n = 2, 2
		}
		f(t)
	}
	if s.Family == Llama {
		NKV, hd, kvl := s.KVHeads(), s.headSize(), s.KVWidth(M)
		vocab(p.Embed || p.Head && s.Tied(), "wte")
		block("ln1w", C, 0, C, 0, false)
		block("qkvw", Cl+2*kvl, C, C+2*NKV*hd, C, true)
		block("attprojw", C, Cl, C, C, true)
		block("ln2w", C, 0, C, 0, false)
		block("fcw", 2*Fl, C, 2*F, C, true)
		block("fcprojw", C, Fl, C, F, true)
		whole(p.Head, "lnfw", dimsOf(C), false)
		vocab(p.Head && !s.Tied(), "lmhead")
		return
	}
	vocab(p.Embed || p.Head, "wte")
	whole(p.Embed, "wpe", dimsOf(s.MaxT, C), true)
	block("ln1w", C, 0, C, 0, false)
	block("ln1b", C, 0, C, 0, false)
	block("qkvw", 3*Cl, C, 3*C, C, true)
	block("qkvb", 3*Cl, 0, 3*C, 0, false)
	block("attprojw", C, Cl, C, C, true)
	block("attprojb", C, 0, C, 0, false)
	block("ln2w", C, 0, C, 0, false)
	block("ln2b", C, 0, C, 0, false)
	block("fcw", Fl, C, F, C, true)
	block("fcb", Fl, 0, F, 0, false)
	block("fcprojw", C, Fl, C, F, true)
	block("fcprojb", C, 0, C, 0, false)
	whole(p.Head, "lnfw", dimsOf(C), false)
	whole(p.Head, "lnfb", dimsOf(C), false)
}

// KVWidth is the key (or value) columns one of mp tensor-parallel ranks
// holds and computes: its NKV/mp key/value heads, or, when mp exceeds
// them, the one head its query heads share, replicated on [Shape.KVCopies]
// ranks (Megatron-LM's replication). GPT-2: C/mp.
func (s Shape) KVWidth(mp int) int {
	mp = max(mp, 1)
	if s.Family != Llama {
		return s.C / mp
	}
	hd := s.headSize()
	if s.KVCopies(mp) > 1 {
		return hd
	}
	return s.KVHeads() / mp * hd
}

// KVCopies is how many ranks of a tensor-parallel group of mp hold each
// key/value head alike: mp/NKV for a Llama whose key/value heads mp
// exceeds, else 1.
func (s Shape) KVCopies(mp int) int {
	if kv := s.KVHeads(); s.Family == Llama && kv > 0 && mp > kv {
		return mp / kv
	}
	return 1
}

// maxSize is the largest size [Shape.ParamBound] lays out: three times
// it, or C plus twice NKV·hd, fits an int with room to spare.
const maxSize = 1 << 40

// ParamBound is [Shape.Params] computed in float64, so that it cannot
// overflow for any sizes: what a check of an untrusted shape compares with
// a limit before anything is laid out. A shape that could not be laid out
// without an int overflowing — a size beyond 2⁴⁰ (more than any model has
// parameters) or, in a Llama, more key/value heads than heads — is
// +Inf.
func (s Shape) ParamBound() float64 {
	sizes := []int{s.Vp, s.L, s.NH, s.C, s.F}
	if s.Family != Llama {
		sizes = append(sizes, s.MaxT)
	}
	for _, n := range sizes {
		if n < -maxSize || n > maxSize {
			return math.Inf(1)
		}
	}
	if kv := s.KVHeads(); s.Family == Llama && s.NH != 0 && kv > max(s.NH, -s.NH) {
		return math.Inf(1)
	}
	var b float64
	s.eachTensor(s.Whole(), func(t tensor) {
		f := 1.0
		for _, d := range t.local.d[:t.local.n] {
			f *= float64(d)
		}
		b += f
	})
	return b
}
