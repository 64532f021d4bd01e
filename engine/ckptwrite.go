package engine

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/gptui/gptui/comm"
	"github.com/gptui/gptui/engine/checkpoint"
	"github.com/gptui/gptui/kernels"
)

// A parallel save: every rank writes what it holds, all at once.
//
//  1. The ranks agree on the save's temporary directory (rank 0 draws its
//     token and broadcasts it on the ckpt group), and each creates it on
//     its machine (checkpoint.BeginSave).
//  2. Each rank writes its blocks into rank_<R>.safetensors there: the
//     parameters and both AdamW moments of the flat ranges writeRanges
//     gives it — its optimizer's ranges (its shard under sharding, else
//     its whole part), cut among the ranks that hold the same ones, so that
//     a tensor held alike by several ranks is written once and the
//     writing is spread over them — as blocks of the global tensors
//     (ckptParts). The blocks are views of the rank's buffers where they
//     lie contiguously; the others are copied out one at a time as the
//     file is written. Nothing is gathered, and no rank holds more than
//     its own buffers and one block's copy.
//  3. The ranks send rank 0 their reports (file, SHA-256, blocks; a few
//     hundred bytes), and rank 0 makes the manifest. Where every rank is
//     on one machine, rank 0 publishes the checkpoint (checkpoint.Commit).
//     Where they are on several (their node names differ), rank 0 sends
//     the manifest to every rank, and the first rank of each machine
//     publishes that machine's files with it (checkpoint.Publish): each
//     machine keeps its own ranks' part of the checkpoint, and the
//     launcher copies the parts between the machines (replicas, and a
//     resume that completes every machine's copy).
//
// An asynchronous save (Engine.save_load.async) copies the rank's ranges
// to host memory in step 1 — its part of the model, no more — and writes
// them in the background; the ranks commit at the first step boundary by
// which every rank has finished writing (saver.collect), so that the
// commit's collectives come at the same point on every rank. A backend
// with device memory copies the ranges to host memory too, synchronous
// or not.

// rankSave is one rank's share of a parallel save.
type rankSave struct {
	step   int    // the checkpoint's step, as its directory is named
	tmp    string // the save's temporary directory
	rank   int
	man    checkpoint.Manifest // taken when the save began: what rank 0 publishes
	parts  []checkpoint.Part
	copied int64 // host bytes copied for it

	report checkpoint.ShardReport // set by write
	err    error
}

// oneMachine reports whether every rank is on one machine (its node name
// in the launcher's inventory, else its host name): one process, or
// ranks that share their output directory.
func (tr *Trainer) oneMachine() bool {
	for _, h := range tr.hosts {
		if h != tr.hosts[0] {
			return false
		}
	}
	return true
}

// publishes reports whether this rank publishes its machine's part of a
// checkpoint: the first rank on its machine.
func (tr *Trainer) publishes() bool {
	if tr.hosts == nil {
		return tr.topo.Rank == 0
	}
	return slices.Index(tr.hosts, tr.hosts[tr.topo.Rank]) == tr.topo.Rank
}

// beginSave starts this rank's share of the parallel save of the state
// after step (0-based): it agrees with the other ranks on the save's
// directory and lists its blocks, views of its buffers, or with copy set
// copies in host memory (in tr.snap, reused by the next such save).
func (tr *Trainer) beginSave(ctx context.Context, step int, copy bool) (*rankSave, error) {
	token, err := tr.saveToken(ctx)
	if err != nil {
		return nil, err
	}
	if err := tr.fence(); err != nil {
		return nil, err
	}
	sl := tr.Cfg.Engine.SaveLoad
	tmp, err := checkpoint.BeginSave(sl.OutputDir, step+1, token)
	if err != nil {
		return nil, err
	}
	rs := &rankSave{step: step + 1, tmp: tmp, rank: tr.topo.Rank, man: tr.manifest(step + 1)}
	ws := tr.writeRanges()
	params, pspans := tr.heldParams()
	kinds := []struct {
		prefix string
		buf    []float32
		spans  []Span
	}{{ckptParams, params, pspans}, {ckptAdamM, tr.Opt.M, tr.Opt.Spans}, {ckptAdamV, tr.Opt.V, tr.Opt.Spans}}
	_, device := tr.be.(kernels.Memory)
	for i, k := range kinds {
		buf, spans := k.buf, k.spans
		if copy || device {
			if buf, spans, err = tr.hostRanges(i, k.buf, k.spans, ws); err != nil {
				return nil, err
			}
			rs.copied += 4 * int64(len(buf))
		}
		rs.parts = tr.ckptParts(rs.parts, k.prefix, buf, spans, ws)
	}
	return rs, nil
}

