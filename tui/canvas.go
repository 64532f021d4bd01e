package tui

import (
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/charmbracelet/x/ansi"
	"github.com/charmbracelet/x/ansi/parser"
)

// canvas is a frame being drawn: lines of styled text written one after
// another into one buffer, so that a frame makes no string per line, cell
// or figure (a dashboard of a thousand ranks draws sixty frames a second
// and must not keep the garbage collector busy). A line is open from its
// first byte until endLine; a pane is the run of lines it ended, which
// the layout then copies, side by side with another pane's, into the
// lines of the screen. What the canvas writes is what the string
// functions fit, rule and style.r would have made, byte for byte.
type canvas struct {
	b     []byte
	spans []span
	open  int    // where the open line starts in b
	tmp   []byte // scratch, for cutting text
	hold  []byte // scratch, for moving text
}

// span is where a line lies in the canvas's buffer.
type span struct{ from, to int }

// block is a run of lines of a canvas: a pane, as drawn.
type block struct{ first, n int }

// newCanvas returns a canvas with room for a frame of w×h cells: each
// line drawn in a pane, then again on the screen's line and in the
// screen's text, in colour, with some room to spare, and its scratch.
func newCanvas(w, h int) *canvas {
	const scratch = 1024
	n := 8*w*h + 4096
	b := make([]byte, 0, n+2*scratch)
	return &canvas{
		b:     b[:0:n],
		tmp:   b[n : n : n+scratch],
		hold:  b[n+scratch : n+scratch : n+2*scratch],
		spans: make([]span, 0, 4*h+16),
	}
}

// endLine ends the open line and returns its number.
func (c *canvas) endLine() int {
	c.spans = append(c.spans, span{c.open, len(c.b)})
	c.open = len(c.b)
	return len(c.spans) - 1
}

// lines returns the number of lines ended.
func (c *canvas) lines() int { return len(c.spans) }

// since returns the lines ended from line first on.
func (c *canvas) since(first int) block { return block{first, len(c.spans) - first} }

// at returns the number of the i-th line of k, or -1 past its end.
func (k block) at(i int) int {
	if i < k.n {
		return k.first + i
	}
	return -1
}

// cut keeps at most n lines of k.
func (k block) cut(n int) block {
	k.n = min(k.n, max(n, 0))
	return k
}

// trim keeps lines lo to hi (excluded) of k, the last lines drawn, and
// returns them.
func (c *canvas) trim(k block, lo, hi int) block {
	to := c.spans[k.first].from
	for j := lo; j < hi; j++ {
		s := c.spans[k.first+j]
		n := copy(c.b[to:], c.b[s.from:s.to])
		c.spans[k.first+j-lo] = span{to, to + n}
		to += n
	}
	c.b, c.spans, c.open = c.b[:to], c.spans[:k.first+hi-lo], to
	return block{k.first, hi - lo}
}

// put writes line i (none for -1) into the open line.
func (c *canvas) put(i int) {
	if i >= 0 {
		s := c.spans[i]
		c.b = append(c.b, c.b[s.from:s.to]...)
	}
}

// putFit writes line i (none for -1) into the open line, fitted to w cells.
func (c *canvas) putFit(i, w int) {
	from := len(c.b)
	c.put(i)
	c.fit(from, w)
}

// place is where the canvas's writing is, to go back to.
type place struct{ b, spans, open int }

// here returns where the writing is.
func (c *canvas) here() place { return place{len(c.b), len(c.spans), c.open} }

// back forgets what was written since p.
func (c *canvas) back(p place) { c.b, c.spans, c.open = c.b[:p.b], c.spans[:p.spans], p.open }

// The writers: text, a byte, a rune, an integer, a number with prec
// decimals (fmt's %.<prec>f), written into the open line.

func (c *canvas) str(s string)              { c.b = append(c.b, s...) }
func (c *canvas) byte(b byte)               { c.b = append(c.b, b) }
func (c *canvas) char(r rune)               { c.b = utf8.AppendRune(c.b, r) }
func (c *canvas) num(n int)                 { c.b = strconv.AppendInt(c.b, int64(n), 10) }
func (c *canvas) fixed(v float64, prec int) { c.b = strconv.AppendFloat(c.b, v, 'f', prec, 64) }

// float writes v as fmt's %.<prec><verb> does ('f', 'e' or 'g').
func (c *canvas) float(v float64, verb byte, prec int) {
	c.b = strconv.AppendFloat(c.b, v, verb, prec, 64)
}

// repeat writes s n times.
func (c *canvas) repeat(s string, n int) {
	for ; n > 0; n-- {
		c.b = append(c.b, s...)
	}
}

// spaces writes n spaces.
func (c *canvas) spaces(n int) {
	for ; n > 0; n-- {
		c.b = append(c.b, ' ')
	}
}

// padTo pads what was written since from with spaces to n runes, as
// fmt's %-ns does.
func (c *canvas) padTo(from, n int) {
	c.spaces(n - utf8.RuneCount(c.b[from:]))
}

// alignRight moves what was written since from right, behind spaces, to
// make it n runes, as fmt's %ns does.
func (c *canvas) alignRight(from, n int) {
	k := n - utf8.RuneCount(c.b[from:])
	if k <= 0 {
		return
	}
	end := len(c.b)
	c.spaces(k)
	copy(c.b[from+k:], c.b[from:end])
	for i := from; i < from+k; i++ {
		c.b[i] = ' '
	}
}

