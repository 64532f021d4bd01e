package main

import (
	"context"
	"os"
	"os/signal"
	"sync"
	"syscall"
)

// interrupts turns SIGINT, SIGTERM and SIGHUP into a two-stage stop. The
// first one cancels the context the commands get (a training run then
// stops at the next step boundary, saves its finished steps and exits), and
// the process then exits with 128 + the signal's number (130, 143, 129). A
// second one cancels the hard context too: collectives and saves in
// progress are abandoned.
type interrupts struct {
	soft, hard context.Context
	stopHard   context.CancelFunc
	stopSoft   context.CancelFunc
	ch         chan os.Signal
	done       chan struct{}

	mu  sync.Mutex
	sig syscall.Signal // the first signal; 0 if none
}

// notifyInterrupts starts watching for the signals until stop is called.
func notifyInterrupts() *interrupts {
	in := &interrupts{ch: make(chan os.Signal, 2), done: make(chan struct{})}
	in.hard, in.stopHard = context.WithCancel(context.Background())
	in.soft, in.stopSoft = context.WithCancel(context.WithValue(in.hard, hardKey{}, in.hard))
	signal.Notify(in.ch, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	go func() {
		for {
			select {
			case s := <-in.ch:
				in.mu.Lock()
				first := in.sig == 0
				if first {
					in.sig = s.(syscall.Signal)
				}
				in.mu.Unlock()
				if first {
					in.stopSoft()
				} else {
					in.stopHard()
				}
			case <-in.done:
				return
			}
		}
	}()
	return in
}

// stop stops watching; a signal after it has its default effect.
func (in *interrupts) stop() {
	signal.Stop(in.ch)
	close(in.done)
	in.stopSoft()
	in.stopHard()
}

// signal returns the first signal received, or 0.
func (in *interrupts) signal() syscall.Signal {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.sig
}

// hardKey is the context key of the hard context under the soft one.
type hardKey struct{}

// hardContext returns the context that only a second interrupt cancels,
// given the one a command got; without interrupts (tests) it is ctx.
func hardContext(ctx context.Context) context.Context {
	if h, ok := ctx.Value(hardKey{}).(context.Context); ok {
		return h
	}
	return ctx
}

// interruptCode is the exit status of a process stopped by sig: 128 + its
// number, as a shell reports a process killed by it.
func interruptCode(sig syscall.Signal) int { return 128 + int(sig) }
