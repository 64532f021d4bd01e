package tui

import (
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/charmbracelet/x/ansi"
)

// canvasPieces are the kinds of text the canvas meets: ASCII, wide,
// combining and zero-width characters, emoji, box drawing, braille,
// escape sequences and the control characters Lip Gloss changes.
var canvasPieces = []string{
	"a", "hello", " ", "  ", "…", "⣀⠉", "▁▃█", "─━", "日本語", "e\u0301", "👍", "👨\u200d👩\u200d👧",
	"\x1b[94m", "\x1b[1;93m", "\x1b[m", "\x1b]8;;http://x\x07", "\t", "\n", "\r\n", "—", "✗", "°C", "x\u200dy", "\x7f", "\x00",
}

// randomText returns up to n pieces of text.
func randomText(rng *rand.Rand, n int) string {
	var b strings.Builder
	for range rng.IntN(n + 1) {
		b.WriteString(canvasPieces[rng.IntN(len(canvasPieces))])
	}
	return b.String()
}

// TestCanvasLikeStrings: what the canvas writes is what the string
// functions make, byte for byte: widths (ansi.StringWidth), cutting
// (ansi.Truncate), fit, rule and the styles, coloured or not.
func TestCanvasLikeStrings(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var looks []style
	for _, colour := range []bool{false, true} {
		st := newStyles(colour)
		looks = append(looks, st.Title, st.Tab, st.Dim, st.Bold, st.OK, st.Warn, st.Bad, st.Sel, st.Match, st.Bar, st.Train, st.Eval, st.Banner)
	}
	for _, st := range looks {
		if st.on && !st.fast {
			t.Errorf("style %q: no plain prefix and suffix", st.r("x"))
		}
	}
	for range 3000 {
		s := randomText(rng, 10)
		if got, want := cellWidth(s), ansi.StringWidth(s); got != want {
			t.Fatalf("cellWidth(%q) = %d, want %d", s, got, want)
		}
		if got, want := cellWidth([]byte(s)), ansi.StringWidth(s); got != want {
			t.Fatalf("cellWidth([]byte(%q)) = %d, want %d", s, got, want)
		}
		for w := range 16 {
			if got, want := string(appendTruncate([]byte("x"), []byte(s), w, "…")), "x"+ansi.Truncate(s, w, "…"); got != want {
				t.Fatalf("appendTruncate(%q, %d) = %q, want %q", s, w, got, want)
			}
			c := newCanvas(4, 4)
			c.str("x")
			c.str(s)
			c.fit(1, w)
			if got, want := string(c.b), "x"+fit(s, w); got != want {
				t.Fatalf("fit(%q, %d) = %q, want %q", s, w, got, want)
			}
			focused := w%2 == 0
			st := newStyles(w%3 == 0)
			c = newCanvas(4, 4)
			from := c.ruleBegin(focused)
			c.str(s)
			c.ruleEnd(st, from, w+4, focused)
			if got, want := string(c.b), rule(st, s, w+4, focused); got != want {
				t.Fatalf("rule(%q, %d) = %q, want %q", s, w+4, got, want)
			}
		}
		for _, st := range looks {
			c := newCanvas(4, 4)
			c.styled(st, s)
			if got, want := string(c.b), st.r(s); got != want {
				t.Fatalf("styled(%q) = %q, want %q", s, got, want)
			}
			c = newCanvas(4, 4)
			c.str("x")
			c.str(s)
			c.paint(st, 1)
			if got, want := string(c.b), "x"+st.r(s); got != want {
				t.Fatalf("paint(%q) = %q, want %q", s, got, want)
			}
		}
	}
}

// TestPacker: the packer lays fields out as the header always has: two
// spaces apart, a new line where the next field does not fit, at most n
// lines, each fitted to the width.
func TestPacker(t *testing.T) {
	// pack is the header's layout as strings, as it was.
	pack := func(fields []string, w, n int) []string {
		var out []string
		line, lw := " ", 1
		for _, f := range fields {
			fw := ansi.StringWidth(f)
			if lw > 1 && lw+2+fw > w {
				out = append(out, fit(line, w))
				line, lw = " ", 1
			}
			if lw > 1 {
				line, lw = line+"  ", lw+2
			}
			line, lw = line+f, lw+fw
		}
		out = append(out, fit(line, w))
		if len(out) > n {
			out = out[:n]
		}
		return out
	}
	rng := rand.New(rand.NewPCG(3, 4))
	for range 3000 {
		var fields []string
		for range rng.IntN(8) {
			fields = append(fields, strings.NewReplacer("\t", "", "\n", "", "\r", "").Replace(randomText(rng, 6)))
		}
		w, n := 1+rng.IntN(40), 1+rng.IntN(3)
		c := newCanvas(w, n)
		p := c.pack(w, n)
		for _, f := range fields {
			p.text(f)
		}
		k := p.finish()
		var got []string
		for i := range k.n {
			s := c.spans[k.first+i]
			got = append(got, string(c.b[s.from:s.to]))
		}
		if want := pack(fields, w, n); strings.Join(got, "\n") != strings.Join(want, "\n") {
			t.Fatalf("pack(%q, %d, %d):\n got %q\nwant %q", fields, w, n, got, want)
		}
	}
}
