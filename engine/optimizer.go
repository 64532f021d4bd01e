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

// Span maps elements of a rank's shard to the flat parameter layout:
// elements At … At+N−1 of the shard's buffers (parameters, gradients,
// moments) are Params[Flat … Flat+N−1] of the model's layout.
type Span struct{ At, Flat, N int }

// AdamW keeps the moments of the parameters it updates — all of them, or
// one rank's shard of the flat parameter buffer under sharding — and
// applies weight decay only to matrices and embeddings.
type AdamW struct {
	Cfg   AdamWConfig
	Spans []Span    // where the moments' elements lie in the layout, ascending
	M, V  []float32 // first and second moments, laid out by Spans
	Step  int       // updates applied so far
}

// NewAdamW returns the optimizer of the parameters spans maps ({0, 0,
// NumParams} for all of them), with zero moments in be's memory.
func NewAdamW(be kernels.Backend, cfg AdamWConfig, spans []Span) *AdamW {
	n := 0
	for _, s := range spans {
		n = max(n, s.At+s.N)
	}
	return &AdamW{Cfg: cfg, Spans: spans, M: kernels.Float32s(be, n), V: kernels.Float32s(be, n)}
}

// ClipScale is the factor global-norm clipping applies to gradients whose
// norm is norm: clip_norm/norm above the threshold, else 1.
func (o *AdamW) ClipScale(norm float64) float32 {
	if c := o.Cfg.ClipNorm; c > 0 && norm > c {
		return float32(c / norm)
	}
	return 1
}

// Apply runs one AdamW step on params, the parameters o.Spans maps (laid
// out as the moments, wherever the caller holds them), with gradients
// grads laid out the same way, multiplied by gscale, tensor by tensor so
// that each gets its weight decay.
func (o *AdamW) Apply(be kernels.Backend, m *Model, params, grads []float32, gscale, lr float32) {
	o.Step++
	for _, sp := range o.Spans {
		for _, t := range m.Tensors {
			s, e := max(t.Offset, sp.Flat), min(t.Offset+t.Size, sp.Flat+sp.N)
			if s >= e {
				continue
			}
			wd := float32(0)
			if t.Decay {
				wd = o.Cfg.WeightDecay
			}
			a, b := sp.At+s-sp.Flat, sp.At+e-sp.Flat
			be.AdamW(params[a:b], grads[a:b], o.M[a:b], o.V[a:b], lr, o.Cfg.Beta1, o.Cfg.Beta2, o.Cfg.Eps, wd, gscale, o.Step)
		}
	}
}

// Schedule is linear warmup then cosine decay from MaxLR to MinLR. A
// checkpoint records the schedule it was trained with (see restoreSchedule).
type Schedule struct {
	MaxLR      float64 `json:"max_lr"`
	MinLR      float64 `json:"min_lr"`
	Warmup     int     `json:"warmup_steps"` // warmup steps: warmup_rate · decay_steps
	DecaySteps int     `json:"decay_steps"`  // steps at which the decay reaches MinLR
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
