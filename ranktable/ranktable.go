// Package ranktable reads, writes, builds, merges and checks the rank table
// of an HCCL job: the RANK_TABLE_FILE of MindSpore and MindFormers, made on
// each machine by hccl_tools.py and merged by hand into one file that every
// machine shares.
//
// The file is a JSON object whose values are all strings:
//
//	{
//	    "version": "1.0",
//	    "server_count": "2",
//	    "server_list": [
//	        {
//	            "server_id": "10.155.111.140",
//	            "device": [
//	                {"device_id": "0", "device_ip": "192.1.27.6", "rank_id": "0"},
//	                {"device_id": "1", "device_ip": "192.2.27.6", "rank_id": "1"}
//	            ],
//	            "host_nic_ip": "reserve"
//	        },
//	        ...
//	    ],
//	    "status": "completed"
//	}
//
// A [Table] holds the same facts with numbers as numbers. [Parse] and [Read]
// check the types and name the JSON path of any mistake; [Check] finds the
// mistakes of meaning (ranks missing or used twice, a wrong server_count, a
// machine whose ranks are not one range); [Build] and [Merge] make tables
// whose ranks are numbered in order.
package ranktable

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Values that hccl_tools.py writes and that Build and Merge write too.
const (
	// Version is the rank table format this package writes.
	Version = "1.0"
	// StatusCompleted is the status of a finished table.
	StatusCompleted = "completed"
	// HostNicReserve is the host_nic_ip that hccl_tools.py writes.
	HostNicReserve = "reserve"
)

// Table is a rank table: the machines of a job and, on each, the devices
// with their ranks.
type Table struct {
	Version     string   // "version", such as "1.0"
	ServerCount int      // "server_count"; Check compares it with len(Servers)
	Servers     []Server // "server_list", in the order of the file
	Status      string   // "status", such as "completed"
}

// Server is one machine of a rank table.
type Server struct {
	ServerID  string   // "server_id", the machine's address
	Devices   []Device // "device", in the order of the file
	HostNicIP string   // "host_nic_ip", usually "reserve"
}

// Device is one accelerator of a machine with its rank in the job.
type Device struct {
	DeviceID int    // "device_id", the device's index on its machine
	DeviceIP string // "device_ip", the address of the device's network port
	RankID   int    // "rank_id", the device's rank in the whole job
}

// RankSize returns the number of devices in all servers, the RANK_SIZE of
// run_distribute.sh.
func (t *Table) RankSize() int {
	n := 0
	for _, s := range t.Servers {
		n += len(s.Devices)
	}
	return n
}

// DeviceRange returns the ranks of the server at index server as the
// half-open range [lo,hi) from its lowest rank to one past its highest: the
// DEVICE_RANGE that run_distribute.sh takes on that machine, [0,8) for the
// first of the machines with eight devices. It returns 0, 0 for a server
// without devices; for a server whose ranks are not one range (see Check)
// the range also spans the ranks of other servers. DeviceRange panics if
// server is out of range, as indexing Servers does.
func (t *Table) DeviceRange(server int) (lo, hi int) {
	devs := t.Servers[server].Devices
	if len(devs) == 0 {
		return 0, 0
	}
	lo, hi = devs[0].RankID, devs[0].RankID
	for _, d := range devs[1:] {
		lo = min(lo, d.RankID)
		hi = max(hi, d.RankID)
	}
	return lo, hi + 1
}

// ServerInput describes one machine for Build.
type ServerInput struct {
	ServerID  string         // the machine's address
	DeviceIDs []int          // the devices to use, in rank order
	DeviceIPs map[int]string // device_ip by device id; a device missing here gets ServerID
}

// Build returns the table of the given machines: ranks are numbered from 0
// in the order of servers and, within a server, of its DeviceIDs, so every
// server holds one range of ranks. The table has version "1.0", status
// "completed" and host_nic_ip "reserve", as hccl_tools.py writes.
func Build(servers []ServerInput) *Table {
	t := &Table{Version: Version, ServerCount: len(servers), Status: StatusCompleted}
	t.Servers = make([]Server, 0, len(servers))
	rank := 0
	for _, in := range servers {
		s := Server{ServerID: in.ServerID, HostNicIP: HostNicReserve, Devices: make([]Device, 0, len(in.DeviceIDs))}
		for _, id := range in.DeviceIDs {
			ip, ok := in.DeviceIPs[id]
			if !ok {
				ip = in.ServerID
			}
			s.Devices = append(s.Devices, Device{DeviceID: id, DeviceIP: ip, RankID: rank})
			rank++
		}
		t.Servers = append(t.Servers, s)
	}
	return t
}

// Merge joins the tables made on each machine into the one table of the
// job: the server lists one after the other in the order given, the ranks
// numbered again from 0 in that order, and server_count the number of
// servers. The tables must share a version; the result has that version
// and status "completed". A server_id found twice is an error. Merge does
// not change its arguments.
func Merge(tables ...*Table) (*Table, error) {
	if len(tables) == 0 {
		return nil, errors.New("merge: no rank tables given")
	}
	out := &Table{Status: StatusCompleted}
	seen := make(map[string]int) // server_id -> index of the table that holds it
	rank := 0
	for i, t := range tables {
		if t == nil {
			return nil, fmt.Errorf("merge: rank table %d is nil", i+1)
		}
		if i == 0 {
			out.Version = t.Version
		} else if t.Version != out.Version {
			return nil, fmt.Errorf("merge: rank table %d has version %q but table 1 has %q", i+1, t.Version, out.Version)
		}
		for j, s := range t.Servers {
			if prev, ok := seen[s.ServerID]; ok {
				if prev == i {
					return nil, fmt.Errorf("merge: server_id %q is listed twice in rank table %d", s.ServerID, i+1)
				}
				return nil, fmt.Errorf("merge: server_id %q (table %d, server_list[%d]) is already in rank table %d", s.ServerID, i+1, j, prev+1)
			}
			seen[s.ServerID] = i
			ns := Server{ServerID: s.ServerID, HostNicIP: s.HostNicIP, Devices: make([]Device, len(s.Devices))}
			for k, d := range s.Devices {
				d.RankID = rank
				rank++
				ns.Devices[k] = d
			}
			out.Servers = append(out.Servers, ns)
		}
	}
	if out.Version == "" {
		out.Version = Version
	}
	out.ServerCount = len(out.Servers)
	return out, nil
}

