package sshexec

import (
	"context"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gptui/gptui/internal/sshtest"
	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"
)

// dialErr dials srv and returns the error, closing a client it got.
func dialErr(t *testing.T, srv *sshtest.Server, cfg ClientConfig) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := Dial(ctx, srv.Addr, srv.Port, cfg)
	if err == nil {
		c.Close()
	}
	return err
}

func TestUnknownHostKey(t *testing.T) {
	t.Parallel()
	for _, addr := range testAddrs {
		t.Run(addr, func(t *testing.T) {
			t.Parallel()
			srv, cfg := startNode(t, addr)
			// A known_hosts file in a directory that does not exist yet.
			cfg.KnownHostsFile = filepath.Join(t.TempDir(), "ssh", "known_hosts")

			err := dialErr(t, srv, cfg)
			var hk *HostKeyError
			if !errors.As(err, &hk) {
				t.Fatalf("Dial error %v is not a *HostKeyError", err)
			}
			want := ssh.FingerprintSHA256(srv.HostKey)
			if hk.Kind != HostKeyUnknown || hk.Fingerprint != want || hk.Host != srv.HostPort() || hk.KnownHostsFile != cfg.KnownHostsFile {
				t.Errorf("HostKeyError = %+v, want unknown %s for %s in %s", hk, want, srv.HostPort(), cfg.KnownHostsFile)
			}
			for _, s := range []string{srv.HostPort(), want, "--accept-new-host-keys"} {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("message %q does not mention %q", err, s)
				}
			}
			if _, err := os.Stat(cfg.KnownHostsFile); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("refused key was recorded: stat %s: %v", cfg.KnownHostsFile, err)
			}

			accept := cfg
			accept.AcceptNewHostKeys = true
			c := dial(t, srv, accept)
			var out strings.Builder
			if code, err := c.Run(context.Background(), "echo ok", &out, nil); err != nil || code != 0 || out.String() != "ok\n" {
				t.Fatalf("Run after accepting = %d, %v, %q", code, err, out.String())
			}
			data, err := os.ReadFile(cfg.KnownHostsFile)
			if err != nil {
				t.Fatalf("known_hosts not written: %v", err)
			}
			if got, want := string(data), srv.KnownHostsLine()+"\n"; got != want {
				t.Errorf("known_hosts = %q, want %q", got, want)
			}
			if fi, err := os.Stat(cfg.KnownHostsFile); err != nil || fi.Mode().Perm() != 0o600 {
				t.Errorf("known_hosts mode: %v, %v; want 0600", fi.Mode(), err)
			}

			// The recorded key is trusted without the flag, and not
			// recorded twice with it.
			if err := dialErr(t, srv, cfg); err != nil {
				t.Fatalf("second Dial without AcceptNewHostKeys: %v", err)
			}
			if err := dialErr(t, srv, accept); err != nil {
				t.Fatalf("third Dial: %v", err)
			}
			if data2, _ := os.ReadFile(cfg.KnownHostsFile); string(data2) != string(data) {
				t.Errorf("known_hosts changed on a known host: %q", data2)
			}
		})
	}
}

// TestAcceptHostKey: a fingerprint a person checked accepts that key and
// records it as AcceptNewHostKeys would (the line ssh-keyscan writes);
// another fingerprint accepts nothing.
func TestAcceptHostKey(t *testing.T) {
	t.Parallel()
	srv, cfg := startNode(t, testAddrs[0])
	cfg.KnownHostsFile = filepath.Join(t.TempDir(), "known_hosts")
	other := cfg
	other.AcceptHostKey = "SHA256:AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"
	var hk *HostKeyError
	if err := dialErr(t, srv, other); !errors.As(err, &hk) || hk.Kind != HostKeyUnknown {
		t.Fatalf("Dial with another fingerprint: %v, want the unknown key refused", err)
	}
	if _, err := os.Stat(cfg.KnownHostsFile); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a refused key was recorded: %v", err)
	}
	this := cfg
	this.AcceptHostKey = ssh.FingerprintSHA256(srv.HostKey)
	if err := dialErr(t, srv, this); err != nil {
		t.Fatalf("Dial accepting its fingerprint: %v", err)
	}
	if data, err := os.ReadFile(cfg.KnownHostsFile); err != nil || string(data) != srv.KnownHostsLine()+"\n" {
		t.Errorf("known_hosts = %q, %v; want %q", data, err, srv.KnownHostsLine()+"\n")
	}
	if err := dialErr(t, srv, cfg); err != nil {
		t.Errorf("the recorded key is not trusted: %v", err)
	}
}

