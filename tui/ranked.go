package tui

import (
	"cmp"
	"slices"
)

// ranked is a figure of each of some ranks (a median compute time, a
// step time), kept in order, so that its median and its greatest are
// read without going through the ranks: a rank's figure changes with an
// event of its own, and costs then a binary search and a move. The
// figures come from JSON, so none is NaN.
type ranked struct {
	xs []rankedFigure // by figure, then by rank, the lowest last
}

type rankedFigure struct {
	v    float64
	rank int
}

// compare orders figures by value, and equal values by rank, the
// lowest last: the last figure is the greatest, of the lowest rank among
// equals.
func (a rankedFigure) compare(b rankedFigure) int {
	return cmp.Or(cmp.Compare(a.v, b.v), cmp.Compare(b.rank, a.rank))
}

func (s *ranked) len() int { return len(s.xs) }

// reset empties s.
func (s *ranked) reset() { s.xs = s.xs[:0] }

// add adds rank's figure v.
func (s *ranked) add(v float64, rank int) {
	f := rankedFigure{v, rank}
	i, _ := slices.BinarySearchFunc(s.xs, f, rankedFigure.compare)
	s.xs = slices.Insert(s.xs, i, f)
}

// remove removes rank's figure v, which s holds.
func (s *ranked) remove(v float64, rank int) {
	if i, ok := slices.BinarySearchFunc(s.xs, rankedFigure{v, rank}, rankedFigure.compare); ok {
		s.xs = slices.Delete(s.xs, i, i+1)
	}
}

// push adds rank's figure v at the end, out of order: sort puts it in
// place once all are pushed.
func (s *ranked) push(v float64, rank int) { s.xs = append(s.xs, rankedFigure{v, rank}) }

// sort puts the figures pushed in order.
func (s *ranked) sort() { slices.SortFunc(s.xs, rankedFigure.compare) }

// last returns the greatest figure, of the lowest rank among equals;
// s must not be empty.
func (s *ranked) last() rankedFigure { return s.xs[len(s.xs)-1] }

// median returns the median of the figures (0 for none), as median
// does.
func (s *ranked) median() float64 { return medianOf(s.xs) }

// medianBelowLast returns the median of the figures but the last.
func (s *ranked) medianBelowLast() float64 { return medianOf(s.xs[:len(s.xs)-1]) }

// medianOf returns the median of figures in order.
func medianOf(xs []rankedFigure) float64 {
	n := len(xs)
	switch {
	case n == 0:
		return 0
	case n%2 == 1:
		return xs[n/2].v
	}
	return (xs[n/2-1].v + xs[n/2].v) / 2
}
