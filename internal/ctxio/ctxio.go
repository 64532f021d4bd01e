// Package ctxio gives readers and writers a context: a copy through them
// stops at the next Read or Write once the context has ended, with its
// error. The sshexec pushes and the cluster's relays stream files through
// them.
package ctxio

import (
	"context"
	"io"
)

// Reader returns r failing with ctx's error once ctx has ended.
func Reader(ctx context.Context, r io.Reader) io.Reader { return reader{ctx, r} }

// Writer returns w failing with ctx's error once ctx has ended.
func Writer(ctx context.Context, w io.Writer) io.Writer { return writer{ctx, w} }

type reader struct {
	ctx context.Context
	r   io.Reader
}

func (r reader) Read(p []byte) (int, error) {
	if err := r.ctx.Err(); err != nil {
		return 0, err
	}
	return r.r.Read(p)
}

type writer struct {
	ctx context.Context
	w   io.Writer
}

func (w writer) Write(p []byte) (int, error) {
	if err := w.ctx.Err(); err != nil {
		return 0, err
	}
	return w.w.Write(p)
}
