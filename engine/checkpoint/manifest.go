package checkpoint

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"

	"github.com/gptui/gptui/badinput"
	"github.com/gptui/gptui/engine/safetensors"
)

// FormatVersion is the manifest format this package writes and the newest it
// reads. Version 2 seals the manifest with its own checksum (see [Seal]);
// version 1 manifests, unsealed, still load.
const FormatVersion = 2

// sealPrefix starts the first line of a sealed manifest, which ends with
// the hex SHA-256 of every byte after that line and `",`.
const sealPrefix = `{"manifest_sha256":"`

// Seal returns the manifest b, a JSON object, sealed: its first line
// becomes {"manifest_sha256":"<hex SHA-256 of the rest>", and the rest is b
// after its opening brace. A seal b already has is replaced. Every
// manifest this package writes is sealed, and a reader refuses a sealed
// manifest whose bytes do not match the seal, and a version-2 manifest
// without one: a manifest altered by a single byte never loads.
func Seal(b []byte) []byte {
	if rest, ok := strings.CutPrefix(string(b), sealPrefix); ok {
		if i := strings.IndexByte(rest, '\n'); i >= 0 {
			b = append([]byte("{"), rest[i+1:]...)
		}
	}
	body := strings.TrimLeft(string(b[min(1, len(b)):]), " \t\r\n")
	sum := sha256.Sum256([]byte(body))
	return []byte(sealPrefix + hex.EncodeToString(sum[:]) + "\",\n" + body)
}

// unseal checks the seal of the manifest b, if it has one (see [Seal]),
// and reports whether it had.
func unseal(name string, b []byte) (bool, error) {
	rest, ok := strings.CutPrefix(string(b), sealPrefix)
	if !ok {
		return false, nil
	}
	line, body, ok := strings.Cut(rest, "\n")
	sum, ok2 := strings.CutSuffix(line, `",`)
	if !ok || !ok2 || len(sum) != 64 {
		return true, &FormatError{File: name, Msg: "its first line is not a manifest_sha256 seal: the manifest is damaged; use another checkpoint"}
	}
	got := sha256.Sum256([]byte(body))
	if hex.EncodeToString(got[:]) != sum {
		return true, &FormatError{File: name, Msg: fmt.Sprintf("SHA-256 of its content %s does not match its seal %s: the manifest was altered or damaged; use another checkpoint", hex.EncodeToString(got[:]), sum)}
	}
	return true, nil
}

// ManifestFile is the name of the manifest inside a checkpoint directory.
const ManifestFile = "manifest.json"

// DtypeF32 is the only tensor dtype a version 1 manifest may declare.
const DtypeF32 = "F32"

// A Slice is a block of a global tensor held by one data file, in global
// coordinates: the elements from Start (inclusive) to Start+Shape
// (exclusive) along every dimension. The file stores the block row-major as
// a tensor of shape Shape.
type Slice struct {
	File  string `json:"file"`
	Key   string `json:"key,omitempty"` // the block's name in File; empty means the tensor's name
	Start []int  `json:"start"`
	Shape []int  `json:"shape"`
}

// entry is the name under which the block is stored in its file.
func (s Slice) entry(tensor string) string {
	if s.Key != "" {
		return s.Key
	}
	return tensor
}

// TensorInfo describes one global tensor and where its blocks are stored.
// The slices of a tensor do not overlap and together cover it.
type TensorInfo struct {
	Name   string  `json:"name"`
	Dtype  string  `json:"dtype"` // "F32"
	Shape  []int   `json:"shape"` // global shape
	Slices []Slice `json:"slices"`
}

// Manifest is the content of manifest.json: the state of a training run
// that is not tensor data, and the index of the tensor data.
type Manifest struct {
	FormatVersion   int    `json:"format_version"`
	Step            int    `json:"step"`             // optimizer steps completed
	ConsumedSamples int64  `json:"consumed_samples"` // training samples drawn so far
	Config          string `json:"config,omitempty"` // the resolved configuration, as YAML

	// Data is the data loader's state; this package stores it verbatim.
	Data json.RawMessage `json:"data,omitempty"`
	// RNG holds random generator states and seeds; stored verbatim.
	RNG map[string]uint64 `json:"rng,omitempty"`
	// LossScale is the fp16 loss scale in effect (0 when unused).
	LossScale float64 `json:"loss_scale"`
	// Run identifies the training run that wrote the checkpoint: a
	// [NewRun] drawn when the run started from scratch, carried by every
	// resume. Checkpoints of one run on different machines are stages of
	// it; "" (older checkpoints, imports) is unknown.
	Run string `json:"run,omitempty"`

	// Tensors and Files are filled in by Save.
	Tensors []TensorInfo      `json:"tensors"`
	Files   map[string]string `json:"files"` // data file name → hex SHA-256

	// Extra holds further named records that this package stores verbatim.
	Extra map[string]json.RawMessage `json:"extra,omitempty"`
}

