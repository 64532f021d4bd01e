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

// AdamW keeps the moments of the parameters it updates — all of them, or
// one rank's shard of the flat parameter buffer under sharding — and applies
// weight decay only to matrices and embeddings.
type AdamW struct {
	Cfg    AdamWConfig
	Lo, Hi int       // the slice Params[Lo:Hi] this optimizer updates
	M, V   []float32 // first and second moments of Params[Lo:Hi]
	Step   int       // updates applied so far
}

// NewAdamW returns the optimizer of Params[lo:hi] (0 and the parameter
// count for all of them), with zero moments in be's memory.
func NewAdamW(be kernels.Backend, cfg AdamWConfig, lo, hi int) *AdamW {
	return &AdamW{Cfg: cfg, Lo: lo, Hi: hi, M: kernels.Float32s(be, hi-lo), V: kernels.Float32s(be, hi-lo)}
}

// ClipScale is the factor global-norm clipping applies to gradients whose
// norm is norm: clip_norm/norm above the threshold, else 1.
func (o *AdamW) ClipScale(norm float64) float32 {
	if c := o.Cfg.ClipNorm; c > 0 && norm > c {
		return float32(c / norm)
	}
	return 1
}

// Apply runs one AdamW step on m.Params[Lo:Hi] with gradients grads
// (grads[i] belongs to Params[Lo+i]) multiplied by gscale, tensor by
// tensor so that each gets its weight decay.
func (o *AdamW) Apply(be kernels.Backend, m *Model, grads []float32, gscale, lr float32) {
	o.Step++
	for _, t := range m.Tensors {
		s, e := max(t.Offset, o.Lo), min(t.Offset+t.Size, o.Hi)
		if s >= e {
			continue
		}
		wd := float32(0)
		if t.Decay {
			wd = o.Cfg.WeightDecay
		}
		be.AdamW(m.Params[s:e], grads[s-o.Lo:e-o.Lo], o.M[s-o.Lo:e-o.Lo], o.V[s-o.Lo:e-o.Lo], lr, o.Cfg.Beta1, o.Cfg.Beta2, o.Cfg.Eps, wd, gscale, o.Step)
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
