package sshexec

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// SSHConfig holds what gptui takes from an OpenSSH client configuration
// file such as ~/.ssh/config: the Host blocks and, in them, the options
// HostName, User, Port, IdentityFile and ProxyJump. Other options are
// skipped. A Match block applies to every host when it is "Match all" and
// to none otherwise, as its other criteria are not evaluated. The zero
// value and nil hold no options.
type SSHConfig struct {
	// Home is the home directory that a leading ~ and %d stand for in
	// IdentityFile; when empty they are left as written.
	Home string

	opts []sshOption
}

// HostConfig is the configuration of one host alias: each field is the
// first value that the configuration gives for it, as OpenSSH takes it,
// or its zero value when none does.
type HostConfig struct {
	HostName      string   // the real host name or address; %h is the alias
	User          string   // the remote user
	Port          int      // the SSH port
	IdentityFiles []string // every IdentityFile that applies, in order, ~ expanded
	ProxyJump     string   // the jump hosts, as written; "none" reads as ""
}

// sshCond says which hosts a block of options applies to.
type sshCond struct {
	patterns []string // Host patterns, lower case; a leading ! negates
	all      bool     // before any Host or Match line, or "Match all"
	never    bool     // a Match block with criteria other than "all"
}

// sshOption is one option line of a configuration with its block.
type sshOption struct {
	cond  *sshCond
	key   string // lower case
	value string
	file  string // where it is written
	line  int
}

// maxIncludeDepth bounds nested Include directives, as OpenSSH does.
const maxIncludeDepth = 16

// ParseSSHConfig parses the OpenSSH client configuration r read from the
// file name. Include directives are skipped, as r has no place in the file
// system; LoadSSHConfig follows them. A bad Port, a missing value or an
// option with too many values is an error, an *InventoryError with the
// line.
func ParseSSHConfig(name string, r io.Reader) (*SSHConfig, error) {
	c := &SSHConfig{}
	p := sshConfigParser{cfg: c}
	if err := p.parse(name, r, &sshCond{all: true}, 0); err != nil {
		return nil, err
	}
	return c, nil
}

// LoadSSHConfig reads the OpenSSH client configuration in the file at
// path, following its Include directives: relative paths are taken from
// home/.ssh, ~ is home, glob patterns are expanded, and files that do not
// exist are skipped. home also becomes the config's Home.
func LoadSSHConfig(path, home string) (*SSHConfig, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	c := &SSHConfig{Home: home}
	p := sshConfigParser{cfg: c, include: true}
	if err := p.parse(path, f, &sshCond{all: true}, 0); err != nil {
		return nil, err
	}
	return c, nil
}

// sshConfigParser reads configuration files into cfg.
type sshConfigParser struct {
	cfg     *SSHConfig
	include bool // follow Include directives
}

func (p *sshConfigParser) parse(name string, r io.Reader, cond *sshCond, depth int) error {
	return scanLines(name, r, func(n int, line string) error {
		fail := func(format string, args ...any) error {
			return &InventoryError{File: name, Line: n, Msg: fmt.Sprintf(format, args...)}
		}
		key, args, err := sshConfigLine(line)
		if err != nil {
			return fail("%v", err)
		}
		switch key {
		case "":
			return nil
		case "host":
			if len(args) == 0 {
				return fail("Host needs at least one pattern")
			}
			cond = &sshCond{}
			for _, a := range args {
				cond.patterns = append(cond.patterns, strings.ToLower(a))
			}
			return nil
		case "match":
			cond = &sshCond{never: true}
			if len(args) == 1 && strings.EqualFold(args[0], "all") {
				cond = &sshCond{all: true}
			}
			return nil
		case "include":
			if len(args) == 0 {
				return fail("Include needs a file")
			}
			if !p.include {
				return nil
			}
			if depth >= maxIncludeDepth {
				return fail("Include nested too deeply")
			}
			for _, a := range args {
				if err := p.includeFiles(name, n, a, cond, depth); err != nil {
					return err
				}
			}
			return nil
		case "hostname", "user", "port", "identityfile", "proxyjump":
		default:
			return nil // not an option gptui uses
		}
		if len(args) != 1 {
			if len(args) == 0 {
				return fail("%s needs a value", key)
			}
			return fail("%s takes one value, not %d (quote a value with spaces)", key, len(args))
		}
		v := args[0]
		if key == "port" {
			if port, err := strconv.Atoi(v); err != nil || port < 1 || port > 65535 {
				return fail("Port %q is not a port number (1-65535)", v)
			}
		}
		p.cfg.opts = append(p.cfg.opts, sshOption{cond: cond, key: key, value: v, file: name, line: n})
		return nil
	})
}

