package presets

// Hard limits on a model's size, whatever the machine. They keep every size
// product the engine computes inside an int and refuse shapes no machine
// could hold before anything is allocated for them; whether a model fits
// this machine's memory is checked by the process that would allocate it.
const (
	// MaxLayers bounds Model.num_layers (GPT-3 175B has 96).
	MaxLayers = 1 << 14
	// MaxElements bounds a model's parameter count and the element count
	// of any one activation tensor: 2^40 float32 values are 4 TiB.
	MaxElements = 1 << 40
)

// ParamBound is the parameter count of a GPT-2 with a vocabulary of vp
// (padded) rows, maxT positions, L blocks of hidden size C and MLP width F,
// computed in float64 so that it cannot overflow for any sizes. The engine's
// layout (engine.Layout) counts the same parameters exactly.
func ParamBound(vp, maxT, L, C, F int) float64 {
	c, f := float64(C), float64(F)
	block := 4*c*c + 2*c*f + 9*c + f // ln1, qkv, attention projection, ln2, fc, fc projection
	return float64(vp)*c + float64(maxT)*c + float64(L)*block + 2*c
}

// ActivationBound is the element count of the largest single activation
// tensor a micro-batch of B sequences of T tokens needs: the attention
// probabilities (B·NH·T·T), the logits (B·T·vp), the MLP's (B·T·F) or the
// QKV projection's (B·T·3C), in float64 so that it cannot overflow.
func ActivationBound(B, T, NH, C, F, vp int) float64 {
	bt := float64(B) * float64(T)
	return max(bt*float64(NH)*float64(T), bt*float64(vp), bt*float64(F), bt*3*float64(C))
}
