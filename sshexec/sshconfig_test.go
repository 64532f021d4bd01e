package sshexec

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

const testSSHConfig = `# gptui test configuration
Host gpu? !gpu9
    HostName 10.0.0.%h
    User alice
    IdentityFile ~/.ssh/cluster_%h   # a trailing comment

Host gpu1
    # Too late: gpu? set these first.
    HostName ignored
    User ignored
    Port 2201

Host=jump*
  Hostname=%h.example.com
  Port = 2222
  ProxyJump none

Host "quoted host" *.lab
	IdentityFile "/keys/with space"
	ProxyJump bastion.example.com:2200

Match host gpu9 exec "true"
	User matched

Match all
	IdentityFile %d/.ssh/id_%r_%%_%x
	ForwardAgent yes

Host *
	USER everyone
	port 22
	ProxyJump default-jump
`

func TestLookup(t *testing.T) {
	cfg, err := ParseSSHConfig("config", strings.NewReader(testSSHConfig))
	if err != nil {
		t.Fatal(err)
	}
	cfg.Home = "/home/me"
	tests := []struct {
		alias string
		want  HostConfig
	}{
		{"gpu1", HostConfig{HostName: "10.0.0.gpu1", User: "alice", Port: 2201, ProxyJump: "default-jump",
			IdentityFiles: []string{"/home/me/.ssh/cluster_10.0.0.gpu1", "/home/me/.ssh/id_alice_%_%x"}}},
		{"GPU2", HostConfig{HostName: "10.0.0.GPU2", User: "alice", Port: 22, ProxyJump: "default-jump",
			IdentityFiles: []string{"/home/me/.ssh/cluster_10.0.0.GPU2", "/home/me/.ssh/id_alice_%_%x"}}},
		{"gpu9", HostConfig{User: "everyone", Port: 22, ProxyJump: "default-jump",
			IdentityFiles: []string{"/home/me/.ssh/id_everyone_%_%x"}}},
		{"gpu10", HostConfig{User: "everyone", Port: 22, ProxyJump: "default-jump",
			IdentityFiles: []string{"/home/me/.ssh/id_everyone_%_%x"}}},
		{"jumpbox", HostConfig{HostName: "jumpbox.example.com", User: "everyone", Port: 2222,
			IdentityFiles: []string{"/home/me/.ssh/id_everyone_%_%x"}}},
		{"n1.lab", HostConfig{User: "everyone", Port: 22, ProxyJump: "bastion.example.com:2200",
			IdentityFiles: []string{"/keys/with space", "/home/me/.ssh/id_everyone_%_%x"}}},
		{"quoted host", HostConfig{User: "everyone", Port: 22, ProxyJump: "bastion.example.com:2200",
			IdentityFiles: []string{"/keys/with space", "/home/me/.ssh/id_everyone_%_%x"}}},
	}
	for _, tc := range tests {
		t.Run(tc.alias, func(t *testing.T) {
			if got := cfg.Lookup(tc.alias); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("Lookup(%q) =\n%+v\nwant\n%+v", tc.alias, got, tc.want)
			}
		})
	}

	cfg.Home = ""
	got := cfg.Lookup("gpu3").IdentityFiles
	if want := []string{"~/.ssh/cluster_10.0.0.gpu3", "%d/.ssh/id_alice_%_%x"}; !reflect.DeepEqual(got, want) {
		t.Errorf("without Home: IdentityFiles = %q, want %q", got, want)
	}
	var none *SSHConfig
	if got := none.Lookup("x"); !reflect.DeepEqual(got, HostConfig{}) {
		t.Errorf("nil config: Lookup = %+v", got)
	}
}

func TestParseSSHConfigErrors(t *testing.T) {
	tests := []struct{ in, want string }{
		{"Host a\n  Port abc\n", `config:2: Port "abc" is not a port number (1-65535)`},
		{"Port 70000\n", `config:1: Port "70000" is not a port number (1-65535)`},
		{"Host a\nHostName\n", `config:2: hostname needs a value`},
		{"User a b\n", `config:1: user takes one value, not 2 (quote a value with spaces)`},
		{"IdentityFile \"/a b\n", `config:1: identityfile: unterminated quote`},
		{"IdentityFile \"/a\"b\n", `config:1: identityfile: text right after a closing quote`},
		{"\n\nHost\n", `config:3: Host needs at least one pattern`},
		{"Include\n", `config:1: Include needs a file`},
		{"Host a\n# " + strings.Repeat("x", 10<<20) + "\n", `config:2: the line is longer than 64 KiB: is this the right file?`},
	}
	for _, tc := range tests {
		t.Run(tc.want, func(t *testing.T) {
			_, err := ParseSSHConfig("config", strings.NewReader(tc.in))
			if err == nil || err.Error() != tc.want {
				t.Fatalf("ParseSSHConfig error %v, want %q", err, tc.want)
			}
			var ie *InventoryError
			if !errors.As(err, &ie) {
				t.Errorf("error %T is not an *InventoryError", err)
			}
		})
	}
	// Options gptui does not use are not checked.
	if _, err := ParseSSHConfig("config", strings.NewReader("ForwardAgent\nLocalForward a b c\n")); err != nil {
		t.Errorf("unused options: %v", err)
	}
}

