package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"strings"

	"github.com/gptui/gptui/ranktable"
	"github.com/gptui/gptui/sshexec"
	"github.com/gptui/gptui/units"
)

const ranktableUsage = `Usage:
  gptui ranktable --hosts FILE [-o OUT]     make the rank table of the inventory's nodes
  gptui ranktable merge A B ... [-o OUT]    join the rank tables of several machines
  gptui ranktable check FILE                check a rank table

The rank table is HCCL's RANK_TABLE_FILE (hccl_tools.py's JSON). Ranks are
numbered in the order of the inventory, then of each node's devices=; a
node with devices=cpu:N gets devices 0..N-1. A device's device_ip is its
node's nic= if given, else the node's host. Without -o the table goes to
standard output.

Flags:
`

// cmdRanktable implements 'gptui ranktable': it builds a rank table from
// the inventory, merges the tables of several machines into one, or checks
// a table.
func cmdRanktable(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) > 0 {
		switch args[0] {
		case "merge":
			return ranktableMerge(args[1:], stdout, stderr)
		case "check":
			return ranktableCheck(args[1:], stdout, stderr)
		}
	}
	return ranktableBuild(args, stdout, stderr)
}

// ranktableFlagSet returns the flag set of a ranktable subcommand with the
// usage text of them all.
func ranktableFlagSet(name string, stderr io.Writer) *flag.FlagSet {
	fs := newFlagSet(name, stderr)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), ranktableUsage)
		fs.PrintDefaults()
	}
	return fs
}

func ranktableBuild(args []string, stdout, stderr io.Writer) error {
	fs := ranktableFlagSet("ranktable", stderr)
	hosts := fs.String("hosts", "", "the inventory `FILE`: one node per line, [user@]host[:port] devices=0-7 ...")
	out := fs.String("o", "", "write the table to `OUT` instead of standard output")
	if err := parse(fs, args); err != nil {
		return err
	}
	if *hosts == "" {
		return usagef("ranktable: --hosts FILE is required (or: ranktable merge, ranktable check)")
	}
	nodes, err := sshexec.LoadInventory(*hosts)
	if err != nil {
		return usageError{fmt.Errorf("ranktable: %w", err)}
	}
	servers := make([]ranktable.ServerInput, len(nodes))
	for i, n := range nodes {
		in := ranktable.ServerInput{ServerID: n.Host, DeviceIDs: n.Devices.IDs}
		if n.Devices.CPU > 0 {
			in.DeviceIDs = make([]int, n.Devices.CPU)
			for d := range in.DeviceIDs {
				in.DeviceIDs[d] = d
			}
		}
		if len(in.DeviceIDs) == 0 {
			return usagef("ranktable: %s:%d: %s has no devices=; write devices=0-7 or devices=cpu:N (probing the nodes is not built yet)", *hosts, n.Line, n.Name)
		}
		in.DeviceIPs = n.DeviceIPsFor(in.DeviceIDs)
		servers[i] = in
	}
	t := ranktable.Build(servers)
	if err := ranktableProblems(*hosts, t); err != nil {
		return err
	}
	// gptui run takes host names; HCCL, and so 'ranktable check', wants
	// addresses: say so now rather than at the check.
	for i, n := range nodes {
		if net.ParseIP(n.Host) == nil {
			fmt.Fprintf(stderr, "gptui ranktable: note: %s:%d: %s is a name, not an IP address: gptui run takes it, ranktable check and HCCL do not; write the node's IP address for HCCL\n", *hosts, n.Line, n.Host)
		}
		if d := t.Servers[i].Devices; len(d) > 1 && len(n.DeviceIPs) == 0 {
			fmt.Fprintf(stderr, "gptui ranktable: note: %s:%d: the %d devices of %s share the device_ip %s: gptui run takes that, ranktable check and HCCL do not; give each device its own address for HCCL (device_ips=A,B,... in the order of devices=; hccn_tool -i N -ip -g tells them)\n", *hosts, n.Line, len(d), n.Name, d[0].DeviceIP)
		}
	}
	return ranktableWrite(*out, t, stdout)
}

func ranktableMerge(args []string, stdout, stderr io.Writer) error {
	fs := ranktableFlagSet("ranktable merge", stderr)
	out := fs.String("o", "", "write the merged table to `OUT` instead of standard output")
	// Files and flags may come in any order: merge A B -o OUT.
	files, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if len(files) == 0 {
		return usagef("ranktable merge: no rank tables given; write: gptui ranktable merge A B ... -o OUT")
	}
	tables := make([]*ranktable.Table, len(files))
	for i, f := range files {
		t, err := ranktable.Read(f)
		if err != nil {
			return usageError{fmt.Errorf("ranktable merge: %w", err)}
		}
		tables[i] = t
	}
	t, err := ranktable.Merge(tables...)
	if err != nil {
		return usageError{fmt.Errorf("ranktable %w (%s)", err, strings.Join(files, ", "))}
	}
	if err := ranktableProblems(strings.Join(files, " + "), t); err != nil {
		return err
	}
	return ranktableWrite(*out, t, stdout)
}

func ranktableCheck(args []string, stdout, stderr io.Writer) error {
	fs := ranktableFlagSet("ranktable check", stderr)
	pos, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usagef("ranktable check: want one rank table file, got %d arguments", len(pos))
	}
	file := pos[0]
	t, err := ranktable.Read(file)
	if err != nil {
		return usageError{fmt.Errorf("ranktable check: %w", err)}
	}
	// The file is for HCCL, which needs IP addresses where gptui's runner
	// also takes host names.
	if errs := append(ranktable.Check(t), ranktable.CheckAddresses(t)...); len(errs) > 0 {
		for _, e := range errs {
			fmt.Fprintf(stdout, "%s: %v\n", file, e)
		}
		return usagef("ranktable check: %s: %d %s", file, len(errs), units.Plural(len(errs), "problem"))
	}
	fmt.Fprintf(stdout, "OK %s: version %s, %d %s, %d devices (RANK_SIZE %d)\n",
		file, t.Version, len(t.Servers), units.Plural(len(t.Servers), "server"), t.RankSize(), t.RankSize())
	for i, s := range t.Servers {
		lo, hi := t.DeviceRange(i)
		fmt.Fprintf(stdout, "  %-20s %2d devices, DEVICE_RANGE [%d,%d)\n", s.ServerID, len(s.Devices), lo, hi)
	}
	return nil
}

// ranktableProblems returns the problems Check finds in the table made
// from what as one usage error.
func ranktableProblems(what string, t *ranktable.Table) error {
	errs := ranktable.Check(t)
	if len(errs) == 0 {
		return nil
	}
	msgs := make([]string, len(errs))
	for i, e := range errs {
		msgs[i] = e.Error()
	}
	return usagef("ranktable: the table from %s is not valid: %s", what, strings.Join(msgs, "; "))
}

// ranktableWrite writes t to the file out, or to stdout when out is empty.
func ranktableWrite(out string, t *ranktable.Table, stdout io.Writer) error {
	if out == "" {
		_, err := t.WriteTo(stdout)
		return err
	}
	if err := ranktable.Write(out, t); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "wrote %s: %d %s, %d devices\n", out, len(t.Servers), units.Plural(len(t.Servers), "server"), t.RankSize())
	return nil
}
