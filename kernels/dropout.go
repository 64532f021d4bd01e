package kernels

// Dropout describes one dropout site of one forward pass. The mask is not
// stored: element i is kept when a counter-based hash of (Key, i) is at least
// P, so the backward pass (and a recompute) regenerates the very same mask,
// and a rank holding a slice of a tensor can draw exactly the elements a
// single process would have drawn by passing their global indices. Every
// backend draws the same mask from the same Dropout.
type Dropout struct {
	P   float32 // probability of zeroing an element; 0 disables the site
	Key uint64  // identifies the site: seed, step, micro-batch, layer, kind

	// Heads and Head0 place a tensor-parallel rank's attention heads in
	// the single process's (B,NH,T,T) probability tensor: the rank holds
	// heads Head0 … Head0+nh−1 of Heads. Zero Heads means all of them.
	Heads, Head0 int
}

// AttIndex is the stream index of row r = h·T + t of batch row bb's local
// (nh,T,T) attention probabilities, given off, the index of element
// [0,0,0,0] of the whole (B,Heads,T,T) tensor.
func (d Dropout) AttIndex(off uint64, bb, nh, r, T int) uint64 {
	hg, h0 := d.Heads, d.Head0
	if hg == 0 {
		hg, h0 = nh, 0
	}
	return off + uint64(((bb*hg+h0)*T+r)*T)
}

// On reports whether the site drops anything.
func (d Dropout) On() bool { return d.P > 0 }

// Scale is the factor 1/(1-P) applied to kept elements.
func (d Dropout) Scale() float32 { return 1 / (1 - d.P) }

// Keep reports whether element i survives.
func (d Dropout) Keep(i uint64) bool {
	u := float32(mix64(d.Key^mix64(i+0x9e3779b97f4a7c15))>>40) * (1.0 / (1 << 24))
	return u >= d.P
}

// Apply writes in[i]·mask/(1−P) to out[i], where element i has index
// first+i in the site's stream. out may alias in.
func (d Dropout) Apply(out, in []float32, first uint64) {
	s := d.Scale()
	out = out[:len(in)]
	for i, v := range in {
		if d.Keep(first + uint64(i)) {
			out[i] = v * s
		} else {
			out[i] = 0
		}
	}
}

// SiteKey derives a site key from its parts (seed, step, micro-batch, layer,
// kind); it is a pure function so every rank derives the same key.
func SiteKey(parts ...uint64) uint64 {
	h := uint64(0x243f6a8885a308d3)
	for _, p := range parts {
		h = mix64(h ^ mix64(p+0x9e3779b97f4a7c15))
	}
	return h
}

// mix64 is the splitmix64 finaliser: a bijective 64-bit mixer.
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}
