package report

import (
	"cmp"
	"fmt"
	"image/color"
	"slices"
	"strconv"

	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// The marks' labels: above each top panel, a lane of numbered tags, one
// for each mark, joined to its line; under the panels, the marks'
// legend, an entry for each number with the kind's line, its step and
// what happened. No two labels overlap, and none leaves the picture.

// Geometry of the labels, in points.
const (
	tagPadX   vg.Length = 3   // between a tag's frame and its text, left and right
	tagPadY   vg.Length = 1   // above and below
	tagGap    vg.Length = 3   // between two tags of a row
	rowGap    vg.Length = 3   // between two rows of tags
	leaderGap vg.Length = 8   // between the data's top and the first row
	frameW    vg.Length = 1.5 // a tag's frame
	swatchW   vg.Length = 24  // an entry's line of the kind
	entryGap  vg.Length = 5   // between the parts of an entry
	columnGap vg.Length = 16  // between two columns of entries
)

// maxTableRows bounds the rows of the marks' legend (a small picture has
// fewer); marks beyond are counted in its last entry.
const maxTableRows = 5

// minColumn is the narrowest column of the marks' legend whose entries
// are shortened to fit.
const minColumn vg.Length = 200

// tag is a mark's label: its number in a frame above a panel, or its
// entry in the marks' legend; mark is -1 for the legend's count of the
// marks it leaves out.
type tag struct {
	mark int
	text string
	rect vg.Rectangle
}

// tagSize returns the size of a tag of text in sty.
func tagSize(sty draw.TextStyle, text string) (w, h vg.Length) {
	e := sty.FontExtents()
	return sty.Width(text) + 2*tagPadX, e.Ascent + e.Descent + 2*tagPadY
}

// laneHeight returns the height of the lane that holds rows rows of tags
// above a panel's data.
func laneHeight(sty draw.TextStyle, rows int) vg.Length {
	_, h := tagSize(sty, "0")
	return leaderGap + vg.Length(rows)*(h+rowGap)
}

// maxLaneRows bounds the rows of tags above a panel; a small picture
// has fewer (render).
const maxLaneRows = 3

// layoutTags places the tags of the marks, whose lines are at xs, above a
// panel's data whose top is at top: each centred on its line, or moved
// aside as little as needed for no two to overlap, between lo and hi. It
// uses as few rows as they need, up to most (the tags taken in turn, in
// the order of their lines), and returns how many. Tags that do not fit
// in most rows are left out, the rightmost of each row first: the marks'
// legend still lists them.
func layoutTags(sty draw.TextStyle, marks []Mark, xs []vg.Length, lo, hi, top vg.Length, most int) ([]tag, int) {
	order := make([]int, len(marks))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(xs[a], xs[b]) })
	texts := make([]string, len(marks))
	ws := make([]vg.Length, len(marks))
	var h vg.Length
	for i := range marks {
		texts[i] = strconv.Itoa(i + 1)
		ws[i], h = tagSize(sty, texts[i])
	}
	for rows := 1; ; rows++ {
		tags := make([]tag, 0, len(marks))
		fits := true
		for r := range rows {
			var row []int
			for k := r; k < len(order); k += rows {
				row = append(row, order[k])
			}
			lefts, ok := spread(row, xs, ws, lo, hi)
			for !ok && rows >= most {
				row = row[:len(row)-1]
				lefts, ok = spread(row, xs, ws, lo, hi)
			}
			fits = fits && ok
			y := top + leaderGap + vg.Length(r)*(h+rowGap)
			for k, i := range row {
				tags = append(tags, tag{mark: i, text: texts[i], rect: vg.Rectangle{
					Min: vg.Point{X: lefts[k], Y: y}, Max: vg.Point{X: lefts[k] + ws[i], Y: y + h}}})
			}
		}
		if fits || rows >= len(marks) {
			slices.SortFunc(tags, func(a, b tag) int { return a.mark - b.mark })
			return tags, rows
		}
	}
}

// spread returns the left edges of the tags of row (marks, in the order
// of their lines at xs, of widths ws): each centred on its line where it
// can be, none overlapping the next, all between lo and hi; ok is false
// where they do not fit.
func spread(row []int, xs, ws []vg.Length, lo, hi vg.Length) (lefts []vg.Length, ok bool) {
	lefts = make([]vg.Length, len(row))
	for k, i := range row {
		l := max(xs[i]-ws[i]/2, lo)
		if k > 0 {
			l = max(l, lefts[k-1]+ws[row[k-1]]+tagGap)
		}
		lefts[k] = l
	}
	for k := len(row) - 1; k >= 0; k-- {
		i := row[k]
		limit := hi - ws[i]
		if k < len(row)-1 {
			limit = min(limit, lefts[k+1]-tagGap-ws[i])
		}
		lefts[k] = min(lefts[k], limit)
	}
	return lefts, len(row) == 0 || lefts[0] >= lo
}

// drawTags draws the tags above a panel whose data's top is at top, each
// joined to its mark's line at xs; text false leaves their numbers out.
func drawTags(c draw.Canvas, sty draw.TextStyle, marks []Mark, xs []vg.Length, top vg.Length, tags []tag, text bool) {
	// The leaders first: a tag of an upper row hides none of the others.
	for _, t := range tags {
		leader := draw.LineStyle{Color: markStyle(marks[t.mark].Kind).Color, Width: vg.Points(1)}
		c.StrokeLine2(leader, xs[t.mark], top, (t.rect.Min.X+t.rect.Max.X)/2, t.rect.Min.Y)
	}
	for _, t := range tags {
		drawFrame(c, sty, t.rect, markStyle(marks[t.mark].Kind).Color, t.text, text)
	}
}

