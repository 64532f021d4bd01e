package event

import "testing"

// TestRestartString: a restart's line names the restart, the cause and
// the step the job resumes from (or that it starts over).
func TestRestartString(t *testing.T) {
	for _, tt := range []struct {
		r    Restart
		want string
	}{
		{Restart{Count: 1, Max: 3, Cause: "rank 3 on node2 was killed by SIGKILL", Step: 10}, "1/3: rank 3 on node2 was killed by SIGKILL; resuming from step 10"},
		{Restart{Count: 2, Max: 2, Cause: "node node2 lost: connection reset"}, "2/2: node node2 lost: connection reset; restarting from the start (no checkpoint saved yet)"},
	} {
		if got := tt.r.String(); got != tt.want {
			t.Errorf("got %q, want %q", got, tt.want)
		}
	}
}
