package profile

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/gptui/gptui/comm"
	"github.com/gptui/gptui/launch"
)

// LinkLine starts the line on which rank 0 of a link measurement's
// workers prints the bandwidth it measured, in bytes/s; [ParseLinkLine]
// reads it.
const LinkLine = "plan-link-bw "

// ParseLinkLine returns the bandwidth of a LinkLine; ok is false for any
// other line.
func ParseLinkLine(line string) (bw float64, ok bool) {
	rest, found := strings.CutPrefix(line, LinkLine)
	if !found {
		return 0, false
	}
	bw, err := strconv.ParseFloat(strings.TrimSpace(rest), 64)
	return bw, err == nil && bw > 0
}

// LinkPeer is one end of a measured link, in a worker process whose
// environment names the job (comm.ConfigFromEnv): it measures the
// all-reduce bus bandwidth over its world's first two ranks and rank 0
// prints it on stdout as a LinkLine.
func LinkPeer(ctx context.Context, print func(line string)) error {
	cc, err := comm.ConfigFromEnv()
	if err != nil {
		return err
	}
	w, err := comm.Connect(ctx, cc)
	if err != nil {
		return err
	}
	defer w.Close()
	bw, err := worldLink(ctx, w)
	if err == nil && cc.Rank == 0 {
		print(fmt.Sprintf("%s%g", LinkLine, bw))
	}
	return err
}

// MeasureLocalLink measures the all-reduce bus bandwidth between this
// process and a second one on this machine: exe with args, which must run
// [LinkPeer] (gptui re-executes itself), over loopback TCP.
func MeasureLocalLink(ctx context.Context, exe string, args []string) (float64, error) {
	const addr = "127.0.0.1"
	port, err := launch.FreePort(addr)
	if err != nil {
		return 0, err
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	secret, err := comm.NewSecret()
	if err != nil {
		return 0, err
	}
	peer := make(chan error, 1)
	go func() {
		_, err := launch.Run(ctx, launch.Options{Exe: exe, Workers: []launch.Worker{{
			Rank: 1, LocalRank: 1, Args: args, Env: launch.Env(1, 1, 2, addr, port, secret),
		}}})
		peer <- err
	}()
	w, err := comm.Connect(ctx, comm.Config{Rank: 0, WorldSize: 2, MasterAddr: addr, MasterPort: port, Timeout: time.Minute, Secret: []byte(secret)})
	if err != nil {
		cancel()
		return 0, errors.Join(fmt.Errorf("profile: connecting to the link peer: %w", err), <-peer)
	}
	bw, err := worldLink(ctx, w)
	w.Close()
	if perr := <-peer; err == nil && perr != nil {
		err = fmt.Errorf("profile: link peer: %w", perr)
	}
	return bw, err
}

// worldLink measures the link between ranks 0 and 1 of w.
func worldLink(ctx context.Context, w *comm.World) (float64, error) {
	g, err := w.Group([]int{0, 1})
	if err != nil {
		return 0, err
	}
	return MeasureLink(ctx, g)
}