// saveToken returns the token of a new save, drawn by rank 0 and
// broadcast to the others: 16 hex digits.
func (tr *Trainer) saveToken(ctx context.Context) (string, error) {
	var b [8]byte
	rand.Read(b[:]) // never fails
	if tr.ckpt == nil {
		return hex.EncodeToString(b[:]), nil
	}
	f := packBytes(b[:])
	if err := tr.ckpt.Broadcast(ctx, f, 0); err != nil {
		return "", fmt.Errorf("checkpoint: agreeing on the save: %w", err)
	}
	return hex.EncodeToString(unpackBytes(f, len(b))), nil
}

// write writes the rank's file into the save's directory; its report or
// error is kept for commitSave.
func (rs *rankSave) write() {
	rs.report, rs.err = checkpoint.WriteShard(rs.tmp, rs.rank, rs.parts)
	rs.parts = nil // the views and copies are no longer needed
}

// saveReport is what a rank tells rank 0 of its share of a save.
type saveReport struct {
	Report checkpoint.ShardReport `json:"report"`
	Err    string                 `json:"error,omitempty"`
}

// commitSave ends the parallel save rs once every rank has written its
// file: the ranks send rank 0 their reports, rank 0 makes the manifest,
// and the checkpoint is published — by rank 0 where the ranks share a
// machine, else by the first rank of each machine, its part — and rank 0
// returns its directory (the others ""). A rank that could not write its
// file fails the save, named, on rank 0, on itself and on every machine.
func (tr *Trainer) commitSave(ctx context.Context, rs *rankSave) (string, error) {
	rep := saveReport{Report: rs.report}
	if rs.err != nil {
		rep.Err = rs.err.Error()
	}
	b, err := json.Marshal(rep)
	if err != nil {
		return "", err
	}
	all := [][]byte{b}
	if tr.ckpt != nil {
		if all, err = gatherBytes(ctx, tr.ckpt, b); err != nil {
			return "", fmt.Errorf("checkpoint: gathering the ranks' reports: %w", err)
		}
	}
	sl := tr.Cfg.Engine.SaveLoad
	var reports []checkpoint.ShardReport
	var failed error // rank 0's verdict
	if tr.topo.Rank == 0 {
		if reports, failed = saveReports(all, rs.step); failed == nil {
			failed = tr.fence()
		}
		if failed == nil && tr.oneMachine() {
			return checkpoint.Commit(sl.OutputDir, rs.tmp, rs.man, reports, sl.KeepLast)
		}
	}
	if tr.oneMachine() {
		if failed != nil {
			os.RemoveAll(rs.tmp)
		}
		return "", errors.Join(failed, rs.err)
	}
	// Several machines: rank 0 tells every rank the manifest, or why the
	// save failed (a leading 0 byte), and each machine publishes its part.
	var verdict []byte
	if tr.topo.Rank == 0 {
		var man []byte
		if failed == nil {
			man, failed = checkpoint.Index(rs.man, reports)
		}
		verdict = append([]byte{1}, man...)
		if failed != nil {
			verdict = append([]byte{0}, failed.Error()...)
		}
	}
	if verdict, err = broadcastBytes(ctx, tr.ckpt, verdict); err != nil {
		return "", fmt.Errorf("checkpoint: sending the manifest: %w", err)
	}
	if len(verdict) == 0 || verdict[0] == 0 {
		if tr.publishes() {
			os.RemoveAll(rs.tmp)
		}
		if failed == nil {
			failed = fmt.Errorf("checkpoint: step %d not saved: %s", rs.step, verdict[min(1, len(verdict)):])
		}
		return "", errors.Join(failed, rs.err)
	}
	if !tr.publishes() || tr.topo.Rank != 0 && sharesRank0(rs.tmp) {
		return "", rs.err
	}
	if err := tr.fence(); err != nil {
		os.RemoveAll(rs.tmp)
		return "", errors.Join(err, rs.err)
	}
	dir, err := checkpoint.Publish(sl.OutputDir, rs.tmp, verdict[1:], sl.KeepLast)
	if tr.topo.Rank != 0 {
		return "", errors.Join(err, rs.err)
	}
	return dir, err
}

