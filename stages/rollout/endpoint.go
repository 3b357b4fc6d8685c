package rollout

import (
	"errors"
	"fmt"
	"net"
	"sync"
	"syscall"
	"time"

	"github.com/kilnrl/kiln/formats/records"
)

// An agent is untrusted code, and its endpoint socket is served by the
// stage's own process: every connection it opens is a descriptor of
// kiln-rollout's. So that one agent cannot exhaust them (and with them the
// engines' connections, the store's files and every other run), each
// sandbox's endpoint holds at most a fixed number of connections at once,
// a connection must send its request head within endpointHeaderTimeout,
// and an agent that opens more than its share has its run aborted
// (AbortEndpointFlood): no real agent holds that many model calls open at
// once. The share comes from the stage's descriptor limit, raised to its
// hard limit at start (raiseNoFile), less what the stage keeps for itself
// (docs/rollout.md §2.3).
const (
	// endpointHeaderTimeout bounds how long a connection may take to send
	// a request's head: an agent's HTTP client sends it at once, so a
	// connection still short of it is idle or hostile and is closed early.
	endpointHeaderTimeout = 10 * time.Second
	// endpointMaxConns and endpointMinConns bound one sandbox's share.
	endpointMaxConns = 128
	endpointMinConns = 16
	// reservedFDs is what the stage keeps for itself whatever the agents
	// do (store, engines, logs, the Go runtime), and reservedPerRun what
	// each run's sandbox needs besides its endpoint (the helper's pipes,
	// the cgroup, artifacts, the engine calls its model turns make).
	reservedFDs    = 256
	reservedPerRun = 32
)

// AbortEndpointFlood is the abort reason of a run whose agent opened more
// connections to its endpoint at once than its share.
const AbortEndpointFlood = records.AbortEndpointFlood

// endpointFloodError is the cause of a run ended because its agent opened
// more connections to its endpoint at once than its share.
type endpointFloodError struct{ max int }

func (e *endpointFloodError) Error() string {
	return fmt.Sprintf("the agent opened more than %d connections to its model endpoint at once (its share of kiln-rollout's file descriptors; no agent needs that many model calls open): the run was stopped so it cannot starve the others", e.max)
}

// raiseNoFile raises the process's soft limit on open files to its hard
// limit and returns the limit in force. Go's runtime does the same at
// start; doing it here states the contract, and covers a process whose
// limit was lowered since.
func raiseNoFile() (uint64, error) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return 0, fmt.Errorf("reading the open-files limit: %w", err)
	}
	if lim.Cur < lim.Max {
		lim.Cur = lim.Max
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
			return 0, fmt.Errorf("raising the open-files limit to %d: %w", lim.Max, err)
		}
	}
	return lim.Cur, nil
}

// endpointShare is the number of connections one sandbox's endpoint may
// hold at once when jobs sandboxes run under an open-files limit of
// limit: what is left after the stage's reserve, split evenly, within
// [endpointMinConns, endpointMaxConns]. enough is false when the limit is
// too low to give every sandbox the minimum on top of the reserve.
func endpointShare(limit uint64, jobs int) (share int, enough bool) {
	jobs = max(jobs, 1)
	reserve := uint64(reservedFDs + reservedPerRun*jobs)
	if limit <= reserve {
		return endpointMinConns, false
	}
	share = int(min((limit-reserve)/uint64(jobs), endpointMaxConns))
	if share < endpointMinConns {
		return endpointMinConns, false
	}
	return share, true
}

// endpointListener is one sandbox's endpoint socket, holding at most max
// connections at once. A connection past max is closed as soon as it is
// accepted, and flood is called (once) with max: the agent is flooding.
type endpointListener struct {
	net.Listener
	max   int
	flood func(max int)

	mu      sync.Mutex
	open    int
	flooded bool
}

func (l *endpointListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		l.mu.Lock()
		if l.open < l.max {
			l.open++
			l.mu.Unlock()
			return &endpointConn{Conn: c, l: l}, nil
		}
		first := !l.flooded
		l.flooded = true
		l.mu.Unlock()
		c.Close()
		if first && l.flood != nil {
			l.flood(l.max)
		}
	}
}

// endpointConn gives its slot back when it closes.
type endpointConn struct {
	net.Conn
	l    *endpointListener
	once sync.Once
}

func (c *endpointConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() {
		c.l.mu.Lock()
		c.l.open--
		c.l.mu.Unlock()
	})
	return err
}

// localResourceError reports whether err is kiln-rollout's own process or
// host running out of descriptors (EMFILE, ENFILE): a local condition, not
// the engine failing, so it never takes an engine out of service.
func localResourceError(err error) bool {
	return errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE)
}
