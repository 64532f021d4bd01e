package event

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"sync"
)

// Metrics is one record of a worker's metrics file (MetricsFile): one
// logged training step, or an evaluation (EvalLoss set, the other figures
// of the step it followed). The engine writes them; the agent, the UI and
// `gptui report` read them.
type Metrics struct {
	Step       int     `json:"step"`
	Epoch      int     `json:"epoch"`
	Loss       float64 `json:"loss"`
	LR         float64 `json:"lr"`
	GradNorm   float64 `json:"grad_norm"`
	TokensPerS float64 `json:"tokens_per_s"`
	StepTimeS  float64 `json:"step_time_s"`
	ReaderS    float64 `json:"reader_cost_s"`
	// CommBytes counts the bytes this rank sent in the step, per group.
	CommBytes map[string]int64 `json:"comm_bytes,omitempty"`
	// CommS is how long this rank's communicator operations ran per step,
	// waiting for their peers included (see ComputeS).
	CommS    float64 `json:"comm_s,omitempty"`
	MFU      float64 `json:"mfu"`
	MemBytes int64   `json:"mem_bytes"`
	EvalLoss float64 `json:"eval_loss,omitempty"`
	// LossScale and SkippedSteps are fp16's loss scale for the next step
	// and the steps skipped for gradient overflow so far.
	LossScale    float64 `json:"loss_scale,omitempty"`
	SkippedSteps int     `json:"skipped_steps,omitempty"`
	// NonFinite names the figures that were NaN or infinite (a skipped
	// fp16 step's gradient norm, a diverged loss): JSON has no such
	// numbers, so they are written as 0 and named here.
	NonFinite []string `json:"non_finite,omitempty"`
}

// Finite returns m with its NaN and infinite figures set to 0 and named
// in NonFinite, so that it encodes as JSON.
func (m Metrics) Finite() Metrics {
	for _, f := range []struct {
		name string
		v    *float64
	}{{"loss", &m.Loss}, {"lr", &m.LR}, {"grad_norm", &m.GradNorm}, {"tokens_per_s", &m.TokensPerS},
		{"step_time_s", &m.StepTimeS}, {"reader_cost_s", &m.ReaderS}, {"comm_s", &m.CommS}, {"mfu", &m.MFU}, {"eval_loss", &m.EvalLoss}, {"loss_scale", &m.LossScale}} {
		if math.IsNaN(*f.v) || math.IsInf(*f.v, 0) {
			*f.v = 0
			m.NonFinite = append(m.NonFinite, f.name)
		}
	}
	return m
}

// AppendLine appends m to b as one line of a metrics file: its JSON
// encoding, with its non-finite figures named (see Finite), and a newline.
// The engine writes its records with it; [DecodeMetrics] reads them back.
func (m Metrics) AppendLine(b []byte) ([]byte, error) {
	j, err := json.Marshal(m.Finite())
	if err != nil {
		return b, err
	}
	return append(append(b, j...), '\n'), nil
}

// DecodeMetrics decodes one line of a metrics file (its newline may be
// there or not). ok is false for a line that is not a record, such as the
// torn last line of a killed run. ReadMetrics and the agent's tail read
// the records with it.
func DecodeMetrics(line []byte) (m Metrics, ok bool) {
	return m, json.Unmarshal(line, &m) == nil
}

// ComputeS is the part of the step this rank spent on its own work: the
// step time less the time in communicator operations (CommS), at least 0.
// In a synchronous job every rank's step takes as long as the slowest's,
// since the others wait for it in the collectives; the slowest rank is the
// one with the longest ComputeS.
func (m Metrics) ComputeS() float64 { return max(m.StepTimeS-m.CommS, 0) }

// MetricsFile returns the path of rank's metrics file in the log
// directory dir: metrics.<rank>.jsonl, one Metrics record per line,
// which the engine writes, the agent tails and `gptui report` reads.
func MetricsFile(dir string, rank int) string {
	return filepath.Join(dir, "metrics."+strconv.Itoa(rank)+".jsonl")
}

// metricsName matches the name MetricsFile gives, capturing the rank.
var metricsName = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^metrics\.(\d+)\.jsonl$`) })

// MetricsFiles returns the ranks whose metrics files are in dir, and their
// paths, by ascending rank.
func MetricsFiles(dir string) (map[int]string, error) {
	des, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	out := map[int]string{}
	for _, de := range des {
		m := metricsName().FindStringSubmatch(de.Name())
		if m == nil || de.IsDir() {
			continue
		}
		r, err := strconv.Atoi(m[1])
		if err != nil {
			continue
		}
		out[r] = filepath.Join(dir, de.Name())
	}
	return out, nil
}

// maxMetricsLine bounds one record of a metrics file.
const maxMetricsLine = 1 << 20

// ReadMetrics reads the records of a metrics file from r. A line that is
// not a record (a torn last line of a killed run) is skipped; name names
// the file in errors.
func ReadMetrics(name string, r io.Reader) ([]Metrics, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), maxMetricsLine)
	var out []Metrics
	for sc.Scan() {
		if m, ok := DecodeMetrics(sc.Bytes()); ok {
			out = append(out, m)
		}
	}
	if err := sc.Err(); err != nil {
		return out, fmt.Errorf("%s: %w", name, err)
	}
	slices.SortStableFunc(out, func(a, b Metrics) int { return a.Step - b.Step })
	return out, nil
}
