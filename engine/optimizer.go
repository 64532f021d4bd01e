package engine

import (
	"math"

	"github.com/gptui/gptui/kernels"
)

// AdamWConfig holds the optimizer's hyperparameters.
type AdamWConfig struct {
	Beta1, Beta2, Eps, WeightDecay float32
	ClipNorm                       float64 // global-norm clipping threshold; 0 disables
}

// AdamW keeps the moments of every parameter in two buffers laid out like the
// parameters, and applies weight decay only to matrices and embeddings.
type AdamW struct {
	Cfg  AdamWConfig
	M, V []float32 // first and second moments
	Step int       // updates applied so far
}

// NewAdamW allocates zero moments for n parameters.
func NewAdamW(cfg AdamWConfig, n int) *AdamW {
	return &AdamW{Cfg: cfg, M: make([]float32, n), V: make([]float32, n)}
}

// Update clips the gradients to the global norm (inside the update, without
// rewriting them) and applies one AdamW step
// with learning rate lr. It returns the gradient norm before clipping.
func (o *AdamW) Update(be kernels.Backend, m *Model, lr float32) float64 {
	norm := math.Sqrt(be.SumSquares(m.Grads))
	gscale := float32(1)
	if c := o.Cfg.ClipNorm; c > 0 && norm > c {
		gscale = float32(c / norm)
	}
	o.Step++
	for _, t := range m.Tensors {
		wd := float32(0)
		if t.Decay {
			wd = o.Cfg.WeightDecay
		}
		s := t.Offset
		e := s + t.Size
		be.AdamW(m.Params[s:e], m.Grads[s:e], o.M[s:e], o.V[s:e], lr, o.Cfg.Beta1, o.Cfg.Beta2, o.Cfg.Eps, wd, gscale, o.Step)
	}
	return norm
}

// Schedule is linear warmup then cosine decay from MaxLR to MinLR.
type Schedule struct {
	MaxLR, MinLR float64
	Warmup       int // warmup steps: warmup_rate · decay_steps
	DecaySteps   int // steps at which the decay reaches MinLR
}

// LR is the learning rate of step (0-based).
//
//	step < Warmup:              MaxLR · (step+1)/Warmup
//	Warmup ≤ step < DecaySteps: MinLR + ½(MaxLR−MinLR)(1 + cos(π·(step−Warmup)/(DecaySteps−Warmup)))
//	after:                      MinLR
func (s Schedule) LR(step int) float64 {
	if step < s.Warmup {
		return s.MaxLR * float64(step+1) / float64(s.Warmup)
	}
	if step >= s.DecaySteps {
		return s.MinLR
	}
	r := float64(step-s.Warmup) / float64(s.DecaySteps-s.Warmup)
	return s.MinLR + 0.5*(s.MaxLR-s.MinLR)*(1+math.Cos(math.Pi*r))
}
