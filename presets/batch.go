package presets

import (
	"fmt"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Batch-size keys and the degrees that multiply the local batch.
const (
	globalBatchPath = "Global.global_batch_size"
	localBatchPath  = "Global.local_batch_size"
	microBatchPath  = "Global.micro_batch_size"
	dpPath          = "Distributed.dp_degree"
	shardingPath    = "Distributed.sharding.sharding_degree"
)

// deriveBatch re-derives the batch sizes that a file or preset fixed when
// the overrides change how many ranks share the global batch but say
// nothing of the local batch: "-c tiny -o Distributed.dp_degree=2" keeps
// tiny's global batch of 8 and gives each of the 2 replicas 4, instead of
// refusing tiny's local batch of 8 as contradicting it. The micro-batch is
// lowered, when it no longer divides the local batch, to the largest size
// that divides both (so it never grows). Nothing changes unless the
// overrides set dp_degree, sharding_degree or global_batch_size, leave
// local_batch_size alone, and the global batch divides evenly; otherwise
// validation reports the contradiction as before. It returns a line that
// says what was derived, or "".
func (l *loader) deriveBatch(t *tree) string {
	c, set, err := decode(l.s, t)
	if err != nil {
		return "" // finish reports it
	}
	overridden := func(path string) bool {
		at, ok := set[path]
		return ok && strings.HasPrefix(at.file, "override ")
	}
	if overridden(localBatchPath) || !(overridden(dpPath) || overridden(shardingPath) || overridden(globalBatchPath)) {
		return ""
	}
	_, haveGlobal := set[globalBatchPath]
	_, haveLocal := set[localBatchPath]
	if !haveGlobal || !haveLocal {
		return "" // the defaults derive what is unset
	}
	g := c.Global
	dp, sh := max(c.Distributed.DPDegree, 1), max(c.Distributed.Sharding.ShardingDegree, 1)
	ranks := mulPositive(dp, sh)
	if ranks == 0 || g.GlobalBatchSize <= 0 || g.GlobalBatchSize == mulPositive(g.LocalBatchSize, ranks) || g.GlobalBatchSize%ranks != 0 {
		return ""
	}
	local := g.GlobalBatchSize / ranks
	at := pos{file: "derived"}
	t.setPath(localBatchPath, &entry{at: at, value: intNode(local)})
	note := fmt.Sprintf("Global.local_batch_size %d derived from global_batch_size %d ÷ (dp_degree %d × sharding_degree %d)",
		local, g.GlobalBatchSize, dp, sh)
	if _, haveMicro := set[microBatchPath]; haveMicro && !overridden(microBatchPath) && g.MicroBatchSize > 0 && local%g.MicroBatchSize != 0 {
		micro := gcd(local, g.MicroBatchSize)
		t.setPath(microBatchPath, &entry{at: at, value: intNode(micro)})
		note += fmt.Sprintf(", micro_batch_size %d → %d", g.MicroBatchSize, micro)
	}
	return note + "; set Global.local_batch_size with -o to choose another"
}

// intNode is the YAML scalar of n.
func intNode(n int) *yaml.Node {
	return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!int", Value: strconv.Itoa(n)}
}

// gcd is the greatest common divisor of two positive integers.
func gcd(a, b int) int {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}
