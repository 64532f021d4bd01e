package badinput

import (
	"errors"
	"fmt"
	"io/fs"
	"testing"
)

type typed struct{}

func (typed) Error() string        { return "typed" }
func (typed) Is(target error) bool { return Is(target) }

// TestMark: a marked error is bad input however it is wrapped, keeps its
// message and its chain; an unmarked one is not.
func TestMark(t *testing.T) {
	base := fmt.Errorf("open x: %w", fs.ErrNotExist)
	for _, tt := range []struct {
		name string
		err  error
		bad  bool
	}{
		{"plain", base, false},
		{"wrapped", Wrap(base), true},
		{"wrapped twice", fmt.Errorf("train: %w", Wrap(base)), true},
		{"new", New("no shards"), true},
		{"type", fmt.Errorf("load: %w", typed{}), true},
		{"joined", errors.Join(errors.New("a"), Wrap(errors.New("b"))), true},
		{"nil", Wrap(nil), false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := errors.Is(tt.err, Err); got != tt.bad {
				t.Errorf("errors.Is(%v, Err) = %v, want %v", tt.err, got, tt.bad)
			}
		})
	}
	if w := Wrap(base); w.Error() != base.Error() || !errors.Is(w, fs.ErrNotExist) {
		t.Errorf("Wrap changed the message or cut the chain: %q", w)
	}
}
