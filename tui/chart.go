package tui

import (
	"math"
	"slices"
	"strconv"
)

// brailleBit is the bit of a braille character's dot at column x (0-1) and
// row y (0-3) of its cell.
var brailleBit = [2][4]rune{{0x01, 0x02, 0x04, 0x40}, {0x08, 0x10, 0x20, 0x80}}

// window returns the points of pts from step from on (pts are in step
// order).
func window(pts []point, from int) []point {
	i, _ := slices.BinarySearchFunc(pts, from, func(p point, s int) int { return p.step - s })
	return pts[i:]
}

// smooth returns the exponential moving average of pts with weight alpha
// on each new point (TensorBoard's smoothing 0.9 is alpha 0.1).
func smooth(pts []point, alpha float64) []point {
	out := make([]point, len(pts))
	var ema float64
	for i, p := range pts {
		if i == 0 {
			ema = p.v
		} else {
			ema += alpha * (p.v - ema)
		}
		out[i] = point{p.step, ema}
	}
	return out
}

// sparkBlocks are the eight heights of a sparkline.
var sparkBlocks = []rune("▁▂▃▄▅▆▇█")

// sparkline draws vs (oldest first) as one line of block heights between
// their least and greatest, in at most w cells (the newest kept).
func (c *canvas) sparkline(vs []float64, w int) {
	if len(vs) > w {
		vs = vs[len(vs)-w:]
	}
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, v := range vs {
		lo, hi = math.Min(lo, v), math.Max(hi, v)
	}
	for _, v := range vs {
		i := 0
		if hi > lo {
			i = int((v - lo) / (hi - lo) * float64(len(sparkBlocks)-1))
		}
		c.char(sparkBlocks[min(max(i, 0), len(sparkBlocks)-1)])
	}
}

// lossChart draws the train loss as a line of braille dots (2×4 dots per
// cell) and the evaluations as • marks, in w×h cells: a y axis with three
// labels on the left and the steps along the bottom row, from xmin to xmax
// (0: the last step seen). The y range is that of the points given.
func lossChart(c *canvas, st styles, train, eval []point, xmin, xmax, w, h int) {
	const labelW = 7 // "10.83 ┤"
	pw, ph := w-labelW, h-1
	if pw < 4 || ph < 2 {
		blank(c, w, h, -1)
		return
	}
	if len(train) == 0 && len(eval) == 0 {
		blank(c, w, h, h/2)
		return
	}
	// The ranges: steps from xmin to the end of the run, losses padded by
	// 5%.
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, s := range [2][]point{train, eval} {
		for _, p := range s {
			lo, hi = math.Min(lo, p.v), math.Max(hi, p.v)
			xmax = max(xmax, p.step)
		}
	}
	if xmax <= xmin {
		xmax = xmin + 1
	}
	if hi-lo < 1e-9 {
		lo, hi = lo-0.5, hi+0.5
	}
	pad := (hi - lo) * 0.05
	lo, hi = lo-pad, hi+pad

	dw, dh := pw*2, ph*4
	dx := func(step int) int {
		return min(max(int(float64(step-xmin)/float64(xmax-xmin)*float64(dw-1)+0.5), 0), dw-1)
	}
	dy := func(v float64) int {
		return min(max(int((hi-v)/(hi-lo)*float64(dh-1)+0.5), 0), dh-1)
	}
	// A cell's braille dots, and evalMark if an evaluation is marked in
	// it.
	const evalMark = 0x100
	cells := make([]uint16, pw*ph)
	set := func(x, y int) { cells[(y/4)*pw+x/2] |= uint16(brailleBit[x%2][y%4]) }
	px, py := -1, -1
	for _, p := range train {
		x, y := dx(p.step), dy(p.v)
		if px < 0 {
			set(x, y)
		} else {
			line(px, py, x, y, set)
		}
		px, py = x, y
	}
	for _, p := range eval {
		cells[(dy(p.v)/4)*pw+dx(p.step)/2] |= evalMark
	}

	for r := range ph {
		from := len(c.b)
		switch r {
		case 0:
			c.fixed(hi, 2)
		case ph / 2:
			c.fixed((hi+lo)/2, 2)
		case ph - 1:
			c.fixed(lo, 2)
		}
		if len(c.b) == from {
			c.str("      │")
		} else {
			c.alignRight(from, 6)
			c.str("┤")
		}
		c.paint(st.Dim, from)
		// Runs of dots in one style, eval marks in another.
		run := -1
		flush := func() {
			if run >= 0 {
				c.paint(st.Train, run)
				run = -1
			}
		}
		for _, cell := range cells[r*pw : (r+1)*pw] {
			switch {
			case cell&evalMark != 0:
				flush()
				c.styled(st.Eval, "•")
				continue
			case run < 0:
				run = len(c.b)
			}
			if cell == 0 {
				c.byte(' ')
			} else {
				c.char(0x2800 + rune(cell))
			}
		}
		flush()
		c.endLine()
	}
	from := len(c.b)
	c.str("      └step ")
	c.num(xmin)
	left := len(c.b) - from - len("      └")
	var digits [20]byte
	right := len(strconv.AppendInt(digits[:0], int64(xmax), 10))
	c.repeat("─", max(pw-left-right, 1))
	c.num(xmax)
	c.fit(from, w)
	c.paint(st.Dim, from)
	c.endLine()
}

// line calls set for the dots of the segment from (x0,y0) to (x1,y1)
// (Bresenham).
func line(x0, y0, x1, y1 int, set func(x, y int)) {
	dx, dy := abs(x1-x0), -abs(y1-y0)
	sx, sy := 1, 1
	if x0 > x1 {
		sx = -1
	}
	if y0 > y1 {
		sy = -1
	}
	err := dx + dy
	for {
		set(x0, y0)
		if x0 == x1 && y0 == y1 {
			return
		}
		e2 := 2 * err
		if e2 >= dy {
			err += dy
			x0 += sx
		}
		if e2 <= dx {
			err += dx
			y0 += sy
		}
	}
}

func abs(x int) int {
	if x < 0 {
		return -x
	}
	return x
}

// blank draws h empty lines of w spaces; on line wait, if not -1, it
// says the chart waits for the first loss.
func blank(c *canvas, w, h, wait int) {
	for i := range h {
		from := len(c.b)
		if i == wait {
			c.spaces(max(0, (w-26)/2))
			c.str("waiting for the first loss")
			c.fit(from, w)
		} else {
			c.spaces(max(w, 0))
		}
		c.endLine()
	}
}
