package event

import (
	"bytes"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// TestMetricsFiles: the files MetricsFile names are found again by rank,
// and ReadMetrics reads their records by step, skipping a torn line.
func TestMetricsFiles(t *testing.T) {
	dir := t.TempDir()
	for _, r := range []int{0, 3, 12} {
		if err := os.WriteFile(MetricsFile(dir, r), []byte(`{"step":1,"loss":2.5}`+"\n"+`{"step":0,"loss":3}`+"\n"+`{"step":2,"lo`), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	os.WriteFile(filepath.Join(dir, "metrics.x.jsonl"), nil, 0o644)
	os.WriteFile(filepath.Join(dir, "workerlog.0"), nil, 0o644)
	files, err := MetricsFiles(dir)
	if err != nil {
		t.Fatal(err)
	}
	if want := map[int]string{0: MetricsFile(dir, 0), 3: MetricsFile(dir, 3), 12: MetricsFile(dir, 12)}; !reflect.DeepEqual(files, want) {
		t.Errorf("MetricsFiles = %v, want %v", files, want)
	}
	f, _ := os.Open(files[3])
	defer f.Close()
	ms, err := ReadMetrics(files[3], f)
	if err != nil || len(ms) != 2 || ms[0].Step != 0 || ms[1].Loss != 2.5 {
		t.Errorf("ReadMetrics = %+v, %v", ms, err)
	}
	if _, err := ReadMetrics("big", strings.NewReader(strings.Repeat("x", maxMetricsLine+1))); err == nil || !strings.Contains(err.Error(), "big") {
		t.Errorf("a line over the limit: %v", err)
	}
}

// TestMetricsLine: a record written by AppendLine is one line that
// DecodeMetrics reads back, its NaN and infinite figures as 0 named in
// NonFinite; a torn line is not a record.
func TestMetricsLine(t *testing.T) {
	m := Metrics{Step: 7, Epoch: 1, Loss: math.NaN(), LR: 3e-4, GradNorm: math.Inf(1), TokensPerS: 1234.5, StepTimeS: 0.25,
		CommBytes: map[string]int64{"dp": 1 << 20}, CommS: 0.01, MFU: 0.3, MemBytes: 1 << 30, LossScale: 65536, SkippedSteps: 2}
	b, err := m.AppendLine([]byte("previous\n"))
	if err != nil {
		t.Fatal(err)
	}
	line, ok := bytes.CutPrefix(b, []byte("previous\n"))
	if !ok || bytes.Count(line, []byte("\n")) != 1 || !bytes.HasSuffix(line, []byte("\n")) {
		t.Fatalf("AppendLine wrote %q after what was there", b)
	}
	got, ok := DecodeMetrics(line)
	want := m
	want.Loss, want.GradNorm, want.NonFinite = 0, 0, []string{"loss", "grad_norm"}
	if !ok || !reflect.DeepEqual(got, want) {
		t.Errorf("DecodeMetrics(%q) = %+v, %v; want %+v", line, got, ok, want)
	}
	if _, ok := DecodeMetrics(line[:len(line)/2]); ok {
		t.Errorf("a torn line %q decoded", line[:len(line)/2])
	}
}

func TestComputeS(t *testing.T) {
	for _, tc := range []struct {
		m    Metrics
		want float64
	}{
		{Metrics{StepTimeS: 0.5, CommS: 0.2}, 0.3},
		{Metrics{StepTimeS: 0.5}, 0.5},
		{Metrics{StepTimeS: 0.5, CommS: 0.7}, 0}, // operations overlapping the compute
	} {
		if got := tc.m.ComputeS(); got < tc.want-1e-12 || got > tc.want+1e-12 {
			t.Errorf("%+v: ComputeS %g, want %g", tc.m, got, tc.want)
		}
	}
}

// FuzzDecodeMetrics: any line either is no record or decodes to a record
// that AppendLine writes and DecodeMetrics reads back to the same line; a metrics
// file of such lines reads without error.
func FuzzDecodeMetrics(f *testing.F) {
	good, _ := Metrics{Step: 3, Loss: 6.5, LR: 1e-3, GradNorm: math.NaN()}.AppendLine(nil)
	for _, s := range []string{string(good), `{"step":1}`, `{"step":`, `{"non_finite":["loss","x"]}`, `[1,2]`, `null`, ""} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, line []byte) {
		m, ok := DecodeMetrics(line)
		if !ok {
			return
		}
		b, err := m.AppendLine(nil)
		if err != nil {
			t.Fatalf("%q decodes to %+v, which does not encode: %v", line, m, err)
		}
		again, ok := DecodeMetrics(b)
		b2, _ := again.AppendLine(nil)
		if !ok || !bytes.Equal(b2, b) {
			t.Fatalf("%q: %+v written as %q reads back as %+v, written as %q (ok %v)", line, m, b, again, b2, ok)
		}
		if _, err := ReadMetrics("fuzz", bytes.NewReader(append(line, '\n'))); err != nil && len(line) < maxMetricsLine {
			t.Fatalf("ReadMetrics(%q): %v", line, err)
		}
	})
}
