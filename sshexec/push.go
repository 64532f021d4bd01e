package sshexec

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"strings"
	"time"

	"github.com/gptui/gptui/internal/ctxio"
	"github.com/pkg/sftp"
)

// Push copies the local file to the remote path over SFTP, unless the
// remote file already has the same content, and reports whether it skipped
// the copy.
//
// remote is a slash-separated path on the node, absolute or relative to the
// login directory ("~/" is accepted as a prefix for the latter). mode is
// the remote file's permission bits; 0 means the local file's.
//
// Content is compared by SHA-256. The remote hash is computed on the node
// by running `sha256sum` (so checking a large, unchanged file costs no
// transfer); when the node has no sha256sum (exit status 127) the file is
// read back over SFTP and hashed locally instead. A remote file of another
// size is known to differ without hashing. When the content matches but
// the mode does not, the mode is corrected and the push still counts as
// skipped.
//
// Otherwise the parent directories are created, the content is written to
// remote+".tmp-<random>", synced (fsync@openssh.com, where the server has
// it), closed, given its mode and renamed over remote
// (posix-rename@openssh.com, atomic), so that a reader on the node sees
// the old file or the new one, never a partial one. Finally the remote
// hash is computed again and must equal the local one.
//
// Push uses one session at a time (SFTP, or a command for the hash); the
// end of ctx closes it, aborting the transfer, and the temporary file is
// then removed as far as possible.
func (c *Client) Push(ctx context.Context, local, remote string, mode os.FileMode) (skipped bool, err error) {
	remote = remotePath(remote)
	defer func() {
		if err != nil {
			if ctxErr := ctx.Err(); ctxErr != nil && !errors.Is(err, ctxErr) {
				err = fmt.Errorf("%w (%v)", ctxErr, err)
			}
			err = fmt.Errorf("push %s to %s:%s: %w", local, c.addr, remote, err)
		}
	}()

	if remote == "" || strings.HasSuffix(remote, "/") {
		return false, errors.New("remote path must name a file")
	}
	lf, err := os.Open(local)
	if err != nil {
		return false, err
	}
	defer lf.Close()
	lfi, err := lf.Stat()
	if err != nil {
		return false, err
	}
	if !lfi.Mode().IsRegular() {
		return false, fmt.Errorf("%s is not a regular file", local)
	}
	if mode == 0 {
		mode = lfi.Mode()
	}
	mode = mode.Perm()
	want, err := hashReader(ctx, lf)
	if err != nil {
		return false, fmt.Errorf("hash %s: %w", local, err)
	}

	// What is there now? (Each step below holds one session at a time, so
	// that concurrent pushes cannot take all of a Client's sessions and
	// then wait on each other for more.)
	var rfi os.FileInfo
	err = c.withSFTP(ctx, func(sc *sftp.Client) error {
		fi, err := sc.Stat(remote)
		switch {
		case err == nil:
			rfi = fi
		case !errors.Is(err, fs.ErrNotExist):
			return fmt.Errorf("stat remote file: %w", err)
		}
		return nil
	})
	if err != nil {
		return false, err
	}
	if rfi != nil && rfi.IsDir() {
		return false, errors.New("remote path is a directory")
	}
	if rfi != nil && rfi.Mode().IsRegular() && rfi.Size() == lfi.Size() {
		got, err := c.remoteSHA256(ctx, remote)
		if err != nil {
			return false, err
		}
		if got == want {
			if rfi.Mode().Perm() != mode {
				err := c.withSFTP(ctx, func(sc *sftp.Client) error { return sc.Chmod(remote, mode) })
				if err != nil {
					return false, fmt.Errorf("chmod: %w", err)
				}
			}
			return true, nil
		}
	}

	tmp := remote + ".tmp-" + randomSuffix()
	err = c.withSFTP(ctx, func(sc *sftp.Client) error {
		if dir := path.Dir(remote); rfi == nil && dir != "." && dir != "/" {
			if err := sc.MkdirAll(dir); err != nil {
				return fmt.Errorf("create remote directory %s: %w", dir, err)
			}
		}
		err := upload(ctx, sc, lf, tmp, mode, want)
		if err == nil {
			if err = rename(sc, tmp, remote); err != nil {
				err = fmt.Errorf("rename %s over %s: %w", tmp, remote, err)
			}
		}
		if err != nil && ctx.Err() == nil {
			_ = sc.Remove(tmp)
		}
		return err
	})
	if err != nil {
		if ctx.Err() != nil {
			c.removeTemp(ctx, tmp)
		}
		return false, err
	}
	got, err := c.remoteSHA256(ctx, remote)
	if err != nil {
		return false, fmt.Errorf("verify: %w", err)
	}
	if got != want {
		return false, fmt.Errorf("verify: remote SHA-256 %s, local %s", got, want)
	}
	return false, nil
}