// Read reads and parses the rank table in the file at path. Its errors
// name the file.
func Read(path string) (*Table, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return Parse(path, b)
}

// Write writes t to the file at path in the form of WriteTo. It writes a
// temporary file in the same directory and renames it, so a reader never
// sees half a table.
func Write(path string, t *Table) (err error) {
	var buf bytes.Buffer
	if _, err := t.WriteTo(&buf); err != nil {
		return err
	}
	dir, base := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	f, err := os.CreateTemp(dir, "."+base+".tmp*")
	if err != nil {
		return fmt.Errorf("write rank table: %w", err)
	}
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(f.Name())
		}
	}()
	if _, err := f.Write(buf.Bytes()); err != nil {
		return fmt.Errorf("write rank table: %w", err)
	}
	if err := f.Chmod(0o644); err != nil {
		return fmt.Errorf("write rank table: %w", err)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("write rank table: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("write rank table: %w", err)
	}
	if err := os.Rename(f.Name(), path); err != nil {
		return fmt.Errorf("write rank table: %w", err)
	}
	return nil
}

// WriteTo writes t as indented JSON in the layout of the MindFormers
// examples: keys in the order of the format, four spaces of indent, one
// device per line, and a final newline. All values are strings.
func (t *Table) WriteTo(w io.Writer) (int64, error) {
	var b bytes.Buffer
	b.WriteString("{\n")
	fmt.Fprintf(&b, "    \"version\": %s,\n", quote(t.Version))
	fmt.Fprintf(&b, "    \"server_count\": %s,\n", quote(strconv.Itoa(t.ServerCount)))
	if len(t.Servers) == 0 {
		b.WriteString("    \"server_list\": [],\n")
	} else {
		b.WriteString("    \"server_list\": [\n")
		for i, s := range t.Servers {
			b.WriteString("        {\n")
			fmt.Fprintf(&b, "            \"server_id\": %s,\n", quote(s.ServerID))
			if len(s.Devices) == 0 {
				b.WriteString("            \"device\": [],\n")
			} else {
				b.WriteString("            \"device\": [\n")
				for j, d := range s.Devices {
					b.WriteString("                ")
					writeDevice(&b, d, true)
					b.WriteString(comma(j, len(s.Devices)))
				}
				b.WriteString("            ],\n")
			}
			fmt.Fprintf(&b, "            \"host_nic_ip\": %s\n", quote(s.HostNicIP))
			b.WriteString("        }")
			b.WriteString(comma(i, len(t.Servers)))
		}
		b.WriteString("    ],\n")
	}
	fmt.Fprintf(&b, "    \"status\": %s\n", quote(t.Status))
	b.WriteString("}\n")
	return b.WriteTo(w)
}

// comma ends element i of n: a comma unless it is the last, then a newline.
func comma(i, n int) string {
	if i < n-1 {
		return ",\n"
	}
	return "\n"
}

// MarshalJSON returns t as compact JSON with the keys in the order of the
// format and every value a string.
func (t Table) MarshalJSON() ([]byte, error) {
	var b bytes.Buffer
	fmt.Fprintf(&b, `{"version":%s,"server_count":%s,"server_list":[`, quote(t.Version), quote(strconv.Itoa(t.ServerCount)))
	for i, s := range t.Servers {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"server_id":%s,"device":[`, quote(s.ServerID))
		for j, d := range s.Devices {
			if j > 0 {
				b.WriteByte(',')
			}
			writeDevice(&b, d, false)
		}
		fmt.Fprintf(&b, `],"host_nic_ip":%s}`, quote(s.HostNicIP))
	}
	fmt.Fprintf(&b, `],"status":%s}`, quote(t.Status))
	return b.Bytes(), nil
}

// UnmarshalJSON sets t from the JSON of a rank table, checked as Parse
// checks it. Its errors are *ParseError without a file name.
func (t *Table) UnmarshalJSON(b []byte) error {
	nt, err := Parse("", b)
	if err != nil {
		return err
	}
	*t = *nt
	return nil
}

// writeDevice writes d as a JSON object on one line: compact, or with a
// space after each colon and comma when spaced is true.
func writeDevice(b *bytes.Buffer, d Device, spaced bool) {
	colon, sep := ":", ","
	if spaced {
		colon, sep = ": ", ", "
	}
	fmt.Fprintf(b, `{"device_id"%s%s%s"device_ip"%s%s%s"rank_id"%s%s}`,
		colon, quote(strconv.Itoa(d.DeviceID)), sep,
		colon, quote(d.DeviceIP), sep,
		colon, quote(strconv.Itoa(d.RankID)))
}

// quote returns s as a JSON string.
func quote(s string) string {
	var b strings.Builder
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	enc.Encode(s) // a string always encodes
	return strings.TrimSuffix(b.String(), "\n")
}
