// Command spearman checks the planner's predicted order of strategies
// against measured step times: it trains a small model with each strategy
// as 'gptui run --no-tui --nproc N' local CPU workers, takes the median
// step time of rank 0's metrics file (after the first steps), predicts
// each with the planner on the measured CPU profile ('gptui plan
// --profile'), and prints a Markdown table with Spearman's rank
// correlation between the two.
//
// Usage (from the repository root, after go build -o gptui ./cmd/gptui and
// ./gptui plan --profile):
//
//	go run ./planner/spearman -gptui ./gptui [-steps 30] [-rounds 1]
package main

import (
	"cmp"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/gptui/gptui/event"
	"github.com/gptui/gptui/planner"
	"github.com/gptui/gptui/presets"
)

// model is the small GPT the strategies train: 4 blocks of hidden 256 on
// sequences of 64, global batch 16, no dropout, the built-in corpus.
var model = []string{
	"Model.hidden_size=256", "Model.num_layers=4", "Model.num_attention_heads=4",
	"Data.Train.dataset.max_seq_len=64", "Model.hidden_dropout_prob=0", "Model.attention_probs_dropout_prob=0",
	"Engine.eval_freq=0", "Engine.logging_freq=1", "Engine.save_load.save_steps=0",
}

const globalBatch = 16

// strategies are the layouts compared, on 4 workers. The first is the
// baseline; oneFactor marks it and the strategies that change one
// dimension of it each (recompute, micro-batch, tensor parallel, pipeline
// parallel, stage 3), whose order is reported on its own as well: the two
// mixed layouts (dp2×mp2, dp2×pp2) sit between their neighbours.
var strategies = []planner.Strategy{
	{DP: 4, MicroBatch: 4},
	{DP: 4, MicroBatch: 4, Recompute: planner.RecomputeFull},
	{DP: 4, MicroBatch: 1},
	{DP: 2, MP: 2, MicroBatch: 4},
	{MP: 4, MicroBatch: 4},
	{DP: 2, PP: 2, MicroBatch: 2},
	{PP: 4, MicroBatch: 2},
	{ShardingDegree: 4, ShardingStage: 3, MicroBatch: 4},
}

// oneFactor indexes strategies: dp4 mb4 and one change of it per dimension.
var oneFactor = []int{0, 1, 2, 4, 6, 7}

func main() {
	gptui := flag.String("gptui", "./gptui", "the gptui binary")
	steps := flag.Int("steps", 30, "training steps per run (the first 5 are not timed)")
	rounds := flag.Int("rounds", 1, "runs per strategy, interleaved; the median of their medians is used")
	nproc := flag.Int("nproc", 4, "local workers")
	profile := flag.String("profile-file", "", "the measured cpu profile (default: gptui's cache directory)")
	flag.Parse()
	if err := run(*gptui, *steps, *rounds, *nproc, *profile); err != nil {
		fmt.Fprintln(os.Stderr, "spearman:", err)
		os.Exit(1)
	}
}