// pushConcurrency is how many SFTP writes of 32 KiB an upload keeps in
// flight: 512 KiB, a quarter of the 2 MiB channel window OpenSSH's server
// advertises. With pkg/sftp's default, 64, which fills that window, a
// push of gptui's 32 MB binary to a node on a new connection took 1.2 s
// and 1.2-1.5 s of the machine's CPU (loopback sshd, 2 cores; perf put
// most of it in sshd's memmove), against 0.37 s and 0.4 s at 16; 8 was no
// faster, 32 took 0.53 s. 512 KiB in flight still fills a 1 ms round trip
// at 500 MB/s.
const pushConcurrency = 16

// upload writes lf's content to the new remote file tmp with mode, and
// checks that what was sent hashes to want.
func upload(ctx context.Context, sc *sftp.Client, lf *os.File, tmp string, mode os.FileMode, want string) error {
	if _, err := lf.Seek(0, io.SeekStart); err != nil {
		return err
	}
	f, err := sc.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL)
	if err != nil {
		return fmt.Errorf("create %s: %w", tmp, err)
	}
	h := sha256.New()
	_, err = f.ReadFromWithConcurrency(io.TeeReader(ctxio.Reader(ctx, lf), h), pushConcurrency)
	if err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", tmp, err)
	}
	if err := f.Sync(); err != nil && !isUnsupported(err) {
		f.Close()
		return fmt.Errorf("sync %s: %w", tmp, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("close %s: %w", tmp, err)
	}
	if sent := hex.EncodeToString(h.Sum(nil)); sent != want {
		return errors.New("local file changed while it was being pushed")
	}
	if err := sc.Chmod(tmp, mode); err != nil {
		return fmt.Errorf("chmod %s: %w", tmp, err)
	}
	return nil
}

// rename moves tmp over remote, atomically where the server has
// posix-rename@openssh.com (OpenSSH has since 5.1). Otherwise remote is
// removed first, as plain SFTP rename refuses to replace a file.
func rename(sc *sftp.Client, tmp, remote string) error {
	err := sc.PosixRename(tmp, remote)
	if err == nil || !isUnsupported(err) {
		return err
	}
	if err := sc.Remove(remote); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return sc.Rename(tmp, remote)
}

// removeTemp removes a temporary file left by a push that ctx ended, with
// a command given its own short deadline.
func (c *Client) removeTemp(ctx context.Context, tmp string) {
	rmCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	_, _ = c.Run(rmCtx, "rm -f "+shellQuote(tmp), nil, nil)
}

// withSFTP runs fn with an SFTP client on a session of its own, which is
// closed when fn returns or ctx ends (aborting what fn is doing).
func (c *Client) withSFTP(ctx context.Context, fn func(sc *sftp.Client) error) error {
	s, release, err := c.openSession(ctx, c.slots)
	if err != nil {
		return fmt.Errorf("start SFTP: %w", err)
	}
	defer release()
	defer s.Close()
	stop := context.AfterFunc(ctx, func() { s.Close() })
	defer stop()
	w, err := s.StdinPipe()
	if err != nil {
		return fmt.Errorf("start SFTP on %s: %w", c.addr, err)
	}
	r, err := s.StdoutPipe()
	if err != nil {
		return fmt.Errorf("start SFTP on %s: %w", c.addr, err)
	}
	if err := s.RequestSubsystem("sftp"); err != nil {
		return fmt.Errorf("start SFTP on %s: %w", c.addr, err)
	}
	sc, err := sftp.NewClientPipe(r, w)
	if err != nil {
		return fmt.Errorf("start SFTP on %s: %w", c.addr, err)
	}
	defer sc.Close()
	return fn(sc)
}

