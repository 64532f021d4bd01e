package ctxio

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
)

// TestStopsWithContext: a copy through Reader or Writer goes through while
// the context lives and fails with its error once it has ended.
func TestStopsWithContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	var b bytes.Buffer
	if _, err := b.ReadFrom(Reader(ctx, strings.NewReader("abc"))); err != nil || b.String() != "abc" {
		t.Fatalf("live: %q, %v", b.String(), err)
	}
	if _, err := Writer(ctx, &b).Write([]byte("d")); err != nil {
		t.Fatal(err)
	}
	cancel()
	if _, err := Reader(ctx, strings.NewReader("x")).Read(make([]byte, 1)); !errors.Is(err, context.Canceled) {
		t.Errorf("read after cancel: %v", err)
	}
	if _, err := Writer(ctx, &b).Write([]byte("e")); !errors.Is(err, context.Canceled) || b.String() != "abcd" {
		t.Errorf("write after cancel: %v, buffer %q", err, b.String())
	}
}
