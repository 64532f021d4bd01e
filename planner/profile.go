package planner

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/gptui/gptui/badinput"
)

// DefaultProfilePath is where 'gptui plan --profile' saves the measured
// CPU profile: gptui/profile-cpu.json in the user's cache directory.
func DefaultProfilePath() (string, error) {
	dir, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("planner: no cache directory for the profile (%w); pass a file", err)
	}
	return filepath.Join(dir, "gptui", "profile-cpu.json"), nil
}

// SaveProfile writes d to path as JSON, creating the directory.
func SaveProfile(path string, d Device) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("planner: saving the profile: %w", err)
	}
	b, err := json.MarshalIndent(d, "", "  ")
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("planner: saving the profile: %w", err)
	}
	return os.Rename(tmp, path)
}

// ProfileError is a profile file that cannot be used.
type ProfileError struct {
	Path string
	Msg  string
}

func (e *ProfileError) Error() string {
	return fmt.Sprintf("%s: %s; run 'gptui plan --profile' to measure it again", e.Path, e.Msg)
}

// Is reports that a ProfileError is bad input (badinput.Err).
func (e *ProfileError) Is(target error) bool { return badinput.Is(target) }

// LoadProfile reads a profile saved by SaveProfile. A missing file is
// reported as fs.ErrNotExist (wrapped); a file that is not a valid
// profile as a *ProfileError. A profile without a measured link between
// nodes (no inter_measured) keeps its inter_bw, the built-in figure, or
// gets it when the file has none.
func LoadProfile(path string) (Device, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Device{}, err
	}
	var d Device
	if err := json.Unmarshal(b, &d); err != nil {
		return Device{}, &ProfileError{path, "not a device profile: " + err.Error()}
	}
	if d.InterBW == 0 && d.InterMeasured == "" {
		// No link between nodes in the file: the built-in figure.
		cpu, _ := LookupDevice("CPU")
		d.InterBW = cpu.InterBW
	}
	if err := (Cluster{Nodes: 1, DevicesPerNode: 1, Device: d}).Validate(); err != nil {
		return Device{}, &ProfileError{path, err.Error()}
	}
	return d, nil
}

// MemTotal returns the machine's memory from /proc/meminfo, or 0 where
// there is none. (ProcessMemLimit is what one process may hold.)
func MemTotal() int64 {
	b, _ := os.ReadFile("/proc/meminfo")
	return statusField(b, "MemTotal:")
}

// ProfileFor returns the device profile called name (see [LookupDevice]);
// for the CPU, the one measured by 'gptui plan --profile' when the file at
// profilePath holds one. note, when not empty, says that the CPU's
// measured profile is missing and the built-in one is used. An unknown
// name or a profile file that cannot be used is bad input.
func ProfileFor(name, profilePath string) (d Device, note string, err error) {
	if d, err = LookupDevice(name); err != nil {
		return d, "", badinput.Wrap(err)
	}
	if d.Accounting != AccountingEngine {
		return d, "", nil
	}
	m, err := LoadProfile(profilePath)
	switch {
	case err == nil:
		return m, "", nil
	case errors.Is(err, fs.ErrNotExist):
		return d, fmt.Sprintf("no measured cpu profile at %s (run 'gptui plan --profile'); using the built-in one", profilePath), nil
	}
	return d, "", err
}
