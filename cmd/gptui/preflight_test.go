package main

import (
	"regexp"
	"strings"
	"testing"

	"github.com/gptui/gptui/event"
)

// TestPreflightLines: the headless printer prints a line per problem of
// a node's pre-flight, naming the node and the fix, and one line for a
// node whose checks all passed.
func TestPreflightLines(t *testing.T) {
	e := event.New(event.KindPreflight)
	e.Node, e.State, e.Message = "gpu1", event.PreflightFailed, "…"
	e.Preflight = &event.Preflight{Iface: "eth0", Addr: "10.0.0.2", Checks: []event.Check{
		{Name: event.CheckIface, Status: event.PreflightOK, Value: "eth0 10.0.0.2"},
		{Name: event.CheckShm, Status: event.PreflightWarning, Message: "/dev/shm is 64.0 MiB", Fix: "docker run --shm-size=8g"},
		{Name: event.CheckDisk, Status: event.PreflightFailed, Message: "no room", Fix: "free some"},
	}}
	got := strings.Join(preflightLines(e), "\n")
	want := "[gpu1] preflight warning: /dev/shm is 64.0 MiB; fix: docker run --shm-size=8g\n[gpu1] preflight failed: no room; fix: free some"
	if got != want {
		t.Errorf("lines:\n%s\nwant:\n%s", got, want)
	}
	e.State, e.Message = event.PreflightOK, "eth0 10.0.0.2, 1 check passed"
	e.Preflight.Checks = e.Preflight.Checks[:1]
	if got := preflightLines(e); len(got) != 1 || got[0] != "[gpu1] preflight ok: eth0 10.0.0.2, 1 check passed" {
		t.Errorf("lines of a node that passed: %q", got)
	}
}

// TestDryRunPreflight: --dry-run prints the pre-flight table, a row per
// node and check, and the workers' interface variables; a job whose
// checkpoints the disk cannot hold is refused by the dry run too (exit
// 2), its table and lines naming the node, the bytes and the fix.
func TestDryRunPreflight(t *testing.T) {
	c := newSSHCluster(t, "cpu:1")
	args := append(small(t), "-o", "Distributed.dp_degree=2", "-o", "Engine.max_steps=4", "-o", "Engine.save_load.save_steps=2", "--dry-run")
	var stdout, stderr syncBuffer
	if err := c.command(t, &stdout, &stderr, args...).Run(); err != nil {
		t.Fatalf("dry run: exit %d\n%s%s", exitStatus(err), stdout.String(), stderr.String())
	}
	out := stdout.String()
	for _, re := range []string{
		`(?m)^\[127\.0\.0\.2\] preflight ok: lo 127\.0\.0\.1, \d+ checks passed$`,
		`(?m)^# pre-flight\nNODE +CHECK +STATUS +FOUND +PROBLEM$`,
		`(?m)^127\.0\.0\.2 +iface +ok +lo 127\.0\.0\.1 *$`,
		`(?m)^127\.0\.0\.3 +master +ok +127\.0\.0\.2:\d+ reached in `,
		`(?m)^127\.0\.0\.2 +peer +ok +1 peer reached in their ephemeral ranges *$`,
		`(?m)^127\.0\.0\.3 +disk +ok +\S+ \S+ free in /`,
		`(?m)^127\.0\.0\.3 +clock +ok +[+-]0\.\d+ s`,
		`(?m)^\[127\.0\.0\.3/1\] cpu: .* NCCL_SOCKET_IFNAME=lo GLOO_SOCKET_IFNAME=lo `,
	} {
		if !regexp.MustCompile(re).MatchString(out) {
			t.Errorf("the dry run's output does not match %s:\n%s", re, out)
		}
	}

	// Every step saved and kept: more than any disk holds.
	stdout, stderr = syncBuffer{}, syncBuffer{}
	big := append(small(t), "-o", "Distributed.dp_degree=2", "-o", "Engine.max_steps=100000000", "-o", "Engine.save_load.save_steps=1", "-o", "Engine.save_load.keep_last=0", "--dry-run")
	err := c.command(t, &stdout, &stderr, big...).Run()
	if code := exitStatus(err); code != 2 {
		t.Fatalf("exit %d, want 2\n%s%s", code, stdout.String(), stderr.String())
	}
	out = stdout.String()
	for _, re := range []string{
		`(?m)^\[127\.0\.0\.3\] preflight failed: 127\.0\.0\.3 has .* free in .*, and they need \S+ \S+ \(\d+ bytes\): 100000000 checkpoints .*; fix: free .*Engine\.save_load\.keep_last$`,
		`(?m)^127\.0\.0\.2 +disk +failed +`,
	} {
		if !regexp.MustCompile(re).MatchString(out) {
			t.Errorf("the refused dry run's output does not match %s:\n%s", re, out)
		}
	}
	if last := strings.TrimSpace(stderr.String()); !strings.Contains(last, "pre-flight: node 127.0.0.2: ") || !strings.Contains(last, "node 127.0.0.3: ") {
		t.Errorf("the error does not name both nodes: %s", last)
	}
	t.Logf("the refusal: %s", strings.TrimSpace(stderr.String()))
}
