package kernels

// # A 16-bit copy of the weights
//
// Under bf16 the GEMMs read the weights rounded to bfloat16 (the fp32
// master weights stay as they are: see the section on activations). A
// backend that would otherwise round a weight in a kernel of its own
// before every GEMM that reads it — twice a micro-batch for each weight,
// forward and for the input's gradient — may keep one rounded copy of the
// model's parameters instead, made once where the engine says the
// weights hold still: from the start of a step's forward passes to the
// end of its backward passes, and over an evaluation. The numbers are
// the same (the copy is the same rounding); the copy costs 2 bytes a
// parameter, and saves 6 bytes a weight and GEMM (read 4, write 2).

// WeightCopier is implemented by backends that can keep such a copy (the
// GPU's, under bf16).
type WeightCopier interface {
	// CopyWeights rounds w, the model's parameters, into the backend's
	// copy; until DropWeights, a GEMM that reads a weight lying in w
	// reads it from the copy. The caller writes nothing into w
	// meanwhile.
	CopyWeights(w []float32)
	// DropWeights ends the copy's use: the GEMMs round what they read
	// again. Its memory is kept for the next CopyWeights.
	DropWeights()
}

// CopyWeights has be keep a 16-bit copy of w for its GEMMs until
// DropWeights, where be is a [WeightCopier]; else it does nothing.
func CopyWeights(be Backend, w []float32) {
	if c, ok := be.(WeightCopier); ok {
		c.CopyWeights(w)
	}
}

// DropWeights ends the use of the copy CopyWeights made, if any.
func DropWeights(be Backend) {
	if c, ok := be.(WeightCopier); ok {
		c.DropWeights()
	}
}
