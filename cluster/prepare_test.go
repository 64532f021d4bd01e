package cluster

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"testing"
)

// TestPrepareFails: the one session that writes an SSH node's config,
// probes it and lists its missing data names the step that failed, with
// the node's own words: a workdir where the config cannot be written (its
// jobs folder a file), and a gptui whose probe fails; and a node that
// answers with more than a MiB is refused, no more of it kept.
func TestPrepareFails(t *testing.T) {
	tc := newCluster(t, "cpu:1")
	real := buildGPTUI(t)
	failingProbe := filepath.Join(t.TempDir(), "gptui")
	script := fmt.Sprintf("#!/bin/sh\nif [ \"$1 $2\" = \"agent --probe\" ]; then\n  echo 'no probe here' >&2\n  exit 3\nfi\nexec %s \"$@\"\n", real)
	if err := os.WriteFile(failingProbe, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	chatty := filepath.Join(t.TempDir(), "gptui")
	script = fmt.Sprintf("#!/bin/sh\nif [ \"$1 $2\" = \"agent --probe\" ]; then\n  head -c 2000000 /dev/zero\n  exit 0\nfi\nexec %s \"$@\"\n", real)
	if err := os.WriteFile(chatty, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name  string
		exe   string
		setUp func(t *testing.T)
		want  string // a regular expression
	}{
		{"config", real, func(t *testing.T) {
			jobs := filepath.Join(tc.workdirs[1], "jobs")
			if err := os.MkdirAll(tc.workdirs[1], 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(jobs, []byte("not a folder\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { os.Remove(jobs) })
		}, `^node 127\.0\.0\.3: config: writing jobs/[^ ]+/config\.yaml under .+/node1 failed: mkdir: .*jobs.*`},
		{"probe", failingProbe, func(*testing.T) {}, `^node 127\.0\.0\.[23]: probe: \./gptui agent --probe: exit status 3: no probe here$`},
		{"output", chatty, func(*testing.T) {}, `^node 127\.0\.0\.[23]: setting up: more than 1048576 bytes of output$`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			tt.setUp(t)
			j := New(tc.jobOptions(t, tt.exe, nil))
			_, err := j.Plan(context.Background())
			j.Close()
			if err == nil || !regexp.MustCompile(tt.want).MatchString(err.Error()) {
				t.Fatalf("Plan: %v, want an error matching %s", err, tt.want)
			}
			t.Logf("%v", err)
		})
	}
}
