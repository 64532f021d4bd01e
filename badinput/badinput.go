// Package badinput marks the errors that bad input causes — a config key,
// a file, an inventory line, a network peer's message — apart from a failure
// of the machine or of gptui itself. The command exits with status 2 for
// them, 1 for the others.
//
// Every package that reports bad input marks its errors with it, so that
//
//	errors.Is(err, badinput.Err)
//
// holds for them however they are wrapped: error types say so in their Is
// method (see [Is]), and a plain error is marked with [Wrap] or [New].
package badinput

import "errors"

// Err is the mark of bad input. It is never returned by itself.
var Err = errors.New("bad input")

// Is is the Is method of an error type whose every value is bad input:
//
//	func (e *FormatError) Is(target error) bool { return badinput.Is(target) }
func Is(target error) bool { return target == Err }

// marked is an error marked as bad input, its message unchanged.
type marked struct{ err error }

func (m marked) Error() string        { return m.err.Error() }
func (m marked) Unwrap() error        { return m.err }
func (m marked) Is(target error) bool { return Is(target) }

// Wrap returns err marked as bad input, with err's message and chain; nil
// stays nil.
func Wrap(err error) error {
	if err == nil {
		return nil
	}
	return marked{err}
}

// New returns a new error with the message text, marked as bad input (for
// sentinel errors such as "no shards found").
func New(text string) error { return marked{errors.New(text)} }
