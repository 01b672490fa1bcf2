// Package dist is data-parallel training's plumbing: a process group of one
// process per device, joined through a small TCP rendezvous the way torchrun
// and Kubernetes' PyTorchJob launch jobs (RANK, WORLD_SIZE, LOCAL_RANK,
// MASTER_ADDR, MASTER_PORT; under torchrun, through its agent's TCPStore),
// collectives over it (NCCL on CUDA devices; the rendezvous's own
// connections on the CPU), and the Reducer that averages a step's
// gradients in buckets.
//
// The rendezvous connections also watch the job: when a rank dies, its
// connection closes, every other rank's group fails with an error naming
// it, and NCCL's queued work is aborted (ncclCommAbort), so no rank hangs in
// a collective that can never finish.
package dist

import (
	"fmt"
	"net"
	"strconv"
	"time"
)

// Config says where a process stands in a job.
type Config struct {
	Rank      int    // this process's rank, 0 ≤ Rank < Size
	Size      int    // the number of processes (WORLD_SIZE)
	LocalRank int    // the rank among this node's processes: its device's index
	Addr      string // host:port of rank 0's rendezvous (MASTER_ADDR:MASTER_PORT); port 0 with a Store: one the system picks
	// Store, if set, is the host:port of a TCPStore (torchrun's agent
	// store) through which the ranks meet: rank 0 publishes its
	// rendezvous address under StoreKey, the others read it there (Note
	// [torchrun's store]).
	Store, StoreKey string
	// Timeout bounds joining, each barrier and each collective over the
	// rendezvous, and how long a rank waits for the others at the end
	// (DefaultTimeout when 0).
	Timeout time.Duration
}

// DefaultTimeout is PyTorch's default for its process groups.
const DefaultTimeout = 10 * time.Minute

// ConfigFromEnv reads a job's place from the variables torchrun (and
// PyTorchJob, and train -nproc) set, through getenv: the library reads no
// environment itself, the commands pass os.Getenv. ok is false when
// WORLD_SIZE is unset (not a distributed job). LOCAL_RANK defaults to RANK,
// MASTER_ADDR to 127.0.0.1; MASTER_PORT has no default. Under torchrun
// (TORCHELASTIC_USE_AGENT_STORE=True) MASTER_ADDR:MASTER_PORT is the
// agent's TCPStore, through which the ranks meet, under a key of the run
// (TORCHELASTIC_RUN_ID) and its attempt (TORCHELASTIC_RESTART_COUNT): see
// Note [torchrun's store].
func ConfigFromEnv(getenv func(string) string) (cfg Config, ok bool, err error) {
	ws := getenv("WORLD_SIZE")
	if ws == "" {
		return Config{}, false, nil
	}
	num := func(name, v string) int {
		n, e := strconv.Atoi(v)
		if e != nil && err == nil {
			err = fmt.Errorf("%s=%q is not a number", name, v)
		}
		return n
	}
	cfg.Size = num("WORLD_SIZE", ws)
	cfg.Rank = num("RANK", getenv("RANK"))
	cfg.LocalRank = cfg.Rank
	if v := getenv("LOCAL_RANK"); v != "" {
		cfg.LocalRank = num("LOCAL_RANK", v)
	}
	host, port := getenv("MASTER_ADDR"), getenv("MASTER_PORT")
	if host == "" {
		host = "127.0.0.1"
	}
	if port == "" && err == nil {
		err = fmt.Errorf("MASTER_PORT is not set (WORLD_SIZE=%s): it is the port of rank 0's rendezvous", ws)
	}
	cfg.Addr = net.JoinHostPort(host, port)
	if getenv("TORCHELASTIC_USE_AGENT_STORE") == "True" && port != "" {
		cfg.Store, cfg.Addr = cfg.Addr, net.JoinHostPort(host, "0")
		cfg.StoreKey = fmt.Sprintf("leangrad/%s/%s/rendezvous", getenv("TORCHELASTIC_RUN_ID"), getenv("TORCHELASTIC_RESTART_COUNT"))
	}
	if err == nil {
		err = cfg.Check()
	}
	return cfg, true, err
}

// Check reports what is wrong with cfg, naming the values.
func (c Config) Check() error {
	switch {
	case c.Size < 1:
		return fmt.Errorf("a job of %d processes (WORLD_SIZE)", c.Size)
	case c.Rank < 0 || c.Rank >= c.Size:
		return fmt.Errorf("rank %d (RANK) outside a job of %d processes (WORLD_SIZE)", c.Rank, c.Size)
	case c.LocalRank < 0:
		return fmt.Errorf("local rank %d (LOCAL_RANK)", c.LocalRank)
	}
	if _, _, err := net.SplitHostPort(c.Addr); err != nil {
		return fmt.Errorf("rendezvous address %q (MASTER_ADDR:MASTER_PORT): %v", c.Addr, err)
	}
	if _, _, err := net.SplitHostPort(c.Store); c.Store != "" && err != nil {
		return fmt.Errorf("store address %q (MASTER_ADDR:MASTER_PORT): %v", c.Store, err)
	}
	return nil
}

func (c Config) timeout() time.Duration {
	if c.Timeout <= 0 {
		return DefaultTimeout
	}
	return c.Timeout
}