// sharesRank0 reports whether the save's directory tmp, on a machine
// other than rank 0's, is rank 0's too — an output directory on a shared
// filesystem — which rank 0 publishes whole: rank 0's file is in it (all
// files were written before the manifest came), or it is gone (rank 0
// has published it already).
func sharesRank0(tmp string) bool {
	_, err := os.Stat(filepath.Join(tmp, checkpoint.ShardFile(0)))
	if err == nil {
		return true
	}
	_, err = os.Stat(tmp)
	return errors.Is(err, fs.ErrNotExist)
}

// saveReports decodes the ranks' reports of the save of step, or says
// which ranks could not write their files.
func saveReports(all [][]byte, step int) ([]checkpoint.ShardReport, error) {
	reports := make([]checkpoint.ShardReport, len(all))
	var failed []string
	for r, b := range all {
		var rep saveReport
		if err := json.Unmarshal(b, &rep); err != nil {
			failed = append(failed, fmt.Sprintf("rank %d: its report: %v", r, err))
			continue
		}
		if rep.Err != "" {
			failed = append(failed, fmt.Sprintf("rank %d: %s", r, rep.Err))
		}
		reports[r] = rep.Report
	}
	if len(failed) > 0 {
		return nil, fmt.Errorf("checkpoint: step %d not saved: %s", step, strings.Join(failed, "; "))
	}
	return reports, nil
}

// saveParallel is a synchronous parallel save of the state after step.
func (tr *Trainer) saveParallel(ctx context.Context, step int) (string, error) {
	rs, err := tr.beginSave(ctx, step, false)
	if err != nil {
		return "", err
	}
	rs.write()
	return tr.commitSave(ctx, rs)
}

// allWritten reports whether every rank has finished writing its file of
// the save in flight (done: this rank has): one 8-byte all-reduce.
func (tr *Trainer) allWritten(ctx context.Context, done bool) (bool, error) {
	if tr.ckpt == nil {
		return done, nil
	}
	flag := 0.0
	if done {
		flag = 1
	}
	n, err := sum64(ctx, tr.ckpt, flag, "checkpoint: asking whether the ranks have written their files")
	return int(n) == tr.ckpt.Size(), err
}

// writeRanges returns the flat ranges of the rank's part of the model
// whose parameters and moments this rank writes in a checkpoint: the
// ranges its optimizer holds (its shard under sharding, else the whole
// part), cut evenly among the ranks that hold the same ones — the members
// of its dp group under sharding, every replica without — the i-th piece
// to the i-th of them.
func (tr *Trainer) writeRanges() [][2]int { return writeRanges(tr.topo, tr.Opt.Spans) }

// writeRanges is [Trainer.writeRanges] for the rank at topo whose
// optimizer holds the spans held.
func writeRanges(topo Topology, held []Span) [][2]int {
	ranges := make([][2]int, len(held))
	for i, s := range held {
		ranges[i] = [2]int{s.Flat, s.Flat + s.N}
	}
	n, i := topo.Replicas(), topo.DataIndex()
	if topo.Sharding > 1 {
		n, i = topo.DP, topo.DPIndex
	}
	// A context-parallel ring's ranks hold the same ones too.
	return cutRanges(ranges, n*topo.CP, i*topo.CP+topo.CPIndex)
}

// cutRanges returns piece i of n of the elements of ranges, taken one
// after another: elements [total·i/n, total·(i+1)/n) of them.
func cutRanges(ranges [][2]int, n, i int) [][2]int {
	total := 0
	for _, r := range ranges {
		total += r[1] - r[0]
	}
	lo, hi := total*i/n, total*(i+1)/n
	var out [][2]int
	k := 0 // elements of the ranges before r
	for _, r := range ranges {
		a, b := max(r[0], r[0]+lo-k), min(r[1], r[0]+hi-k)
		if a < b {
			out = append(out, [2]int{a, b})
		}
		k += r[1] - r[0]
	}
	return out
}

