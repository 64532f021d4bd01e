package main

import (
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/gptui/gptui/engine/smalljob"
)

// smallFiles is the small config of the job tests (engine/smalljob),
// written once for the package.
var smallFiles struct {
	once sync.Once
	dir  string // holds the config and its corpus
	cfg  string // the config's path
	err  error
}

// small returns the options that select the small config, "-c FILE",
// writing the config and its corpus the first time.
func small(t *testing.T) []string {
	t.Helper()
	f := &smallFiles
	f.once.Do(func() {
		if f.dir, f.err = os.MkdirTemp("", "gptui-small-"); f.err == nil {
			f.cfg, f.err = smalljob.Write(f.dir)
		}
	})
	if f.err != nil {
		t.Fatalf("small config: %v", f.err)
	}
	return []string{"-c", f.cfg}
}

// ownOutput returns the override that points Engine.save_load.output_dir
// at a new folder of the test's own. The package's tests share one working
// directory (testwd), where the presets' relative output_dir ("output")
// would be every test's; and a run from step 0 that saves is refused an
// output_dir holding another run's checkpoints.
func ownOutput(t *testing.T) []string {
	t.Helper()
	return []string{"-o", "Engine.save_load.output_dir=" + filepath.Join(t.TempDir(), "out")}
}
