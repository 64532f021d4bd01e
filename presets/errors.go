package presets

import (
	"strconv"
	"strings"

	"github.com/gptui/gptui/badinput"
)

// Error reports a problem with user input: a configuration file, a preset,
// an override or a value that fails validation. Its message has the form
// "FILE:LINE: KEY: MSG", leaving out the parts that are empty (Line is
// printed only when positive). For overrides File reads
// `override "Section.key=value"`.
//
// Every user-input error returned by this package is, or wraps, an *Error,
// so callers can use errors.As to tell bad input from other failures.
type Error struct {
	File string // file or source the error concerns
	Line int    // 1-based line, or 0 if unknown
	Key  string // full dotted key, such as "Model.hidden_size"
	Msg  string // what is wrong and, where possible, what to do
	// Err is the underlying error, if any (for example from reading a
	// file); it is appended to the message and returned by Unwrap.
	Err error
}

// Error implements the error interface.
func (e *Error) Error() string {
	var b strings.Builder
	sep := func() {
		if b.Len() > 0 {
			b.WriteString(": ")
		}
	}
	if e.File != "" {
		b.WriteString(e.File)
		if e.Line > 0 {
			b.WriteString(":")
			b.WriteString(strconv.Itoa(e.Line))
		}
	} else if e.Line > 0 {
		b.WriteString("line ")
		b.WriteString(strconv.Itoa(e.Line))
	}
	if e.Key != "" {
		sep()
		b.WriteString(e.Key)
	}
	if e.Msg != "" {
		sep()
		b.WriteString(e.Msg)
	}
	if e.Err != nil {
		sep()
		b.WriteString(e.Err.Error())
	}
	return b.String()
}

// Is reports that an Error is bad input (badinput.Err).
func (e *Error) Is(target error) bool { return badinput.Is(target) }

// Unwrap returns the underlying error, if any.
func (e *Error) Unwrap() error { return e.Err }

// pos is where a value was set.
type pos struct {
	file string
	line int
}

// errAt returns an *Error at p.
func errAt(p pos, key, msg string) *Error {
	return &Error{File: p.file, Line: p.line, Key: key, Msg: msg}
}
