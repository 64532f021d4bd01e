package ranktable

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"strconv"
	"strings"

	"github.com/gptui/gptui/badinput"
)

// ParseError is a mistake in the text of a rank table or of an hccn.conf
// file.
type ParseError struct {
	File   string // the file name; empty when not known
	Line   int    // the line, from 1, for syntax errors and hccn.conf; else 0
	Column int    // the column, from 1, for JSON syntax errors; else 0
	Path   string // where in the JSON, such as "server_list[1].device[3].rank_id"
	Msg    string // what is wrong
}

// Error returns the mistake as "FILE:LINE:COLUMN: PATH: MSG", leaving out
// the parts that are not known.
func (e *ParseError) Error() string {
	var b strings.Builder
	b.WriteString(e.File)
	if e.Line > 0 {
		fmt.Fprintf(&b, ":%d", e.Line)
		if e.Column > 0 {
			fmt.Fprintf(&b, ":%d", e.Column)
		}
	}
	if e.Path != "" {
		if b.Len() > 0 {
			b.WriteString(": ")
		}
		b.WriteString(e.Path)
	}
	if b.Len() > 0 {
		b.WriteString(": ")
	}
	b.WriteString(e.Msg)
	return b.String()
}

// Is reports that a ParseError is bad input (badinput.Err).
func (e *ParseError) Is(target error) bool { return badinput.Is(target) }

// maxDigits bounds the numbers of a rank table: ids and counts have at
// most this many significant digits.
const maxDigits = 9

// Parse parses the rank table b read from the file name. It checks the
// types: the table, each server and each device must be objects;
// server_list and device arrays; every value a string, and server_count,
// device_id and rank_id strings of decimal digits. server_count,
// server_list, server_id, device, device_id and rank_id are required; the
// others may be missing and read as empty. Keys of other names are
// ignored. Its errors are *ParseError, naming the file and the JSON path:
//
//	rank_table.json: server_list[1].device[3].rank_id: "x" is not a number
//
// Parse does not check the meaning of the table; see Check.
func Parse(name string, b []byte) (*Table, error) {
	p := parser{file: name}
	var raw json.RawMessage
	if err := json.Unmarshal(b, &raw); err != nil {
		return nil, p.syntaxError(b, err)
	}
	t, err := p.table(raw)
	if err != nil {
		return nil, err
	}
	return t, nil
}

// parser turns the JSON of a rank table into a Table.
type parser struct{ file string }

func (p *parser) errorf(path, format string, args ...any) error {
	return &ParseError{File: p.file, Path: path, Msg: fmt.Sprintf(format, args...)}
}

// syntaxError describes err from decoding b with its line and column.
func (p *parser) syntaxError(b []byte, err error) error {
	var se *json.SyntaxError
	if !errors.As(err, &se) {
		return &ParseError{File: p.file, Msg: err.Error()}
	}
	off := int(min(max(se.Offset, 0), int64(len(b))))
	line := 1 + bytes.Count(b[:off], []byte("\n"))
	col := off - bytes.LastIndexByte(b[:off], '\n')
	if off > 0 {
		col-- // Offset is just after the byte that did not fit
	}
	return &ParseError{File: p.file, Line: line, Column: max(col, 1), Msg: se.Error()}
}

func (p *parser) table(raw json.RawMessage) (*Table, error) {
	obj, err := p.object("", raw)
	if err != nil {
		return nil, err
	}
	t := &Table{}
	if t.Version, err = p.optString("version", obj); err != nil {
		return nil, err
	}
	if t.Status, err = p.optString("status", obj); err != nil {
		return nil, err
	}
	if t.ServerCount, err = p.number("server_count", obj); err != nil {
		return nil, err
	}
	list, err := p.array("server_list", obj)
	if err != nil {
		return nil, err
	}
	t.Servers = make([]Server, len(list))
	for i, raw := range list {
		if err := p.server(fmt.Sprintf("server_list[%d]", i), raw, &t.Servers[i]); err != nil {
			return nil, err
		}
	}
	return t, nil
}

func (p *parser) server(path string, raw json.RawMessage, s *Server) error {
	obj, err := p.object(path, raw)
	if err != nil {
		return err
	}
	if s.ServerID, err = p.reqString(path+".server_id", obj); err != nil {
		return err
	}
	if s.HostNicIP, err = p.optString(path+".host_nic_ip", obj); err != nil {
		return err
	}
	list, err := p.array(path+".device", obj)
	if err != nil {
		return err
	}
	s.Devices = make([]Device, len(list))
	for j, raw := range list {
		dpath := fmt.Sprintf("%s.device[%d]", path, j)
		dobj, err := p.object(dpath, raw)
		if err != nil {
			return err
		}
		d := &s.Devices[j]
		if d.DeviceID, err = p.number(dpath+".device_id", dobj); err != nil {
			return err
		}
		if d.DeviceIP, err = p.optString(dpath+".device_ip", dobj); err != nil {
			return err
		}
		if d.RankID, err = p.number(dpath+".rank_id", dobj); err != nil {
			return err
		}
	}
	return nil
}

