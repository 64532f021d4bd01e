package engine

import "math"

// Dynamic loss scaling constants, as PaddlePaddle's and PyTorch's AMP
// defaults: halve on overflow, double after 1000 clean steps.
const (
	growthInterval = 1000
	growthFactor   = 2.0
	backoffFactor  = 0.5
	minLossScale   = 1.0
)

// lossScaler is fp16's dynamic loss scale. A nil *lossScaler scales by 1
// and never skips.
//
// fp16 has 5 exponent bits: gradients below 2⁻²⁴ flush to zero. The loss is
// multiplied by a scale S before the backward pass (through the logits'
// gradient, dscale), so the gradients come out S times larger, and divided
// again inside the update (AdamW's gscale), where S is exact: a power of
// two changes no bits unless something overflows. An overflow shows as a
// non-finite global gradient norm: the step is skipped (the parameters and
// moments are left as they are), counted and logged, and S halves. After
// growthInterval good steps in a row S doubles again. bf16 has fp32's
// exponent range and needs no scaling.
type lossScaler struct {
	scale   float64 // the current S
	good    int     // clean steps since the last change
	skipped int     // steps skipped for overflow, in this run
}

// newLossScaler returns the scaler of a run in dtype, starting at scale
// (Engine.mix_precision.scale_loss), or nil when dtype needs none.
func newLossScaler(dtype string, scale float64) *lossScaler {
	if dtype != "fp16" {
		return nil
	}
	if !(scale >= minLossScale) || math.IsInf(scale, 0) {
		scale = minLossScale
	}
	return &lossScaler{scale: scale}
}

// Scale is the factor applied to the loss of the next step.
func (s *lossScaler) Scale() float64 {
	if s == nil {
		return 1
	}
	return s.scale
}

// update records a step whose scaled gradients have global norm norm and
// reports whether the step may be applied. On overflow it backs the scale
// off; after growthInterval clean steps it grows it.
func (s *lossScaler) update(norm float64) bool {
	finite := !math.IsInf(norm, 0) && !math.IsNaN(norm)
	if s == nil {
		return true // fp32/bf16: a non-finite norm is the model's problem, as in one process
	}
	if !finite {
		s.skipped++
		s.good = 0
		s.scale = max(s.scale*backoffFactor, minLossScale)
		return false
	}
	s.good++
	if s.good >= growthInterval {
		s.good = 0
		s.scale *= growthFactor
	}
	return true
}
