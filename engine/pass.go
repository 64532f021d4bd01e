package engine

import "context"

// pass is one forward or backward pass through the model, carried
// explicitly from the step that starts it through every layer: what it is
// for, the context its communication runs under, who hears of finished
// gradients, and its first failure. The model keeps none of this between
// calls.
type pass struct {
	ctx        context.Context
	DropoutKey         // step and first sample: the keys of the dropout masks
	train      bool    // dropout on and the loss gradient left for backward; false: an evaluation
	dscale     float32 // the scale of the loss gradient (1/(B·T·accumulation·replicas), times fp16's loss scale)

	// loss, if not nil, is a float64 of the backend's memory the head adds
	// the pass's mean loss to (on the device: the host reads it once, when
	// the step or the evaluation is done).
	loss []float64

	// onGrads, if not nil, is called by the backward pass as soon as the
	// parameter gradients of local block li are complete.
	onGrads func(li int)

	// err is the first communication failure of the pass; later
	// communication is skipped and the kernels run on, so the caller
	// checks it once the pass is done.
	err error
}

// fail records err as the pass's failure, unless it failed already.
func (p *pass) fail(err error) {
	if p.err == nil {
		p.err = err
	}
}