// includeFiles reads the files that the Include argument pattern names,
// written on line n of the file name, with cond as their starting block.
func (p *sshConfigParser) includeFiles(name string, n int, pattern string, cond *sshCond, depth int) error {
	if rest, ok := strings.CutPrefix(pattern, "~"); ok && (rest == "" || rest[0] == '/') {
		pattern = p.cfg.Home + rest
	}
	if !filepath.IsAbs(pattern) {
		pattern = filepath.Join(p.cfg.Home, ".ssh", pattern)
	}
	files, err := filepath.Glob(pattern)
	if err != nil {
		return &InventoryError{File: name, Line: n, Msg: fmt.Sprintf("Include %q: %v", pattern, err)}
	}
	for _, file := range files {
		f, err := os.Open(file)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return &InventoryError{File: name, Line: n, Msg: fmt.Sprintf("Include: %v", err)}
		}
		err = p.parse(file, f, cond, depth+1)
		f.Close()
		if err != nil {
			return err
		}
	}
	return nil
}

// sshConfigLine splits a configuration line into its keyword, in lower
// case, and its arguments. Keyword and arguments are separated by spaces
// or one '='; an argument may be double-quoted; an unquoted word starting
// with '#' ends the line. A blank or comment line gives an empty keyword.
func sshConfigLine(line string) (key string, args []string, err error) {
	line = strings.TrimSpace(line)
	if line == "" || line[0] == '#' {
		return "", nil, nil
	}
	end := strings.IndexAny(line, " \t=")
	if end < 0 {
		end = len(line)
	}
	key, line = strings.ToLower(line[:end]), strings.TrimLeft(line[end:], " \t")
	if rest, ok := strings.CutPrefix(line, "="); ok {
		line = strings.TrimLeft(rest, " \t")
	}
	for line != "" {
		if line[0] == '#' {
			break
		}
		var arg string
		if line[0] == '"' {
			q := strings.IndexByte(line[1:], '"')
			if q < 0 {
				return "", nil, fmt.Errorf("%s: unterminated quote", key)
			}
			arg, line = line[1:1+q], line[2+q:]
			if line != "" && line[0] != ' ' && line[0] != '\t' {
				return "", nil, fmt.Errorf("%s: text right after a closing quote", key)
			}
		} else {
			end := strings.IndexAny(line, " \t")
			if end < 0 {
				end = len(line)
			}
			arg, line = line[:end], line[end:]
		}
		args = append(args, arg)
		line = strings.TrimLeft(line, " \t")
	}
	return key, args, nil
}

