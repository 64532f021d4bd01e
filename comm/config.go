package comm

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"time"
)

// DefaultTimeout is the Timeout used when [Config.Timeout] is zero.
const DefaultTimeout = 30 * time.Second

// DefaultInitTimeout is the InitTimeout of [ConfigFromEnv] when
// GPTUI_COMM_INIT_TIMEOUT is unset: PyTorch's default for its process
// groups, 10 minutes.
const DefaultInitTimeout = 10 * time.Minute

// defaultChunkBytes is the size of the pieces large buffers are cut into on
// the wire, so that a ring forwards one piece while the next arrives.
const defaultChunkBytes = 1 << 20

// Config says how a process joins a World.
type Config struct {
	// Rank is this process's index, 0 ≤ Rank < WorldSize.
	Rank int
	// WorldSize is the number of processes in the job.
	WorldSize int
	// MasterAddr is the host (name or IP address) that rank 0 listens on
	// and the other ranks dial to register. Each rank's own mesh listener
	// uses the local address it reaches the master from, so MasterAddr
	// must be an address every rank can reach (127.0.0.1 for one host).
	MasterAddr string
	// MasterPort is the TCP port of MasterAddr.
	MasterPort int
	// Timeout bounds each wait for data inside an operation. A member that
	// is silent (no data and no heartbeat) for half of it is declared
	// failed. Zero means DefaultTimeout.
	Timeout time.Duration
	// InitTimeout bounds connecting (the whole of Connect): the ranks of
	// a job start at different times (a node that pulls its container, a
	// slow push). It is also the bound a data path over NCCL gives the
	// making of its communicators and their first operations (package
	// comm/nccl). Zero means Timeout; ConfigFromEnv gives
	// DefaultInitTimeout when GPTUI_COMM_INIT_TIMEOUT is unset.
	InitTimeout time.Duration

	// Secret is the job's secret, the same on every rank (SecretEnv):
	// every connection of the job proves that its peer holds it. Required
	// when WorldSize > 1.
	Secret []byte
	// Logf, if not nil, reports peers that were refused (they failed the
	// authentication): who, and why; after the first, those refused within
	// 10 s of a line are counted and reported as one line.
	Logf func(format string, args ...any)
	// chunkBytes overrides defaultChunkBytes (tests use tiny chunks to
	// exercise the pipelining with small buffers).
	chunkBytes int
}

// ConfigFromEnv reads a Config from the variables torchrun sets for each
// worker: RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT, the job's secret
// from GPTUI_JOB_SECRET (SecretEnv; required with WORLD_SIZE > 1), and the timeouts
// from GPTUI_COMM_TIMEOUT and GPTUI_COMM_INIT_TIMEOUT (Go durations such as
// "90s"; unset means DefaultTimeout and DefaultInitTimeout). An unset WORLD_SIZE means 1; RANK, MASTER_ADDR and
// MASTER_PORT may be left unset only when WORLD_SIZE is 1. Errors name the
// variable at fault.
func ConfigFromEnv() (Config, error) {
	return configFrom(os.LookupEnv)
}

// configFrom is ConfigFromEnv reading variables through lookup.
func configFrom(lookup func(string) (string, bool)) (Config, error) {
	var c Config
	intVar := func(name string, dst *int, required bool) error {
		v, ok := lookup(name)
		if !ok || v == "" {
			if required {
				return fmt.Errorf("comm: %s is not set", name)
			}
			return nil
		}
		n, err := strconv.Atoi(v)
		if err != nil {
			return fmt.Errorf("comm: %s=%q is not an integer", name, v)
		}
		*dst = n
		return nil
	}
	c.WorldSize = 1
	if err := intVar("WORLD_SIZE", &c.WorldSize, false); err != nil {
		return Config{}, err
	}
	if c.WorldSize < 1 {
		return Config{}, fmt.Errorf("comm: WORLD_SIZE=%d must be at least 1", c.WorldSize)
	}
	multi := c.WorldSize > 1
	if err := intVar("RANK", &c.Rank, multi); err != nil {
		return Config{}, err
	}
	if c.Rank < 0 || c.Rank >= c.WorldSize {
		return Config{}, fmt.Errorf("comm: RANK=%d is outside [0, WORLD_SIZE=%d)", c.Rank, c.WorldSize)
	}
	if v, ok := lookup("MASTER_ADDR"); ok && v != "" {
		c.MasterAddr = v
	} else if multi {
		return Config{}, errors.New("comm: MASTER_ADDR is not set")
	}
	if err := intVar("MASTER_PORT", &c.MasterPort, multi); err != nil {
		return Config{}, err
	}
	if c.MasterPort < 0 || c.MasterPort > 65535 || (multi && c.MasterPort == 0) {
		return Config{}, fmt.Errorf("comm: MASTER_PORT=%d is not a TCP port", c.MasterPort)
	}
	if v, ok := lookup(SecretEnv); ok && v != "" {
		c.Secret = []byte(v)
	} else if multi {
		return Config{}, ErrNoSecret
	}
	c.InitTimeout = DefaultInitTimeout
	for _, d := range []struct {
		env string
		dst *time.Duration
	}{{"GPTUI_COMM_TIMEOUT", &c.Timeout}, {"GPTUI_COMM_INIT_TIMEOUT", &c.InitTimeout}} {
		v, ok := lookup(d.env)
		if !ok || v == "" {
			continue
		}
		t, err := time.ParseDuration(v)
		if err != nil {
			return Config{}, fmt.Errorf("comm: %s=%q is not a duration (such as 90s or 5m)", d.env, v)
		}
		if t <= 0 {
			return Config{}, fmt.Errorf("comm: %s=%q must be positive", d.env, v)
		}
		*d.dst = t
	}
	return c, nil
}

// check validates c and fills in the defaults.
func (c Config) check() (Config, error) {
	switch {
	case c.WorldSize < 1:
		return c, fmt.Errorf("comm: world size %d must be at least 1", c.WorldSize)
	case c.Rank < 0 || c.Rank >= c.WorldSize:
		return c, fmt.Errorf("comm: rank %d is outside [0, %d)", c.Rank, c.WorldSize)
	case c.Timeout < 0 || c.InitTimeout < 0:
		return c, fmt.Errorf("comm: negative timeout %v or %v", c.Timeout, c.InitTimeout)
	case c.WorldSize > 1 && len(c.Secret) == 0:
		return c, ErrNoSecret
	case c.WorldSize > 1 && c.MasterAddr == "":
		return c, errors.New("comm: no master address")
	case c.WorldSize > 1 && (c.MasterPort <= 0 || c.MasterPort > 65535):
		return c, fmt.Errorf("comm: master port %d is not a TCP port", c.MasterPort)
	}
	if c.Timeout == 0 {
		c.Timeout = DefaultTimeout
	}
	if c.InitTimeout == 0 {
		c.InitTimeout = c.Timeout
	}
	if c.chunkBytes <= 0 {
		c.chunkBytes = defaultChunkBytes
	}
	c.chunkBytes = max(8, c.chunkBytes&^7) // whole float32s and float64s
	return c, nil
}
