package engine

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestLayersHoldNoParallelism: the layers compute, the layout
// communicates. gpt2.go and llama.go call no collective and do no rank
// arithmetic; they reach the parallel dimensions only through the hooks
// of parallel (parallel.go).
func TestLayersHoldNoParallelism(t *testing.T) {
	banned := regexp.MustCompile(`(?i)\.(allReduce|allReduce64|allGather|reduceScatter|sumCopies|send|recv|exchange|gather|reduce)\(|MPRank|CPRank|\bm\.tp\.|\bm\.cp\.|\bm\.stage3\.|\bcomm\.`)
	for _, name := range []string{"gpt2.go", "llama.go"} {
		src, err := os.ReadFile(filepath.Join(srcDir, name))
		if err != nil {
			t.Fatal(err)
		}
		for i, line := range strings.Split(string(src), "\n") {
			code, _, _ := strings.Cut(line, "//")
			if loc := banned.FindString(code); loc != "" {
				t.Errorf("%s:%d: %q: the layers reach the layout only through m.par (parallel.go)", name, i+1, strings.TrimSpace(line))
			}
		}
	}
}
