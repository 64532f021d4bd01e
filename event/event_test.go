package event

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"
)

func TestRoundTrip(t *testing.T) {
	var buf bytes.Buffer
	w := NewWriter(&buf)
	in := []Event{New(KindJob), New(KindMetrics), New(KindLog)}
	in[0].State = JobStarted
	in[1].Rank, in[1].Metrics = 3, &Metrics{Step: 7, Loss: 2.5}
	in[2].Rank, in[2].Node, in[2].Line = 0, "n1", "hello"
	for _, e := range in {
		if err := w.Write(e); err != nil {
			t.Fatal(err)
		}
	}
	// Noise a shell might print is skipped.
	r := NewReader(io.MultiReader(strings.NewReader("Welcome!\n\n{not json\n"), &buf))
	for i := range in {
		e, err := r.Next()
		if err != nil {
			t.Fatalf("event %d: %v", i, err)
		}
		if e.Kind != in[i].Kind || e.Rank != in[i].Rank || e.Line != in[i].Line || e.State != in[i].State {
			t.Errorf("event %d: got %+v, want %+v", i, e, in[i])
		}
	}
	if _, err := r.Next(); err != io.EOF {
		t.Errorf("at the end: %v, want io.EOF", err)
	}
	if in[1].Metrics.Step != 7 {
		t.Error("metrics lost")
	}
}

func TestVersion(t *testing.T) {
	r := NewReader(strings.NewReader(`{"v":99,"kind":"job"}` + "\n"))
	_, err := r.Next()
	var ve *VersionError
	if !errors.As(err, &ve) || ve.Got != 99 || !strings.Contains(err.Error(), "v99") {
		t.Fatalf("got %v, want a VersionError naming v99", err)
	}
}
