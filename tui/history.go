package tui

// ring holds the last cap lines of a worker's log.
type ring struct {
	lines []string
	next  int   // where the next line goes once the ring is full
	total int64 // lines ever added
}

func newRing(n int) *ring { return &ring{lines: make([]string, 0, n)} }

// add appends a line, dropping the oldest when the ring is full.
func (r *ring) add(s string) {
	r.total++
	if len(r.lines) < cap(r.lines) {
		r.lines = append(r.lines, s)
		return
	}
	r.lines[r.next] = s
	r.next = (r.next + 1) % len(r.lines)
}

// len returns the number of lines held.
func (r *ring) len() int { return len(r.lines) }

// at returns the i-th line held, 0 the oldest.
func (r *ring) at(i int) string {
	if len(r.lines) < cap(r.lines) {
		return r.lines[i]
	}
	return r.lines[(r.next+i)%len(r.lines)]
}

// point is one loss value at a step.
type point struct {
	step int
	v    float64
}

func (p point) stepOf() int { return p.step }

// stepped is a value at a training step.
type stepped interface{ stepOf() int }

// series is a curve with bounded memory: when it holds cap points it
// drops every other one and from then on keeps only every stride-th point
// added, so a run of any length keeps its whole shape in at most cap
// points.
type series[T stepped] struct {
	pts    []T
	cap    int
	stride int // keep one point in stride
	skip   int // points skipped since the last one kept
}

func newSeries[T stepped](n int) *series[T] { return &series[T]{cap: max(n, 2), stride: 1} }

// add appends a point. A step before the last one (a job restarted from a
// checkpoint) first drops the points from that step on; a point at the
// last one's step replaces it.
func (s *series[T]) add(p T) {
	for len(s.pts) > 0 && s.pts[len(s.pts)-1].stepOf() >= p.stepOf() {
		s.pts = s.pts[:len(s.pts)-1]
		s.skip = 0
	}
	if len(s.pts) > 0 && s.skip+1 < s.stride {
		s.skip++
		return
	}
	s.skip = 0
	if len(s.pts) == s.cap {
		half := s.pts[:0]
		for i := 0; i < len(s.pts); i += 2 {
			half = append(half, s.pts[i])
		}
		s.pts = half
		s.stride *= 2
	}
	s.pts = append(s.pts, p)
}

// last returns the newest point and whether there is one.
func (s *series[T]) last() (T, bool) {
	if len(s.pts) == 0 {
		var zero T
		return zero, false
	}
	return s.pts[len(s.pts)-1], true
}