// A FormatError reports a checkpoint file that is malformed, damaged or of
// an unsupported version.
type FormatError struct {
	File string // the file's path or name
	Msg  string // what is wrong
	Err  error  // the underlying error, if any
}

// Error returns "checkpoint: <file>: <msg>[: <err>]".
func (e *FormatError) Error() string {
	s := "checkpoint: " + e.File + ": " + e.Msg
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

// Is reports that a FormatError is bad input (badinput.Err).
func (e *FormatError) Is(target error) bool { return badinput.Is(target) }

// Unwrap returns the underlying error.
func (e *FormatError) Unwrap() error { return e.Err }

// ParseManifest decodes and validates a manifest; name is the file's path,
// used in errors. It checks the manifest's seal ([Seal]; version 2 needs
// one), accepts format versions 1 to [FormatVersion] and checks
// that tensor names are unique, shapes positive, every slice lies inside its
// tensor and in a listed file, the slices of a tensor neither overlap nor
// leave holes, and checksums are SHA-256 hex digests. Every error is a
// *[FormatError] naming the file.
func ParseManifest(name string, b []byte) (*Manifest, error) {
	sealed, err := unseal(name, b)
	if err != nil {
		return nil, err
	}
	// Check the version before anything else: a newer format may break
	// any of the rules below.
	var v struct {
		FormatVersion *int `json:"format_version"`
	}
	if err := json.Unmarshal(b, &v); err != nil {
		return nil, &FormatError{File: name, Msg: "not a valid manifest", Err: err}
	}
	switch {
	case v.FormatVersion == nil:
		return nil, &FormatError{File: name, Msg: "no format_version"}
	case *v.FormatVersion > FormatVersion:
		return nil, &FormatError{File: name, Msg: fmt.Sprintf(
			"format version %d is newer than version %d, the newest this program reads; use a newer gptui",
			*v.FormatVersion, FormatVersion)}
	case *v.FormatVersion < 1:
		return nil, &FormatError{File: name, Msg: fmt.Sprintf("invalid format version %d", *v.FormatVersion)}
	case *v.FormatVersion >= 2 && !sealed:
		return nil, &FormatError{File: name, Msg: fmt.Sprintf("format version %d without its manifest_sha256 seal on the first line: the manifest was altered or damaged; use another checkpoint", *v.FormatVersion)}
	}
	m := new(Manifest)
	if err := json.Unmarshal(b, m); err != nil {
		return nil, &FormatError{File: name, Msg: "not a valid manifest", Err: err}
	}
	if msg := checkManifest(m); msg != "" {
		return nil, &FormatError{File: name, Msg: msg}
	}
	return m, nil
}

// checkManifest returns what is wrong with m, or "".
func checkManifest(m *Manifest) string {
	switch {
	case m.Step < 0:
		return fmt.Sprintf("negative step %d", m.Step)
	case m.ConsumedSamples < 0:
		return fmt.Sprintf("negative consumed_samples %d", m.ConsumedSamples)
	case m.LossScale < 0 || math.IsInf(m.LossScale, 0) || math.IsNaN(m.LossScale):
		return fmt.Sprintf("invalid loss_scale %v", m.LossScale)
	case !validRun(m.Run):
		return fmt.Sprintf("run %q is not a run identifier (up to 64 lowercase hex digits)", m.Run)
	}
	for _, f := range slices.Sorted(maps.Keys(m.Files)) {
		sum := m.Files[f]
		if msg := checkFileName(f); msg != "" {
			return fmt.Sprintf("files: %q: %s", f, msg)
		}
		if len(sum) != 64 || strings.ToLower(sum) != sum {
			return fmt.Sprintf("files: %q: checksum %q is not a lowercase hex SHA-256", f, sum)
		}
		if _, err := hex.DecodeString(sum); err != nil {
			return fmt.Sprintf("files: %q: checksum %q is not a lowercase hex SHA-256", f, sum)
		}
	}
	return checkTensors(m.Tensors, func(f string) bool { _, ok := m.Files[f]; return ok })
}

// NewRun returns a new run identifier for [Manifest.Run]: 128 random
// bits in hex.
func NewRun() string {
	var b [16]byte
	rand.Read(b[:]) // never fails
	return hex.EncodeToString(b[:])
}

// validRun reports whether r can be a [Manifest.Run]: empty, or up to 64
// lowercase hex digits.
func validRun(r string) bool {
	if len(r) > 64 {
		return false
	}
	for _, c := range r {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// checkFileName returns what keeps f from naming a data file inside a
// checkpoint directory, or "".
func checkFileName(f string) string {
	switch {
	case f == "" || f == "." || f == "..":
		return "not a file name"
	case strings.ContainsAny(f, `/\`+"\x00"):
		return "not a plain file name"
	case f == ManifestFile:
		return "the manifest is not a data file"
	}
	return ""
}

// checkTensors validates tensors whose slices may only name files for
// which listed is true. It returns what is wrong, or "".
func checkTensors(tensors []TensorInfo, listed func(string) bool) string {
	names := make(map[string]bool, len(tensors))
	type fileEntry struct{ file, entry string }
	entries := make(map[fileEntry]string)
	for i, t := range tensors {
		if t.Name == "" {
			return fmt.Sprintf("tensor %d has no name", i)
		}
		if names[t.Name] {
			return fmt.Sprintf("tensor %q appears twice", t.Name)
		}
		names[t.Name] = true
		if t.Dtype != DtypeF32 {
			return fmt.Sprintf("tensor %q: unsupported dtype %q (want %q)", t.Name, t.Dtype, DtypeF32)
		}
		total, err := safetensors.Elements(t.Shape, 1)
		if err != nil {
			return fmt.Sprintf("tensor %q: shape %v: %v", t.Name, t.Shape, err)
		}
		if len(t.Slices) == 0 {
			return fmt.Sprintf("tensor %q has no slices", t.Name)
		}
		var covered int64
		for j, s := range t.Slices {
			if msg := checkSlice(t.Shape, s, listed); msg != "" {
				return fmt.Sprintf("tensor %q: slice %d: %s", t.Name, j, msg)
			}
			fe := fileEntry{s.File, s.entry(t.Name)}
			if other, ok := entries[fe]; ok {
				return fmt.Sprintf("tensor %q: slice %d: entry %q of %q already holds a block of %q", t.Name, j, fe.entry, fe.file, other)
			}
			entries[fe] = t.Name
			for k, o := range t.Slices[:j] {
				if overlaps(s, o) {
					return fmt.Sprintf("tensor %q: slices %d and %d overlap", t.Name, k, j)
				}
			}
			n, _ := safetensors.Elements(s.Shape, 1)
			covered += n
		}
		if covered != total {
			return fmt.Sprintf("tensor %q: slices hold %d of its %d elements", t.Name, covered, total)
		}
	}
	return ""
}

// checkSlice returns what keeps s from being a block of a tensor of shape
// global stored in a listed file, or "".
func checkSlice(global []int, s Slice, listed func(string) bool) string {
	if !listed(s.File) {
		return fmt.Sprintf("file %q is not listed in files", s.File)
	}
	if len(s.Start) != len(global) || len(s.Shape) != len(global) {
		return fmt.Sprintf("start %v and shape %v do not have the tensor's %d dimensions", s.Start, s.Shape, len(global))
	}
	if _, err := safetensors.Elements(s.Shape, 1); err != nil {
		return fmt.Sprintf("shape %v: %v", s.Shape, err)
	}
	for d, g := range global {
		if s.Start[d] < 0 || s.Start[d] > g-s.Shape[d] {
			return fmt.Sprintf("start %v shape %v reaches outside the tensor's shape %v", s.Start, s.Shape, global)
		}
	}
	return ""
}

// overlaps reports whether two blocks of the same tensor share an element.
func overlaps(a, b Slice) bool {
	for d := range a.Start {
		if a.Start[d] >= b.Start[d]+b.Shape[d] || b.Start[d] >= a.Start[d]+a.Shape[d] {
			return false
		}
	}
	return true
}