func TestLoadSSHConfigInclude(t *testing.T) {
	home := t.TempDir()
	write := func(rel, text string) {
		t.Helper()
		p := filepath.Join(home, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(".ssh/config", "Include config.d/*.conf missing.conf\nHost b\n  Include ~/other/b.conf\nHost *\n  User last\n")
	write(".ssh/config.d/10-a.conf", "Host a\n  HostName 10.0.0.1\n")
	write(".ssh/config.d/20-a.conf", "Host a\n  HostName 10.0.0.2\n  Port 2022\n")
	write(".ssh/config.d/ignored.txt", "Host *\n  User ignored\n")
	write("other/b.conf", "HostName 10.0.0.3\nUser bob\n")
	cfg, err := LoadSSHConfig(filepath.Join(home, ".ssh", "config"), home)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Home != home {
		t.Errorf("Home = %q, want %q", cfg.Home, home)
	}
	tests := map[string]HostConfig{
		"a": {HostName: "10.0.0.1", User: "last", Port: 2022},
		"b": {HostName: "10.0.0.3", User: "bob"},
		"c": {User: "last"},
	}
	for alias, want := range tests {
		if got := cfg.Lookup(alias); !reflect.DeepEqual(got, want) {
			t.Errorf("Lookup(%q) = %+v, want %+v", alias, got, want)
		}
	}

	write(".ssh/config", "Include config\n")
	_, err = LoadSSHConfig(filepath.Join(home, ".ssh", "config"), home)
	if err == nil || !strings.Contains(err.Error(), "Include nested too deeply") {
		t.Errorf("an Include of itself: %v", err)
	}
	write(".ssh/config", "Include bad.conf\n")
	write(".ssh/bad.conf", "\nPort x\n")
	_, err = LoadSSHConfig(filepath.Join(home, ".ssh", "config"), home)
	if want := filepath.Join(home, ".ssh", "bad.conf") + `:2: Port "x" is not a port number (1-65535)`; err == nil || err.Error() != want {
		t.Errorf("a bad included file: %v, want %q", err, want)
	}
	// ParseSSHConfig has no file system and skips Include.
	cfg, err = ParseSSHConfig("config", strings.NewReader("Include /etc/passwd\nUser x\n"))
	if err != nil || cfg.Lookup("a").User != "x" {
		t.Errorf("ParseSSHConfig with Include: %v, %+v", err, cfg)
	}
}

func TestSSHGlob(t *testing.T) {
	tests := []struct {
		pattern, s string
		want       bool
	}{
		{"", "", true},
		{"*", "", true},
		{"*", "anything", true},
		{"a", "a", true},
		{"a", "ab", false},
		{"a?c", "abc", true},
		{"a?c", "ac", false},
		{"*.lab", "n1.lab", true},
		{"*.lab", "n1.lab.x", false},
		{"a*b*c", "aXXbYYbZc", true},
		{"a*b*c", "aXXbYY", false},
		{"*a", "*ba", true},
		{"gpu*", "gpu", true},
		{"**?", "", false},
	}
	for _, tc := range tests {
		if got := sshGlob(tc.pattern, tc.s); got != tc.want {
			t.Errorf("sshGlob(%q, %q) = %v, want %v", tc.pattern, tc.s, got, tc.want)
		}
	}
}

func FuzzParseSSHConfig(f *testing.F) {
	f.Add(testSSHConfig)
	f.Add("Host a\n  Port=22\nInclude x\nMatch all\n IdentityFile \"%d/%h %r\"\n")
	f.Fuzz(func(t *testing.T, in string) {
		cfg, err := ParseSSHConfig("config", strings.NewReader(in))
		if err != nil {
			var ie *InventoryError
			if !errors.As(err, &ie) && !strings.Contains(err.Error(), "too long") {
				t.Fatalf("error %#v is not an *InventoryError", err)
			}
			return
		}
		cfg.Home = "/home/me"
		for _, alias := range []string{"a", "gpu1", "jumpbox", "x.lab", ""} {
			hc := cfg.Lookup(alias)
			if hc.Port < 0 || hc.Port > 65535 {
				t.Fatalf("Lookup(%q).Port = %d", alias, hc.Port)
			}
		}
	})
}