func TestChangedHostKey(t *testing.T) {
	t.Parallel()
	other := sshtest.Start(t, "127.0.0.3")
	for _, tc := range []struct {
		name  string
		setup func(t *testing.T, srv *sshtest.Server, cfg ClientConfig) (known ssh.PublicKey)
	}{
		{"node reinstalled", func(t *testing.T, srv *sshtest.Server, cfg ClientConfig) ssh.PublicKey {
			old := srv.HostKey
			srv.RotateHostKey(t)
			return old
		}},
		{"wrong known_hosts line", func(t *testing.T, srv *sshtest.Server, cfg ClientConfig) ssh.PublicKey {
			line := knownhosts.Line([]string{srv.HostPort()}, other.HostKey)
			if err := os.WriteFile(cfg.KnownHostsFile, []byte("# cluster nodes\n"+line+"\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			return other.HostKey
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv, cfg := startNode(t, "127.0.0.2")
			known := tc.setup(t, srv, cfg)
			before, err := os.ReadFile(cfg.KnownHostsFile)
			if err != nil {
				t.Fatal(err)
			}
			for _, acceptNew := range []bool{false, true} {
				cfg.AcceptNewHostKeys = acceptNew
				err := dialErr(t, srv, cfg)
				var hk *HostKeyError
				if !errors.As(err, &hk) {
					t.Fatalf("AcceptNewHostKeys=%v: Dial error %v is not a *HostKeyError", acceptNew, err)
				}
				offered, knownFP := ssh.FingerprintSHA256(srv.HostKey), ssh.FingerprintSHA256(known)
				if hk.Kind != HostKeyChanged || hk.Fingerprint != offered || hk.Known != knownFP {
					t.Errorf("HostKeyError = %+v, want changed: known %s, offered %s", hk, knownFP, offered)
				}
				for _, s := range []string{srv.HostPort(), offered, knownFP, cfg.KnownHostsFile, "reinstalled"} {
					if !strings.Contains(err.Error(), s) {
						t.Errorf("message %q does not mention %q", err, s)
					}
				}
			}
			after, _ := os.ReadFile(cfg.KnownHostsFile)
			if string(after) != string(before) {
				t.Errorf("known_hosts changed from %q to %q", before, after)
			}
		})
	}
}

// TestKnownKeyTypeIsNegotiated checks that a host known by one of its
// several keys is accepted whichever type that is: the client must ask for
// the recorded type rather than its own first preference.
func TestKnownKeyTypeIsNegotiated(t *testing.T) {
	t.Parallel()
	srv, cfg := startNode(t, "127.0.0.3")
	for _, key := range srv.HostKeys {
		t.Run(key.Type(), func(t *testing.T) {
			line := knownhosts.Line([]string{srv.HostPort()}, key)
			if err := os.WriteFile(cfg.KnownHostsFile, []byte(line+"\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			if err := dialErr(t, srv, cfg); err != nil {
				t.Fatalf("Dial with only the %s key known: %v", key.Type(), err)
			}
		})
	}
}

func TestRevokedHostKey(t *testing.T) {
	t.Parallel()
	srv, cfg := startNode(t, "127.0.0.2")
	revoked := "@revoked * " + strings.TrimSpace(string(ssh.MarshalAuthorizedKey(srv.HostKey)))
	if err := os.WriteFile(cfg.KnownHostsFile, []byte(srv.KnownHostsLine()+"\n"+revoked+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg.AcceptNewHostKeys = true
	var hk *HostKeyError
	if err := dialErr(t, srv, cfg); !errors.As(err, &hk) || hk.Kind != HostKeyRevoked {
		t.Fatalf("Dial error %v, want a revoked *HostKeyError", err)
	}
}

func TestHostKeyErrorMessage(t *testing.T) {
	for _, tc := range []struct {
		err  HostKeyError
		want string
	}{
		{
			HostKeyError{Host: "127.0.0.2:2222", Kind: HostKeyUnknown, Fingerprint: "SHA256:new", KnownHostsFile: "/k"},
			"unknown host key for 127.0.0.2:2222 (SHA256:new); verify it and rerun with --accept-new-host-keys",
		},
		{
			HostKeyError{Host: "n1:22", Kind: HostKeyChanged, Fingerprint: "SHA256:B", Known: "SHA256:A", KnownLines: []int{7}, KnownHostsFile: "/k"},
			"host key for n1:22 changed: known SHA256:A, offered SHA256:B; if the node was reinstalled, remove its line from /k (line 7)",
		},
		{
			HostKeyError{Host: "n1:22", Kind: HostKeyChanged, Fingerprint: "SHA256:B", Known: "SHA256:A, SHA256:C", KnownLines: []int{2, 9}, KnownHostsFile: "/k"},
			"host key for n1:22 changed: known SHA256:A, SHA256:C, offered SHA256:B; if the node was reinstalled, remove its line from /k (lines 2, 9)",
		},
		{
			HostKeyError{Host: "n1:22", Kind: HostKeyRevoked, Fingerprint: "SHA256:B", KnownHostsFile: "/k"},
			"host key for n1:22 (SHA256:B) is marked @revoked in /k; refusing to connect",
		},
	} {
		if got := tc.err.Error(); got != tc.want {
			t.Errorf("Error() =\n%s\nwant\n%s", got, tc.want)
		}
	}
}

// testHostKeys returns an ed25519 and an ECDSA P-256 public key.
func testHostKeys(t *testing.T) (ed, ec ssh.PublicKey) {
	t.Helper()
	edPub, _, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	ecPriv, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	if ed, err = ssh.NewPublicKey(edPub); err != nil {
		t.Fatal(err)
	}
	if ec, err = ssh.NewPublicKey(&ecPriv.PublicKey); err != nil {
		t.Fatal(err)
	}
	return ed, ec
}

func TestAppendKnownHost(t *testing.T) {
	key, _ := testHostKeys(t)
	const hostport = "127.0.0.2:2222"
	for _, tc := range []struct {
		name, before string
	}{
		{"no file", ""},
		{"ends with newline", "# a\n"},
		{"no final newline", "# a"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := filepath.Join(t.TempDir(), "known_hosts")
			if tc.before != "" {
				if err := os.WriteFile(f, []byte(tc.before), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			if err := appendKnownHost(f, hostport, key); err != nil {
				t.Fatal(err)
			}
			got, _ := os.ReadFile(f)
			want := tc.before
			if want != "" && !strings.HasSuffix(want, "\n") {
				want += "\n"
			}
			want += "[127.0.0.2]:2222 " + string(ssh.MarshalAuthorizedKey(key))
			if string(got) != want {
				t.Errorf("known_hosts = %q, want %q", got, want)
			}
		})
	}
}

func TestAlgorithmsForKnownKeys(t *testing.T) {
	ed, ec := testHostKeys(t)
	const hostport = "127.0.0.3:2222"
	remote := &net.TCPAddr{IP: net.IPv4(127, 0, 0, 3), Port: 2222}
	dir := t.TempDir()
	for _, tc := range []struct {
		name  string
		lines []string
		want  []string
	}{
		{"unknown host", nil, hostKeyAlgorithms()},
		{"ed25519 known", []string{knownhosts.Line([]string{hostport}, ed)}, []string{ssh.KeyAlgoED25519}},
		{"ecdsa known", []string{knownhosts.Line([]string{hostport}, ec)}, []string{ssh.KeyAlgoECDSA256}},
		{"both known", []string{
			knownhosts.Line([]string{hostport}, ec),
			knownhosts.Line([]string{hostport}, ed),
		}, []string{ssh.KeyAlgoED25519, ssh.KeyAlgoECDSA256}},
		{"other host known", []string{knownhosts.Line([]string{"127.0.0.9:22"}, ec)}, hostKeyAlgorithms()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := filepath.Join(dir, strings.ReplaceAll(tc.name, " ", "_"))
			if tc.lines != nil {
				if err := os.WriteFile(f, []byte(strings.Join(tc.lines, "\n")+"\n"), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			k, err := loadKnownHosts(f, false)
			if err != nil {
				t.Fatal(err)
			}
			got := k.algorithms(hostport, remote)
			if strings.Join(got, ",") != strings.Join(tc.want, ",") {
				t.Errorf("algorithms = %v, want %v", got, tc.want)
			}
		})
	}
}
