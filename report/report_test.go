package report

import (
	"errors"
	"image/png"
	"math"
	"os"
	"path/filepath"
	"testing"

	"gonum.org/v1/plot/plotter"

	"github.com/gptui/gptui/event"
)

// TestWriteFile: the picture of two ranks' records is a PNG of the asked
// size, written whole; a directory that does not exist is an error that
// says so, and leaves nothing.
func TestWriteFile(t *testing.T) {
	runs := Runs{}
	for r := range 2 {
		for s := range 20 {
			runs[r] = append(runs[r], event.Metrics{Step: s, Loss: 10 - float64(s)/4, LR: 1e-3, StepTimeS: 0.1 * float64(r+1), TokensPerS: 1000})
		}
		runs[r] = append(runs[r], event.Metrics{Step: 19, EvalLoss: 6})
	}
	path := filepath.Join(t.TempDir(), "r.png")
	if err := WriteFile(path, runs, Options{Width: 640, Height: 480, Title: "test"}); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatalf("not a PNG: %v", err)
	}
	if b := img.Bounds(); b.Dx() != 640 || b.Dy() != 480 {
		t.Errorf("%d×%d, want 640×480", b.Dx(), b.Dy())
	}
	if err := WriteFile(filepath.Join(t.TempDir(), "none", "r.png"), runs, Options{}); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a missing directory: %v", err)
	}
	if err := WriteFile(path, Runs{}, Options{}); !errors.Is(err, ErrNoMetrics) {
		t.Errorf("no records: %v", err)
	}
	left, _ := filepath.Glob(filepath.Join(filepath.Dir(path), ".report-*"))
	if len(left) != 0 {
		t.Errorf("temporary files left: %v", left)
	}
}

// TestPadFlat: a panel of one value (a constant learning rate) gets ±10%
// around it, not the plot's ±1 that shows it as 0.
func TestPadFlat(t *testing.T) {
	for _, v := range []float64{1e-3, 0, -2} {
		p := newPlot("lr", "")
		if err := addLine(p, "", plotter.XYs{{X: 0, Y: v}, {X: 10, Y: v}}, 0); err != nil {
			t.Fatal(err)
		}
		padFlat(p)
		if !(p.Y.Min < v && v < p.Y.Max) || v != 0 && p.Y.Max-p.Y.Min > 0.21*math.Abs(v)+1e-15 {
			t.Errorf("%g: range [%g, %g]", v, p.Y.Min, p.Y.Max)
		}
	}
}
