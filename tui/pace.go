package tui

import (
	"cmp"
	"slices"
	"time"
)

// The dashboard settles after each batch of events and each tick of its
// clock: it finds which ranks are silent, the slowest rank, the order of
// the ranks pane, the ranks' states counted and the widths the ranks
// pane's columns need. Going through every rank for that costs, at a
// thousand ranks, more than drawing a frame, and a batch is often a
// single event. So the dashboard keeps in a paceIndex what it found of
// each rank, and the ranks in the order of their figures: a batch
// settles the ranks its events named, each in a few binary searches,
// and the verdict is read off the index. Only what concerns every rank
// goes through them all, building the index afresh: an event of the job
// or of a node, a new rank, the job's start or end, the order switched.
// The clock's tick, once a second, goes through the ranks once to find
// those whose silence has begun or grown, and settles those.

// paceIndex is what settle keeps of the ranks (see above).
type paceIndex struct {
	per   []rankPace
	dirty []int // the ranks named by events since the last settle

	all   ranked // the median compute time of each rank with a step in this attempt
	run   ranked // the same, of the running ranks
	steps ranked // the last step's time of each rank with a step in this attempt

	silent  []int // the silent ranks, in order
	stalled []int // the ranks with a stall kept (stall.secs > 0), in order

	counts [len(rankOrder)]int // the ranks in each state as counted (rankOrder)
	causes [len(rankOrder)]int // those of them that caused the job's failure
	nodeW  [flexMax + 1]int
	collW  [flexMax + 1]int // the ranks by the width of their node and collective cells, at most flexMax

	// What the last settle went by; a change of any, or full, settles
	// every rank again.
	now     time.Time
	running bool
	bySlow  bool
	full    bool
}

// rankPace is what the last settle found of one rank.
type rankPace struct {
	dirty   bool
	has     bool    // it has a step in this attempt
	med     float64 // its median compute time (medianCompute), if has
	step    float64 // its last step's time, if has
	running bool    // it runs (counted in paceIndex.run, if has)
	silent  bool
	stalled bool
	key     float64 // its place slowest first (bySlow)
	shown   int     // its state as counted: an index in rankOrder, -1 for none
	cause   bool
	nodeW   int // the widths of its node and collective cells, at most flexMax
	collW   int
}

// shownIndex returns the index of state s in rankOrder; -1 for none.
func shownIndex(s string) int {
	for i, o := range rankOrder {
		if o == s {
			return i
		}
	}
	return -1
}

// touch notes that an event named rank: the next settle settles it.
func (m *dashModel) touch(rank int) {
	x := &m.pace
	if rank < 0 || rank >= len(x.per) {
		x.full = true // a new rank: the index grows
		return
	}
	if p := &x.per[rank]; !p.dirty {
		p.dirty = true
		x.dirty = append(x.dirty, rank)
	}
}

// touchAll notes that an event concerned every rank.
func (m *dashModel) touchAll() { m.pace.full = true }

// settle brings the figures drawn from many events and the clock up to
// date after a batch of events or a tick at now: which ranks are silent,
// the slowest rank and the order of the ranks pane. It settles the ranks
// touched since the last settle, or every rank if need be (see
// paceIndex).
func (m *dashModel) settle(now time.Time) {
	x := &m.pace
	m.settled = now
	if x.full || len(x.per) != len(m.ranks) || x.running != m.running() || x.bySlow != m.bySlow {
		m.settleAll(now)
		return
	}
	if !now.Equal(x.now) {
		// Silences grow with the clock, and stalls age.
		running := m.running()
		for i := range m.ranks {
			if r := &m.ranks[i]; r.silent != silence(r, now, running) {
				m.touch(i)
			}
		}
		if m.bySlow {
			for _, i := range x.stalled {
				m.touch(i)
			}
		}
		x.now = now
	}
	if len(x.dirty) > 64 && len(x.dirty) > len(m.ranks)/8 {
		// Many ranks to move (a job that hangs falls silent whole): the
		// index is built afresh sooner.
		m.settleAll(now)
		return
	}
	for _, i := range x.dirty {
		m.leave(i)
		m.measure(i, now)
		m.enter(i, true)
	}
	x.dirty = x.dirty[:0]
	m.slow = x.verdict(m.ranks, now)
}

