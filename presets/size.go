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

// ActivationBound is the element count of the largest single activation
// tensor a micro-batch of B sequences of T tokens needs: the attention
// probabilities (B·NH·T·T), the logits (B·T·vp), the MLP's (B·T·F) or the
// QKV projection's (B·T·3C), in float64 so that it cannot overflow.
func ActivationBound(B, T, NH, C, F, vp int) float64 {
	bt := float64(B) * float64(T)
	return max(bt*float64(NH)*float64(T), bt*float64(vp), bt*float64(F), bt*3*float64(C))
}
