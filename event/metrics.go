package event

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
)

// MetricsFile returns the path of rank's metrics file in the log
// directory dir: metrics.<rank>.jsonl, one engine.Metrics record per line,
// which the engine writes, the agent tails and `gptui report` reads.
func MetricsFile(dir string, rank int) string {
	return filepath.Join(dir, "metrics."+strconv.Itoa(rank)+".jsonl")
}

// metricsName matches the name MetricsFile gives, capturing the rank.
var metricsName = regexp.MustCompile(`^metrics\.(\d+)\.jsonl$`)

// MetricsFiles returns the ranks whose metrics files are in dir, and their
// paths, by ascending rank.
func MetricsFiles(dir string) (map[int]string, error) {
	des, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	out := map[int]string{}
	for _, de := range des {
		m := metricsName.FindStringSubmatch(de.Name())
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
		var m Metrics
		if json.Unmarshal(sc.Bytes(), &m) == nil {
			out = append(out, m)
		}
	}
	if err := sc.Err(); err != nil {
		return out, fmt.Errorf("%s: %w", name, err)
	}
	slices.SortStableFunc(out, func(a, b Metrics) int { return a.Step - b.Step })
	return out, nil
}
