package main

import (
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/gptui/gptui/comm"
	"github.com/gptui/gptui/engine"
	"github.com/gptui/gptui/planner"
	"github.com/gptui/gptui/presets"
	"github.com/gptui/gptui/units"
)

// autoPlan applies Distributed.auto for 'gptui train' (planner.Auto: the
// fastest strategy for world CPU workers on this machine) and prints the
// choice and its prediction.
func autoPlan(cfg *presets.Config, overrides []string, world int, stdout io.Writer) (*presets.Config, *planner.Plan, error) {
	path, _ := planner.DefaultProfilePath()
	dev, _, err := planner.ProfileFor("cpu", path)
	if err != nil {
		return nil, nil, err
	}
	out, best, plans, err := planner.Auto(cfg, overrides, world, dev)
	if err != nil {
		return nil, nil, err
	}
	fmt.Fprintf(stdout, "[plan] auto: %d worker(s) on %s; %d plans, %d rejected\n", world, dev.Name, len(plans), planner.Rejected(plans))
	fmt.Fprintf(stdout, "[plan] chosen %s\n", planner.Summary(best))
	fmt.Fprintf(stdout, "[plan] applied: %s\n", strings.Join(planner.Overrides(best.Strategy, planner.ModelOf(cfg).GlobalBatch), " "))
	return out, &best, nil
}

// reportPlan logs the measured step time and memory beside the plan's
// prediction.
func reportPlan(stdout io.Writer, p *planner.Plan, stepS float64, mem engine.Memory) {
	rel := func(got, want float64) string {
		if want == 0 {
			return "n/a"
		}
		return strconv.FormatFloat(100*(got-want)/want, 'f', 1, 64) + "%"
	}
	fmt.Fprintf(stdout, "[plan] measured: step %.3f s (predicted %.3f s, %s), memory %s (predicted %s, %s)\n",
		stepS, p.StepTime, rel(stepS, p.StepTime), units.Bytes(mem.Total()), units.Bytes(p.Mem.Total), rel(float64(mem.Total()), float64(p.Mem.Total)))
}

// worldSize is the number of ranks of w; 1 without one.
func worldSize(w *comm.World) int {
	if w == nil {
		return 1
	}
	return w.Size()
}