// settleAll settles every rank at now, building the index afresh.
func (m *dashModel) settleAll(now time.Time) {
	x := &m.pace
	n := len(m.ranks)
	if cap(x.per) < n {
		x.per = make([]rankPace, n)
	}
	x.per = x.per[:n]
	clear(x.per)
	x.dirty = x.dirty[:0]
	x.all.reset()
	x.run.reset()
	x.steps.reset()
	x.silent, x.stalled = x.silent[:0], x.stalled[:0]
	clear(x.counts[:])
	clear(x.causes[:])
	clear(x.nodeW[:])
	clear(x.collW[:])
	x.now, x.running, x.bySlow, x.full = now, m.running(), m.bySlow, false
	for i := range m.ranks {
		m.measure(i, now)
		m.enter(i, false)
	}
	x.all.sort()
	x.run.sort()
	x.steps.sort()
	if len(m.order) != n {
		m.order = make([]int, n)
	}
	for i := range m.order {
		m.order[i] = i
	}
	if m.bySlow {
		// Silent ranks first, the longest silent first; then by compute
		// time, a recent stall counted in; equals by number.
		slices.SortFunc(m.order, x.bySlowKey)
	}
	m.slow = x.verdict(m.ranks, now)
}

// silence is how long rank r has been silent at now (0: it is not): a
// running rank's time since its last progress report, once over
// silentAfter, while the job runs, unless its agent is the one silent.
func silence(r *rankState, now time.Time, running bool) time.Duration {
	if d := now.Sub(r.heard); r.state == rankRunning && !r.heard.IsZero() && d > silentAfter && running && !r.agentSilent {
		return d
	}
	return 0
}

// measure sets rank i's silence and what the index keeps of it at now.
func (m *dashModel) measure(i int, now time.Time) {
	r, p := &m.ranks[i], &m.pace.per[i]
	r.silent = silence(r, now, m.pace.running)
	p.dirty = false
	p.med, p.has = r.medianCompute()
	p.step = r.last.StepTimeS
	p.running = r.state == rankRunning
	p.silent = r.silent > 0
	p.stalled = r.stall.secs > 0
	p.key = -1
	switch {
	case r.silent > 0:
		p.key = 1e9 + r.silent.Seconds()
	case p.has:
		p.key = p.med
		if r.stall.secs > 0 && now.Sub(r.stall.at) <= stallHold {
			p.key += r.stall.secs
		}
	}
	shown := r.state
	if r.silent > 0 {
		shown = rankSilent
	}
	p.shown, p.cause = shownIndex(shown), r.cause
	p.nodeW = min(cellWidth(r.node), flexMax)
	p.collW = min(cellWidth(collective(r)), flexMax)
}

// enter counts rank i in the index, as measured; in order places it in
// the figures' order at once (else settleAll sorts them all).
func (m *dashModel) enter(i int, inOrder bool) {
	x := &m.pace
	p := &x.per[i]
	add := (*ranked).push
	if inOrder {
		add = (*ranked).add
	}
	if p.has {
		add(&x.all, p.med, i)
		add(&x.steps, p.step, i)
		if p.running {
			add(&x.run, p.med, i)
		}
	}
	if p.silent {
		x.silent = insertRank(x.silent, i)
	}
	if p.stalled {
		x.stalled = insertRank(x.stalled, i)
	}
	if p.shown >= 0 {
		x.counts[p.shown]++
		if p.cause {
			x.causes[p.shown]++
		}
	}
	x.nodeW[p.nodeW]++
	x.collW[p.collW]++
	if inOrder && m.bySlow {
		at, _ := slices.BinarySearchFunc(m.order, i, x.bySlowKey)
		m.order = slices.Insert(m.order, at, i)
	}
}

