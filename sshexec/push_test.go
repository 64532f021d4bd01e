package sshexec

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pkg/sftp"
)

// leftovers returns the temporary files Push left in dir.
func leftovers(t *testing.T, dir string) []string {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(dir, "*.tmp-*"))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func inode(t *testing.T, p string) uint64 {
	t.Helper()
	fi, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		t.Skip("no inode numbers on this system")
	}
	return st.Ino
}

func TestPush(t *testing.T) {
	t.Parallel()
	for _, addr := range testAddrs {
		t.Run(addr, func(t *testing.T) {
			t.Parallel()
			srv, cfg := startNode(t, addr)
			c := dial(t, srv, cfg)
			ctx := context.Background()

			localDir, remoteDir := t.TempDir(), t.TempDir()
			local := filepath.Join(localDir, "gptui")
			content := make([]byte, 1<<20+123)
			rand.Read(content)
			if err := os.WriteFile(local, content, 0o644); err != nil {
				t.Fatal(err)
			}
			// The server runs on this machine, so the remote path is
			// visible locally too. Parent directories do not exist yet; the
			// name needs quoting in a shell.
			dir := filepath.Join(remoteDir, "a b", "c'd")
			remote := filepath.Join(dir, "gptui $1")

			check := func(step string, wantSkipped bool, skipped bool, err error, want []byte, mode os.FileMode) {
				t.Helper()
				if err != nil {
					t.Fatalf("%s: Push: %v", step, err)
				}
				if skipped != wantSkipped {
					t.Errorf("%s: skipped = %v, want %v", step, skipped, wantSkipped)
				}
				got, err := os.ReadFile(remote)
				if err != nil || !bytes.Equal(got, want) {
					t.Errorf("%s: remote content differs (%d bytes, %v)", step, len(got), err)
				}
				if fi, err := os.Stat(remote); err != nil || fi.Mode().Perm() != mode {
					t.Errorf("%s: remote mode %v (%v), want %v", step, fi.Mode().Perm(), err, mode)
				}
				if l := leftovers(t, dir); len(l) != 0 {
					t.Errorf("%s: temporary files left: %v", step, l)
				}
			}

			skipped, err := c.Push(ctx, local, remote, 0o755)
			check("first push", false, skipped, err, content, 0o755)
			ino := inode(t, remote)

			start := time.Now()
			skipped, err = c.Push(ctx, local, remote, 0o755)
			check("same content", true, skipped, err, content, 0o755)
			t.Logf("unchanged push of %d bytes skipped in %v", len(content), time.Since(start))
			if inode(t, remote) != ino {
				t.Error("same content: remote file was replaced")
			}

			skipped, err = c.Push(ctx, local, remote, 0o700)
			check("mode only", true, skipped, err, content, 0o700)

			content[len(content)/2] ^= 0xff // same size, different content
			if err := os.WriteFile(local, content, 0o644); err != nil {
				t.Fatal(err)
			}
			skipped, err = c.Push(ctx, local, remote, 0o755)
			check("changed content", false, skipped, err, content, 0o755)
			if inode(t, remote) == ino {
				t.Error("changed content: remote file was rewritten in place, not replaced")
			}

			content = content[:1000]
			if err := os.WriteFile(local, content, 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(local, 0o600); err != nil {
				t.Fatal(err)
			}
			skipped, err = c.Push(ctx, local, remote, 0)
			check("shorter, local mode", false, skipped, err, content, 0o600)

			empty := filepath.Join(localDir, "empty")
			if err := os.WriteFile(empty, nil, 0o644); err != nil {
				t.Fatal(err)
			}
			skipped, err = c.Push(ctx, empty, remote, 0o644)
			check("empty", false, skipped, err, nil, 0o644)
		})
	}
}

func TestPushErrors(t *testing.T) {
	t.Parallel()
	srv, cfg := startNode(t, "127.0.0.2")
	c := dial(t, srv, cfg)
	local := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(local, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	remoteDir := t.TempDir()
	for _, tc := range []struct {
		name, local, remote, want string
	}{
		{"missing local file", local + ".absent", filepath.Join(remoteDir, "f"), "no such file"},
		{"local directory", remoteDir, filepath.Join(remoteDir, "f"), "not a regular file"},
		{"remote directory", local, remoteDir, "is a directory"},
		{"remote parent is a file", local, filepath.Join(local, "f"), "create remote directory"},
		{"empty remote path", local, "", "must name a file"},
		{"remote path ends in a slash", local, remoteDir + "/", "must name a file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := c.Push(context.Background(), tc.local, tc.remote, 0o644)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Push error %v, want one containing %q", err, tc.want)
			}
		})
	}
}

