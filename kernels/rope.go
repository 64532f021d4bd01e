package kernels

import (
	"errors"
	"fmt"
	"math"
)

// RoPE describes the rotary position embeddings of a Llama model: the
// frequencies whose cosines and sines [RoPE.Table] precomputes for
// Backend.RoPEForward and RoPEBackward. The rotary dimension is the head
// size hd; pair i < hd/2 of a head turns at frequency θ_i = Theta^(−2i/hd)
// radians per position (Hugging Face's inv_freq).
type RoPE struct {
	// Theta is the base of the frequencies (HF rope_theta): 10000 in
	// Llama 2, 500000 in Llama 3.
	Theta float64
	// Scaling is Llama 3.1's frequency scaling (HF rope_scaling with
	// rope_type "llama3"), or nil for none.
	Scaling *RoPEScaling
}

// RoPEScaling is Llama 3.1's frequency scaling, which stretches the low
// frequencies to a longer context than the model was first trained on.
// With wavelength λ_i = 2π/θ_i and L = OriginalMaxPositions:
//
//	λ_i < L/HighFreqFactor:  θ_i unchanged (high frequencies)
//	λ_i > L/LowFreqFactor:   θ_i / Factor  (low frequencies)
//	otherwise:               (1−s)·θ_i/Factor + s·θ_i,
//	                         s = (L/λ_i − LowFreqFactor) / (HighFreqFactor − LowFreqFactor)
type RoPEScaling struct {
	Factor               float64 // factor: 8 in Llama 3.1, 32 in Llama 3.2
	LowFreqFactor        float64 // low_freq_factor: 1
	HighFreqFactor       float64 // high_freq_factor: 4
	OriginalMaxPositions int     // original_max_position_embeddings: 8192
}

// Check returns an error saying what is wrong with r for head size hd, or
// nil: an even hd of at least 2, a positive finite Theta, and a scaling
// with Factor > 0, 0 < LowFreqFactor < HighFreqFactor and a positive
// original context.
func (r RoPE) Check(hd int) error {
	if hd < 2 || hd%2 != 0 {
		return fmt.Errorf("rotary embeddings need an even head size of at least 2, not %d", hd)
	}
	if !(r.Theta > 0) || math.IsInf(r.Theta, 0) {
		return fmt.Errorf("rope theta %v: want a positive number (10000 in Llama 2, 500000 in Llama 3)", r.Theta)
	}
	if s := r.Scaling; s != nil {
		switch {
		case !(s.Factor > 0) || math.IsInf(s.Factor, 0):
			return fmt.Errorf("rope scaling factor %v: want a positive number (8 in Llama 3.1)", s.Factor)
		case !(s.LowFreqFactor > 0 && s.HighFreqFactor > s.LowFreqFactor) || math.IsInf(s.HighFreqFactor, 0):
			return fmt.Errorf("rope scaling low_freq_factor %v, high_freq_factor %v: want 0 < low < high (1 and 4 in Llama 3.1)", s.LowFreqFactor, s.HighFreqFactor)
		case s.OriginalMaxPositions < 1:
			return errors.New("rope scaling original_max_position_embeddings: want a positive number of positions (8192 in Llama 3.1)")
		}
	}
	return nil
}

// InvFreq returns the hd/2 frequencies θ_i, in radians per position, after
// the scaling if there is one, computed in float64.
func (r RoPE) InvFreq(hd int) []float64 {
	f := make([]float64, hd/2)
	for i := range f {
		f[i] = math.Pow(r.Theta, -float64(2*i)/float64(hd))
	}
	s := r.Scaling
	if s == nil {
		return f
	}
	L := float64(s.OriginalMaxPositions)
	lowWave, highWave := L/s.LowFreqFactor, L/s.HighFreqFactor
	for i, th := range f {
		switch wave := 2 * math.Pi / th; {
		case wave < highWave:
		case wave > lowWave:
			f[i] = th / s.Factor
		default:
			sm := (L/wave - s.LowFreqFactor) / (s.HighFreqFactor - s.LowFreqFactor)
			f[i] = (1-sm)*th/s.Factor + sm*th
		}
	}
	return f
}

// Table fills table (maxT,hd), the table RoPEForward reads: row p holds
// cos(p·θ_i) for i < hd/2, then sin(p·θ_i), each computed in float64 and
// rounded once. table may be a backend's buffer (kernels.Float32s; Sync
// before filling it).
func (r RoPE) Table(table []float32, maxT, hd int) {
	f := r.InvFreq(hd)
	h := hd / 2
	for p := 0; p < maxT; p++ {
		row := table[p*hd : (p+1)*hd]
		for i, th := range f {
			s, c := math.Sincos(float64(p) * th)
			row[i], row[h+i] = float32(c), float32(s)
		}
	}
}