// width returns the cells of what was written since from.
func (c *canvas) width(from int) int { return cellWidth(c.b[from:]) }

// fit makes what was written since from exactly w cells, as fit does:
// cut with an ellipsis, or padded with spaces.
func (c *canvas) fit(from, w int) {
	if w <= 0 {
		c.b = c.b[:from]
		return
	}
	n := cellWidth(c.b[from:])
	if n > w {
		c.tmp = append(c.tmp[:0], c.b[from:]...)
		c.b = appendTruncate(c.b[:from], c.tmp, w, "…")
		n = cellWidth(c.b[from:])
	}
	c.spaces(w - n)
}

// styled writes s in style st, as st.r(s) does.
func (c *canvas) styled(st style, s string) {
	if !st.on || s == "" {
		c.str(s)
		return
	}
	if st.fast && !strings.ContainsAny(s, "\t\r\n") {
		c.str(st.pre)
		c.str(s)
		c.str(st.post)
		return
	}
	c.str(st.r(s))
}

// paint puts what was written since from in style st: the canvas then
// holds what st.r of that text returns.
func (c *canvas) paint(st style, from int) {
	switch {
	case !st.on || len(c.b) == from:
		return
	case !st.fast || hasControl(c.b[from:]):
		text := string(c.b[from:])
		c.b = append(c.b[:from], st.r(text)...)
		return
	}
	n := len(c.b)
	c.str(st.pre)
	copy(c.b[from+len(st.pre):], c.b[from:n])
	copy(c.b[from:], st.pre)
	c.str(st.post)
}

// ruleBegin starts a pane's title line (see rule) and returns where it
// starts, for ruleEnd; the title follows.
func (c *canvas) ruleBegin(focused bool) int {
	from := len(c.b)
	if focused {
		c.str("━▶ ")
	} else {
		c.str("─  ")
	}
	return from
}

// ruleEnd ends the title line ruleBegin started at from, w cells wide, as
// rule does.
func (c *canvas) ruleEnd(st styles, from, w int, focused bool) {
	line, look := "─", st.Dim
	if focused {
		line, look = "━", st.Sel
	}
	c.byte(' ')
	n := c.width(from)
	if n >= w {
		c.fit(from, w)
		return
	}
	c.repeat(line, w-n)
	c.paint(look, from)
}

// textLine writes s as a line of its own and returns its number.
func (c *canvas) textLine(s string) int {
	c.str(s)
	return c.endLine()
}

// fitLine writes s fitted to w cells as a line of its own.
func (c *canvas) fitLine(s string, w int) int {
	from := len(c.b)
	c.str(s)
	c.fit(from, w)
	return c.endLine()
}

// hasControl reports whether b holds a tab, a carriage return or a
// newline: text that Lip Gloss changes as it styles it.
func hasControl(b []byte) bool {
	for _, x := range b {
		if x == '\t' || x == '\r' || x == '\n' {
			return true
		}
	}
	return false
}

// cellWidth returns the cells s takes on a terminal, escape sequences
// left out: ansi.StringWidth, for bytes as well as strings.
func cellWidth[T string | []byte](s T) int {
	pstate := parser.GroundState
	width := 0
	for i := 0; i < len(s); i++ {
		// Printable ASCII before ASCII is a grapheme cluster of one cell.
		if pstate == parser.GroundState && s[i] >= 0x20 && s[i] < 0x7f && (i+1 == len(s) || s[i+1] < 0x80) {
			width++
			continue
		}
		state, action := parser.Table.Transition(pstate, s[i])
		if action == parser.PrintAction || state == parser.Utf8State {
			cluster, w := ansi.FirstGraphemeCluster(s[i:], ansi.GraphemeWidth)
			width += w
			i += len(cluster) - 1
			pstate = parser.GroundState
			continue
		}
		pstate = state
	}
	return width
}

// appendTruncate appends s cut to length cells, tail included, to dst:
// ansi.Truncate, without making a string.
func appendTruncate(dst, s []byte, length int, tail string) []byte {
	if cellWidth(s) <= length {
		return append(dst, s...)
	}
	length -= cellWidth(tail)
	if length < 0 {
		return dst
	}
	curWidth := 0
	ignoring := false
	pstate := parser.GroundState
	for i := 0; i < len(s); {
		state, action := parser.Table.Transition(pstate, s[i])
		if state == parser.Utf8State {
			cluster, width := ansi.FirstGraphemeCluster(s[i:], ansi.GraphemeWidth)
			i += len(cluster)
			curWidth += width
			if ignoring {
				continue
			}
			if curWidth > length {
				ignoring = true
				dst = append(dst, tail...)
				continue
			}
			dst = append(dst, cluster...)
			pstate = parser.GroundState
			continue
		}
		switch action {
		case parser.PrintAction:
			if curWidth >= length && !ignoring {
				ignoring = true
				dst = append(dst, tail...)
			}
			if ignoring {
				i++
				continue
			}
			curWidth++
			fallthrough
		case parser.ExecuteAction:
			if ignoring {
				i++
				continue
			}
			fallthrough
		default:
			dst = append(dst, s[i])
			i++
		}
		pstate = state
		if curWidth > length && !ignoring {
			ignoring = true
			dst = append(dst, tail...)
		}
	}
	return dst
}
