package sshexec

import (
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"
)

// Kinds of [HostKeyError].
const (
	// HostKeyUnknown means the known_hosts file has no key for the host.
	HostKeyUnknown = "unknown"
	// HostKeyChanged means the known_hosts file has keys for the host and
	// the host offered a different one.
	HostKeyChanged = "changed"
	// HostKeyRevoked means the host offered a key that the known_hosts file
	// marks @revoked.
	HostKeyRevoked = "revoked"
)

// HostKeyError reports a host key that Dial refused: one not in the
// known_hosts file (and AcceptNewHostKeys not set), one that differs from
// the key recorded there, or one marked @revoked.
type HostKeyError struct {
	// Host is the address dialed, in host:port form.
	Host string
	// Kind is HostKeyUnknown, HostKeyChanged or HostKeyRevoked.
	Kind string
	// KeyType is the type of the key the host offered, e.g. "ssh-ed25519".
	KeyType string
	// Fingerprint is the SHA-256 fingerprint of the key the host offered,
	// as "SHA256:..." (the form ssh-keygen -l prints).
	Fingerprint string
	// Known holds, for HostKeyChanged, the fingerprints of the keys the
	// known_hosts file records for the host, separated by ", ".
	Known string
	// KnownLines holds, for HostKeyChanged, the line numbers of those keys
	// in KnownHostsFile.
	KnownLines []int
	// KnownHostsFile is the known_hosts file that was consulted.
	KnownHostsFile string
}

// Error says what went wrong and what to do about it.
func (e *HostKeyError) Error() string {
	switch e.Kind {
	case HostKeyUnknown:
		return fmt.Sprintf("unknown host key for %s (%s); verify it and rerun with --accept-new-host-keys",
			e.Host, e.Fingerprint)
	case HostKeyChanged:
		where := ""
		switch len(e.KnownLines) {
		case 0:
		case 1:
			where = fmt.Sprintf(" (line %d)", e.KnownLines[0])
		default:
			lines := make([]string, len(e.KnownLines))
			for i, l := range e.KnownLines {
				lines[i] = strconv.Itoa(l)
			}
			where = fmt.Sprintf(" (lines %s)", strings.Join(lines, ", "))
		}
		return fmt.Sprintf("host key for %s changed: known %s, offered %s; if the node was reinstalled, remove its line from %s%s",
			e.Host, e.Known, e.Fingerprint, e.KnownHostsFile, where)
	case HostKeyRevoked:
		return fmt.Sprintf("host key for %s (%s) is marked @revoked in %s; refusing to connect",
			e.Host, e.Fingerprint, e.KnownHostsFile)
	}
	return fmt.Sprintf("host key for %s (%s) refused: %s", e.Host, e.Fingerprint, e.Kind)
}

// hostKeyAlgorithms returns the plain (non-certificate) host key
// algorithms Dial negotiates, in order of preference: ed25519 first, as
// OpenSSH prefers, and no SHA-1 RSA signatures.
func hostKeyAlgorithms() []string {
	return []string{
		ssh.KeyAlgoED25519,
		ssh.KeyAlgoECDSA256,
		ssh.KeyAlgoECDSA384,
		ssh.KeyAlgoECDSA521,
		ssh.KeyAlgoRSASHA512,
		ssh.KeyAlgoRSASHA256,
	}
}

// algorithmsForKeyType returns the host key algorithms that produce
// signatures from a key of the given type.
func algorithmsForKeyType(keyType string) []string {
	if keyType == ssh.KeyAlgoRSA {
		return []string{ssh.KeyAlgoRSASHA512, ssh.KeyAlgoRSASHA256}
	}
	return []string{keyType}
}

// knownHosts checks host keys against one known_hosts file.
type knownHosts struct {
	file   string
	accept bool
	// acceptKey is the fingerprint of the one unknown key to accept.
	acceptKey string
	// check is the parsed file's callback; nil when the file does not
	// exist, in which case every host is unknown.
	check ssh.HostKeyCallback
}

// loadKnownHosts parses file. A missing file is an empty one.
func loadKnownHosts(file string, accept bool) (*knownHosts, error) {
	k := &knownHosts{file: file, accept: accept}
	cb, err := knownhosts.New(file)
	switch {
	case err == nil:
		k.check = cb
	case errors.Is(err, fs.ErrNotExist):
	default:
		return nil, fmt.Errorf("read known hosts: %w", err)
	}
	return k, nil
}

