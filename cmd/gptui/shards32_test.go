package main

import (
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/gptui/gptui/engine/data"
)

// TestTrainOn32BitShards: `gptui train` reads shards of 32-bit tokens
// (llm.c's Llama 3 layout, which `data prepare` writes for a vocabulary
// past 65,536) for a model of such a vocabulary, ids past 65,535
// included: its first loss is that of a model that has not learned,
// ln 70000, and a token past the vocabulary is refused naming the shard.
func TestTrainOn32BitShards(t *testing.T) {
	const V = 70000
	dir := t.TempDir()
	shards := filepath.Join(dir, "shards")
	os.Mkdir(shards, 0o755)
	toks := make([]uint32, 4096)
	r := rand.New(rand.NewPCG(32, 1))
	for i := range toks {
		toks[i] = uint32(1<<16 + r.IntN(V-1<<16)) // all past 16 bits
	}
	if err := data.WriteShard(filepath.Join(shards, "data_000000.bin"), toks); err != nil {
		t.Fatal(err)
	}
	args := []string{"train", "-c", "llama-tiny", "-o", "Model.vocab_size=" + strconv.Itoa(V), "-o", "Data.Train.dataset.input_dir=" + shards,
		"-o", "Data.Train.dataset.split=[1,0,0]", "-o", "Engine.eval_freq=0", "-o", "Engine.max_steps=2", "-o", "Engine.logging_freq=1",
		"-o", "Engine.save_load.save_steps=0", "-o", "Engine.log_dir=" + filepath.Join(dir, "log")}
	code, out, stderr := runCLI(t, args...)
	if code != 0 {
		t.Fatalf("train on 32-bit shards: exit %d\n%s\n%s", code, out, stderr)
	}
	if loss := lastLoss(t, filepath.Join(dir, "log"), 2); math.Abs(loss-math.Log(V)) > 0.5 {
		t.Errorf("the last loss is %.3f; want about ln %d = %.3f", loss, V, math.Log(V))
	}
	toks[100] = V
	if err := data.WriteShard(filepath.Join(shards, "data_000000.bin"), toks); err != nil {
		t.Fatal(err)
	}
	code, _, stderr = runCLI(t, args...)
	checkUserError(t, code, stderr, []string{"data_000000.bin", "token 70000", "outside the model's vocabulary of 70000"})
	if strings.Contains(stderr, "16-bit") {
		t.Errorf("the error speaks of 16-bit tokens: %s", stderr)
	}
}
