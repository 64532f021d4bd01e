// Package safetensors reads and writes safetensors files, the tensor file
// format of Hugging Face's safetensors library: gptui's checkpoint shards
// (package checkpoint) and Hugging Face model files (package hf) are both
// read and written here.
//
// # Format
//
// A file is an 8-byte little-endian header length N, N bytes of JSON, then
// the data:
//
//	{"__metadata__": {"format": "pt"},                  optional, strings only
//	 "name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]},
//	 …}
//
// Each tensor is stored row-major and little-endian at its [begin, end)
// byte range of the data, which starts right after the header. The ranges
// tile the data exactly: no gaps, no overlaps, nothing after the last.
//
// # Reading
//
// [Parse] reads and checks a header against the file's real size before
// anything a header declares is allocated: a header larger than the file
// or than [MaxHeaderLen], a range outside the data or not matching its
// shape and dtype, is a *[FormatError] naming the file, in one line. Data
// is read later, on demand, through an [io.ReaderAt]: a whole tensor
// ([File.Read]) or any block of it ([File.ReadBlock]), F16 and BF16 widened
// to float32 exactly (package half). Other dtypes are recognised but not
// read.
//
// # Writing
//
// A [Writer] writes float32 tensors as F32: the header first, with the
// tensors in the order given, compact JSON (metadata keys sorted) padded
// with spaces to a multiple of 8 bytes so that the data is 8-byte aligned,
// then the values as they come. The bytes are a function of the tensors
// and metadata alone. Where the file goes, and how it is made durable, is
// the caller's.
package safetensors

import (
	"errors"
	"fmt"
)

// MaxHeaderLen bounds the JSON header of a file (100 MiB, the limit of the
// reference implementation).
const MaxHeaderLen = 100 << 20

// MaxElements bounds the element count of a tensor, so that sizes in bytes
// and offsets never overflow int64.
const MaxElements = 1 << 58

// metadataKey is the reserved header entry holding string metadata.
const metadataKey = "__metadata__"

// chunkElems is how many elements are converted per write or read call.
const chunkElems = 1 << 16

// DtypeF32 is the dtype of the tensors a [Writer] writes.
const DtypeF32 = "F32"

// FormatError is a file that is not a valid safetensors file, or a tensor
// of it that cannot be read.
type FormatError struct {
	File string // the file's path or name
	Msg  string // what is wrong
	Err  error  // the underlying error, if any
}

// Error returns "<file>: <msg>[: <err>]".
func (e *FormatError) Error() string {
	s := e.File + ": " + e.Msg
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

func (e *FormatError) Unwrap() error { return e.Err }

// Elements returns the element count of shape after checking that every
// dimension is at least minDim (0 in a safetensors file, which may hold
// empty tensors) and that the count is at most [MaxElements].
func Elements(shape []int, minDim int) (int64, error) {
	n := int64(1)
	for _, d := range shape {
		if d < minDim {
			return 0, fmt.Errorf("dimension %d is below %d", d, minDim)
		}
		if d > 0 && n > MaxElements/int64(d) {
			return 0, errors.New("too many elements")
		}
		n *= int64(d)
	}
	return n, nil
}

// DtypeSize returns the size in bytes of one element of the dtype dt, or 0
// for a dtype the format does not have.
func DtypeSize(dt string) int {
	switch dt {
	case "BOOL", "U8", "I8", "F8_E4M3", "F8_E5M2":
		return 1
	case "U16", "I16", "F16", "BF16":
		return 2
	case "U32", "I32", "F32":
		return 4
	case "U64", "I64", "F64":
		return 8
	}
	return 0
}

// Float reports whether tensors of dtype dt are read as float32: F32, and
// F16 and BF16, widened exactly.
func Float(dt string) bool { return decoder(dt) != nil }