// members holds an object's members by key, for paths of the form
// "prefix.key".
type members map[string]json.RawMessage

// get returns the member named by the last element of path.
func (m members) get(path string) (json.RawMessage, bool) {
	key := path[strings.LastIndexByte(path, '.')+1:]
	raw, ok := m[key]
	return raw, ok
}

func (p *parser) object(path string, raw json.RawMessage) (members, error) {
	if k := kind(raw); k != "an object" {
		return nil, p.errorf(path, "want an object, not %s", k)
	}
	var m members
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, p.errorf(path, "%v", err)
	}
	return m, nil
}

func (p *parser) array(path string, obj members) ([]json.RawMessage, error) {
	raw, ok := obj.get(path)
	if !ok {
		return nil, p.errorf(path, "missing")
	}
	if k := kind(raw); k != "an array" {
		return nil, p.errorf(path, "want an array, not %s", k)
	}
	var list []json.RawMessage
	if err := json.Unmarshal(raw, &list); err != nil {
		return nil, p.errorf(path, "%v", err)
	}
	return list, nil
}

// optString returns the string at path, or "" if there is none.
func (p *parser) optString(path string, obj members) (string, error) {
	if _, ok := obj.get(path); !ok {
		return "", nil
	}
	return p.reqString(path, obj)
}

func (p *parser) reqString(path string, obj members) (string, error) {
	raw, ok := obj.get(path)
	if !ok {
		return "", p.errorf(path, "missing")
	}
	if k := kind(raw); k != "a string" {
		if k == "a number" {
			return "", p.errorf(path, "%s must be a string: write \"%s\"", raw, raw)
		}
		return "", p.errorf(path, "want a string, not %s", k)
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return "", p.errorf(path, "%v", err)
	}
	return s, nil
}

// number returns the string of decimal digits at path as a number.
func (p *parser) number(path string, obj members) (int, error) {
	s, err := p.reqString(path, obj)
	if err != nil {
		return 0, err
	}
	if s == "" || strings.TrimLeft(s, "0123456789") != "" {
		return 0, p.errorf(path, "%s is not a number", quote(s))
	}
	if len(strings.TrimLeft(s, "0")) > maxDigits {
		return 0, p.errorf(path, "%s is too large", quote(s))
	}
	n, err := strconv.Atoi(s)
	if err != nil {
		return 0, p.errorf(path, "%s is not a number", quote(s))
	}
	return n, nil
}

// kind names the JSON type of the valid JSON value raw.
func kind(raw json.RawMessage) string {
	raw = bytes.TrimLeft(raw, " \t\r\n")
	if len(raw) == 0 {
		return "nothing"
	}
	switch raw[0] {
	case '{':
		return "an object"
	case '[':
		return "an array"
	case '"':
		return "a string"
	case 't', 'f':
		return "a boolean"
	case 'n':
		return "null"
	}
	return "a number"
}

// ParseHCCN reads the device addresses from an Ascend hccn.conf file
// (/etc/hccn.conf), whose lines "address_N=IP" give the address of the
// network port of device N, and returns them by device. Other keys
// (netmask_N, netdetect_N, gateway_N, ...), blank lines and lines starting
// with '#' are skipped. A line that is not KEY=VALUE, an address that is
// not an IP address or a device given twice is an error; errors are
// *ParseError with the line.
func ParseHCCN(r io.Reader) (map[int]string, error) {
	ips := make(map[int]string)
	lines := make(map[int]int) // device -> line of its address
	sc := bufio.NewScanner(r)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		fail := func(format string, args ...any) error {
			return &ParseError{File: "hccn.conf", Line: n, Msg: fmt.Sprintf(format, args...)}
		}
		key, val, ok := strings.Cut(line, "=")
		if !ok {
			return nil, fail("%q is not KEY=VALUE", line)
		}
		key, val = strings.TrimSpace(key), strings.TrimSpace(val)
		dev, ok := strings.CutPrefix(key, "address_")
		if !ok {
			continue
		}
		id, err := strconv.Atoi(dev)
		if err != nil || id < 0 || strings.TrimLeft(dev, "0123456789") != "" {
			return nil, fail("%s: %q is not a device number", key, dev)
		}
		addr, err := netip.ParseAddr(val)
		if err != nil {
			return nil, fail("%s: %q is not an IP address", key, val)
		}
		if prev, ok := lines[id]; ok {
			return nil, fail("%s: device %d already has an address on line %d", key, id, prev)
		}
		ips[id], lines[id] = addr.String(), n
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("hccn.conf: %w", err)
	}
	return ips, nil
}
