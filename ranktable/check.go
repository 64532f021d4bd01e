package ranktable

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
)

// Check returns every mistake of meaning in t, in the order of the file,
// or nil if there is none. It reports
//
//   - a server_count other than the number of servers,
//   - a server without a server_id, or a server_id used twice,
//   - a server without devices,
//   - a device_id used twice on one server,
//   - a rank_id used twice, or out of 0..N-1 for N devices in all,
//   - the rank_ids of 0..N-1 that no device has,
//   - a server whose rank_ids, in the order of its devices, are not one
//     ascending range lo, lo+1, ..., hi-1: run_distribute.sh gives each
//     machine its ranks as a DEVICE_RANGE [lo,hi),
//   - an empty server_list.
//
// Each error starts with the JSON path of the mistake where there is one.
// Check accepts host names as server_id and device_ip, as gptui's runner
// does; see [CheckAddresses] for HCCL's stricter rule.
func Check(t *Table) []error {
	if t == nil {
		return []error{errors.New("no rank table")}
	}
	var errs []error
	add := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if len(t.Servers) == 0 {
		add("server_list: no servers; a rank table needs at least one server with devices")
	}

	if t.ServerCount != len(t.Servers) {
		add("server_count: %d, but server_list has %d servers", t.ServerCount, len(t.Servers))
	}
	n := t.RankSize()
	type where struct{ server, device int }
	ranks := make(map[int]where, n)
	serverIDs := make(map[string]int, len(t.Servers))
	for i, s := range t.Servers {
		sp := fmt.Sprintf("server_list[%d]", i)
		switch prev, dup := serverIDs[s.ServerID]; {
		case s.ServerID == "":
			add("%s.server_id: empty", sp)
		case dup:
			add("%s.server_id: %q is also the server_id of server_list[%d]", sp, s.ServerID, prev)
		default:
			serverIDs[s.ServerID] = i
		}
		if len(s.Devices) == 0 {
			add("%s (server_id %q): no devices", sp, s.ServerID)
			continue
		}
		devices := make(map[int]int, len(s.Devices))
		for j, d := range s.Devices {
			dp := fmt.Sprintf("%s.device[%d]", sp, j)
			if prev, dup := devices[d.DeviceID]; dup {
				add("%s.device_id: device %d is also %s.device[%d]", dp, d.DeviceID, sp, prev)
			} else {
				devices[d.DeviceID] = j
			}
			switch prev, dup := ranks[d.RankID]; {
			case d.RankID < 0 || d.RankID >= n:
				add("%s.rank_id: %d is out of range: %d devices have ranks 0..%d", dp, d.RankID, n, n-1)
			case dup:
				add("%s.rank_id: rank %d is also server_list[%d].device[%d]", dp, d.RankID, prev.server, prev.device)
			default:
				ranks[d.RankID] = where{i, j}
			}
		}
		if !contiguous(s.Devices) {
			ids := make([]int, len(s.Devices))
			for j, d := range s.Devices {
				ids[j] = d.RankID
			}
			lo, hi := t.DeviceRange(i)
			add("%s (server_id %q): rank_ids %s are not the range [%d,%d) in order; each server needs one range of ranks for its DEVICE_RANGE",
				sp, s.ServerID, list(ids), lo, hi)
		}
	}
	if len(ranks) < n {
		var missing []int
		for r := range n {
			if _, ok := ranks[r]; !ok {
				missing = append(missing, r)
			}
		}
		add("rank_ids missing: %s (%d devices have ranks 0..%d)", spans(missing), n, n-1)
	}
	return errs
}

// CheckAddresses returns, in the order of the file, every server_id and
// device_ip of t that is not an IP address (IPv4 or IPv6), and every
// device_ip that another device of the same server has too: HCCL reaches
// the machines and devices at these addresses, each device at its own
// network port, and hccl_tools.py writes them so. gptui's own runner also
// takes host names, and one address for a node's devices (see [Check]).
func CheckAddresses(t *Table) []error {
	if t == nil {
		return nil
	}
	var errs []error
	for i, s := range t.Servers {
		if _, err := netip.ParseAddr(s.ServerID); err != nil && s.ServerID != "" {
			errs = append(errs, fmt.Errorf("server_list[%d].server_id: %q is not an IP address; write the machine's IP address", i, s.ServerID))
		}
		var ips []string              // the addresses, in the order of the devices
		sharing := map[string][]int{} // the devices of each address
		for j, d := range s.Devices {
			if _, err := netip.ParseAddr(d.DeviceIP); err != nil {
				errs = append(errs, fmt.Errorf("server_list[%d].device[%d].device_ip: %q is not an IP address; write the device's IP address (hccn_tool -i %d -ip -g)", i, j, d.DeviceIP, d.DeviceID))
				continue
			}
			if _, ok := sharing[d.DeviceIP]; !ok {
				ips = append(ips, d.DeviceIP)
			}
			sharing[d.DeviceIP] = append(sharing[d.DeviceIP], d.DeviceID)
		}
		for _, ip := range ips {
			if ids := sharing[ip]; len(ids) > 1 {
				errs = append(errs, fmt.Errorf("server_list[%d] (server_id %q): devices %s share the device_ip %s; each device has a network port of its own: write each one's IP address (hccn_tool -i N -ip -g; device_ips= in gptui's inventory)", i, s.ServerID, list(ids), ip))
			}
		}
	}
	return errs
}

// contiguous reports whether the ranks of devs count up by one.
func contiguous(devs []Device) bool {
	for j := 1; j < len(devs); j++ {
		if devs[j].RankID != devs[j-1].RankID+1 {
			return false
		}
	}
	return true
}

// list writes ids as "8, 10, 9", cut short after a dozen.
func list(ids []int) string {
	const most = 12
	var b strings.Builder
	for i, id := range ids {
		if i == most {
			fmt.Fprintf(&b, ", ... (%d in all)", len(ids))
			break
		}
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(strconv.Itoa(id))
	}
	return b.String()
}

// spans writes the ascending ids as runs, "5, 7-9", cut short after a
// dozen runs.
func spans(ids []int) string {
	ids = slices.Clone(ids)
	slices.Sort(ids)
	var runs []string
	for i := 0; i < len(ids); {
		j := i
		for j+1 < len(ids) && ids[j+1] == ids[j]+1 {
			j++
		}
		if j == i {
			runs = append(runs, strconv.Itoa(ids[i]))
		} else {
			runs = append(runs, fmt.Sprintf("%d-%d", ids[i], ids[j]))
		}
		i = j + 1
	}
	const most = 12
	if len(runs) > most {
		return strings.Join(runs[:most], ", ") + fmt.Sprintf(", ... (%d in all)", len(ids))
	}
	return strings.Join(runs, ", ")
}
