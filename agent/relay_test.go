package agent

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// relayUnderTest is a ServeFiles run by a test: grants go to in, reports
// come from lines.
type relayUnderTest struct {
	in    *io.PipeWriter
	lines chan string
	port  int
	done  chan error
}

func startRelay(t *testing.T) *relayUnderTest {
	t.Helper()
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	r := &relayUnderTest{in: inW, lines: make(chan string, 100), done: make(chan error, 1)}
	go func() {
		err := ServeFiles(context.Background(), inR, outW)
		outW.Close()
		r.done <- err
	}()
	go func() {
		sc := bufio.NewScanner(outR)
		for sc.Scan() {
			r.lines <- sc.Text()
		}
		close(r.lines)
	}()
	l := r.next(t)
	if _, err := fmt.Sscanf(l, "listening %d", &r.port); err != nil {
		t.Fatalf("first line %q: %v", l, err)
	}
	t.Cleanup(func() {
		inW.Close()
		select {
		case err := <-r.done:
			if err != nil {
				t.Errorf("ServeFiles: %v", err)
			}
		case <-time.After(5 * time.Second):
			t.Errorf("ServeFiles did not return after the end of its input")
		}
	})
	return r
}

// next returns the next report.
func (r *relayUnderTest) next(t *testing.T) string {
	t.Helper()
	select {
	case l, ok := <-r.lines:
		if !ok {
			t.Fatal("ServeFiles ended its reports")
		}
		return l
	case <-time.After(10 * time.Second):
		t.Fatal("no report from ServeFiles within 10 s")
	}
	return ""
}

// fetch connects, sends token and a newline, and returns what came back.
func (r *relayUnderTest) fetch(t *testing.T, token string) []byte {
	t.Helper()
	c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", r.port))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, token+"\n"); err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(c)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func testToken() string {
	b := make([]byte, 32)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// TestServeFiles: a granted token gets the file's bytes, once; a token not
// granted and a used one get nothing; each transfer is reported.
func TestServeFiles(t *testing.T) {
	dir := t.TempDir()
	content := bytes.Repeat([]byte("relay "), 700_000) // 4.2 MB: several chunks
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, content, 0o644); err != nil {
		t.Fatal(err)
	}
	r := startRelay(t)
	tok := testToken()
	fmt.Fprintf(r.in, "grant 7 %s %s\n", tok, file)
	if l := r.next(t); l != "granted 7" {
		t.Errorf("report %q, want granted 7", l)
	}

	if got := r.fetch(t, testToken()); len(got) != 0 {
		t.Errorf("a token not granted got %d bytes", len(got))
	}
	if l := r.next(t); !strings.HasPrefix(l, "refused 127.0.0.1:") || !strings.HasSuffix(l, "a token not granted") {
		t.Errorf("report %q, want a refusal", l)
	}
	if got := r.fetch(t, tok); !bytes.Equal(got, content) {
		t.Errorf("the granted token got %d bytes, want the file's %d", len(got), len(content))
	}
	if l := r.next(t); l != fmt.Sprintf("sending 7 %d", len(content)) {
		t.Errorf("report %q, want sending", l)
	}
	var last string
	for last = r.next(t); strings.HasPrefix(last, "progress 7 "); last = r.next(t) {
	}
	if want := fmt.Sprintf("sent 7 %d", len(content)); last != want {
		t.Errorf("report %q, want %q", last, want)
	}
	if got := r.fetch(t, tok); len(got) != 0 {
		t.Errorf("a used token got %d bytes", len(got))
	}
	if l := r.next(t); !strings.HasSuffix(l, "a token not granted") {
		t.Errorf("report %q, want a refusal", l)
	}

	// A grant of a file that is not there: the connection gets nothing,
	// and the failure is reported.
	tok = testToken()
	fmt.Fprintf(r.in, "grant 8 %s %s\n", tok, filepath.Join(dir, "missing"))
	if l := r.next(t); l != "granted 8" {
		t.Errorf("report %q, want granted 8", l)
	}
	if got := r.fetch(t, tok); len(got) != 0 {
		t.Errorf("a missing file sent %d bytes", len(got))
	}
	if l := r.next(t); !strings.HasPrefix(l, "failed 8 ") {
		t.Errorf("report %q, want failed 8", l)
	}
}

// TestServeFilesBadGrant: a grant line that is not one is reported.
func TestServeFilesBadGrant(t *testing.T) {
	r := startRelay(t)
	fmt.Fprintf(r.in, "grant 1 short /etc/hostname\n")
	if l := r.next(t); !strings.HasPrefix(l, "bad-grant ") {
		t.Errorf("report %q, want bad-grant", l)
	}
}