// Lookup returns the configuration of the host alias, taking for each
// option the first value of a block that applies, as ssh does: a Host
// block applies when one of its patterns matches alias and none of its
// negated (!) patterns does; patterns use * and ? and match without regard
// to case. In HostName %h stands for the alias; in IdentityFile a leading
// ~ and %d stand for Home, %h for the host name, %r for the user and %%
// for %, while other tokens are left as written.
func (c *SSHConfig) Lookup(alias string) HostConfig {
	var hc HostConfig
	if c == nil {
		return hc
	}
	var hostName, user, port, jump bool // set already
	var identities []string
	host := strings.ToLower(alias)
	for _, o := range c.opts {
		if !o.cond.matches(host) {
			continue
		}
		switch o.key {
		case "hostname":
			if !hostName {
				hc.HostName, hostName = strings.ReplaceAll(strings.ReplaceAll(o.value, "%h", alias), "%%", "%"), true
			}
		case "user":
			if !user {
				hc.User, user = o.value, true
			}
		case "port":
			if !port {
				hc.Port, _ = strconv.Atoi(o.value) // checked by the parser
				port = true
			}
		case "proxyjump":
			if !jump {
				hc.ProxyJump, jump = o.value, true
				if strings.EqualFold(hc.ProxyJump, "none") {
					hc.ProxyJump = ""
				}
			}
		case "identityfile":
			identities = append(identities, o.value)
		}
	}
	hostname := hc.HostName
	if hostname == "" {
		hostname = alias
	}
	for _, id := range identities {
		if strings.EqualFold(id, "none") {
			continue
		}
		hc.IdentityFiles = append(hc.IdentityFiles, c.expandIdentity(id, hostname, hc.User))
	}
	return hc
}

// proxyJumpAt returns the file and line of the ProxyJump option that
// Lookup(alias) takes; "" and 0 when there is none.
func (c *SSHConfig) proxyJumpAt(alias string) (file string, line int) {
	if c == nil {
		return "", 0
	}
	host := strings.ToLower(alias)
	for _, o := range c.opts {
		if o.key == "proxyjump" && o.cond.matches(host) {
			return o.file, o.line
		}
	}
	return "", 0
}

// expandIdentity expands ~ and the tokens %d, %h, %r and %% in the
// IdentityFile path.
func (c *SSHConfig) expandIdentity(path, host, user string) string {
	path = c.expandHome(path)
	if !strings.Contains(path, "%") {
		return path
	}
	var b strings.Builder
	for i := 0; i < len(path); i++ {
		if path[i] != '%' || i+1 == len(path) {
			b.WriteByte(path[i])
			continue
		}
		switch tok := path[i+1]; {
		case tok == '%':
			b.WriteByte('%')
		case tok == 'd' && c.Home != "":
			b.WriteString(c.Home)
		case tok == 'h':
			b.WriteString(host)
		case tok == 'r' && user != "":
			b.WriteString(user)
		default:
			b.WriteString(path[i : i+2])
		}
		i++
	}
	return b.String()
}

// expandHome replaces a leading ~ or ~/ in path with Home, when it is
// known.
func (c *SSHConfig) expandHome(path string) string {
	if c == nil || c.Home == "" {
		return path
	}
	if path == "~" {
		return c.Home
	}
	if rest, ok := strings.CutPrefix(path, "~/"); ok {
		return filepath.Join(c.Home, rest)
	}
	return path
}

// matches reports whether the options of the block apply to host, in
// lower case.
func (c *sshCond) matches(host string) bool {
	if c.all || c.never {
		return c.all
	}
	ok := false
	for _, p := range c.patterns {
		if neg, isNeg := strings.CutPrefix(p, "!"); isNeg {
			if sshGlob(neg, host) {
				return false
			}
		} else if !ok && sshGlob(p, host) {
			ok = true
		}
	}
	return ok
}

// sshGlob reports whether s matches pattern, where * matches any run of
// bytes and ? any one byte.
func sshGlob(pattern, s string) bool {
	// The classic two-pointer match with backtracking to the last star.
	p, i := 0, 0
	star, mark := -1, 0
	for i < len(s) {
		switch {
		case p < len(pattern) && pattern[p] == '*':
			star, mark = p, i
			p++
		case p < len(pattern) && (pattern[p] == '?' || pattern[p] == s[i]):
			p++
			i++
		case star >= 0:
			p = star + 1
			mark++
			i = mark
		default:
			return false
		}
	}
	for p < len(pattern) && pattern[p] == '*' {
		p++
	}
	return p == len(pattern)
}
