package engine

import (
	"context"
	"encoding/hex"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/gptui/gptui/comm"
	"github.com/gptui/gptui/engine/checkpoint"
)

// Each rank's record in the resume agreement, as float32s that hold
// integers below 2^16 exactly: whether it resumes, the step (two 16-bit
// halves), the first 128 bits of its manifest's SHA-256 (eight 16-bit
// chunks) and its host name (one byte each, zero padded).
const (
	agreeHashChunks = 8
	agreeHostBytes  = 64
	agreeRecord     = 3 + agreeHashChunks + agreeHostBytes
)

// resumePoint is what one rank would start from.
type resumePoint struct {
	step int    // -1: from scratch
	hash string // hex prefix of the manifest's SHA-256; "" from scratch
	host string
}

// agreeResume checks, before any compute, that every rank of the world
// starts from the same checkpoint: the ranks all-gather the step and
// manifest hash of what they resume from (ck, nil for none) and their
// node names (GPTUI_NODE, which the cluster launcher sets, else the host name). Ranks that would start from different steps, or from the
// same step with different manifests, get a *ConfigError naming them.
// It costs one all-gather of a few hundred bytes per rank. It returns
// every rank's node name (nil for one process), by which a parallel save
// knows which ranks share a machine.
func agreeResume(ctx context.Context, w *comm.World, ck *checkpoint.Checkpoint) ([]string, error) {
	if w == nil || w.Size() == 1 {
		return nil, nil
	}
	self := resumePoint{step: -1}
	// The node's name in the launcher's inventory, else the host name.
	if self.host = os.Getenv("GPTUI_NODE"); self.host == "" {
		self.host, _ = os.Hostname()
	}
	if ck != nil {
		s, err := checkpoint.Summarize(ck)
		if err != nil {
			return nil, err
		}
		self.step, self.hash = s.Step, s.Manifest[:4*agreeHashChunks]
	}
	g, err := w.WorldGroup("resume")
	if err != nil {
		return nil, err
	}
	out := make([]float32, agreeRecord*w.Size())
	if err := g.AllGather(ctx, encodeResumePoint(self), out); err != nil {
		return nil, fmt.Errorf("resume: agreeing on the checkpoint: %w", err)
	}
	points := make([]resumePoint, w.Size())
	hosts := make([]string, w.Size())
	for r := range points {
		points[r] = decodeResumePoint(out[r*agreeRecord : (r+1)*agreeRecord])
		hosts[r] = points[r].host
	}
	return hosts, resumeDisagreement(points)
}

func encodeResumePoint(p resumePoint) []float32 {
	rec := make([]float32, agreeRecord)
	if p.step >= 0 {
		rec[0] = 1
		rec[1], rec[2] = float32(p.step>>16), float32(p.step&0xffff)
		b, _ := hex.DecodeString(p.hash)
		for i := 0; i+1 < len(b) && i/2 < agreeHashChunks; i += 2 {
			rec[3+i/2] = float32(int(b[i])<<8 | int(b[i+1]))
		}
	}
	for i := 0; i < len(p.host) && i < agreeHostBytes; i++ {
		rec[3+agreeHashChunks+i] = float32(p.host[i])
	}
	return rec
}

func decodeResumePoint(rec []float32) resumePoint {
	p := resumePoint{step: -1}
	if rec[0] == 1 {
		p.step = int(rec[1])<<16 | int(rec[2])
		b := make([]byte, 2*agreeHashChunks)
		for i := range agreeHashChunks {
			v := int(rec[3+i])
			b[2*i], b[2*i+1] = byte(v>>8), byte(v)
		}
		p.hash = hex.EncodeToString(b)
	}
	var host []byte
	for _, f := range rec[3+agreeHashChunks:] {
		if f == 0 {
			break
		}
		host = append(host, byte(f))
	}
	p.host = string(host)
	return p
}

// resumeDisagreement returns nil if every rank starts from the same point,
// else a *ConfigError such as "resume: ranks 0–1 on node1 would start from
// step 20, ranks 2–3 on node2 from step 10: ...", runs of consecutive ranks
// with the same host and point grouped.
func resumeDisagreement(points []resumePoint) error {
	same := true
	for _, p := range points[1:] {
		if p.step != points[0].step || p.hash != points[0].hash {
			same = false
		}
	}
	if same {
		return nil
	}
	var parts []string
	for lo := 0; lo < len(points); {
		hi := lo
		for hi+1 < len(points) && points[hi+1] == points[lo] {
			hi++
		}
		p := points[lo]
		ranks := "rank " + strconv.Itoa(lo)
		if hi > lo {
			ranks = fmt.Sprintf("ranks %d–%d", lo, hi)
		}
		what := "step 0 (no checkpoint)"
		if p.step >= 0 {
			what = "step " + strconv.Itoa(p.step)
			if p.hash != points[0].hash && p.step == points[0].step {
				what += " (a different checkpoint: manifest " + p.hash + ")"
			}
		}
		verb := "from "
		if lo == 0 {
			verb = "would start from "
		}
		parts = append(parts, ranks+" on "+p.host+" "+verb+what)
		lo = hi + 1
	}
	return &ConfigError{Msg: "resume: " + strings.Join(parts, ", ") + ": remove the stale checkpoint or pass -o Engine.save_load.ckpt_dir=DIR"}
}