// drawFrame draws text centred in rect, on white, framed in clr; text
// false leaves the text out.
func drawFrame(c draw.Canvas, sty draw.TextStyle, rect vg.Rectangle, clr color.Color, s string, text bool) {
	c.FillPolygon(color.White, []vg.Point{rect.Min, {X: rect.Max.X, Y: rect.Min.Y}, rect.Max, {X: rect.Min.X, Y: rect.Max.Y}})
	in := frameW / 2
	c.StrokeLines(draw.LineStyle{Color: clr, Width: frameW}, []vg.Point{
		{X: rect.Min.X + in, Y: rect.Min.Y + in}, {X: rect.Max.X - in, Y: rect.Min.Y + in},
		{X: rect.Max.X - in, Y: rect.Max.Y - in}, {X: rect.Min.X + in, Y: rect.Max.Y - in},
		{X: rect.Min.X + in, Y: rect.Min.Y},
	})
	if text {
		fillCentred(c, sty, rect, s)
	}
}

// fillCentred draws s centred in rect.
func fillCentred(c draw.Canvas, sty draw.TextStyle, rect vg.Rectangle, s string) {
	r := sty.Rectangle(s)
	c.FillText(sty, vg.Point{
		X: (rect.Min.X+rect.Max.X)/2 - (r.Min.X+r.Max.X)/2,
		Y: (rect.Min.Y+rect.Max.Y)/2 - (r.Min.Y+r.Max.Y)/2,
	}, s)
}

// markTable is the marks' legend: an entry for each mark, in columns,
// each entry the kind's line, the mark's number and what happened.
type markTable struct {
	entries []tableEntry
	rows    int
	colW    vg.Length // a column's width
	pitch   vg.Length // from a row to the next
	height  vg.Length
	origin  vg.Point // the top left corner, where render puts it
}

// tableEntry is one entry of the marks' legend: the tag of mark (-1 for
// none, the count of the marks left out) and text.
type tableEntry struct {
	mark int
	text string
}

// newMarkTable lays out the legend of marks in width, in at most
// maxTableRows rows and an eighth of height: in as many columns as its
// entries need, or, where that takes too many rows, as many as fit of
// minColumn or more, each entry shortened to fit its column.
func newMarkTable(marks []Mark, width, height vg.Length) *markTable {
	sty := textStyle(labelSize)
	t := &markTable{}
	_, h := tagSize(sty, "0")
	t.pitch = h + vg.Points(3)
	prefix := func(i int) vg.Length {
		w, _ := tagSize(sty, strconv.Itoa(i+1))
		return swatchW + entryGap + w + entryGap
	}
	var widest vg.Length
	for i, m := range marks {
		what := fmt.Sprintf("%s at step %d: %s", kindName(m.Kind), m.Step, m.Label)
		if m.Kind == MarkRestart {
			what = fmt.Sprintf("restart from step %d: %s", m.Step, m.Label)
		}
		t.entries = append(t.entries, tableEntry{mark: i, text: what})
		widest = max(widest, prefix(i)+sty.Width(what))
	}
	n := len(marks)
	most := max(1, min(maxTableRows, int((height/8+vg.Points(3))/t.pitch)))
	cols := max(1, min(n, int((width+columnGap)/(widest+columnGap))))
	if (n+cols-1)/cols > most {
		cols = max(cols, min((n+most-1)/most, int((width+columnGap)/(minColumn+columnGap))))
	}
	t.rows = min((n+cols-1)/cols, most)
	if n > cols*t.rows {
		shown := cols*t.rows - 1
		t.entries = append(t.entries[:shown], tableEntry{mark: -1, text: fmt.Sprintf("and %d more marks, %d to %d", n-shown, shown+1, n)})
	}
	t.colW = (width + columnGap) / vg.Length(cols)
	for k, e := range t.entries {
		room := t.colW - columnGap
		if e.mark >= 0 {
			room -= prefix(e.mark)
		}
		t.entries[k].text = fit(sty, e.text, room)
	}
	t.height = vg.Length(t.rows)*t.pitch - vg.Points(3)
	return t
}

// draw draws the legend at its origin and returns its entries' places;
// text false leaves their texts out.
func (t *markTable) draw(c draw.Canvas, sty draw.TextStyle, marks []Mark, text bool) []tag {
	var out []tag
	for k, e := range t.entries {
		col, row := k/t.rows, k%t.rows
		x := t.origin.X + vg.Length(col)*t.colW
		top := t.origin.Y - vg.Length(row)*t.pitch
		_, h := tagSize(sty, "0")
		rect := vg.Rectangle{Min: vg.Point{X: x, Y: top - h}, Max: vg.Point{X: x, Y: top}}
		if e.mark >= 0 {
			s := markStyle(marks[e.mark].Kind)
			mid := top - h/2
			c.StrokeLine2(s, x, mid, x+swatchW, mid)
			x += swatchW + entryGap
			w, _ := tagSize(sty, strconv.Itoa(e.mark+1))
			drawFrame(c, sty, vg.Rectangle{Min: vg.Point{X: x, Y: top - h}, Max: vg.Point{X: x + w, Y: top}}, s.Color, strconv.Itoa(e.mark+1), text)
			x += w + entryGap
		}
		w := sty.Width(e.text)
		if text {
			fillCentred(c, sty, vg.Rectangle{Min: vg.Point{X: x, Y: top - h}, Max: vg.Point{X: x + w, Y: top}}, e.text)
		}
		rect.Max.X = x + w
		out = append(out, tag{mark: e.mark, text: e.text, rect: rect})
	}
	return out
}
