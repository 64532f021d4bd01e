package tui

import (
	"strconv"
	"strings"

	"charm.land/lipgloss/v2"
	"github.com/charmbracelet/x/ansi"
)

// style paints text with a Lip Gloss style, or leaves it plain when colour
// is off: with NO_COLOR set the UI writes no SGR sequence at all, so that
// what it draws is plain text (and the golden files are too).
type style struct {
	s  lipgloss.Style
	on bool
	// pre and post are what r puts around a line of text, the same for
	// any (fast): the canvas writes them itself.
	pre, post string
	fast      bool
}

// r renders text in the style.
func (s style) r(text string) string {
	if !s.on || text == "" {
		return text
	}
	return s.s.Render(text)
}

// styles are the looks of the UI. Nothing in the UI relies on colour alone:
// the selected row has a "›" marker, the active tab brackets, the focused
// pane a heavy rule, so a NO_COLOR terminal loses nothing but the colour.
type styles struct {
	Title, Tab, Dim, Bold, OK, Warn, Bad, Sel, Match, Bar, Train, Eval, Banner style
}

// newStyles returns the styles, with colour on or off.
func newStyles(colour bool) styles {
	mk := func(s lipgloss.Style) style {
		st := style{s: s, on: colour}
		if colour {
			const probe = "x"
			st.pre, st.post, st.fast = strings.Cut(s.Render(probe), probe)
			st.fast = st.fast && !strings.Contains(st.post, probe)
		}
		return st
	}
	n := lipgloss.NewStyle
	return styles{
		Title:  mk(n().Bold(true).Foreground(lipgloss.Color("12"))),
		Tab:    mk(n().Bold(true).Foreground(lipgloss.Color("11"))),
		Dim:    mk(n().Foreground(lipgloss.Color("8"))),
		Bold:   mk(n().Bold(true)),
		OK:     mk(n().Foreground(lipgloss.Color("10"))),
		Warn:   mk(n().Foreground(lipgloss.Color("11"))),
		Bad:    mk(n().Foreground(lipgloss.Color("9")).Bold(true)),
		Sel:    mk(n().Foreground(lipgloss.Color("14")).Bold(true)),
		Match:  mk(n().Foreground(lipgloss.Color("0")).Background(lipgloss.Color("11"))),
		Bar:    mk(n().Foreground(lipgloss.Color("10"))),
		Train:  mk(n().Foreground(lipgloss.Color("12"))),
		Eval:   mk(n().Foreground(lipgloss.Color("13"))),
		Banner: mk(n().Foreground(lipgloss.Color("15")).Background(lipgloss.Color("1")).Bold(true)),
	}
}

// stateStyle picks the style that goes with a node, worker or job state.
func (st styles) state(s string) style {
	switch s {
	case "running", "ready", "probed", "done", "exited", "started":
		return st.OK
	case "failed", "lost", "hung", "silent", "host key":
		return st.Bad
	case "connecting", "pushing", "starting", "stopping", "stopped":
		return st.Warn
	}
	return st.Dim
}

// fit truncates s (which may hold ANSI sequences) to w cells and pads it
// with spaces to exactly w cells.
func fit(s string, w int) string {
	if w <= 0 {
		return ""
	}
	n := ansi.StringWidth(s)
	if n > w {
		s = ansi.Truncate(s, w, "…")
		n = ansi.StringWidth(s)
	}
	if n < w {
		s += strings.Repeat(" ", w-n)
	}
	return s
}

// rule draws a pane's title line: a light rule, or a heavy one when the
// pane has the focus.
func rule(st styles, title string, w int, focused bool) string {
	line, mark := "─", "  "
	if focused {
		line, mark = "━", "▶ "
	}
	head := line + mark + title + " "
	n := ansi.StringWidth(head)
	if n >= w {
		return fit(head, w)
	}
	s := head + strings.Repeat(line, w-n)
	if focused {
		return st.Sel.r(s)
	}
	return st.Dim.r(s)
}

// appendDuration appends s seconds to b as 1h02m, 3m05s or 42s.
func appendDuration(b []byte, s float64) []byte {
	if s < 0 || s != s {
		return append(b, '-')
	}
	t := int64(s + 0.5)
	two := func(b []byte, n int64) []byte { return append(b, byte('0'+n/10), byte('0'+n%10)) }
	switch {
	case t >= 3600:
		b = strconv.AppendInt(b, t/3600, 10)
		return append(two(append(b, 'h'), t%3600/60), 'm')
	case t >= 60:
		b = strconv.AppendInt(b, t/60, 10)
		return append(two(append(b, 'm'), t%60), 's')
	}
	return append(strconv.AppendInt(b, t, 10), 's')
}

// clean makes text from outside (a worker's output, an error message) safe
// to lay out: escape sequences removed, tabs expanded, newlines and other
// control characters turned into spaces.
func clean(s string) string {
	plain := true
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] == 0x7f {
			plain = false
			break
		}
	}
	if plain {
		return s
	}
	s = ansi.Strip(s)
	var b strings.Builder
	for _, r := range s {
		switch {
		case r == '\t':
			b.WriteString("    ")
		case r < 0x20 || r == 0x7f:
			b.WriteByte(' ')
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// trunc cuts s to n cells with an ellipsis.
func trunc(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return fit(s, n)
}

// wrap breaks s into lines of at most w cells (at least 10): at spaces
// where it can, inside a word longer than a line where it must, so that
// nothing is cut off. Escape sequences are kept; runs of spaces become one.
func wrap(s string, w int) []string {
	w = max(w, 10)
	var out []string
	line, lw := "", 0
	for _, word := range strings.Split(s, " ") {
		ww := ansi.StringWidth(word)
		if ww == 0 {
			continue
		}
		if lw > 0 && lw+1+ww > w {
			out = append(out, line)
			line, lw = "", 0
		}
		for ww > w { // a word longer than a line (lw is 0 here)
			out = append(out, ansi.Cut(word, 0, w))
			word, ww = ansi.Cut(word, w, ww), ww-w
		}
		if lw > 0 {
			line, lw = line+" ", lw+1
		}
		line, lw = line+word, lw+ww
	}
	return append(out, line)
}
