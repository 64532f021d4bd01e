package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/gptui/gptui/ranktable"
)

// ranktableDir returns a temporary directory that is also $HOME, so that
// no ~/.ssh/config of the machine running the tests is read.
func ranktableDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	t.Setenv("HOME", dir)
	return dir
}

func writeTestFile(t *testing.T, path, text string) string {
	t.Helper()
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// The rank table of 4 nodes with devices=0-7 and the devices' addresses
// (device_ips=) is the one of the MindFormers GPT2-13B guide; check
// accepts it. Without device_ips= each device gets its node's address, a
// table gptui run takes but check (HCCL) refuses, one line per node.
func TestRanktableGolden(t *testing.T) {
	dir := ranktableDir(t)
	want, err := ranktable.Read(filepath.Join(srcDir, "../../ranktable/testdata/mindformers_gpt2_13b_4x8.json"))
	if err != nil {
		t.Fatal(err)
	}
	lines := []string{"# the 4 machines of the GPT2-13B example"}
	var shared []string
	for i, s := range want.Servers {
		ips := make([]string, len(s.Devices))
		for j, d := range s.Devices {
			ips[j] = d.DeviceIP
		}
		comment := ""
		if i == 2 {
			comment = "   # the third"
		}
		lines = append(lines, s.ServerID+" devices=0-7 device_ips="+strings.Join(ips, ",")+comment)
		shared = append(shared, s.ServerID+" devices=0-7")
	}
	hosts := writeTestFile(t, filepath.Join(dir, "hosts.txt"), strings.Join(lines, "\n")+"\n")
	sharedHosts := writeTestFile(t, filepath.Join(dir, "shared.txt"), strings.Join(shared, "\n")+"\n")
	sharedOut := filepath.Join(dir, "shared.json")
	code, _, stderr := runCLI(t, "ranktable", "--hosts", sharedHosts, "-o", sharedOut)
	if code != 0 || strings.Count(stderr, "share the device_ip") != 4 || !strings.Contains(stderr, "device_ips=") {
		t.Errorf("ranktable --hosts without device_ips=: exit %d, stderr %q: want 4 notes of shared device_ips", code, stderr)
	}
	code, stdout, _ := runCLI(t, "ranktable", "check", sharedOut)
	if code != 2 || strings.Count(stdout, "devices 0, 1, 2, 3, 4, 5, 6, 7 share the device_ip 10.155.111.14") != 4 {
		t.Errorf("check of a table whose devices share their node's address: exit %d, stdout\n%s\nwant exit 2 and one line per node", code, stdout)
	}

	out := filepath.Join(dir, "rank_table.json")
	code, stdout, stderr = runCLI(t, "ranktable", "--hosts", hosts, "-o", out)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	if want := "wrote " + out + ": 4 servers, 32 devices\n"; stdout != want {
		t.Errorf("stdout %q, want %q", stdout, want)
	}
	got, err := ranktable.Read(out)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("table from the inventory =\n%+v\nwant\n%+v", got, want)
	}

	// The JSON itself: strings everywhere, ranks 0..31 in order.
	b, _ := os.ReadFile(out)
	var raw struct {
		Version     string `json:"version"`
		ServerCount string `json:"server_count"`
		ServerList  []struct {
			ServerID  string              `json:"server_id"`
			Device    []map[string]string `json:"device"`
			HostNicIP string              `json:"host_nic_ip"`
		} `json:"server_list"`
		Status string `json:"status"`
	}
	if err := json.Unmarshal(b, &raw); err != nil {
		t.Fatalf("%v\n%s", err, b)
	}
	if raw.Version != "1.0" || raw.ServerCount != "4" || raw.Status != "completed" || len(raw.ServerList) != 4 {
		t.Errorf("header: %+v", raw)
	}
	rank := 0
	for i, s := range raw.ServerList {
		if s.ServerID != fmt.Sprintf("10.155.111.%d", 140+i) || s.HostNicIP != "reserve" || len(s.Device) != 8 {
			t.Errorf("server_list[%d] = %+v", i, s)
		}
		for j, d := range s.Device {
			if d["device_id"] != strconv.Itoa(j) || d["rank_id"] != strconv.Itoa(rank) || d["device_ip"] != want.Servers[i].Devices[j].DeviceIP {
				t.Errorf("server_list[%d].device[%d] = %v", i, j, d)
			}
			rank++
		}
	}

	// Without -o the same table goes to standard output.
	code, stdout, stderr = runCLI(t, "ranktable", "--hosts", hosts)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	if stdout != string(b) {
		t.Errorf("stdout differs from the -o file:\n%s", stdout)
	}

	code, stdout, _ = runCLI(t, "ranktable", "check", out)
	wantCheck := "OK " + out + ": version 1.0, 4 servers, 32 devices (RANK_SIZE 32)\n" +
		"  10.155.111.140        8 devices, DEVICE_RANGE [0,8)\n" +
		"  10.155.111.141        8 devices, DEVICE_RANGE [8,16)\n" +
		"  10.155.111.142        8 devices, DEVICE_RANGE [16,24)\n" +
		"  10.155.111.143        8 devices, DEVICE_RANGE [24,32)\n"
	if code != 0 || stdout != wantCheck {
		t.Errorf("check: exit %d, stdout\n%s\nwant\n%s", code, stdout, wantCheck)
	}
}