// hostRanges copies the elements of the flat ranges ws from buf (a buffer
// of the backend laid out by spans) into host buffer i of tr.snap, one
// range after another, and returns it and its layout.
func (tr *Trainer) hostRanges(i int, buf []float32, spans []Span, ws [][2]int) ([]float32, []Span, error) {
	var out []Span
	n := 0
	for _, w := range ws {
		for _, s := range spans {
			if a, b := max(w[0], s.Flat), min(w[1], s.Flat+s.N); a < b {
				out = append(out, Span{At: n, Flat: a, N: b - a})
				n += b - a
			}
		}
	}
	if len(tr.snap) != 3 {
		tr.snap = make([][]float32, 3)
	}
	tr.snap[i] = slices.Grow(tr.snap[i][:0], n)[:n]
	host := tr.snap[i]
	k := 0
	for _, w := range ws {
		for _, s := range spans {
			if a, b := max(w[0], s.Flat), min(w[1], s.Flat+s.N); a < b {
				from := s.At + a - s.Flat
				if err := kernels.Download(tr.be, host[k:k+b-a], buf[from:from+b-a]); err != nil {
					return nil, nil, err
				}
				k += b - a
			}
		}
	}
	return host, out, nil
}

// ckptParts appends the checkpoint blocks of one kind of state (prefix:
// params/, adam_m/ or adam_v/) that this rank writes (saveBlocks): views of
// buf, laid out by spans, where a block is a whole box, else copied out
// when written.
func (tr *Trainer) ckptParts(parts []checkpoint.Part, prefix string, buf []float32, spans []Span, ws [][2]int) []checkpoint.Part {
	saveBlocks(tr.Model.Tensors, tr.Model.Part, tr.Model.Cfg.Tied(), spans, ws, func(b saveBlock) {
		data := buf[b.at : b.at+numel(b.box.shape)]
		p := checkpoint.Part{Name: prefix + b.t.Name, GlobalShape: b.t.Global, Start: b.start, Shape: b.shape}
		if b.whole {
			p.Data = data
		} else {
			bshape, sh, lo := b.box.shape, b.shape, b.lo
			p.Fill = func(dst []float32) error {
				copyBlock(dst, sh, make([]int, len(sh)), data, bshape, lo, sh)
				return nil
			}
		}
		parts = append(parts, p)
	})
	return parts
}

// saveBlock is one block of a global tensor that a rank writes: the share
// of a piece of tensor t in box, a contiguous stretch of t that starts at
// at in the rank's buffer.
type saveBlock struct {
	t            Tensor
	box          box
	at           int   // the box's first element in the buffer
	start, shape []int // the block, in global coordinates
	lo           []int // its first element within the box
	whole        bool  // it is the whole box: contiguous in the buffer
}

// saveBlocks calls fn for each block a rank with the tensors ts of part
// writes of the elements of its part's flat ranges ws, held in a buffer
// laid out by spans (element Flat+k at At+k). Each tensor's share of a
// range is cut into boxes (contiguous stretches that are blocks too), and
// each piece of the tensor that meets a box gives a block. A tensor each
// rank of a tensor-parallel group holds whole is written by its first
// rank, a block several hold alike (Piece.Copy) by the first of them, and
// the tied wte, which the first and the last pipeline stage both hold, half
// by each (wteShare). tied says whether the model's head is wte.
func saveBlocks(ts []Tensor, part Part, tied bool, spans []Span, ws [][2]int, fn func(saveBlock)) {
	for _, w := range ws {
		for _, s := range spans {
			a, b := max(w[0], s.Flat), min(w[1], s.Flat+s.N)
			if a >= b {
				continue
			}
			for _, t := range ts {
				if !t.Split && part.MPRank != 0 {
					continue
				}
				x, y := max(a, t.Offset), min(b, t.Offset+t.Size)
				if t.Name == "wte" {
					lo, hi := wteShare(t, part, tied)
					x, y = max(x, t.Offset+lo), min(y, t.Offset+hi)
				}
				if x >= y {
					continue
				}
				for _, bx := range boxes(t.Shape, x-t.Offset, y-t.Offset) {
					pieceBlocks(t, bx, s.At+t.Offset+bx.offset-s.Flat, fn)
				}
			}
		}
	}
}