// remoteSHA256 returns the hex SHA-256 of the remote file p: computed on
// the node with sha256sum, or, where that command is missing, by reading the
// file back over SFTP.
func (c *Client) remoteSHA256(ctx context.Context, p string) (string, error) {
	var stdout, stderr bytes.Buffer
	code, err := c.Run(ctx, "sha256sum "+shellQuote(p), &stdout, &stderr)
	if err != nil {
		return "", fmt.Errorf("remote sha256sum: %w", err)
	}
	switch code {
	case 0:
		return parseSHA256Sum(stdout.String())
	case 127:
		var sum string
		err := c.withSFTP(ctx, func(sc *sftp.Client) (err error) {
			sum, err = sftpSHA256(ctx, sc, p)
			return err
		})
		return sum, err
	}
	return "", fmt.Errorf("remote sha256sum exited with status %d: %s", code, strings.TrimSpace(stderr.String()))
}

// sftpSHA256 reads the remote file p over SFTP and hashes it.
func sftpSHA256(ctx context.Context, sc *sftp.Client, p string) (string, error) {
	f, err := sc.Open(p)
	if err != nil {
		return "", fmt.Errorf("read back %s: %w", p, err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := f.WriteTo(ctxio.Writer(ctx, h)); err != nil {
		return "", fmt.Errorf("read back %s: %w", p, err)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// parseSHA256Sum extracts the hash from sha256sum's output line
// "<hex>  <name>", where GNU coreutils prefixes the line with a backslash
// when the name has special characters.
func parseSHA256Sum(out string) (string, error) {
	fields := strings.Fields(out)
	if len(fields) == 0 {
		return "", errors.New("remote sha256sum printed nothing")
	}
	sum := strings.ToLower(strings.TrimPrefix(fields[0], `\`))
	if b, err := hex.DecodeString(sum); err != nil || len(b) != sha256.Size {
		return "", fmt.Errorf("remote sha256sum printed %q, not a SHA-256", strings.TrimSpace(out))
	}
	return sum, nil
}

// hashReader returns the hex SHA-256 of r, stopping early if ctx ends.
func hashReader(ctx context.Context, r io.Reader) (string, error) {
	h := sha256.New()
	if _, err := io.Copy(h, ctxio.Reader(ctx, r)); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// remotePath turns "~/x" into "x": SFTP and commands both start in the
// login directory, and neither expands "~" inside a quoted path.
func remotePath(p string) string {
	if rest, ok := strings.CutPrefix(p, "~/"); ok {
		return rest
	}
	return p
}

// shellQuote quotes p as one word for a POSIX shell. A relative path
// starting with "-" is prefixed with "./" so that it is not an option.
func shellQuote(p string) string {
	if strings.HasPrefix(p, "-") {
		p = "./" + p
	}
	return "'" + strings.ReplaceAll(p, "'", `'\''`) + "'"
}

// randomSuffix returns 12 random hex digits for a temporary file name.
func randomSuffix() string {
	b := make([]byte, 6)
	_, _ = rand.Read(b) // crypto/rand.Read never fails
	return hex.EncodeToString(b)
}

// isUnsupported reports whether an SFTP error says the server lacks the
// operation (for example fsync@openssh.com).
func isUnsupported(err error) bool {
	var se *sftp.StatusError
	return errors.As(err, &se) && se.FxCode() == sftp.ErrSSHFxOpUnsupported
}