// leave takes rank i out of the index, as last measured.
func (m *dashModel) leave(i int) {
	x := &m.pace
	p := &x.per[i]
	if p.has {
		x.all.remove(p.med, i)
		x.steps.remove(p.step, i)
		if p.running {
			x.run.remove(p.med, i)
		}
	}
	if p.silent {
		x.silent = removeRank(x.silent, i)
	}
	if p.stalled {
		x.stalled = removeRank(x.stalled, i)
	}
	if p.shown >= 0 {
		x.counts[p.shown]--
		if p.cause {
			x.causes[p.shown]--
		}
	}
	x.nodeW[p.nodeW]--
	x.collW[p.collW]--
	if m.bySlow {
		if at, ok := slices.BinarySearchFunc(m.order, i, x.bySlowKey); ok {
			m.order = slices.Delete(m.order, at, at+1)
		}
	}
}

// bySlowKey orders ranks slowest first: by key, the greatest first, then
// by number.
func (x *paceIndex) bySlowKey(a, b int) int {
	return cmp.Or(cmp.Compare(x.per[b].key, x.per[a].key), cmp.Compare(a, b))
}

// insertRank adds rank to the ranks in order rs.
func insertRank(rs []int, rank int) []int {
	at, found := slices.BinarySearch(rs, rank)
	if found {
		return rs
	}
	return slices.Insert(rs, at, rank)
}

// removeRank removes rank from the ranks in order rs.
func removeRank(rs []int, rank int) []int {
	if at, found := slices.BinarySearch(rs, rank); found {
		return slices.Delete(rs, at, at+1)
	}
	return rs
}

// widest returns the width the widest cell of the column (its widths
// histogram) needs, at most flexMax.
func widest(hist *[flexMax + 1]int) int {
	for w := flexMax; w > 0; w-- {
		if hist[w] > 0 {
			return w
		}
	}
	return 0
}

// verdict gives the verdict on the ranks at now (see slowest), read off
// the index. By compute time, the slowest rank is the one whose median
// compute time (step time less the time in collectives,
// event.Metrics.ComputeS) over its last slowWindow steps is the longest,
// among the running ranks (or all, once fewer than two run), if it is
// clearly the longest (straggleRatio, straggleShare); of equals, the
// lowest. In a synchronous job every rank's step takes the slowest's
// time, so the step time alone names no one: the others wait for the
// straggler in their collectives.
func (x *paceIndex) verdict(ranks []rankState, now time.Time) slowest {
	s := slowest{rank: -1}
	for _, i := range x.silent {
		if r := &ranks[i]; r.silent > s.silent {
			s.rank, s.silent = i, r.silent
		}
	}
	s.typical = x.all.median()
	if s.rank >= 0 {
		return s
	}
	for _, i := range x.stalled {
		r := &ranks[i]
		if r.state != rankRunning || r.stall.secs <= 0 || now.Sub(r.stall.at) > stallHold {
			continue
		}
		if s.rank < 0 || r.stall.at.After(s.stall.at) {
			s.rank, s.stall = i, r.stall
		}
	}
	if s.rank >= 0 {
		return s
	}
	// The running ranks; when fewer than two run (the job has ended),
	// every rank's last steps, so the verdict outlives the job.
	among := &x.all
	if x.run.len() >= 2 {
		among = &x.run
	}
	if among.len() < 2 {
		return slowest{rank: -1, typical: s.typical}
	}
	top := among.last()
	s.rank, s.compute = top.rank, top.v
	// Against the others: with two ranks, the other one.
	s.typical = among.medianBelowLast()
	if s.compute < straggleRatio*s.typical || s.compute-s.typical < straggleShare*x.steps.median() {
		return slowest{rank: -1, typical: s.typical}
	}
	return s
}