func TestPushCancel(t *testing.T) {
	t.Parallel()
	srv, cfg := startNode(t, "127.0.0.3")
	c := dial(t, srv, cfg)
	local := filepath.Join(t.TempDir(), "big")
	if err := os.WriteFile(local, bytes.Repeat([]byte("gptui"), 40<<20/5), 0o644); err != nil {
		t.Fatal(err)
	}
	remoteDir := t.TempDir()
	remote := filepath.Join(remoteDir, "big")

	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(50*time.Millisecond, cancel)
	start := time.Now()
	_, err := c.Push(ctx, local, remote, 0o644)
	d := time.Since(start)
	t.Logf("Push returned %v after %v", err, d)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Push = %v, want context.Canceled (40 MB pushed in under 50ms?)", err)
	}
	if d > 2*time.Second {
		t.Errorf("Push returned %v after cancellation", d)
	}
	if _, err := os.Stat(remote); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("remote file exists after a cancelled push: %v", err)
	}
	if l := leftovers(t, remoteDir); len(l) != 0 {
		t.Errorf("temporary files left: %v", l)
	}
}

// TestRemoteSHA256 checks both ways of hashing a remote file.
func TestRemoteSHA256(t *testing.T) {
	t.Parallel()
	srv, cfg := startNode(t, "127.0.0.2")
	c := dial(t, srv, cfg)
	dir := t.TempDir()
	for _, name := range []string{"plain", "with space", "it's", "-dash", "back\\slash"} {
		p := filepath.Join(dir, name)
		data := []byte("content of " + name)
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256(data)
		want := hex.EncodeToString(sum[:])

		got, err := c.remoteSHA256(context.Background(), p)
		if err != nil || got != want {
			t.Errorf("sha256sum of %q = %s, %v; want %s", name, got, err, want)
		}
		err = c.withSFTP(context.Background(), func(sc *sftp.Client) (err error) {
			got, err = sftpSHA256(context.Background(), sc, p)
			return err
		})
		if err != nil || got != want {
			t.Errorf("SFTP read-back hash of %q = %s, %v; want %s", name, got, err, want)
		}
	}
}

func TestShellQuote(t *testing.T) {
	t.Parallel()
	srv, cfg := startNode(t, "127.0.0.3")
	c := dial(t, srv, cfg)
	for _, tc := range []struct{ in, want string }{
		{"/a/b", "/a/b"},
		{"a b", "a b"},
		{"it's", "it's"},
		{"$HOME `id` $(id)", "$HOME `id` $(id)"},
		{"'", "'"},
		{"-n", "./-n"},
		{"x\ny", "x\ny"},
	} {
		var out bytes.Buffer
		if _, err := c.Run(context.Background(), "printf %s "+shellQuote(tc.in), &out, nil); err != nil || out.String() != tc.want {
			t.Errorf("printf %%s %s printed %q (%v), want %q", shellQuote(tc.in), out.String(), err, tc.want)
		}
	}
}

func TestParseSHA256Sum(t *testing.T) {
	const h = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
	for _, tc := range []struct {
		out, want string
		ok        bool
	}{
		{h + "  /x\n", h, true},
		{`\` + h + `  /a\\b` + "\n", h, true},
		{strings.ToUpper(h) + "  x", h, true},
		{"", "", false},
		{"sha256sum: x: No such file or directory", "", false},
		{h[:60] + "  x", "", false},
	} {
		got, err := parseSHA256Sum(tc.out)
		if got != tc.want || (err == nil) != tc.ok {
			t.Errorf("parseSHA256Sum(%q) = %q, %v; want %q, ok %v", tc.out, got, err, tc.want, tc.ok)
		}
	}
}

func TestRemotePath(t *testing.T) {
	for in, want := range map[string]string{
		"~/run/gptui": "run/gptui",
		"/opt/gptui":  "/opt/gptui",
		"rel/x":       "rel/x",
		"~user/x":     "~user/x",
	} {
		if got := remotePath(in); got != want {
			t.Errorf("remotePath(%q) = %q, want %q", in, got, want)
		}
	}
}