func TestRanktableBuild(t *testing.T) {
	dir := ranktableDir(t)
	hosts := writeTestFile(t, filepath.Join(dir, "hosts.txt"), "a devices=3,1 nic=192.168.9.1\nlocalhost devices=cpu:2\n")
	code, stdout, stderr := runCLI(t, "ranktable", "-hosts", hosts)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	got, err := ranktable.Parse("stdout", []byte(stdout))
	if err != nil {
		t.Fatal(err)
	}
	want := &ranktable.Table{Version: "1.0", ServerCount: 2, Status: "completed", Servers: []ranktable.Server{
		{ServerID: "a", HostNicIP: "reserve", Devices: []ranktable.Device{{DeviceID: 3, DeviceIP: "192.168.9.1", RankID: 0}, {DeviceID: 1, DeviceIP: "192.168.9.1", RankID: 1}}},
		{ServerID: "127.0.0.1", HostNicIP: "reserve", Devices: []ranktable.Device{{DeviceID: 0, DeviceIP: "127.0.0.1", RankID: 2}, {DeviceID: 1, DeviceIP: "127.0.0.1", RankID: 3}}},
	}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("table =\n%+v\nwant\n%+v", got, want)
	}
}

// machineTable writes the table hccl_tools.py makes on one machine.
func machineTable(t *testing.T, dir, id string, devices int) string {
	t.Helper()
	ids := make([]int, devices)
	for i := range ids {
		ids[i] = i
	}
	path := filepath.Join(dir, id+".json")
	if err := ranktable.Write(path, ranktable.Build([]ranktable.ServerInput{{ServerID: id, DeviceIDs: ids}})); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestRanktableMerge(t *testing.T) {
	dir := ranktableDir(t)
	a := machineTable(t, dir, "10.0.0.1", 2)
	b := machineTable(t, dir, "10.0.0.2", 3)
	c := machineTable(t, dir, "10.0.0.3", 1)
	out := filepath.Join(dir, "merged.json")
	code, stdout, stderr := runCLI(t, "ranktable", "merge", a, b, "-o", out, c)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	if want := "wrote " + out + ": 3 servers, 6 devices\n"; stdout != want {
		t.Errorf("stdout %q, want %q", stdout, want)
	}
	got, err := ranktable.Read(out)
	if err != nil {
		t.Fatal(err)
	}
	var ranks []string
	for _, s := range got.Servers {
		for _, d := range s.Devices {
			ranks = append(ranks, fmt.Sprintf("%s/%d=%d", s.ServerID, d.DeviceID, d.RankID))
		}
	}
	if want := "10.0.0.1/0=0 10.0.0.1/1=1 10.0.0.2/0=2 10.0.0.2/1=3 10.0.0.2/2=4 10.0.0.3/0=5"; strings.Join(ranks, " ") != want || got.ServerCount != 3 {
		t.Errorf("merged: server_count %d, ranks %s\nwant %s", got.ServerCount, strings.Join(ranks, " "), want)
	}
	// Without -o, to standard output.
	code, stdout, _ = runCLI(t, "ranktable", "merge", a, b, c)
	if back, err := ranktable.Parse("stdout", []byte(stdout)); code != 0 || err != nil || !reflect.DeepEqual(back, got) {
		t.Errorf("merge to stdout: exit %d, %v", code, err)
	}
}

func TestRanktableErrors(t *testing.T) {
	dir := ranktableDir(t)
	file := func(name, text string) string { return writeTestFile(t, filepath.Join(dir, name), text) }
	a := machineTable(t, dir, "10.0.0.1", 2)
	bad := file("bad.json", `{"version":"1.0","server_count":"1","server_list":[{"server_id":"x","device":[{"device_id":"0","rank_id":"x"}]}]}`)
	twoRanks := file("tworanks.json", `{"version":"1.0","server_count":"2","server_list":[
		{"server_id":"10.0.0.1","device":[{"device_id":"0","device_ip":"1.1.1.1","rank_id":"0"},{"device_id":"0","device_ip":"1.1.1.1","rank_id":"2"}]},
		{"server_id":"10.0.0.2","device":[{"device_id":"0","device_ip":"1.1.1.2","rank_id":"2"}]}],"status":"completed"}`)
	empty := file("empty.json", `{"version":"1.0","server_count":"0","server_list":[],"status":"completed"}`)
	names := file("names.json", `{"version":"1.0","server_count":"1","server_list":[
		{"server_id":"node1","device":[{"device_id":"0","device_ip":"10.0.0.300","rank_id":"0"},{"device_id":"1","device_ip":"1.1.1.2","rank_id":"1"}]}],"status":"completed"}`)
	tests := []struct {
		name   string
		args   []string
		want   []string // substrings of the error line
		stdout string
	}{
		{"no hosts", []string{"ranktable"}, []string{"--hosts FILE is required"}, ""},
		{"missing inventory", []string{"ranktable", "--hosts", filepath.Join(dir, "none.txt")}, []string{"none.txt"}, ""},
		{"bad inventory", []string{"ranktable", "--hosts", file("h1.txt", "a devices=0-7\nb devices=0-x\n")}, []string{"h1.txt:2", `devices "0-x"`, "write ranges like 0-7"}, ""},
		{"no devices", []string{"ranktable", "--hosts", file("h2.txt", "a devices=0\n\nb\n")}, []string{"h2.txt:3: b has no devices="}, ""},
		{"same server twice", []string{"ranktable", "--hosts", file("h3.txt", "a:22 devices=0\na:23 devices=0\n")}, []string{`"a" is also the server_id of server_list[0]`}, ""},
		{"stray argument", []string{"ranktable", "--hosts", "x", "y"}, []string{`unexpected argument "y"`}, ""},
		{"bad flag", []string{"ranktable", "--host", "x"}, []string{"-host"}, ""},
		{"merge nothing", []string{"ranktable", "merge", "-o", filepath.Join(dir, "o.json")}, []string{"no rank tables given"}, ""},
		{"merge bad file", []string{"ranktable", "merge", a, bad}, []string{"bad.json: server_list[0].device[0].rank_id: \"x\" is not a number"}, ""},
		{"merge missing file", []string{"ranktable", "merge", a, filepath.Join(dir, "nope.json")}, []string{"nope.json"}, ""},
		{"merge twice", []string{"ranktable", "merge", a, a}, []string{`server_id "10.0.0.1" (table 2, server_list[0]) is already in rank table 1`}, ""},
		{"merge bad table", []string{"ranktable", "merge", twoRanks}, []string{"device_id: device 0 is also server_list[0].device[0]"}, ""},
		{"check nothing", []string{"ranktable", "check"}, []string{"want one rank table file, got 0"}, ""},
		{"check two", []string{"ranktable", "check", a, a}, []string{"want one rank table file, got 2"}, ""},
		{"check unreadable", []string{"ranktable", "check", bad}, []string{`bad.json: server_list[0].device[0].rank_id: "x" is not a number`}, ""},
		{"check problems", []string{"ranktable", "check", twoRanks}, []string{"tworanks.json: 5 problems"},
			twoRanks + ": server_list[0].device[1].device_id: device 0 is also server_list[0].device[0]\n" +
				twoRanks + ": server_list[0] (server_id \"10.0.0.1\"): rank_ids 0, 2 are not the range [0,3) in order; each server needs one range of ranks for its DEVICE_RANGE\n" +
				twoRanks + ": server_list[1].device[0].rank_id: rank 2 is also server_list[0].device[1]\n" +
				twoRanks + ": rank_ids missing: 1 (3 devices have ranks 0..2)\n" +
				twoRanks + ": server_list[0] (server_id \"10.0.0.1\"): devices 0, 0 share the device_ip 1.1.1.1; each device has a network port of its own: write each one's IP address (hccn_tool -i N -ip -g; device_ips= in gptui's inventory)\n"},
		{"check empty", []string{"ranktable", "check", empty}, []string{"empty.json: 1 problem"},
			empty + ": server_list: no servers; a rank table needs at least one server with devices\n"},
		{"check not IPs", []string{"ranktable", "check", names}, []string{"names.json: 2 problems"},
			names + ": server_list[0].server_id: \"node1\" is not an IP address; write the machine's IP address\n" +
				names + ": server_list[0].device[0].device_ip: \"10.0.0.300\" is not an IP address; write the device's IP address (hccn_tool -i 0 -ip -g)\n"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, stdout, stderr := runCLI(t, tc.args...)
			checkUserError(t, code, stderr, tc.want)
			if stdout != tc.stdout {
				t.Errorf("stdout\n%s\nwant\n%s", stdout, tc.stdout)
			}
		})
	}
}

