package engine

import (
	"context"
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/gptui/gptui/kernels"
	"github.com/gptui/gptui/kernels/cpu"
	"github.com/gptui/gptui/units"
)

// peakOf is a CPU backend whose PeakFLOPS is peak.
type peakOf struct {
	kernels.Backend
	peak float64
}

func (b peakOf) PeakFLOPS() float64 { return b.peak }

// TestMeterUnknownPeak: a backend that does not know its peak (0, as the
// GPU backend's when its fallback measurement cannot run; NaN or Inf from
// a broken one) trains on, its log lines and metrics showing the MFU as
// unknown rather than Inf or NaN; a known peak gives a percentage. The
// [memory] and [train] lines give the memory account as every screen
// does (units.Bytes: binary units, labelled).
func TestMeterUnknownPeak(t *testing.T) {
	for _, tc := range []struct {
		name    string
		peak    float64
		known   bool
		backend string // in the [backend] line
	}{
		{"known", 1e9, true, ", peak 1.0 GFLOP/s"},
		{"zero", 0, false, ", peak unknown (MFU not shown)"},
		{"not a number", math.NaN(), false, ", peak unknown (MFU not shown)"},
		{"infinite", math.Inf(1), false, ", peak unknown (MFU not shown)"},
		{"negative", -1, false, ", peak unknown (MFU not shown)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			cfg := smallConfig(t, dir+"/out", dir, 2)
			var log strings.Builder
			tr, err := NewTrainer(cfg, peakOf{cpu.New(), tc.peak}, Options{Builtin: smallTokens, Stdout: &log})
			if err != nil {
				t.Fatal(err)
			}
			res, err := tr.Run(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			out := log.String()
			mem := tr.Memory
			account := fmt.Sprintf("[memory] rank 0: params %s grads %s optimizer %s activations %s (recompute: off) scratch %s total %s\n",
				units.Bytes(mem.Params), units.Bytes(mem.Grads), units.Bytes(mem.Optimizer), units.Bytes(mem.Activations), units.Bytes(mem.Scratch), units.Bytes(mem.Total()))
			if !strings.Contains(out, account) || !strings.Contains(account, "iB grads ") || mem.Scratch <= 0 {
				t.Errorf("the log lacks %q:\n%s", account, out)
			}
			if !strings.Contains(out, tc.backend) {
				t.Errorf("the log lacks %q:\n%s", tc.backend, out)
			}
			for _, bad := range []string{"Inf", "NaN"} {
				if strings.Contains(out, bad) {
					t.Errorf("the log shows %s:\n%s", bad, out)
				}
			}
			trains := 0
			for _, l := range strings.Split(out, "\n") {
				if !strings.Contains(l, "[train] ") {
					continue
				}
				trains++
				if unknown := strings.Contains(l, " mfu: unknown mem: "); unknown == tc.known || !strings.Contains(l, " mfu: ") {
					t.Errorf("[train] line with a peak of %v: %q", tc.peak, l)
				}
				if !strings.HasSuffix(l, " mem: "+units.Bytes(mem.Total())) {
					t.Errorf("[train] line does not end with the memory total, %s: %q", units.Bytes(mem.Total()), l)
				}
			}
			if trains == 0 {
				t.Errorf("no [train] line:\n%s", out)
			}
			if bad := math.IsNaN(res.MFU) || math.IsInf(res.MFU, 0); bad || (res.MFU > 0) != tc.known {
				t.Errorf("Result.MFU = %v with a peak of %v", res.MFU, tc.peak)
			}
		})
	}
}
