package cluster

import "github.com/gptui/gptui/presets"

// Reshape sets c's layout for ranks ranks as a restart on fewer (or more)
// nodes re-plans it (Restarts.MinNodes): the data-parallel and sharding
// degrees and the batch sizes change, the global batch is kept by
// gradient accumulation, the tensor and pipeline degrees stay. A layout
// that cannot take that many ranks is an error saying why. The terminal
// UI re-plans with it when a lost node is dropped by hand.
func Reshape(c *presets.Config, ranks int) error { return reshape(c, ranks) }