// algorithms returns the host key algorithms to negotiate with hostport.
// When the file knows keys for the host, only their types are offered:
// otherwise a server holding several host keys could present one of a type
// the file does not record, which would look like a changed key.
func (k *knownHosts) algorithms(hostport string, remote net.Addr) []string {
	all := hostKeyAlgorithms()
	known := k.knownKeys(hostport, remote)
	if len(known) == 0 {
		return all
	}
	var want []string
	for _, kk := range known {
		want = append(want, algorithmsForKeyType(kk.Key.Type())...)
	}
	pinned := slices.DeleteFunc(all, func(a string) bool { return !slices.Contains(want, a) })
	if len(pinned) == 0 {
		// Only key types we do not negotiate are known (ssh-dss, say); offer
		// everything and let the check report the mismatch.
		return hostKeyAlgorithms()
	}
	return pinned
}

// knownKeys returns the keys the file records for hostport, by checking a
// key that cannot be among them.
func (k *knownHosts) knownKeys(hostport string, remote net.Addr) []knownhosts.KnownKey {
	if k.check == nil {
		return nil
	}
	pub, _, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil
	}
	probe, err := ssh.NewPublicKey(pub)
	if err != nil {
		return nil
	}
	var ke *knownhosts.KeyError
	if errors.As(k.check(hostport, remote, probe), &ke) {
		return ke.Want
	}
	return nil
}

// hostKeyCallback returns the ssh.HostKeyCallback for one dial. A refusal
// is a *HostKeyError.
func (k *knownHosts) hostKeyCallback() ssh.HostKeyCallback {
	return func(hostport string, remote net.Addr, key ssh.PublicKey) error {
		var err error
		if k.check == nil {
			err = &knownhosts.KeyError{}
		} else {
			err = k.check(hostport, remote, key)
		}
		if err == nil {
			return nil
		}
		hkErr := &HostKeyError{
			Host:           hostport,
			KeyType:        key.Type(),
			Fingerprint:    ssh.FingerprintSHA256(key),
			KnownHostsFile: k.file,
		}
		var keyErr *knownhosts.KeyError
		var revoked *knownhosts.RevokedError
		switch {
		case errors.As(err, &revoked):
			hkErr.Kind = HostKeyRevoked
			return hkErr
		case errors.As(err, &keyErr) && len(keyErr.Want) == 0:
			if k.accept || k.acceptKey != "" && k.acceptKey == hkErr.Fingerprint {
				return appendKnownHost(k.file, hostport, key)
			}
			hkErr.Kind = HostKeyUnknown
			return hkErr
		case errors.As(err, &keyErr):
			hkErr.Kind = HostKeyChanged
			fps := make([]string, len(keyErr.Want))
			for i, w := range keyErr.Want {
				fps[i] = ssh.FingerprintSHA256(w.Key)
				hkErr.KnownLines = append(hkErr.KnownLines, w.Line)
			}
			hkErr.Known = strings.Join(fps, ", ")
			return hkErr
		}
		return fmt.Errorf("check host key of %s against %s: %w", hostport, k.file, err)
	}
}

// appendKnownHost records key for hostport at the end of file, creating
// the file (mode 0600) and its directory (0700) when missing. The line is
// written with a single append so that concurrent dials do not interleave.
func appendKnownHost(file, hostport string, key ssh.PublicKey) error {
	if err := os.MkdirAll(filepath.Dir(file), 0o700); err != nil {
		return fmt.Errorf("record host key of %s: %w", hostport, err)
	}
	f, err := os.OpenFile(file, os.O_RDWR|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("record host key of %s: %w", hostport, err)
	}
	line := knownhosts.Line([]string{hostport}, key) + "\n"
	// Do not glue the new line onto a last line without a newline.
	if fi, err := f.Stat(); err == nil && fi.Size() > 0 {
		last := make([]byte, 1)
		if _, err := f.ReadAt(last, fi.Size()-1); err == nil || errors.Is(err, io.EOF) {
			if last[0] != '\n' {
				line = "\n" + line
			}
		}
	}
	if _, err := f.WriteString(line); err != nil {
		f.Close()
		return fmt.Errorf("record host key of %s in %s: %w", hostport, file, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("record host key of %s in %s: %w", hostport, file, err)
	}
	return nil
}