// wteShare is the range [lo, hi) of the elements of the rank's wte t (its
// rows of the vocabulary, whole rows) that the rank writes. Where the first
// pipeline stage (part.Embed) and the last (part.Head) are ranks apart and
// the head is tied, both hold wte alike: the first writes the first half of
// its rows, the last the rest, so that neither writes the largest tensor
// of the model alone (with 345M's 51.5M-parameter embedding on mp2×pp2,
// the first stage's ranks wrote 15% over a quarter of the checkpoint).
func wteShare(t Tensor, part Part, tied bool) (lo, hi int) {
	if part.Embed == part.Head || !tied {
		return 0, t.Size
	}
	rows := t.Shape[0]
	half := rows / 2 * (t.Size / max(rows, 1))
	if part.Embed {
		return 0, half
	}
	return half, t.Size
}

// pieceBlocks calls fn for the block of each piece of t that meets box
// bx, which starts at at in the buffer.
func pieceBlocks(t Tensor, bx box, at int, fn func(saveBlock)) {
next:
	for _, pc := range t.Pieces {
		if pc.Copy {
			continue
		}
		n := len(pc.Shape)
		b := saveBlock{t: t, box: bx, at: at, start: make([]int, n), shape: make([]int, n), lo: make([]int, n), whole: true}
		for d := range n {
			l := max(bx.at[d], pc.Local[d])
			h := min(bx.at[d]+bx.shape[d], pc.Local[d]+pc.Shape[d])
			if l >= h {
				continue next
			}
			b.lo[d], b.shape[d], b.start[d] = l-bx.at[d], h-l, pc.Global[d]+l-pc.Local[d]
			b.whole = b.whole && b.shape[d] == bx.shape[d]
		}
		fn(b)
	}
}

// gatherBytes sends b from every member of g to member 0, which returns
// them all in member order (the others nil): an all-gather of the lengths,
// then one transfer per member, two bytes a value.
func gatherBytes(ctx context.Context, g *comm.Group, b []byte) ([][]byte, error) {
	if len(b) >= 1<<24 {
		return nil, fmt.Errorf("%d bytes to gather: over the bound of 16 MiB", len(b))
	}
	lens := make([]float32, g.Size())
	if err := g.AllGather(ctx, []float32{float32(len(b))}, lens); err != nil {
		return nil, err
	}
	if g.Rank() != 0 {
		return nil, g.Send(ctx, packBytes(b), 0)
	}
	out := make([][]byte, g.Size())
	out[0] = b
	for r := 1; r < g.Size(); r++ {
		n := int(lens[r])
		if n < 0 || n >= 1<<24 {
			return nil, errors.New("a member's length is out of bounds")
		}
		f := make([]float32, (n+1)/2)
		if err := g.Recv(ctx, f, r); err != nil {
			return nil, err
		}
		out[r] = unpackBytes(f, n)
	}
	return out, nil
}

// broadcastBytes sends b from member 0 of g to every member, which
// returns it (member 0 its own): two broadcasts, its length and its
// bytes, two a value.
func broadcastBytes(ctx context.Context, g *comm.Group, b []byte) ([]byte, error) {
	if len(b) >= 1<<24 {
		return nil, fmt.Errorf("%d bytes to broadcast: over the bound of 16 MiB", len(b))
	}
	n := []float32{float32(len(b))}
	if err := g.Broadcast(ctx, n, 0); err != nil {
		return nil, err
	}
	if n[0] < 0 || n[0] >= 1<<24 {
		return nil, errors.New("the length broadcast is out of bounds")
	}
	f := packBytes(b)
	if g.Rank() != 0 {
		f = make([]float32, (int(n[0])+1)/2)
	}
	if err := g.Broadcast(ctx, f, 0); err != nil {
		return nil, err
	}
	if g.Rank() == 0 {
		return b, nil
	}
	return unpackBytes(f, int(n[0])), nil
}

// packBytes holds b two bytes a value, as integers below 2^16 that a
// float32 holds exactly.
func packBytes(b []byte) []float32 {
	f := make([]float32, (len(b)+1)/2)
	for i, c := range b {
		if i%2 == 0 {
			f[i/2] += float32(int(c) << 8)
		} else {
			f[i/2] += float32(c)
		}
	}
	return f
}

// unpackBytes returns the n bytes packBytes packed into f.
func unpackBytes(f []float32, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		v := int(f[i/2])
		if i%2 == 0 {
			b[i] = byte(v >> 8)
		} else {
			b[i] = byte(v)
		}
	}
	return b
}
