package comm

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
)

// SecretEnv is the environment variable that carries a job's secret to
// its workers (ConfigFromEnv reads it). The launchers (gptui run, the
// terminal UI, the node agents) make a new secret for every job and hand it
// only to the processes they start: through the environment locally, and
// inside the job spec on the agent's SSH session for remote nodes — never
// over the job's own network and never in a file.
const SecretEnv = "GPTUI_JOB_SECRET"

// ErrNoSecret is the error of a multi-rank Config without a Secret.
var ErrNoSecret = errors.New("comm: no job secret: " + SecretEnv + " is not set; start the ranks with 'gptui run', which makes one, or give every rank the same random value")

// NewSecret returns a new random job secret: 32 bytes from crypto/rand, in
// hex.
func NewSecret() (string, error) {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("comm: making a job secret: %w", err)
	}
	return hex.EncodeToString(b[:]), nil
}

// nonceBytes is the size of the random challenges each side sends.
const nonceBytes = 32

// newNonce returns a fresh random challenge.
func newNonce() []byte {
	b := make([]byte, nonceBytes)
	rand.Read(b)
	return b
}

// Labels keep the MACs of the three proofs apart, so that none can be
// replayed as another.
const (
	labelMaster = "gptui-comm master"
	labelRank   = "gptui-comm rank"
	labelMesh   = "gptui-comm mesh"
)

// mac is HMAC-SHA256 under secret of label and parts, each part preceded
// by its length so that no two lists of parts encode alike.
func mac(secret []byte, label string, parts ...[]byte) []byte {
	h := hmac.New(sha256.New, secret)
	for _, p := range append([][]byte{[]byte(label)}, parts...) {
		h.Write(binary.LittleEndian.AppendUint32(nil, uint32(len(p))))
		h.Write(p)
	}
	return h.Sum(nil)
}

// u32 encodes n for a MAC's parts.
func u32(n int) []byte { return binary.LittleEndian.AppendUint32(nil, uint32(n)) }

// joinMACs returns the master's and the rank's proofs of the join of
// rank (mesh listener addr) to a world of size world, given both sides'
// nonces: each proves that its sender knows the job's secret, over
// challenges the other side chose.
func joinMACs(secret, rankNonce, masterNonce []byte, rank, world int, addr string) (master, ofRank []byte) {
	parts := [][]byte{[]byte(protocolVersion), rankNonce, masterNonce, u32(rank), u32(world), []byte(addr)}
	return mac(secret, labelMaster, parts...), mac(secret, labelRank, parts...)
}

// meshMAC is the proof of a mesh connection from rank to the rank that
// sent nonce, within the job whose master handed out token.
func meshMAC(secret []byte, token string, nonce []byte, rank int) []byte {
	return mac(secret, labelMesh, []byte(token), nonce, u32(rank))
}

// decodeHex decodes a hex field of n bytes from an unauthenticated peer.
func decodeHex(s string, n int) ([]byte, bool) {
	if len(s) != 2*n {
		return nil, false
	}
	b, err := hex.DecodeString(s)
	return b, err == nil
}