// What 'ranktable --hosts' writes from an inventory that gives the devices'
// addresses, 'ranktable check' accepts: localhost is 127.0.0.1, and
// 127.0.0.2 and 127.0.0.3 are servers of their own. A host name, which
// check refuses, gets a note at once.
func TestRanktableBuildThenCheck(t *testing.T) {
	dir := ranktableDir(t)
	hosts := writeTestFile(t, filepath.Join(dir, "hosts.txt"), "localhost devices=cpu:2 device_ips=10.1.0.1,10.1.0.2\n127.0.0.2 devices=cpu:2 workdir=/tmp/b device_ips=10.2.0.1,10.2.0.2\n127.0.0.3 devices=0-1 workdir=/tmp/c device_ips=10.3.0.1,10.3.0.2\n")
	out := filepath.Join(dir, "rank_table.json")
	if code, _, stderr := runCLI(t, "ranktable", "--hosts", hosts, "-o", out); code != 0 || stderr != "" {
		t.Fatalf("ranktable --hosts: exit %d: %s", code, stderr)
	}
	code, stdout, stderr := runCLI(t, "ranktable", "check", out)
	if code != 0 {
		t.Fatalf("ranktable check of the table ranktable --hosts wrote: exit %d\n%s%s", code, stdout, stderr)
	}
	for _, id := range []string{"127.0.0.1 ", "127.0.0.2 ", "127.0.0.3 "} {
		if !strings.Contains(stdout, "  "+id) {
			t.Errorf("check's servers lack %q:\n%s", id, stdout)
		}
	}

	named := writeTestFile(t, filepath.Join(dir, "named.txt"), "node1 devices=0\n")
	code, _, stderr = runCLI(t, "ranktable", "--hosts", named, "-o", filepath.Join(dir, "named.json"))
	if want := "gptui ranktable: note: " + named + ":1: node1 is a name, not an IP address: gptui run takes it, ranktable check and HCCL do not; write the node's IP address for HCCL\n"; code != 0 || stderr != want {
		t.Errorf("ranktable --hosts with a name: exit %d, stderr %q, want %q", code, stderr, want)
	}
}

func TestRanktableHelp(t *testing.T) {
	for _, args := range [][]string{{"ranktable", "-h"}, {"ranktable", "merge", "-h"}, {"ranktable", "check", "-h"}} {
		code, _, stderr := runCLI(t, args...)
		if code != 0 || !strings.Contains(stderr, "gptui ranktable merge A B ... [-o OUT]") {
			t.Errorf("%v: exit %d, stderr %q", args, code, stderr)
		}
	}
}
