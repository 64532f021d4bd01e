package ranktable

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

// seedFile is the 4-machine, 32-device example of the MindFormers GPT2-13B
// guide, in its layout.
const seedFile = "testdata/mindformers_gpt2_13b_4x8.json"

// seedHCCN returns the hccn.conf of machine k of the seed's example: device
// d's port is 192.(d%4+1).27.(6+2k+d/4).
func seedHCCN(k int) string {
	var b strings.Builder
	b.WriteString("# hccn.conf of the example\n")
	for d := range 8 {
		fmt.Fprintf(&b, "address_%d=192.%d.27.%d\n", d, d%4+1, 6+2*k+d/4)
		fmt.Fprintf(&b, "netmask_%d=255.255.255.0\n", d)
		fmt.Fprintf(&b, "netdetect_%d=192.%d.27.1\n", d, d%4+1)
	}
	return b.String()
}

func readSeed(t *testing.T) *Table {
	t.Helper()
	tab, err := Read(seedFile)
	if err != nil {
		t.Fatal(err)
	}
	return tab
}

func TestSeed(t *testing.T) {
	seed := readSeed(t)
	var in []ServerInput
	for k := range 4 {
		ips, err := ParseHCCN(strings.NewReader(seedHCCN(k)))
		if err != nil {
			t.Fatal(err)
		}
		in = append(in, ServerInput{
			ServerID:  fmt.Sprintf("10.155.111.%d", 140+k),
			DeviceIDs: []int{0, 1, 2, 3, 4, 5, 6, 7},
			DeviceIPs: ips,
		})
	}
	built := Build(in)
	if !reflect.DeepEqual(built, seed) {
		t.Fatalf("Build from the hccn.conf files:\n%+v\nthe seed's table:\n%+v", built, seed)
	}
	if errs := Check(seed); errs != nil {
		t.Errorf("Check(seed) = %v", errs)
	}
	if n := seed.RankSize(); n != 32 {
		t.Errorf("RankSize = %d, want 32", n)
	}
	for k := range 4 {
		if lo, hi := seed.DeviceRange(k); lo != 8*k || hi != 8*k+8 {
			t.Errorf("DeviceRange(%d) = [%d,%d), want [%d,%d)", k, lo, hi, 8*k, 8*k+8)
		}
	}

	// WriteTo's layout, kept in a golden file.
	var buf bytes.Buffer
	if _, err := seed.WriteTo(&buf); err != nil {
		t.Fatal(err)
	}
	golden := "testdata/mindformers_gpt2_13b_4x8.golden"
	if *update {
		if err := os.WriteFile(golden, buf.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(buf.Bytes(), want) {
		t.Errorf("WriteTo differs from %s (go test -update rewrites it):\n%s", golden, buf.Bytes())
	}
	// Both forms are the same JSON as the seed's.
	var fromSeed, fromWrite any
	raw, _ := os.ReadFile(seedFile)
	json.Unmarshal(raw, &fromSeed)
	if err := json.Unmarshal(buf.Bytes(), &fromWrite); err != nil {
		t.Fatalf("WriteTo wrote bad JSON: %v", err)
	}
	if !reflect.DeepEqual(fromSeed, fromWrite) {
		t.Errorf("WriteTo's JSON differs from the seed's")
	}
	compact, err := json.Marshal(seed)
	if err != nil {
		t.Fatal(err)
	}
	var fromMarshal any
	json.Unmarshal(compact, &fromMarshal)
	if !reflect.DeepEqual(fromSeed, fromMarshal) {
		t.Errorf("MarshalJSON's JSON differs from the seed's: %s", compact)
	}
	if !bytes.HasPrefix(compact, []byte(`{"version":"1.0","server_count":"4","server_list":[{"server_id":"10.155.111.140","device":[{"device_id":"0","device_ip":"192.1.27.6","rank_id":"0"},`)) {
		t.Errorf("MarshalJSON key order: %.120s", compact)
	}
}

func TestMarshalJSONInStruct(t *testing.T) {
	type job struct {
		Table Table  `json:"table"`
		Ptr   *Table `json:"ptr"`
	}
	tab := Build([]ServerInput{{ServerID: "a", DeviceIDs: []int{0, 1}}})
	b, err := json.Marshal(job{Table: *tab, Ptr: tab})
	if err != nil {
		t.Fatal(err)
	}
	want := `{"version":"1.0","server_count":"1","server_list":[{"server_id":"a","device":[{"device_id":"0","device_ip":"a","rank_id":"0"},{"device_id":"1","device_ip":"a","rank_id":"1"}],"host_nic_ip":"reserve"}],"status":"completed"}`
	if got := string(b); got != `{"table":`+want+`,"ptr":`+want+`}` {
		t.Errorf("json.Marshal = %s", got)
	}
	var back job
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(&back.Table, tab) || !reflect.DeepEqual(back.Ptr, tab) {
		t.Errorf("json.Unmarshal = %+v", back)
	}
	err = json.Unmarshal([]byte(`{"table":{"server_count":"x","server_list":[]}}`), &back)
	var pe *ParseError
	if !errors.As(err, &pe) || pe.Path != "server_count" {
		t.Errorf("json.Unmarshal of a bad table: %v, want a *ParseError at server_count", err)
	}
}

func TestParseErrors(t *testing.T) {
	dev := func(id, ip, rank string) string {
		return fmt.Sprintf(`{"device_id":%s,"device_ip":%s,"rank_id":%s}`, id, ip, rank)
	}
	table := func(count, servers string) string {
		return fmt.Sprintf(`{"version":"1.0","server_count":%s,"server_list":%s,"status":"completed"}`, count, servers)
	}
	good := dev(`"0"`, `"1.1.1.1"`, `"0"`)
	tests := []struct {
		name, json, want string
	}{
		{"syntax", "{\n  \"version\": \"1.0\",\n  x\n}", `rank_table.json:3:3: invalid character 'x' looking for beginning of object key string`},
		{"truncated", `{"version":`, `rank_table.json:1:11: unexpected end of JSON input`},
		{"empty", ``, `rank_table.json:1:1: unexpected end of JSON input`},
		{"not an object", `[1]`, `rank_table.json: want an object, not an array`},
		{"no server_count", `{"server_list":[]}`, `rank_table.json: server_count: missing`},
		{"server_count a number", table(`4`, `[]`), `rank_table.json: server_count: 4 must be a string: write "4"`},
		{"server_count not digits", table(`"four"`, `[]`), `rank_table.json: server_count: "four" is not a number`},
		{"server_count negative", table(`"-1"`, `[]`), `rank_table.json: server_count: "-1" is not a number`},
		{"server_count empty", table(`""`, `[]`), `rank_table.json: server_count: "" is not a number`},
		{"server_count huge", table(`"12345678901234567890"`, `[]`), `rank_table.json: server_count: "12345678901234567890" is too large`},
		{"version not a string", `{"version":1.0,"server_count":"0","server_list":[]}`, `rank_table.json: version: 1.0 must be a string: write "1.0"`},
		{"status null", `{"status":null,"server_count":"0","server_list":[]}`, `rank_table.json: status: want a string, not null`},
		{"no server_list", `{"server_count":"0"}`, `rank_table.json: server_list: missing`},
		{"server_list an object", table(`"0"`, `{}`), `rank_table.json: server_list: want an array, not an object`},
		{"server a string", table(`"1"`, `["a"]`), `rank_table.json: server_list[0]: want an object, not a string`},
		{"no server_id", table(`"1"`, `[{"device":[]}]`), `rank_table.json: server_list[0].server_id: missing`},
		{"no device", table(`"1"`, `[{"server_id":"a"}]`), `rank_table.json: server_list[0].device: missing`},
		{"host_nic_ip bool", table(`"1"`, `[{"server_id":"a","device":[],"host_nic_ip":true}]`), `rank_table.json: server_list[0].host_nic_ip: want a string, not a boolean`},
		{"device not object", table(`"1"`, `[{"server_id":"a","device":[`+good+`,[]]}]`), `rank_table.json: server_list[0].device[1]: want an object, not an array`},
		{"rank_id x", table(`"2"`, `[{"server_id":"a","device":[`+good+`]},{"server_id":"b","device":[`+good+`,`+good+`,`+good+`,`+dev(`"3"`, `"1"`, `"x"`)+`]}]`),
			`rank_table.json: server_list[1].device[3].rank_id: "x" is not a number`},
		{"device_id missing", table(`"1"`, `[{"server_id":"a","device":[{"rank_id":"0"}]}]`), `rank_table.json: server_list[0].device[0].device_id: missing`},
		{"device_id number", table(`"1"`, `[{"server_id":"a","device":[`+dev(`0`, `""`, `"0"`)+`]}]`), `rank_table.json: server_list[0].device[0].device_id: 0 must be a string: write "0"`},
		{"device_ip number", table(`"1"`, `[{"server_id":"a","device":[`+dev(`"0"`, `1`, `"0"`)+`]}]`), `rank_table.json: server_list[0].device[0].device_ip: 1 must be a string: write "1"`},
		{"rank_id spaces", table(`"1"`, `[{"server_id":"a","device":[`+dev(`"0"`, `""`, `" 0"`)+`]}]`), `rank_table.json: server_list[0].device[0].rank_id: " 0" is not a number`},
		{"rank_id plus", table(`"1"`, `[{"server_id":"a","device":[`+dev(`"0"`, `""`, `"+1"`)+`]}]`), `rank_table.json: server_list[0].device[0].rank_id: "+1" is not a number`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tab, err := Parse("rank_table.json", []byte(tc.json))
			if err == nil {
				t.Fatalf("Parse = %+v, want error %q", tab, tc.want)
			}
			if err.Error() != tc.want {
				t.Errorf("Parse error\n got %q\nwant %q", err, tc.want)
			}
			var pe *ParseError
			if !errors.As(err, &pe) || pe.File != "rank_table.json" {
				t.Errorf("error %#v is not a *ParseError naming the file", err)
			}
		})
	}
}

func TestParseOptional(t *testing.T) {
	// Only the required keys, other keys, and leading zeros.
	src := `{"server_count":"01","server_list":[{"server_id":"a","container_ip":"x","device":[{"device_id":"007","rank_id":"0"}]}],"extra":[1,2]}`
	got, err := Parse("t.json", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	want := &Table{ServerCount: 1, Servers: []Server{{ServerID: "a", Devices: []Device{{DeviceID: 7}}}}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Parse = %+v, want %+v", got, want)
	}
}

func TestBuild(t *testing.T) {
	tests := []struct {
		name string
		in   []ServerInput
		want *Table
	}{
		{"none", nil, &Table{Version: "1.0", Status: "completed", Servers: []Server{}}},
		{"addresses and gaps", []ServerInput{
			{ServerID: "n1", DeviceIDs: []int{2, 0}, DeviceIPs: map[int]string{0: "10.0.0.1", 5: "unused"}},
			{ServerID: "n2", DeviceIDs: []int{}},
			{ServerID: "n3", DeviceIDs: []int{0, 1, 2}},
		}, &Table{Version: "1.0", ServerCount: 3, Status: "completed", Servers: []Server{
			{ServerID: "n1", HostNicIP: "reserve", Devices: []Device{{2, "n1", 0}, {0, "10.0.0.1", 1}}},
			{ServerID: "n2", HostNicIP: "reserve", Devices: []Device{}},
			{ServerID: "n3", HostNicIP: "reserve", Devices: []Device{{0, "n3", 2}, {1, "n3", 3}, {2, "n3", 4}}},
		}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := Build(tc.in); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("Build =\n%+v\nwant\n%+v", got, tc.want)
			}
		})
	}
}

// machine returns the table that hccl_tools.py makes on one machine: its
// devices ranked from 0.
func machine(id string, devices ...int) *Table {
	return Build([]ServerInput{{ServerID: id, DeviceIDs: devices}})
}

func TestMerge(t *testing.T) {
	seed := readSeed(t)
	// The seed's machines as hccl_tools.py writes them, one table each.
	var parts []*Table
	for _, s := range seed.Servers {
		p := &Table{Version: "1.0", ServerCount: 1, Status: "completed", Servers: []Server{s}}
		p.Servers[0].Devices = append([]Device(nil), s.Devices...)
		for j := range p.Servers[0].Devices {
			p.Servers[0].Devices[j].RankID = j
		}
		parts = append(parts, p)
	}
	twoAndOne := Build([]ServerInput{{ServerID: "a", DeviceIDs: []int{0, 1}}, {ServerID: "b", DeviceIDs: []int{3}}})
	twoAndOne.Servers[1].Devices[0].RankID = 7 // a bad rank, numbered again
	tests := []struct {
		name    string
		in      []*Table
		want    *Table
		wantErr string
	}{
		{"seed", parts, seed, ""},
		{"one", []*Table{machine("x", 0)}, machine("x", 0), ""},
		{"several servers per table", []*Table{twoAndOne, machine("c", 4, 5)}, &Table{Version: "1.0", ServerCount: 3, Status: "completed", Servers: []Server{
			{ServerID: "a", HostNicIP: "reserve", Devices: []Device{{0, "a", 0}, {1, "a", 1}}},
			{ServerID: "b", HostNicIP: "reserve", Devices: []Device{{3, "b", 2}}},
			{ServerID: "c", HostNicIP: "reserve", Devices: []Device{{4, "c", 3}, {5, "c", 4}}},
		}}, ""},
		{"no version", []*Table{{ServerCount: 1, Servers: []Server{{ServerID: "a", Devices: []Device{{0, "x", 5}}}}}},
			&Table{Version: "1.0", ServerCount: 1, Status: "completed", Servers: []Server{{ServerID: "a", Devices: []Device{{0, "x", 0}}}}}, ""},
		{"none", nil, nil, "merge: no rank tables given"},
		{"nil", []*Table{machine("a", 0), nil}, nil, "merge: rank table 2 is nil"},
		{"same server twice", []*Table{machine("a", 0), machine("b", 0), machine("a", 1)}, nil, `merge: server_id "a" (table 3, server_list[0]) is already in rank table 1`},
		{"same server in one table", []*Table{Build([]ServerInput{{ServerID: "a"}, {ServerID: "a"}})}, nil, `merge: server_id "a" is listed twice in rank table 1`},
		{"versions differ", []*Table{machine("a", 0), {Version: "1.2", ServerCount: 1, Servers: []Server{{ServerID: "b"}}}}, nil, `merge: rank table 2 has version "1.2" but table 1 has "1.0"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var before []byte
			if len(tc.in) > 0 && tc.in[0] != nil {
				before, _ = json.Marshal(tc.in[0])
			}
			got, err := Merge(tc.in...)
			if tc.wantErr != "" {
				if err == nil || err.Error() != tc.wantErr {
					t.Fatalf("Merge error %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("Merge =\n%+v\nwant\n%+v", got, tc.want)
			}
			if errs := Check(got); errs != nil {
				t.Errorf("Check(Merge) = %v", errs)
			}
			if after, _ := json.Marshal(tc.in[0]); !bytes.Equal(before, after) {
				t.Errorf("Merge changed its first argument:\n%s\n%s", before, after)
			}
			if len(got.Servers) > 0 && len(got.Servers[0].Devices) > 0 {
				got.Servers[0].Devices[0].DeviceIP = "changed"
				if tc.in[0].Servers[0].Devices[0].DeviceIP == "changed" {
					t.Errorf("Merge's result shares devices with its argument")
				}
			}
		})
	}
}

func TestCheck(t *testing.T) {
	good := func() *Table {
		return Build([]ServerInput{{ServerID: "a", DeviceIDs: []int{0, 1, 2}}, {ServerID: "b", DeviceIDs: []int{0, 1}}})
	}
	with := func(f func(*Table)) *Table { t := good(); f(t); return t }
	tests := []struct {
		name string
		in   *Table
		want []string
	}{
		{"good", good(), nil},
		{"nil", nil, []string{"no rank table"}},
		{"no servers", &Table{Version: Version}, []string{"server_list: no servers; a rank table needs at least one server with devices"}},
		{"server_count", with(func(t *Table) { t.ServerCount = 4 }), []string{"server_count: 4, but server_list has 2 servers"}},
		{"duplicate rank", with(func(t *Table) { t.Servers[1].Devices[1].RankID = 3 }), []string{
			"server_list[1].device[1].rank_id: rank 3 is also server_list[1].device[0]",
			`server_list[1] (server_id "b"): rank_ids 3, 3 are not the range [3,4) in order; each server needs one range of ranks for its DEVICE_RANGE`,
			"rank_ids missing: 4 (5 devices have ranks 0..4)",
		}},
		{"rank out of range", with(func(t *Table) { t.Servers[1].Devices[1].RankID = 9 }), []string{
			"server_list[1].device[1].rank_id: 9 is out of range: 5 devices have ranks 0..4",
			`server_list[1] (server_id "b"): rank_ids 3, 9 are not the range [3,10) in order; each server needs one range of ranks for its DEVICE_RANGE`,
			"rank_ids missing: 4 (5 devices have ranks 0..4)",
		}},
		{"ranks interleaved", with(func(t *Table) {
			t.Servers[0].Devices[1].RankID, t.Servers[1].Devices[0].RankID = 3, 1
		}), []string{
			`server_list[0] (server_id "a"): rank_ids 0, 3, 2 are not the range [0,4) in order; each server needs one range of ranks for its DEVICE_RANGE`,
			`server_list[1] (server_id "b"): rank_ids 1, 4 are not the range [1,5) in order; each server needs one range of ranks for its DEVICE_RANGE`,
		}},
		{"ranks descending", with(func(t *Table) { t.Servers[1].Devices[0].RankID, t.Servers[1].Devices[1].RankID = 4, 3 }), []string{
			`server_list[1] (server_id "b"): rank_ids 4, 3 are not the range [3,5) in order; each server needs one range of ranks for its DEVICE_RANGE`,
		}},
		{"servers swapped", with(func(t *Table) { t.Servers[0], t.Servers[1] = t.Servers[1], t.Servers[0] }), nil},
		{"duplicate device", with(func(t *Table) { t.Servers[0].Devices[2].DeviceID = 0 }), []string{
			"server_list[0].device[2].device_id: device 0 is also server_list[0].device[0]",
		}},
		{"empty server", with(func(t *Table) {
			t.Servers = append(t.Servers, Server{ServerID: "c"})
			t.ServerCount = 3
		}), []string{`server_list[2] (server_id "c"): no devices`}},
		{"server ids", with(func(t *Table) {
			t.Servers[0].ServerID = ""
			t.Servers = append(t.Servers, t.Servers[1])
			t.ServerCount = 3
		}), []string{
			"server_list[0].server_id: empty",
			`server_list[2].server_id: "b" is also the server_id of server_list[1]`,
			"server_list[2].device[0].rank_id: rank 3 is also server_list[1].device[0]",
			"server_list[2].device[1].rank_id: rank 4 is also server_list[1].device[1]",
			"rank_ids missing: 5-6 (7 devices have ranks 0..6)",
		}},
		{"many missing", &Table{ServerCount: 1, Servers: []Server{{ServerID: "a", Devices: []Device{
			{0, "", 0}, {1, "", 2}, {2, "", 4}, {3, "", 6}, {4, "", 8}, {5, "", 10}, {6, "", 12}, {7, "", 14}, {8, "", 16}, {9, "", 18}, {10, "", 20}, {11, "", 22}, {12, "", 24}, {13, "", 26}, {14, "", 28}, {15, "", 30}, {16, "", 32}, {17, "", 34}, {18, "", 36}, {19, "", 38}, {20, "", 40}, {21, "", 42}, {22, "", 44}, {23, "", 46}, {24, "", 48}, {25, "", 50}, {26, "", 52},
		}}}}, nil},
	}
	// The last case is long; check its tail only.
	manyMissing := len(tests) - 1
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			errs := Check(tc.in)
			var got []string
			for _, e := range errs {
				got = append(got, e.Error())
			}
			if i == manyMissing {
				last := got[len(got)-1]
				if want := "rank_ids missing: 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, ... (13 in all) (27 devices have ranks 0..26)"; last != want {
					t.Errorf("last problem\n got %q\nwant %q", last, want)
				}
				if !strings.Contains(got[len(got)-2], ", ... (27 in all) are not the range [0,53)") {
					t.Errorf("long rank list not cut short: %q", got[len(got)-2])
				}
				return
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("Check =\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(tc.want, "\n"))
			}
		})
	}
}

// TestCheckAddresses: HCCL's rule, IP addresses as server_id and
// device_ip, IPv4 and IPv6.
func TestCheckAddresses(t *testing.T) {
	tests := []struct {
		name            string
		server, devices string
		want            []string
	}{
		{"ipv4", "10.0.0.1", "192.1.27.6", nil},
		{"ipv6", "fe80::1", "2001:db8::7", nil},
		{"host name", "node1", "192.1.27.6", []string{`server_list[0].server_id: "node1" is not an IP address; write the machine's IP address`}},
		{"bad device ip", "10.0.0.1", "192.1.27.256", []string{`server_list[0].device[0].device_ip: "192.1.27.256" is not an IP address; write the device's IP address (hccn_tool -i 3 -ip -g)`}},
		{"empty device ip", "10.0.0.1", "", []string{`server_list[0].device[0].device_ip: "" is not an IP address; write the device's IP address (hccn_tool -i 3 -ip -g)`}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tb := Build([]ServerInput{{ServerID: tc.server, DeviceIDs: []int{3}, DeviceIPs: map[int]string{3: tc.devices}}})
			var got []string
			for _, e := range CheckAddresses(tb) {
				got = append(got, e.Error())
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("CheckAddresses =\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(tc.want, "\n"))
			}
		})
	}
}

func TestDeviceRange(t *testing.T) {
	tab := &Table{Servers: []Server{
		{Devices: []Device{{RankID: 0}, {RankID: 1}}},
		{},
		{Devices: []Device{{RankID: 5}, {RankID: 2}, {RankID: 3}}},
		{Devices: []Device{{RankID: 7}}},
	}}
	want := [][2]int{{0, 2}, {0, 0}, {2, 6}, {7, 8}}
	for i, w := range want {
		if lo, hi := tab.DeviceRange(i); lo != w[0] || hi != w[1] {
			t.Errorf("DeviceRange(%d) = [%d,%d), want [%d,%d)", i, lo, hi, w[0], w[1])
		}
	}
}

func TestParseHCCN(t *testing.T) {
	tests := []struct {
		name, in string
		want     map[int]string
		wantErr  string
	}{
		{"empty", "", map[int]string{}, ""},
		{"typical", "address_0=192.168.100.101\nnetmask_0=255.255.255.0\n\n# comment\naddress_1 = 192.168.101.101 \r\nnetdetect_1=192.168.101.1\n",
			map[int]string{0: "192.168.100.101", 1: "192.168.101.101"}, ""},
		{"ipv6", "address_3=fe80::0001\n", map[int]string{3: "fe80::1"}, ""},
		{"not key=value", "address_0=1.2.3.4\nfoo\n", nil, `hccn.conf:2: "foo" is not KEY=VALUE`},
		{"bad address", "address_0=1.2.3\n", nil, `hccn.conf:1: address_0: "1.2.3" is not an IP address`},
		{"bad device", "address_x=1.2.3.4\n", nil, `hccn.conf:1: address_x: "x" is not a device number`},
		{"signed device", "address_+1=1.2.3.4\n", nil, `hccn.conf:1: address_+1: "+1" is not a device number`},
		{"twice", "address_0=1.2.3.4\naddress_00=1.2.3.5\n", nil, `hccn.conf:2: address_00: device 0 already has an address on line 1`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseHCCN(strings.NewReader(tc.in))
			if tc.wantErr != "" {
				if err == nil || err.Error() != tc.wantErr {
					t.Fatalf("ParseHCCN error %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("ParseHCCN = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestReadWrite(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "rank_table.json")
	seed := readSeed(t)
	if err := os.WriteFile(path, []byte("old"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := Write(path, seed); err != nil {
		t.Fatal(err)
	}
	got, err := Read(path)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, seed) {
		t.Errorf("Read after Write = %+v", got)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o644 {
		t.Errorf("written file mode: %v %v", fi.Mode(), err)
	}
	if err := Write(filepath.Join(dir, "no", "such", "dir.json"), seed); err == nil {
		t.Errorf("Write into a missing directory succeeded")
	}
	if err := os.Mkdir(filepath.Join(dir, "isdir.json"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := Write(filepath.Join(dir, "isdir.json"), seed); err == nil {
		t.Errorf("Write over a directory succeeded")
	}
	entries, _ := os.ReadDir(dir)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if !reflect.DeepEqual(names, []string{"isdir.json", "rank_table.json"}) {
		t.Errorf("files left in the directory: %v", names)
	}
	if _, err := Read(filepath.Join(dir, "none.json")); err == nil || !strings.Contains(err.Error(), "none.json") {
		t.Errorf("Read of a missing file: %v", err)
	}
	os.WriteFile(path, []byte(`{"server_count":"x"}`), 0o644)
	if _, err := Read(path); err == nil || !strings.HasPrefix(err.Error(), path+": server_count: ") {
		t.Errorf("Read of a bad file: %v", err)
	}
}

func FuzzParse(f *testing.F) {
	seed, err := os.ReadFile(seedFile)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(seed)
	f.Add([]byte(`{"server_count":"1","server_list":[{"server_id":"a","device":[{"device_id":"0","rank_id":"0"}]}]}`))
	f.Add([]byte(`{"server_count":"0","server_list":[],"version":"\u003c\ud800"}`))
	f.Add([]byte(`{"server_count":"2","server_list":[{"server_id":"a","device":[]},{"server_id":"a","device":[{"device_id":"1","rank_id":"5"},{"device_id":"1","rank_id":"5"}]}]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		tab, err := Parse("f.json", b)
		if err != nil {
			var pe *ParseError
			if !errors.As(err, &pe) || pe.File != "f.json" {
				t.Fatalf("error %#v is not a *ParseError naming the file", err)
			}
			return
		}
		Check(tab)
		for i := range tab.Servers {
			if lo, hi := tab.DeviceRange(i); lo > hi {
				t.Fatalf("DeviceRange(%d) = [%d,%d)", i, lo, hi)
			}
		}
		// Both written forms read back as the same table, and write the same.
		var buf bytes.Buffer
		tab.WriteTo(&buf)
		again, err := Parse("again.json", buf.Bytes())
		if err != nil {
			t.Fatalf("reading WriteTo's output: %v\n%s", err, buf.Bytes())
		}
		if !reflect.DeepEqual(again, tab) {
			t.Fatalf("WriteTo then Parse:\n%+v\nwant\n%+v", again, tab)
		}
		var buf2 bytes.Buffer
		again.WriteTo(&buf2)
		if !bytes.Equal(buf.Bytes(), buf2.Bytes()) {
			t.Fatalf("WriteTo is not stable:\n%s\n%s", buf.Bytes(), buf2.Bytes())
		}
		compact, err := json.Marshal(tab)
		if err != nil {
			t.Fatal(err)
		}
		var viaJSON Table
		if err := json.Unmarshal(compact, &viaJSON); err != nil {
			t.Fatalf("reading MarshalJSON's output: %v\n%s", err, compact)
		}
		if !reflect.DeepEqual(&viaJSON, tab) {
			t.Fatalf("MarshalJSON then UnmarshalJSON:\n%+v\nwant\n%+v", viaJSON, tab)
		}
		if m, err := Merge(tab); err == nil {
			if errs := Check(m); len(errs) > 0 && len(m.Servers) > 0 && allHaveDevices(m) && uniqueDevices(m) && noEmptyID(m) {
				t.Fatalf("Check(Merge(t)) = %v", errs)
			}
		}
	})
}

func allHaveDevices(t *Table) bool {
	for _, s := range t.Servers {
		if len(s.Devices) == 0 {
			return false
		}
	}
	return true
}

func uniqueDevices(t *Table) bool {
	for _, s := range t.Servers {
		seen := map[int]bool{}
		for _, d := range s.Devices {
			if seen[d.DeviceID] {
				return false
			}
			seen[d.DeviceID] = true
		}
	}
	return true
}

func noEmptyID(t *Table) bool {
	for _, s := range t.Servers {
		if s.ServerID == "" {
			return false
		}
	}
	return true
}
