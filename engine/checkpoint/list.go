package checkpoint

import (
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// Contents lists what of a checkpoint output directory a new checkpoint
// there would supersede: its checkpoint directories, highest step first,
// and the one its latest file names (empty without one). A missing
// directory holds nothing.
func Contents(outputDir string) (steps []string, latest string, err error) {
	steps, err = listSteps(outputDir)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, "", err
	}
	f, err := os.Open(filepath.Join(outputDir, LatestFile))
	switch {
	case err == nil:
		defer f.Close()
		b, err := io.ReadAll(io.LimitReader(f, 256)) // a name, not a file's worth
		if err != nil {
			return nil, "", err
		}
		latest = strings.TrimSpace(string(b))
	case !errors.Is(err, fs.ErrNotExist):
		return nil, "", err
	}
	return steps, latest, nil
}
