package planner

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/gptui/gptui/units"
)

// WriteTable writes the ranked plans as the table 'gptui plan' prints: the
// first top feasible plans (all when top ≤ 0) with their memory per device
// by component, predicted step time, throughput, MFU, pipeline bubble and
// communication, then the first top rejected plans with their reasons and
// a count of the rest.
func WriteTable(w io.Writer, plans []Plan, top int) error {
	var ok, rejected []Plan
	for _, p := range plans {
		if p.Feasible {
			ok = append(ok, p)
		} else {
			rejected = append(rejected, p)
		}
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "#\tstrategy\tparams\tgrads\toptim\tacts\tscratch\tother\ttotal GiB\tstep s\ttokens/s\tMFU\tbubble\tcomm s\tsent GB\t")
	for i, p := range limit(ok, top) {
		m := p.Mem
		fmt.Fprintf(tw, "%d\t%s\t%.2f\t%.2f\t%.2f\t%.2f\t%.2f\t%.2f\t%.2f\t%.3f\t%.0f\t%.1f%%\t%s\t%.3f\t%.2f\t\n",
			i+1, p.Strategy, units.InGiB(m.Params), units.InGiB(m.Grads), units.InGiB(m.Optimizer), units.InGiB(m.Activations), units.InGiB(m.Scratch),
			units.InGiB(m.Other), units.InGiB(m.Total),
			p.StepTime, p.TokensPerS, 100*p.MFU, bubble(p), p.Time.Comm, p.CommBytes/1e9)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(ok) == 0 {
		fmt.Fprintln(w, "no feasible plan")
	} else if n := len(ok) - len(limit(ok, top)); n > 0 {
		fmt.Fprintf(w, "... and %d more feasible plan(s)\n", n)
	}
	if len(rejected) == 0 {
		return nil
	}
	fmt.Fprintf(w, "\nrejected: %d plan(s)\n", len(rejected))
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, p := range limit(rejected, top) {
		fmt.Fprintf(tw, "  %s\t%s\n", p.Strategy, p.Reason)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if n := len(rejected) - len(limit(rejected, top)); n > 0 {
		fmt.Fprintf(w, "  ... and %d more (%s)\n", n, ReasonCounts(rejected[len(limit(rejected, top)):]))
	}
	return nil
}

// Compare is one line setting plan p against the reference plan ref (the
// config's own strategy): how much faster p is predicted to be.
func Compare(p, ref Plan) string {
	var b strings.Builder
	fmt.Fprintf(&b, "config's strategy %s: ", ref.Strategy)
	if !ref.Feasible {
		fmt.Fprintf(&b, "infeasible (%s)", ref.Reason)
		if ref.StepTime > 0 {
			fmt.Fprintf(&b, "; would take %.3f s/step", ref.StepTime)
		}
		return b.String()
	}
	fmt.Fprintf(&b, "%.3f s/step, %s per device; chosen %s is %.2f× as fast (%.1f%% less time)",
		ref.StepTime, units.Bytes(ref.Mem.Total), p.Strategy, ref.StepTime/p.StepTime, 100*(1-p.StepTime/ref.StepTime))
	return b.String()
}

// Summary describes a plan's prediction in one line.
func Summary(p Plan) string {
	return fmt.Sprintf("%s: step %.3f s, %.0f tokens/s, MFU %.1f%%, memory %s per device (params %s grads %s optimizer %s activations %s scratch %s other %s), bubble %s, comm %.3f s",
		p.Strategy, p.StepTime, p.TokensPerS, 100*p.MFU, units.Bytes(p.Mem.Total), units.Bytes(p.Mem.Params), units.Bytes(p.Mem.Grads), units.Bytes(p.Mem.Optimizer),
		units.Bytes(p.Mem.Activations), units.Bytes(p.Mem.Scratch), units.Bytes(p.Mem.Other), bubble(p), p.Time.Comm)
}

func bubble(p Plan) string {
	if p.PP <= 1 {
		return "-"
	}
	return fmt.Sprintf("%.1f%%", 100*p.BubbleFraction)
}

func limit(p []Plan, top int) []Plan {
	if top > 0 && len(p) > top {
		return p[:top]
	}
	return p
}

// ReasonCounts counts the reasons of the infeasible plans by kind, in the
// order they first appear: "3000 out of memory, 23 not supported".
func ReasonCounts(plans []Plan) string {
	count := map[string]int{}
	var order []string
	for _, p := range plans {
		if p.Feasible {
			continue
		}
		k := p.Reason
		if i := strings.IndexByte(k, ':'); i > 0 {
			k = strings.TrimSpace(k[:i])
		}
		if count[k] == 0 {
			order = append(order, k)
		}
		count[k]++
	}
	var parts []string
	for _, k := range order {
		parts = append(parts, fmt.Sprintf("%d %s", count[k], k))
	}
	return strings.Join(parts, ", ")
}