func run(gptui string, steps, rounds, nproc int, profilePath string) error {
	if profilePath == "" {
		var err error
		if profilePath, err = planner.DefaultProfilePath(); err != nil {
			return err
		}
	}
	dev, err := planner.LoadProfile(profilePath)
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("no profile at %s: run 'gptui plan --profile' first", profilePath)
	} else if err != nil {
		return err
	}
	cl := planner.Cluster{Nodes: 1, DevicesPerNode: nproc, Device: dev}
	cfg, err := presets.Load("tiny", append(slices.Clone(model), fmt.Sprintf("Global.global_batch_size=%d", globalBatch), fmt.Sprintf("Global.local_batch_size=%d", globalBatch)))
	if err != nil {
		return err
	}
	m := planner.ModelOf(cfg)
	pred := make([]planner.Plan, len(strategies))
	for i, s := range strategies {
		if pred[i] = planner.Estimate(m, cl, s); pred[i].Reason != "" {
			return fmt.Errorf("%s: %s", s, pred[i].Reason)
		}
	}
	measured := make([][]float64, len(strategies))
	tmp, err := os.MkdirTemp("", "spearman")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	for r := range rounds {
		for i, s := range strategies {
			dir := filepath.Join(tmp, fmt.Sprintf("r%d-s%d", r, i))
			args := []string{"run", "--no-tui", "--nproc", fmt.Sprint(nproc), "-c", "tiny",
				"-o", fmt.Sprintf("Engine.max_steps=%d", steps), "-o", "Engine.log_dir=" + dir}
			for _, o := range append(slices.Clone(model), planner.Overrides(s, globalBatch)...) {
				args = append(args, "-o", o)
			}
			start := time.Now()
			out, err := exec.Command(gptui, args...).CombinedOutput()
			if err != nil {
				return fmt.Errorf("%s: %v\n%s", s, err, out)
			}
			med, err := medianStep(event.MetricsFile(dir, 0), 5)
			if err != nil {
				return fmt.Errorf("%s: %w", s, err)
			}
			measured[i] = append(measured[i], med)
			fmt.Fprintf(os.Stderr, "round %d %-28s median step %.3f s (predicted %.3f s), %.0f s wall\n", r+1, s, med, pred[i].StepTime, time.Since(start).Seconds())
		}
	}
	var p, q []float64
	fmt.Printf("Machine: %s, %d CPUs; profile %s (%s)\n\n", hostname(), runtime.NumCPU(), profilePath, dev.Measured)
	fmt.Println("| strategy | predicted step (s) | measured median step (s) | runs | predicted rank | measured rank |")
	fmt.Println("| --- | --- | --- | --- | --- | --- |")
	for i := range strategies {
		p = append(p, pred[i].StepTime)
		q = append(q, median(measured[i]))
	}
	rp, rq := ranks(p), ranks(q)
	for i, s := range strategies {
		fmt.Printf("| %s | %.3f | %.3f | %s | %.0f | %.0f |\n", s, p[i], q[i], join(measured[i]), rp[i], rq[i])
	}
	fmt.Printf("\nSpearman's rank correlation, all %d strategies: %.3f\n", len(strategies), pearson(rp, rq))
	var p1, q1 []float64
	for _, i := range oneFactor {
		p1, q1 = append(p1, p[i]), append(q1, q[i])
	}
	fmt.Printf("Spearman's rank correlation, the baseline and one change per dimension (%d strategies): %.3f\n", len(oneFactor), pearson(ranks(p1), ranks(q1)))
	return nil
}

// medianStep is the median step_time_s of the metrics file's training
// lines from step skip on.
func medianStep(path string, skip int) (float64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	ms, err := event.ReadMetrics(path, f)
	if err != nil {
		return 0, err
	}
	var times []float64
	for _, m := range ms {
		if m.EvalLoss == 0 && m.Step >= skip {
			times = append(times, m.StepTimeS)
		}
	}
	if len(times) == 0 {
		return 0, fmt.Errorf("%s: no timed steps", path)
	}
	return median(times), nil
}

func median(x []float64) float64 {
	s := slices.Clone(x)
	slices.Sort(s)
	if len(s)%2 == 0 {
		return (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return s[len(s)/2]
}

// ranks returns the rank of each value (1 = smallest), ties averaged.
func ranks(x []float64) []float64 {
	idx := make([]int, len(x))
	for i := range idx {
		idx[i] = i
	}
	slices.SortFunc(idx, func(a, b int) int { return cmp.Compare(x[a], x[b]) })
	r := make([]float64, len(x))
	for i := 0; i < len(idx); {
		j := i
		for j+1 < len(idx) && x[idx[j+1]] == x[idx[i]] {
			j++
		}
		for k := i; k <= j; k++ {
			r[idx[k]] = float64(i+j)/2 + 1
		}
		i = j + 1
	}
	return r
}

// pearson is the correlation of a and b (of ranks: Spearman's).
func pearson(a, b []float64) float64 {
	var ma, mb float64
	for i := range a {
		ma += a[i]
		mb += b[i]
	}
	ma /= float64(len(a))
	mb /= float64(len(b))
	var sab, saa, sbb float64
	for i := range a {
		sab += (a[i] - ma) * (b[i] - mb)
		saa += (a[i] - ma) * (a[i] - ma)
		sbb += (b[i] - mb) * (b[i] - mb)
	}
	return sab / math.Sqrt(saa*sbb)
}

func join(x []float64) string {
	s := make([]string, len(x))
	for i, v := range x {
		s[i] = fmt.Sprintf("%.3f", v)
	}
	return strings.Join(s, ", ")
}

func hostname() string {
	h, err := os.Hostname()
	if err != nil {
		return "unknown"
	}
	return h
}
